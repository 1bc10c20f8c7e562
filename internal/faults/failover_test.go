package faults

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// A Redis Cluster of three masters with one replica each loses, mid-run,
// the master holding the pipeline's filter: first its replica falls behind
// (it stops, and its link is cut, so the master goes on answering writes
// the replica will never get: asynchronous replication's window, made
// wide), then the master is killed with SIGKILL and the replica takes
// over. Two workers run with DEDUPE_REDIS_MIN_REPLICAS=1: no decision
// that only the dead master had was acted on, so nothing is lost and no
// duplicate passes. The killed node is restarted and rejoins as a replica
// of the new master; until it is in sync the workers cannot decide (their
// writes reach no replica), which the recovery time includes.
func TestRedisClusterFailover(t *testing.T) {
	ctx := context.Background()
	// Nodes are deemed failed after 500 ms: the failover takes 1-2 s.
	cl := testenv.Cluster(t, 1, "--cluster-node-timeout", "500")
	r := newKafkaRig(t, 1, cl.Addrs()...)
	r.extraEnv = append(r.extraEnv, "DEDUPE_REDIS_MIN_REPLICAS=1")
	run(t, "redis cluster failover", r, 2, everything, func(r *rig) (int, time.Duration) {
		time.Sleep(1 * time.Second)
		// One shard (the default): every key of the pipeline carries the
		// hash tag {faults:0}.
		master, replicas, err := cl.Shard(ctx, "{faults:0}")
		if err != nil {
			t.Fatal(err)
		}
		if len(replicas) != 1 {
			t.Fatalf("master %s has %d replicas, want 1", master.Addr, len(replicas))
		}
		replica := replicas[0]
		mc := redis.NewClient(&redis.Options{Addr: master.Addr})
		defer mc.Close()
		// The workers wait for replicas: each call writes its shard's sync
		// key after the script.
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		keys, _, err := mc.Scan(sctx, 0, "dedupe:{faults:0}:*:w", 1000).Result()
		cancel()
		if err != nil || len(keys) == 0 {
			t.Fatalf("no sync key on %s (%v): the workers do not wait for replicas", master.Addr, err)
		}

		if err := replica.Pause(); err != nil {
			t.Fatal(err)
		}
		kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = mc.Do(kctx, "CLIENT", "KILL", "TYPE", "replica").Err()
		cancel()
		if err != nil {
			replica.Resume()
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		master.Kill()
		killed := time.Now()
		replica.Resume()
		// From the moment the replica's link was cut no call could succeed:
		// the next decision, whenever it comes, ends the outage.
		before := decided(r)
		resumed := make(chan time.Duration, 1)
		go func() {
			for time.Since(killed) < 60*time.Second {
				if decided(r) > before {
					resumed <- time.Since(killed)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			resumed <- -1
		}()

		if err := cl.WaitHealthy(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		promoted := time.Since(killed)
		if now, _, err := cl.Shard(ctx, "{faults:0}"); err != nil || now != replica {
			t.Fatalf("after the failover the filter is on %v (%v), want %s", now, err, replica.Addr)
		}
		if err := master.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if err := cl.WaitReplicated(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		whole := time.Since(killed)
		recovery := <-resumed
		if recovery < 0 {
			t.Fatalf("no decision within 60s of killing the master")
		}
		t.Logf("killed master %s: replica %s promoted after %v, the old master in sync as its replica after %v, workers deciding again after %v",
			master.Addr, replica.Addr, promoted.Round(time.Millisecond), whole.Round(time.Millisecond), recovery.Round(time.Millisecond))
		r.recoveries = append(r.recoveries, recovery.Round(time.Millisecond))
		return 1, recovery
	})
}

// decided is the sum of dedupe_verdicts_total over the live workers.
func decided(r *rig) float64 {
	var sum float64
	for _, v := range r.metric("dedupe_verdicts_total{") {
		sum += v
	}
	return sum
}

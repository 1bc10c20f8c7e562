package faults

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"dedupe-worker/internal/redisproc"
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
	// The last tenth of the input arrives during the outage, so that there
	// is input to decide when it ends.
	chunk := events / 10
	run(t, "redis cluster failover", r, 2, events-chunk, func(r *rig) (int, time.Duration) {
		// The failover is to meet decisions in flight.
		r.waitRead(10_000)
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
		mc := testenv.RedisClient(t, master)
		// The workers wait for replicas: each call writes its shard's sync
		// key (the shard's tag, then "w") after the script.
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		n, err := mc.Exists(sctx, "dedupe:{faults:0}:w").Result()
		cancel()
		if err != nil || n != 1 {
			t.Fatalf("no sync key on %s (%v): the workers do not wait for replicas", master.Addr, err)
		}
		// replOffset is the master's replication offset, which every write
		// it applies moves, whether a replica gets it or not.
		replOffset := func() int64 {
			ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			v, err := redisproc.InfoField(ictx, mc, "replication", "master_repl_offset")
			if err != nil {
				return -1
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}

		if err := replica.Pause(); err != nil {
			t.Fatal(err)
		}
		kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = mc.Do(kctx, "CLIENT", "KILL", "TYPE", "replica").Err()
		cancel()
		cut := replOffset()
		if err != nil || cut < 0 {
			replica.Resume()
			t.Fatalf("cutting the replica's link: %v (replication offset %d)", err, cut)
		}
		// The workers' calls go on writing to the master (their WAIT then
		// fails): once it has applied some, it holds writes its replica
		// will never get.
		if !testenv.Until(10*time.Second, func() bool { return replOffset() > cut }) {
			replica.Resume()
			t.Fatalf("the master applied no write within 10s of its replica's link being cut (offset %d)", cut)
		}
		master.Kill()
		killed := time.Now()
		replica.Resume()
		// From the moment the replica's link was cut no call could succeed:
		// the next decision, whenever it comes, ends the outage.
		r.tries++
		before := decided(r)
		resumed := make(chan time.Duration, 1)
		var ended atomic.Bool // the scenario returned (or failed): stop looking
		defer ended.Store(true)
		go func() {
			if testenv.Until(60*time.Second, func() bool { return ended.Load() || decided(r) > before }) && !ended.Load() {
				resumed <- time.Since(killed)
				return
			}
			resumed <- -1
		}()
		r.feed(len(r.pending))

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
			n, err := r.uncommitted()
			t.Fatalf("no decision within 60s of killing the master, with %d input records not committed (%v)", n, err)
		}
		t.Logf("killed master %s: replica %s promoted after %v, the old master in sync as its replica after %v, workers deciding again after %v",
			master.Addr, replica.Addr, promoted.Round(time.Millisecond), whole.Round(time.Millisecond), recovery.Round(time.Millisecond))
		r.recoveries = append(r.recoveries, recovery.Round(time.Millisecond))
		return 1, recovery
	})
}

// decided is dedupe_verdicts_total summed over the live workers.
func decided(r *rig) float64 {
	var sum float64
	for _, m := range r.metrics() {
		sum += m.Value("dedupe_verdicts_total")
	}
	return sum
}

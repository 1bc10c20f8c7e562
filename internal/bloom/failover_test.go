package bloom

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testenv"
)

// With MinReplicas and no replica to wait for, a call fails with a clear
// error within CallTimeout instead of hanging, and nothing else breaks.
func TestMinReplicasWithoutReplicaFails(t *testing.T) {
	t0 := testenv.Now()
	if _, err := New(nil, Config{Pipeline: "x", MinReplicas: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("negative MinReplicas: %v, want ErrInvalidConfig", err)
	}
	c := testenv.RedisClient(t, testenv.Redis(t))
	const timeout = 300 * time.Millisecond
	f := newFilter(t, c, t0, 10_000, 1e-6, func(cfg *Config) {
		cfg.MinReplicas = 1
		cfg.CallTimeout = timeout
	})
	es := stream(100, 2, 4, t0)
	for try := 0; try < 2; try++ { // the second call replays the first
		start := time.Now()
		v, err := f.TestAndSet(context.Background(), es)
		took := time.Since(start)
		if err == nil || v != nil {
			t.Fatalf("call %d: verdicts %v, error %v; want an error", try, v, err)
		}
		if !errors.Is(err, ErrRedis) || !errors.Is(err, ErrTooFewReplicas) || !strings.Contains(err.Error(), "0 of 1 replicas acknowledged") {
			t.Fatalf("call %d: %v; want ErrRedis and ErrTooFewReplicas saying 0 of 1 replicas acknowledged", try, err)
		}
		if took > timeout+200*time.Millisecond {
			t.Errorf("call %d failed after %v; the call timeout is %v", try, took, timeout)
		}
		t.Logf("call %d failed after %v: %v", try, took.Round(time.Millisecond), err)
	}
}

// A call that fails because its replica lags has still run on the master.
// Its retry only replays the decisions recorded then, writing nothing of
// its own, and arrives on another connection: it must still wait until
// those decisions are on the replica, not succeed because its connection
// has nothing outstanding. (Redis 7.0 sets a connection's WAIT offset on
// every command, so there this holds even without the sync key; newer
// versions set it only on writes.)
func TestMinReplicasRetryWaitsForLaggingReplica(t *testing.T) {
	t0 := testenv.Now()
	master := testenv.Redis(t, "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(master.Addr)
	replica := testenv.Redis(t, "--replicaof", host, port)
	mc := testenv.RedisClient(t, master)
	waitReplicaOnline(t, mc)

	const timeout = 400 * time.Millisecond
	mutate := func(cfg *Config) {
		cfg.MinReplicas = 1
		cfg.CallTimeout = timeout
	}
	f := newFilter(t, mc, t0, 10_000, 1e-6, mutate)
	ctx := context.Background()
	es := stream(600, 2, 3, t0)
	first := verdicts(t, f, es[:300]...)

	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			replica.Resume()
		}
	}()
	if v, err := f.TestAndSet(ctx, es[300:]); !errors.Is(err, ErrTooFewReplicas) {
		t.Fatalf("with the replica stopped: verdicts %v, error %v; want ErrTooFewReplicas", v, err)
	}
	// Fresh connections, as another replica of the worker, or a pool that
	// dropped the first one, would use.
	other := newFilter(t, testenv.RedisClient(t, master), t0, 10_000, 1e-6, mutate)
	v, err := other.TestAndSet(ctx, es[300:])
	if !errors.Is(err, ErrTooFewReplicas) {
		t.Fatalf("retry with the replica still stopped: verdicts %v, error %v; want ErrTooFewReplicas", v, err)
	}
	t.Logf("retry with the replica stopped: %v", err)

	replica.Resume()
	resumed = true
	v, err = other.TestAndSet(ctx, es[300:])
	if err != nil {
		t.Fatalf("retry after the replica is back: %v", err)
	}
	for k, x := range v {
		if x != ReplayedFirstSeen && x != ReplayedDuplicate {
			t.Fatalf("element %d of the retried batch: %v, want a replay of the failed call's decision", k, x)
		}
	}
	// The replica has the decisions: as a master, it would answer alike.
	rc := testenv.RedisClient(t, replica)
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	promoted := newFilter(t, rc, t0, 10_000, 1e-6, nil)
	all := verdicts(t, promoted, es...)
	for k := range es {
		var want Verdict
		if k < 300 {
			want = replayOf(first[k])
		} else {
			want = v[k-300]
		}
		if all[k] != want {
			t.Fatalf("element %d on the promoted replica: %v, want %v", k, all[k], want)
		}
	}
}

// waitReplicaOnline waits until master's replica is in sync and answers
// WAIT at once: just after its first sync it can take a second.
func waitReplicaOnline(t testing.TB, master *redis.Client) {
	t.Helper()
	ctx := context.Background()
	var info string
	if !testenv.Until(20*time.Second, func() bool {
		info, _ = master.Info(ctx, "replication").Result()
		if !strings.Contains(info, ",state=online,") {
			return false
		}
		master.Set(ctx, "replica-check", 1, time.Minute)
		n, _ := master.Wait(ctx, 1, 100*time.Millisecond).Result()
		return n == 1
	}) {
		t.Fatalf("replica not in sync after 20s: %s", info)
	}
}

// A master of a Redis Cluster with one replica each dies while batches
// run; its replica takes over. Just before, the replica fell behind: it
// stopped reading, and its link was cut, so what the master acknowledged
// in the meantime never reached it, the way asynchronous replication loses
// writes. With MinReplicas 1 no such write was ever acted on: every ID is
// first seen from one source only, and replaying every batch gives its
// recorded verdicts. Without WAIT, the same fault loses decisions already
// returned; that run checks that the fault does what it should.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a Redis Cluster master twice; takes about 30s")
	}
	// A node is deemed failed after 500 ms without an answer: failovers
	// take one to two seconds.
	cl := testenv.Cluster(t, 1, "--cluster-node-timeout", "500")
	cc := testenv.ClusterClient(t, cl)

	t.Run("min replicas 1", func(t *testing.T) {
		r := failover(t, cl, cc, "failover-wait", 1)
		for _, p := range r.problems {
			t.Error(p)
		}
		// Without a reload of the client's slot map after a failure, the
		// new master would be found only at the periodic reload (60 s).
		if r.resumed > 10*time.Second {
			t.Errorf("calls succeeded again %v after the cluster was whole again", r.resumed)
		}
		if r.failed == 0 {
			t.Error("no call failed: the fault did not happen while batches ran")
		}
		assertAllKeysExpire(t, cc)
	})
	t.Run("without WAIT decisions are lost", func(t *testing.T) {
		r := failover(t, cl, cc, "failover-nowait", 0)
		if len(r.problems) == 0 {
			t.Error("no decision was lost without WAIT: the fault does not exercise unreplicated writes")
		}
		for i, p := range r.problems {
			if i == 3 {
				t.Logf("... and %d more", len(r.problems)-3)
				break
			}
			t.Logf("as expected without WAIT: %s", p)
		}
	})
}

type failoverResult struct {
	problems []string
	failed   int
	// resumed is the time from the cluster being whole again (a master
	// per slot, a replica in sync behind each) to the next successful call.
	resumed time.Duration
}

// Phases of the fault, as batches see them.
const (
	beforeFault = iota
	replicaCut  // the replica is stopped and its link cut; the master is up
	masterDown  // the master is killed, until the cluster is whole again
	wholeAgain
	phases
)

// lagAttempts is how many batch attempts must run on the master while its
// replica is cut off before the master is killed.
const lagAttempts = 2

// failover runs a stream of batches through a filter with minReplicas on
// cl, makes the replica of shard 0's master fall behind and kills that
// master mid-stream, lets the replica take over and restarts the killed
// node, which rejoins as a replica. It returns what went wrong: IDs first
// seen from several sources, and replays that disagree with the first
// answer.
//
// The stream and the fault wait for each other, never for time to pass:
// batch 50 waits until the replica is cut off; the master is killed once
// batches have run on it since and its replication offset has moved past
// the cut, so that it has taken writes the replica never gets; batch 100
// waits until the master is killed, and the last batch until the cluster is
// whole again.
func failover(t *testing.T, cl *redisproc.Cluster, cc *redis.ClusterClient, pipeline string, minReplicas int) failoverResult {
	t0 := testenv.Now()
	ctx := context.Background()
	f := newFilter(t, cc, t0, 200_000, 1e-6, func(cfg *Config) {
		cfg.Pipeline = pipeline
		cfg.Plan, _ = NewPlan(200_000, 1e-6, PlanOptions{MinShards: 3, Kind: testKind})
		cfg.MinReplicas = minReplicas
		cfg.CallTimeout = 400 * time.Millisecond
	})
	// The fault needs shard 0's master with its replica attached and known
	// to the cluster: just after the cluster starts, or after the previous
	// failover, the node asked may not list the replica yet.
	var replicas int
	if !testenv.Until(30*time.Second, func() bool {
		_, rs, err := cl.Shard(ctx, f.syncKey(0))
		replicas = len(rs)
		return err == nil && replicas == 1
	}) {
		t.Fatalf("shard 0's master lists %d replicas after 30s, want 1", replicas)
	}

	// 20,000 elements over 4 partitions; every fourth one from the 4,000th
	// on repeats the ID of the element 4,000 earlier (40 batches), so the
	// copies of what is decided while the replica lags come after the
	// failover.
	const n, lag, size = 20_000, 4_000, 100
	es := make([]Element, n)
	isCopy := make([]bool, n)
	offsets := [4]int64{}
	for i := range es {
		id := fmt.Sprintf("%s-%d", pipeline, i)
		if i >= lag && i%4 == 3 && !isCopy[i-lag] {
			id, isCopy[i] = string(es[i-lag].ID), true
		}
		p := i % 4
		es[i] = Element{ID: []byte(id), Time: t0, Source: Source{Topic: "clicks", Partition: int32(p), Offset: offsets[p]}}
		offsets[p]++
	}

	var r failoverResult
	var phase atomic.Int32
	var ranIn [phases]atomic.Int64 // batch attempts that began and ended in each phase
	var whole atomic.Int64         // when the cluster was whole again, Unix ns
	cut, killed, faultDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var faultErr error  // what fault returned, once faultDone is closed
	var faultLog string // what it did, once faultDone is closed
	fault := func() error {
		master, replicas, err := cl.Shard(ctx, f.syncKey(0))
		if err != nil {
			return err
		}
		if len(replicas) != 1 {
			return fmt.Errorf("master %s of shard 0 has %d replicas, want 1", master.Addr, len(replicas))
		}
		replica := replicas[0]
		mc := redis.NewClient(&redis.Options{Addr: master.Addr})
		defer mc.Close()
		// The replica stops reading and loses its link: the master goes on
		// acknowledging writes the replica will never get.
		if err := replica.Pause(); err != nil {
			return err
		}
		if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
			replica.Resume()
			return err
		}
		atCut, err := replOffset(ctx, mc)
		if err != nil {
			replica.Resume()
			return err
		}
		phase.Store(replicaCut)
		close(cut)
		// Wait until it has: batches ran on the master after the cut, and
		// its replication offset moved past the one at the cut.
		var offset int64
		if !testenv.Until(30*time.Second, func() bool {
			offset, err = replOffset(ctx, mc)
			return err == nil && offset > atCut && ranIn[replicaCut].Load() >= lagAttempts
		}) {
			replica.Resume()
			return fmt.Errorf("after 30s with the replica cut off, %d batch attempts ran and master %s is at replication offset %d (%v), %d at the cut",
				ranIn[replicaCut].Load(), master.Addr, offset, err, atCut)
		}
		master.Kill()
		killedAt := time.Now()
		phase.Store(masterDown)
		close(killed)
		replica.Resume()
		if err := cl.WaitHealthy(ctx, 30*time.Second); err != nil {
			return fmt.Errorf("after killing %s: %w", master.Addr, err)
		}
		promoted := time.Since(killedAt)
		if now, _, err := cl.Shard(ctx, f.syncKey(0)); err != nil || now != replica {
			return fmt.Errorf("shard 0 is on %v (%v) after the failover, want %s", now, err, replica.Addr)
		}
		if err := master.Restart(ctx); err != nil {
			return err
		}
		if err := cl.WaitReplicated(ctx, 30*time.Second); err != nil {
			return fmt.Errorf("after restarting %s: %w", master.Addr, err)
		}
		whole.Store(time.Now().UnixNano())
		phase.Store(wholeAgain)
		faultLog = fmt.Sprintf("master %s took %d bytes of writes past the cut, then was killed; replica %s serves shard 0 after %v; the restarted node is its replica, in sync, after %v",
			master.Addr, offset-atCut, replica.Addr, promoted.Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond))
		return nil
	}

	deadline := time.Now().Add(90 * time.Second)
	// await waits until the fault has got as far as ch says, and fails the
	// test if it fails or the deadline passes first.
	await := func(ch <-chan struct{}, what string) {
		t.Helper()
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		select {
		case <-ch:
		case <-faultDone:
			if faultErr != nil {
				t.Fatal(faultErr)
			}
		case <-timer.C:
			t.Fatalf("batches still waiting for %s after 90s", what)
		}
	}

	got := make([]Verdict, n)
	seen := map[string]bool{}
	var longest time.Duration
	for i := 0; i < n; i += size {
		switch i {
		case 50 * size:
			go func() { faultErr = fault(); close(faultDone) }()
			await(cut, "the replica to be cut off")
		case 100 * size:
			await(killed, "the master to be killed")
		case n - size:
			await(faultDone, "the cluster to be whole again")
		}
		batch := es[i : i+size]
		start := time.Now()
		v := retryBatch(t, deadline, fmt.Sprintf("batch %d", i/size), func() ([]Verdict, error) {
			p := phase.Load()
			v, err := f.TestAndSet(ctx, batch)
			if phase.Load() == p {
				ranIn[p].Add(1)
			}
			return v, err
		}, func(err error) {
			if !errors.Is(err, ErrRedis) {
				t.Fatalf("batch %d: %v, want an error wrapping ErrRedis", i/size, err)
			}
			r.failed++
			// Log each kind of error once: the same text but for numbers.
			if kind := strings.Map(func(c rune) rune {
				if c >= '0' && c <= '9' {
					return -1
				}
				return c
			}, err.Error()); !seen[kind] {
				seen[kind] = true
				t.Logf("batch %d failed, retrying: %v", i/size, err)
			}
		})
		copy(got[i:], v)
		if w := whole.Load(); w != 0 && r.resumed == 0 {
			r.resumed = time.Since(time.Unix(0, w))
		}
		longest = max(longest, time.Since(start))
	}
	// The last batch waited for the fault to end.
	if faultErr != nil {
		t.Fatal(faultErr)
	}
	t.Log(faultLog)
	if r.resumed == 0 {
		t.Fatal("no call succeeded after the cluster was whole again")
	}
	t.Logf("min replicas %d: batch attempts with the replica cut off %d, with the master down %d; %d calls failed and were retried; longest a batch took to succeed %v; first success %v after the cluster was whole",
		minReplicas, ranIn[replicaCut].Load(), ranIn[masterDown].Load(), r.failed, longest.Round(time.Millisecond), r.resumed.Round(time.Millisecond))
	if ranIn[masterDown].Load() == 0 {
		t.Fatal("no batch ran while the master was down: the failover did not meet batches in flight")
	}

	// Each ID is first seen from exactly one source.
	firsts := map[string][]Source{}
	for i, v := range got {
		if v == FirstSeen || v == ReplayedFirstSeen {
			firsts[string(es[i].ID)] = append(firsts[string(es[i].ID)], es[i].Source)
		}
	}
	for i := range es {
		if i < lag || !isCopy[i] {
			if srcs := firsts[string(es[i].ID)]; len(srcs) != 1 {
				r.problems = append(r.problems, fmt.Sprintf("%s first seen from %d sources: %v", es[i].ID, len(srcs), srcs))
			}
		}
	}
	// Every batch replayed, with other boundaries, gives its first verdicts.
	for i := 0; i < n; i += 250 {
		v, err := f.TestAndSet(ctx, es[i:i+250])
		if err != nil {
			t.Fatalf("replaying from element %d: %v", i, err)
		}
		for k, x := range v {
			if want := replayOf(got[i+k]); x != want {
				r.problems = append(r.problems, fmt.Sprintf("replay of %v (%s): %v, first decided %v", es[i+k].Source, es[i+k].ID, x, got[i+k]))
			}
		}
	}
	return r
}

// replOffset is the master_repl_offset of the server c talks to: how far
// its replication stream has gone.
func replOffset(ctx context.Context, c *redis.Client) (int64, error) {
	v, err := redisproc.InfoField(ctx, c, "replication", "master_repl_offset")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// BenchmarkMinReplicas measures what WAIT adds to a call of 500 elements
// on a master with one replica on loopback: the master-to-replica round
// trip and the sync key write.
func BenchmarkMinReplicas(b *testing.B) {
	t0 := testenv.Now()
	master := testenv.Redis(b, "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(master.Addr)
	testenv.Redis(b, "--replicaof", host, port)
	mc := testenv.RedisClient(b, master)
	waitReplicaOnline(b, mc)
	for _, n := range []int{0, 1} {
		b.Run(fmt.Sprintf("min=%d", n), func(b *testing.B) {
			f := newFilter(b, mc, t0, 1_000_000, 1e-6, func(cfg *Config) {
				cfg.Pipeline = fmt.Sprintf("bench-%d", n)
				cfg.MinReplicas = n
			})
			if err := f.Preallocate(context.Background(), t0); err != nil {
				b.Fatal(err)
			}
			waitReplicaOnline(b, mc)
			es := make([]Element, 500)
			var off int64
			for b.Loop() {
				for i := range es {
					es[i] = Element{ID: fmt.Appendf(nil, "id-%d", off), Time: t0, Source: Source{Topic: "t", Partition: 0, Offset: off}}
					off++
				}
				if _, err := f.TestAndSet(context.Background(), es); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

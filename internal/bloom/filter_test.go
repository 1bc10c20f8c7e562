package bloom

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// newFilter makes a filter whose clock stands still at now: testenv.Now(),
// plus any offset the test chooses. Redis applies EXPIREAT with its own real
// clock, so the injected clock and the event times of a test start at the
// real present, never at a calendar date, and may only run ahead of it: a
// clock behind Redis's makes keys that expire at once.
func newFilter(t testing.TB, c redis.UniversalClient, now time.Time, n int64, p float64, mutate func(*Config)) *Filter {
	t.Helper()
	plan, err := NewPlan(n, p, PlanOptions{Kind: testKind})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Pipeline: "test", Plan: plan, Window: Window{Length: 10 * time.Minute, Mode: Rolling, MaxLag: time.Hour},
		Now: func() time.Time { return now }}
	if mutate != nil {
		mutate(&cfg)
	}
	f, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// el builds an element of topic "t".
func el(id string, partition int32, offset int64, at time.Time) Element {
	return Element{ID: []byte(id), Time: at, Source: Source{Topic: "t", Partition: partition, Offset: offset}}
}

func verdicts(t testing.TB, f *Filter, es ...Element) []Verdict {
	t.Helper()
	v, err := f.TestAndSet(context.Background(), es)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func same(a, b []Verdict) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

const (
	F  = FirstSeen
	D  = Duplicate
	RF = ReplayedFirstSeen
	RD = ReplayedDuplicate
)

// The scenario table runs with the filter's clock at the real time and a
// year ahead of it: decisions depend on the event times and the injected
// clock, never on the date the test runs.
func TestTestAndSetScenarios(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	for _, clock := range []struct {
		name  string
		ahead time.Duration
	}{{"clock at real time", 0}, {"clock a year ahead", 365 * 24 * time.Hour}} {
		t.Run(clock.name, func(t *testing.T) { testAndSetScenarios(t, c, testenv.Now().Add(clock.ahead)) })
	}
}

func testAndSetScenarios(t *testing.T, c *redis.Client, t0 time.Time) {
	w := 10 * time.Minute
	bucketStart := t0.Truncate(w)
	for _, tc := range []struct {
		name    string
		mode    Mode
		batches [][]Element
		want    [][]Verdict
	}{
		{"repeat inside one batch is first seen once", Rolling,
			[][]Element{{el("a", 0, 0, t0), el("b", 0, 1, t0), el("a", 0, 2, t0), el("a", 1, 0, t0)}},
			[][]Verdict{{F, F, D, D}}},
		{"repeat in a later batch", Fixed,
			[][]Element{{el("a", 0, 0, t0)}, {el("b", 0, 1, t0), el("a", 0, 2, t0)}},
			[][]Verdict{{F}, {F, D}}},
		{"fixed: a copy in the next bucket passes", Fixed,
			[][]Element{{el("a", 0, 0, bucketStart.Add(w-time.Second))}, {el("a", 0, 1, bucketStart.Add(w))}},
			[][]Verdict{{F}, {F}}},
		{"rolling: a copy in the next bucket is caught", Rolling,
			[][]Element{{el("a", 0, 0, bucketStart.Add(w-time.Second))}, {el("a", 0, 1, bucketStart.Add(w))}},
			[][]Verdict{{F}, {D}}},
		{"rolling: both buckets in one batch", Rolling,
			[][]Element{{el("a", 0, 1, bucketStart.Add(w)), el("a", 0, 0, bucketStart.Add(w-time.Second))}},
			[][]Verdict{{D, F}}},
		{"rolling: a later copy decided first, after its bucket began, is caught", Rolling,
			[][]Element{{el("a", 0, 0, bucketStart)}, {el("a", 0, 1, bucketStart.Add(-time.Second))}},
			[][]Verdict{{F}, {D}}},
		{"rolling: two windows apart passes", Rolling,
			[][]Element{{el("a", 0, 0, bucketStart.Add(-w))}, {el("a", 0, 1, bucketStart.Add(w))}},
			[][]Verdict{{F}, {F}}},
		{"an element seen in the previous bucket is not set again", Rolling,
			[][]Element{{el("a", 0, 0, bucketStart.Add(-time.Second))}, {el("a", 0, 1, t0)}, {el("a", 0, 2, t0.Add(w))}},
			[][]Verdict{{F}, {D}, {F}}},
		{"late and future events are forwarded", Rolling,
			[][]Element{{el("a", 0, 0, t0.Add(-2*time.Hour)), el("a", 0, 1, t0.Add(-2*time.Hour)), el("b", 0, 2, t0.Add(3*w))}},
			[][]Verdict{{Late, Late, Future}}},
		{"binary, long and unicode IDs", Fixed,
			[][]Element{{el("\x00\xff\x00", 0, 0, t0), el(strings.Repeat("x", 4<<20), 0, 1, t0), el("ключ", 0, 2, t0),
				el("\x00\xff\x00", 0, 3, t0), el(strings.Repeat("x", 4<<20), 0, 4, t0), el("ключ", 0, 5, t0), el("\x00\xff", 0, 6, t0)}},
			[][]Verdict{{F, F, F, D, D, D, F}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			// Copies in the next bucket are decided now: events up to a
			// window ahead of the clock are tested.
			f := newFilter(t, c, t0, 10_000, 1e-6, func(cfg *Config) { cfg.Window.Mode, cfg.MaxFutureSkew = tc.mode, w })
			for i, b := range tc.batches {
				if got := verdicts(t, f, b...); !same(got, tc.want[i]) {
					t.Errorf("batch %d: %v, want %v", i, got, tc.want[i])
				}
			}
			assertAllKeysExpire(t, c)
		})
	}
}

// assertAllKeysExpire fails if Redis holds no key, or any key without a
// TTL: a scan that finds nothing has checked nothing.
func assertAllKeysExpire(t testing.TB, c redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	var seen atomic.Int64 // masters are scanned concurrently
	check := func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			seen.Add(1)
			ttl, err := node.TTL(ctx, iter.Val()).Result()
			if err != nil {
				return err
			}
			if ttl <= 0 {
				t.Errorf("key %s has TTL %v", iter.Val(), ttl)
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, check)
	} else {
		err = check(ctx, c.(*redis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
	if seen.Load() == 0 {
		t.Fatal("no key in Redis: nothing was written, so no expiry was checked")
	}
}

// stream is a deterministic sequence of elements over several partitions
// with repeated IDs.
func stream(n, partitions int, dupEvery int, at time.Time) []Element {
	out := make([]Element, n)
	offsets := make([]int64, partitions)
	for i := range out {
		id := fmt.Sprintf("id-%d", i)
		if dupEvery > 0 && i%dupEvery == dupEvery-1 {
			id = fmt.Sprintf("id-%d", i/3)
		}
		p := i % partitions
		out[i] = Element{ID: []byte(id), Time: at, Source: Source{Topic: "clicks", Partition: int32(p), Offset: offsets[p]}}
		offsets[p]++
	}
	return out
}

func runBatches(t testing.TB, f *Filter, es []Element, size int) []Verdict {
	t.Helper()
	var out []Verdict
	for i := 0; i < len(es); i += size {
		out = append(out, verdicts(t, f, es[i:min(i+size, len(es))]...)...)
	}
	return out
}

func replayOf(v Verdict) Verdict {
	switch v {
	case FirstSeen:
		return ReplayedFirstSeen
	case Duplicate:
		return ReplayedDuplicate
	}
	return v
}

// Re-reading offsets with other batch boundaries, by another replica, must
// give the first decisions back; a re-read that runs into new offsets
// decides those fresh.
func TestReplayGivesTheFirstDecisions(t *testing.T) {
	t0 := testenv.Now()
	for _, topo := range []string{"standalone", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			var c redis.UniversalClient
			shards := 1
			if topo == "standalone" {
				c = testenv.RedisClient(t, testenv.Redis(t))
			} else {
				c = testenv.ClusterClient(t, sharedCluster(t))
				shards = 5
			}
			mutate := func(cfg *Config) {
				cfg.Pipeline = "replay-" + topo
				p, _ := NewPlan(20_000, 1e-6, PlanOptions{MinShards: shards, Kind: testKind})
				cfg.Plan = p
			}
			a := newFilter(t, c, t0, 20_000, 1e-6, mutate)
			b := newFilter(t, c, t0, 20_000, 1e-6, mutate) // another replica
			es := stream(6000, 4, 7, t0)
			first := runBatches(t, a, es[:4000], 250)
			var firsts int
			for _, v := range first {
				if v == FirstSeen {
					firsts++
				}
			}
			if firsts == 0 || firsts == len(first) {
				t.Fatalf("stream gave %d first seen of %d", firsts, len(first))
			}
			// Replica b re-reads from offset 500 of every partition with other
			// boundaries and goes past what a decided.
			var again []Element
			var idx []int
			for i, e := range es {
				if e.Source.Offset >= 500 {
					again = append(again, e)
					idx = append(idx, i)
				}
			}
			got := runBatches(t, b, again, 333)
			// Decide the tail fresh with a third, independent filter state: it
			// must match what a single pass over everything gives.
			for k, i := range idx {
				if i < 4000 {
					if want := replayOf(first[i]); got[k] != want {
						t.Fatalf("offset %v: replay gave %v, first decision was %v", es[i].Source, got[k], first[i])
					}
				} else if got[k] != FirstSeen && got[k] != Duplicate {
					t.Fatalf("offset %v past the first run: %v, want a fresh decision", es[i].Source, got[k])
				}
			}
			// Every distinct ID forwarded exactly once over the two runs.
			forwarded := map[string]int{}
			for i, v := range first {
				if v == FirstSeen {
					forwarded[string(es[i].ID)]++
				}
			}
			for k, i := range idx {
				if i >= 4000 && got[k] == FirstSeen {
					forwarded[string(es[i].ID)]++
				}
			}
			for _, e := range es {
				if n := forwarded[string(e.ID)]; n != 1 {
					t.Fatalf("ID %s forwarded %d times", e.ID, n)
				}
			}
			assertAllKeysExpire(t, c)
		})
	}
}

func TestReplayBeyondHorizonIsForwarded(t *testing.T) {
	t0 := testenv.Now()
	c := testenv.RedisClient(t, testenv.Redis(t))
	f := newFilter(t, c, t0, 10_000, 1e-6, func(cfg *Config) { cfg.ReplayHorizon = 1024 })
	es := stream(3000, 1, 0, t0)
	runBatches(t, f, es, 500)
	got := verdicts(t, f, es[100], es[2500])
	if want := []Verdict{ReplayUnknown, ReplayedFirstSeen}; !same(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}

// Replicas racing on the same IDs: each ID is first seen exactly once.
func TestConcurrentReplicasAgree(t *testing.T) {
	t0 := testenv.Now()
	for _, topo := range []string{"standalone", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			var c redis.UniversalClient
			if topo == "standalone" {
				c = testenv.RedisClient(t, testenv.Redis(t))
			} else {
				c = testenv.ClusterClient(t, sharedCluster(t))
			}
			const replicas, ids = 6, 3000
			var mu sync.Mutex
			firsts := map[string]int{}
			var wg sync.WaitGroup
			for r := 0; r < replicas; r++ {
				f := newFilter(t, c, t0, 50_000, 1e-6, func(cfg *Config) {
					cfg.Pipeline = "race-" + topo
					p, _ := NewPlan(50_000, 1e-6, PlanOptions{MinShards: 4, Kind: testKind})
					cfg.Plan = p
				})
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Each replica reads its own partition holding every ID.
					es := make([]Element, ids)
					for i := range es {
						es[i] = el(fmt.Sprintf("race-%d", (i*7+r*13)%ids), int32(r), int64(i), t0)
					}
					for i := 0; i < ids; i += 200 {
						v, err := f.TestAndSet(context.Background(), es[i:i+200])
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						for k, x := range v {
							if x == FirstSeen {
								firsts[string(es[i+k].ID)]++
							}
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if len(firsts) != ids {
				t.Errorf("%d IDs first seen, want %d", len(firsts), ids)
			}
			for id, n := range firsts {
				if n != 1 {
					t.Errorf("%s first seen %d times", id, n)
				}
			}
		})
	}
}

// The measured false-positive rate on real Redis against the formula: at
// the design load, and with the filter overfilled six times, where the
// formula must still hold.
func TestMeasuredFalsePositives(t *testing.T) {
	t0 := testenv.Now()
	c := testenv.RedisClient(t, testenv.Redis(t))
	for _, tc := range []struct {
		name       string
		n, queries int
		p          float64
	}{
		{"design load", 40_000, 8_000, 1e-2},
		{"overfilled", 20_000, 100_000, 1e-3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFilter(t, c, t0, int64(tc.n), tc.p, func(cfg *Config) {
				cfg.Window.Mode = Fixed
				cfg.Pipeline = strings.ReplaceAll(tc.name, " ", "-")
			})
			ins := make([]Element, tc.n)
			for i := range ins {
				ins[i] = el(fmt.Sprintf("in-%d", i), 0, int64(i), t0)
			}
			runBatches(t, f, ins, 1000)
			q := make([]Element, tc.queries)
			for i := range q {
				q[i] = el(fmt.Sprintf("out-%d", i), 1, int64(i), t0)
			}
			// Queries are inserted too: the rate grows as they go in, so the
			// formula is summed over the growth.
			v := runBatches(t, f, q, 1000)
			fp := 0
			for _, x := range v {
				if x == Duplicate {
					fp++
				}
			}
			plan := f.Plan()
			var want float64
			for i := 0; i < tc.queries; i += 100 {
				want += 100 * plan.FPRHolding(float64(tc.n+i+50))
			}
			bound := 5*math.Sqrt(want) + 1
			if math.Abs(float64(fp)-want) > bound {
				t.Errorf("%d false positives in %d queries, formula expects %.1f ± %.1f", fp, tc.queries, want, bound)
			}
			t.Logf("%d false positives in %d queries; formula expects %.1f (target %g at n=%d, achieved %.3g)",
				fp, tc.queries, want, plan.TargetFPR, tc.n, plan.AchievedFPR)
		})
	}
}

func TestStatsEstimateCount(t *testing.T) {
	t0 := testenv.Now()
	c := testenv.RedisClient(t, testenv.Redis(t))
	f := newFilter(t, c, t0, 50_000, 1e-4, func(cfg *Config) {
		p, _ := NewPlan(50_000, 1e-4, PlanOptions{MinShards: 2, Kind: testKind})
		cfg.Plan = p
	})
	const n = 30_000
	runBatches(t, f, stream(n, 3, 0, t0), 1000)
	st, err := f.Stats(t.Context(), t0)
	if err != nil {
		t.Fatal(err)
	}
	var est float64
	for _, s := range st {
		if s.Bucket == f.cfg.Window.Bucket(t0) {
			est += s.Elements
			if !s.Exists || s.TTL <= 0 || s.Fill <= 0 || s.FPR <= 0 || s.FPR > 1e-4 {
				t.Errorf("shard stats %+v", s)
			}
		} else if s.Exists || s.BitsSet != 0 {
			t.Errorf("previous bucket %+v", s)
		}
	}
	if math.Abs(est-n)/n > 0.03 {
		t.Errorf("estimated %.0f elements, inserted %d", est, n)
	}
}

func TestBadInput(t *testing.T) {
	t0 := testenv.Now()
	c := testenv.RedisClient(t, testenv.Redis(t))
	f := newFilter(t, c, t0, 1000, 1e-6, nil)
	for name, es := range map[string][]Element{
		"empty ID":         {el("", 0, 0, t0)},
		"no time":          {el("a", 0, 0, time.Time{})},
		"no topic":         {{ID: []byte("a"), Time: t0}},
		"negative offset":  {el("a", 0, -1, t0)},
		"offset too large": {el("a", 0, MaxOffset+1, t0)},
		"same source":      {el("a", 0, 5, t0), el("b", 0, 5, t0)},
	} {
		if _, err := f.TestAndSet(t.Context(), es); !errors.Is(err, ErrInvalidElement) {
			t.Errorf("%s: %v, want ErrInvalidElement", name, err)
		}
	}
	if n, err := c.DBSize(t.Context()).Result(); err != nil || n != 0 {
		t.Errorf("bad input wrote %d keys (DBSIZE error %v)", n, err)
	}
	if _, err := New(c, Config{Pipeline: "bad name!", Plan: f.Plan(), Window: Window{Length: time.Minute}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad pipeline name: %v", err)
	}
	if _, err := New(c, Config{Pipeline: "x", Plan: f.Plan(), Window: Window{Length: 1500 * time.Millisecond}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("fractional window: %v", err)
	}
	// A client the filter cannot tell a server from a Cluster by (a Ring
	// here; a wrapper would be the same) is refused, not taken for one
	// server.
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": c.Options().Addr}})
	defer ring.Close()
	if _, err := New(ring, Config{Pipeline: "x", Plan: f.Plan(), Window: Window{Length: time.Minute}}); !errors.Is(err, ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "*redis.Ring") {
		t.Errorf("a Ring client: %v, want ErrInvalidConfig naming the type", err)
	}
}

func TestPreallocateMakesFullKeysWithTTL(t *testing.T) {
	t0 := testenv.Now()
	c := testenv.RedisClient(t, testenv.Redis(t))
	f := newFilter(t, c, t0, 200_000, 1e-6, nil)
	if err := f.Preallocate(t.Context(), t0); err != nil {
		t.Fatal(err)
	}
	b := f.cfg.Window.Bucket(t0)
	key := f.own.filterKey(0, b)
	st0 := f.Plan().Stages[0]
	var mem int64
	for pt := range st0.Parts {
		n, err := c.StrLen(t.Context(), f.own.partKey(0, b, 0, pt)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if uint64(n) != st0.partBytes() {
			t.Errorf("part %d: preallocated %d bytes, want %d", pt, n, st0.partBytes())
		}
		m, err := c.MemoryUsage(t.Context(), f.own.partKey(0, b, 0, pt)).Result()
		if err != nil {
			t.Fatal(err)
		}
		mem += m
	}
	if mem <= 0 || uint64(mem) > f.Plan().Memory+256*uint64(st0.Parts) {
		t.Errorf("MEMORY USAGE %d, plan says %d", mem, f.Plan().Memory)
	}
	n, err := c.StrLen(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	verdicts(t, f, el("a", 0, 0, t0))
	// A second preallocation must not clear what was written.
	if err := f.Preallocate(t.Context(), t0); err != nil {
		t.Fatal(err)
	}
	if got := verdicts(t, f, el("a", 0, 1, t0)); got[0] != Duplicate {
		t.Errorf("after preallocating again: %v", got)
	}
	if n2, err := c.StrLen(t.Context(), key).Result(); err != nil || n2 != n {
		t.Errorf("key grew from %d to %d bytes (STRLEN error %v)", n, n2, err)
	}
	assertAllKeysExpire(t, c)
}

func TestCheckCapacity(t *testing.T) {
	t0 := testenv.Now()
	c := testenv.RedisClient(t, testenv.Redis(t))
	f := newFilter(t, c, t0, 1_000_000, 1e-6, nil)
	if err := f.CheckCapacity(t.Context()); err != nil {
		t.Fatalf("no maxmemory: %v", err)
	}
	configSet(t, c, "maxmemory", "10mb")
	if err := f.CheckCapacity(t.Context()); !errors.Is(err, ErrInvalidPlan) {
		t.Fatalf("maxmemory 10mb for a %d-byte window: %v", f.Plan().Memory, err)
	}
	configSet(t, c, "maxmemory", "1gb")
	if err := f.CheckCapacity(t.Context()); err != nil {
		t.Fatalf("maxmemory 1gb: %v", err)
	}
}

// configSet sets a server parameter, failing the test if the server refuses.
func configSet(t testing.TB, c *redis.Client, param, value string) {
	t.Helper()
	if err := c.ConfigSet(context.Background(), param, value).Err(); err != nil {
		t.Fatalf("CONFIG SET %s %s: %v", param, value, err)
	}
}

// retryBatch calls call until it succeeds and returns its verdicts, as a
// worker sends a failed batch again. Each error goes to failed, which may
// fail the test. Between attempts it pauses 20 ms: a back-off, so that a
// failing call is not repeated in a tight loop, not a wait for anything to
// happen. It fails the test, naming what, if the batch still fails at
// deadline.
func retryBatch(t testing.TB, deadline time.Time, what string, call func() ([]Verdict, error), failed func(error)) []Verdict {
	t.Helper()
	for {
		v, err := call()
		if err == nil {
			return v
		}
		if failed != nil {
			failed(err)
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("%s still failing at its deadline: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

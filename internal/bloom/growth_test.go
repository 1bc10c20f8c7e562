package bloom

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// assertStage fails unless every shard of the bucket of at inserts into
// stage want, none overfilled and at most maxTestOnly test-only: a batch
// that needs a stage not made yet waits for it.
func assertStage(t testing.TB, f *Filter, at time.Time, want int, maxTestOnly int64) {
	t.Helper()
	b := f.cfg.Window.Bucket(at)
	for s := 0; s < f.own.plan.Shards; s++ {
		g, err := f.growth(context.Background(), f.own, s, b)
		if err != nil {
			t.Fatal(err)
		}
		if g.Stage != want || g.Overfilled != 0 || g.TestOnly > maxTestOnly || g.Held == 0 {
			t.Errorf("shard %d: %+v, want stage %d in use, none overfilled and at most %d test-only", s, g, want, maxTestOnly)
		}
	}
}

// growingFilter is a filter for n IDs per window at rate p that grows up
// to growth times n, with its clock at now.
func growingFilter(t testing.TB, c redis.UniversalClient, now time.Time, n int64, p, growth float64, mutate ...func(*Config)) *Filter {
	t.Helper()
	plan, err := NewPlan(n, p, PlanOptions{MaxGrowth: growth, Kind: testKind})
	if err != nil {
		t.Fatal(err)
	}
	return newFilter(t, c, now, n, p, func(cfg *Config) {
		cfg.Plan = plan
		for _, m := range mutate {
			m(cfg)
		}
	})
}

// batchOf is distinct IDs prefix-from..prefix-to at at, at offsets from..to
// of partition 0 of topic prefix.
func batchOf(prefix string, from, to int, at time.Time) []Element {
	var es []Element
	for i := from; i < to; i++ {
		es = append(es, Element{ID: fmt.Appendf(nil, "%s-%d", prefix, i), Time: at, Source: Source{Topic: prefix, Offset: int64(i)}})
	}
	return es
}

// fillStage0 fills stage 0 of the one shard of f's window at at: its
// capacity of distinct IDs prefix-0.. in one call, then one more ID per
// call while a false positive (not inserted) left it short. It returns
// the next ID's number.
func fillStage0(t testing.TB, f *Filter, at time.Time, prefix string) int {
	t.Helper()
	capacity := int(f.own.plan.Stages[0].CapacityPerShard)
	if f.own.plan.Shards != 1 {
		t.Fatalf("fillStage0 fills one shard, the plan has %d", f.own.plan.Shards)
	}
	verdicts(t, f, batchOf(prefix, 0, capacity, at)...)
	next := capacity
	for ; ; next++ {
		g, err := f.growth(t.Context(), f.own, 0, f.cfg.Window.Bucket(at))
		if err != nil {
			t.Fatal(err)
		}
		if g.Stage != 0 || g.Held > int64(capacity) {
			t.Fatalf("%+v after %d IDs: want stage 0 filled to %d", g, next, capacity)
		}
		if g.Held == int64(capacity) {
			return next
		}
		if next > 2*capacity {
			t.Fatalf("stage 0 holds %d of %d after %d IDs", g.Held, capacity, next)
		}
		verdicts(t, f, batchOf(prefix, next, next+1, at)...)
	}
}

// fillTo decides distinct IDs prefix-from..prefix-to in batches of 100,
// making the next stage when a call asks for it, as the maintenance does,
// and returns how many were taken for duplicates: false positives, since
// every ID is new.
func fillTo(t testing.TB, f *Filter, at time.Time, prefix string, from, to int) int {
	t.Helper()
	fp := 0
	for lo := from; lo < to; lo += 100 {
		select {
		case <-f.GrowthWanted():
			if _, err := f.Grow(context.Background(), at); err != nil {
				t.Fatal(err)
			}
		default:
		}
		var es []Element
		for i := lo; i < min(lo+100, to); i++ {
			es = append(es, Element{ID: fmt.Appendf(nil, "%s-%d", prefix, i), Time: at, Source: Source{Topic: prefix, Partition: 0, Offset: int64(i)}})
		}
		for _, v := range verdicts(t, f, es...) {
			if v == Duplicate {
				fp++
			}
		}
	}
	return fp
}

// The false-positive rate holds as a window grows to 64 times its planned
// n: new IDs taken for duplicates stay within 4 standard deviations of
// the configured rate times the IDs tested (a Poisson count), at 1x, 4x,
// 16x and 64x, standalone and on a Cluster. Without growth the 64x window
// drops a large share of new IDs.
func TestGrowthKeepsTheRate(t *testing.T) {
	const (
		n = 2000
		p = 1e-3
	)
	for _, srv := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
		mode   Mode
		shards int
		parts  int // keys per shard of stages 1 and up
	}{
		{"standalone, rolling, one shard", func(t *testing.T) redis.UniversalClient { return testenv.RedisClient(t, testenv.Redis(t)) }, Rolling, 1, 1},
		{"cluster, fixed, three shards, stages in two keys each", func(t *testing.T) redis.UniversalClient { return testenv.ClusterClient(t, testenv.Cluster(t, 0)) }, Fixed, 3, 2},
	} {
		t.Run(srv.name, func(t *testing.T) {
			c := srv.client(t)
			at := testenv.Now()
			f := growingFilter(t, c, at, n, p, 64, func(cfg *Config) {
				plan, err := NewPlan(n, p, PlanOptions{MaxGrowth: 64, MinShards: srv.shards, Kind: testKind})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Pipeline, cfg.Plan, cfg.Window.Mode = "grow", inParts(plan, srv.parts), srv.mode
			})
			if f.own.plan.Shards != srv.shards {
				t.Fatalf("%d shards, want %d", f.own.plan.Shards, srv.shards)
			}
			fp, done := 0, 0
			for _, load := range []int{1, 4, 16, 64} {
				fp += fillTo(t, f, at, "id", done, load*n)
				done = load * n
				mu := p * float64(done)
				bound := mu + 4*math.Sqrt(mu) + 1
				t.Logf("load %dx: %d new IDs, %d taken for duplicates (rate %.2g; bound %.0f for p = %g)", load, done, fp, float64(fp)/float64(done), bound, p)
				if float64(fp) > bound {
					t.Errorf("load %dx: %d false positives in %d new IDs, above the bound %.0f", load, fp, done, bound)
				}
			}
			// 128,000 IDs fill stages 0 to 3 exactly (2,000 + 6,000 +
			// 24,000 + 96,000), none past a stage. With several shards, one
			// may get a little more than its share of the 64x and reach
			// the cap: at most 1% only tested.
			assertStage(t, f, at, 3, int64(64*n/100))
			t.Logf("growth: %+v", f.GrowthStats())
			assertAllKeysExpire(t, c)
			if t.Failed() {
				return
			}
			// The same load without growth: a Bloom filter takes every ID
			// and its rate climbs; a fingerprint table stops at its hard
			// load, and the rest are only tested (their copies pass).
			flat := growingFilter(t, c, at, n, p, 1, func(cfg *Config) { cfg.Pipeline = "flat" })
			got := fillTo(t, flat, at, "id", 0, 64*n)
			if testKind == KindFingerprint {
				var only int64
				for s := range flat.own.plan.Shards {
					g, _ := flat.growth(t.Context(), flat.own, s, flat.cfg.Window.Bucket(at))
					only += g.TestOnly
				}
				if only < 60*n {
					t.Errorf("without growth at 64x: %d IDs only tested, want all but the table's hard load (%d slots)", only, flat.own.plan.Stages[0].slots())
				}
			} else if got < 10*int(p*64*n) {
				t.Errorf("without growth at 64x: %d false positives, expected far more than %g", got, p*64*n)
			}
		})
	}
}

// Across stage switches, a replay with other batch boundaries gets the
// first decisions, and six replicas racing over the same IDs decide each
// first seen once.
func TestGrowthReplaysAndRaces(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	at := testenv.Now()
	const n = 1000
	f := growingFilter(t, c, at, n, 1e-6, 64)
	// 30,000 elements with repeats, over stages 0 to 2.
	es := stream(30_000, 4, 3, at)
	var first []Verdict
	for lo := 0; lo < len(es); lo += 700 {
		if _, err := f.Grow(t.Context(), at); err != nil {
			t.Fatal(err)
		}
		first = append(first, verdicts(t, f, es[lo:min(lo+700, len(es))]...)...)
	}
	// Batches of 700 outrun the maintenance of a 1,000-ID stage: they
	// wait for their stages, and the switches are what is tested.
	if g, err := f.growth(t.Context(), f.own, 0, f.cfg.Window.Bucket(at)); err != nil || g.Stage < 2 {
		t.Fatalf("growth %+v (error %v): want stage 2 or later reached", g, err)
	}
	replay := runBatches(t, f, es, 333)
	for i := range es {
		if replay[i] != replayOf(first[i]) {
			t.Fatalf("element %d: replayed %v, first %v", i, replay[i], first[i])
		}
	}

	// Six replicas, each with its own partition of the same IDs, across
	// the switch from a stage of 4,000 to the next.
	g := growingFilter(t, c, at, 4*n, 1e-6, 64, func(cfg *Config) { cfg.Pipeline = "race" })
	ids := 12_000
	var wg sync.WaitGroup
	firsts := make([][]string, 6)
	for r := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lo := 0; lo < ids; lo += 50 {
				if _, err := g.Grow(context.Background(), at); err != nil {
					t.Error(err)
					return
				}
				var es []Element
				for i := lo; i < lo+50; i++ {
					es = append(es, Element{ID: fmt.Appendf(nil, "id-%d", (i*7+r*1000)%ids), Time: at, Source: Source{Topic: "race", Partition: int32(r), Offset: int64(i)}})
				}
				v, err := g.TestAndSet(context.Background(), es)
				if err != nil {
					t.Error(err)
					return
				}
				for k, x := range v {
					if x == FirstSeen {
						firsts[r] = append(firsts[r], string(es[k].ID))
					}
				}
			}
		}()
	}
	wg.Wait()
	seen := map[string]int{}
	for _, fs := range firsts {
		for _, id := range fs {
			seen[id]++
		}
	}
	if len(seen) < ids-5 { // at 1e-6, a false positive among 12,000 is unlikely
		t.Errorf("%d of %d IDs first seen", len(seen), ids)
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s first seen %d times", id, k)
		}
	}
	assertStage(t, g, at, 1, 0)
	assertAllKeysExpire(t, c)
}

// Past its last stage a window only tests: new IDs are not inserted,
// counted as test-only, and no further key is made; racing makers of a
// stage make it once.
func TestGrowthCap(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	at := testenv.Now()
	const n = 1000
	f := growingFilter(t, c, at, n, 1e-3, 4) // stages of 1,000 and 4,000
	if len(f.own.plan.Stages) != 2 {
		t.Fatalf("%d stages for a growth of 4, want 2", len(f.own.plan.Stages))
	}
	// Racing makers: stage 1 once stage 0 is full.
	fillStage0(t, f, at, "a")
	var wg sync.WaitGroup
	var mu sync.Mutex
	made := 0
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := f.Grow(context.Background(), at)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			made += len(m)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if made != f.own.plan.Shards {
		t.Fatalf("stage 1 made %d times by six racing makers, want once per shard (%d)", made, f.own.plan.Shards)
	}
	fp := fillTo(t, f, at, "a", 1100, 10_000)
	b := f.cfg.Window.Bucket(at)
	var testOnly int64
	for s := 0; s < f.own.plan.Shards; s++ {
		g, err := f.growth(t.Context(), f.own, s, b)
		if err != nil {
			t.Fatal(err)
		}
		if g.Stage != 1 || g.Held < f.own.plan.Stages[1].CapacityPerShard {
			t.Errorf("shard %d: %+v, want stage 1 full", s, g)
		}
		testOnly += g.TestOnly
	}
	// 10,000 IDs, at most 4,000 held: the rest tested only.
	if testOnly < 4000 {
		t.Errorf("%d new IDs test-only, want about 6,000", testOnly)
	}
	if mu := 1e-3 * 10_000; float64(fp) > mu+4*math.Sqrt(mu)+1 {
		t.Errorf("%d false positives at the cap, above the bound for %g", fp, mu)
	}
	for s := 0; s < f.own.plan.Shards; s++ {
		if n, _ := c.Exists(t.Context(), f.own.stageKey(s, b, 2)).Result(); n != 0 {
			t.Errorf("a stage 2 key exists past the cap")
		}
	}
	assertAllKeysExpire(t, c)
}

// Without the maintenance, a batch that needs the next stage is refused
// before anything is decided, makes the stage itself, waits for it and is
// decided into it: nothing overfilled, nothing test-only, every new ID
// inserted (its copy is a duplicate), and the wait counted.
func TestGrowthWithoutMaintenanceWaits(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	at := testenv.Now()
	f := growingFilter(t, c, at, 1000, 1e-3, 64)
	var es []Element
	for i := range 5000 {
		es = append(es, Element{ID: fmt.Appendf(nil, "o-%d", i), Time: at, Source: Source{Topic: "o", Offset: int64(i)}})
	}
	first := runBatches(t, f, es, 500)
	b := f.cfg.Window.Bucket(at)
	g, err := f.growth(t.Context(), f.own, 0, b)
	if err != nil {
		t.Fatal(err)
	}
	// Stages 0 and 1 hold 1,000 and 3,000; the rest is in stage 2.
	if g.Stage != 2 || g.Overfilled != 0 || g.TestOnly != 0 || g.Inserted < 4990 {
		t.Errorf("%+v: want stage 2 in use, all 5,000 inserted (less a few false positives), none overfilled or test-only", g)
	}
	w := f.GrowthStats()
	if w.Refused < 2 || w.Waits < 2 || w.Failed != 0 || w.Longest <= 0 {
		t.Errorf("%+v: want at least two refusals and waits (stages 1 and 2), none failed", w)
	}
	t.Logf("without the maintenance: %+v", w)
	// Copies of every ID decided first seen are duplicates.
	var copies []Element
	for i, v := range first {
		if v == FirstSeen {
			copies = append(copies, Element{ID: es[i].ID, Time: at, Source: Source{Topic: "copies", Offset: int64(len(copies))}})
		}
	}
	if len(copies) < 4990 {
		t.Fatalf("%d of 5,000 new IDs first seen", len(copies))
	}
	for i, v := range runBatches(t, f, copies, 500) {
		if v != Duplicate {
			t.Errorf("copy of %s: %v, want duplicate", copies[i].ID, v)
		}
	}
}

// A window filling fast gets its next stage before it needs it: once the
// room left in the newest stage is at most the measured rate times the
// next stage's lead, the call asks for it (GrowthWanted and the growth
// record), Grow makes it, and the batch that fills the stage is not
// refused. The rate is the script's own, sampled at most every 250 ms
// by the server's clock: the test fills until a rate is measured.
func TestGrowthAheadOfNeed(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	at := testenv.Now()
	const n = 50_000
	f := growingFilter(t, c, at, n, 1e-6, 64)
	if f.own.plan.Shards != 1 {
		t.Fatalf("%d shards, want 1", f.own.plan.Shards)
	}
	b := f.cfg.Window.Bucket(at)
	// Batches until the record holds a measured rate.
	next := 0
	var g Growth
	if !testenv.Until(time.Minute, func() bool {
		verdicts(t, f, batchOf("ahead", next, next+100, at)...)
		next += 100
		var err error
		if g, err = f.growth(t.Context(), f.own, 0, b); err != nil {
			t.Fatal(err)
		}
		return g.Rate > 0 || next >= n/2
	}) || g.Rate == 0 {
		t.Fatalf("no rate measured after %d IDs: %+v", next, g)
	}
	select {
	case <-f.GrowthWanted():
		t.Fatalf("stage 1 asked for at %d of %d IDs, rate %.0f/s", next, n, g.Rate)
	default:
	}
	// The room a measured rate calls for, and then some: the trigger
	// fires without waiting for the stage to fill.
	lead := StageLead(f.own.plan.Stages[1])
	due := n - int(math.Ceil(g.Rate*lead.Seconds()))
	if due <= next {
		t.Fatalf("rate %.0f/s: stage 1 due at once (%d IDs in), nothing left to show", g.Rate, next)
	}
	var asked bool
	for next < n && !asked {
		verdicts(t, f, batchOf("ahead", next, next+100, at)...)
		next += 100
		select {
		case <-f.GrowthWanted():
			asked = true
		default:
		}
	}
	if !asked {
		t.Fatal("stage 1 never asked for")
	}
	g, _ = f.growth(t.Context(), f.own, 0, b)
	if g.Held >= f.own.plan.Stages[0].CapacityPerShard || g.Wanted != 1 {
		t.Fatalf("asked at %+v: want stage 1 asked for while stage 0 has room", g)
	}
	t.Logf("stage 1 asked for with %d IDs of room at %.0f IDs/s (lead %v)", f.own.plan.Stages[0].CapacityPerShard-g.Held, g.Rate, lead)
	if made, err := f.Grow(t.Context(), at); err != nil || len(made) != 1 {
		t.Fatalf("made %v, error %v: want stage 1", made, err)
	}
	fillTo(t, f, at, "ahead", next, n+1000)
	if w := f.GrowthStats(); w.Refused != 0 || w.Waits != 0 {
		t.Errorf("%+v: a batch waited for a stage made ahead", w)
	}
	assertStage(t, f, at, 1, 0)
}

// Replicas that need the same stage at once all wait for it, one makes
// it, and nobody inserts into a stage that is being made: every ID is
// first seen once, and every copy afterwards is a duplicate. The stage's
// lock is held (as by a maker on another replica) until every replica has
// been refused, so that all of them wait.
func TestGrowthReplicasWaitForOneStage(t *testing.T) {
	srv := testenv.Redis(t)
	c := testenv.RedisClient(t, srv)
	at := testenv.Now()
	const n, replicas, batch = 1000, 4, 400
	var fs []*Filter
	for range replicas {
		// One client each, as replicas have.
		fs = append(fs, growingFilter(t, testenv.RedisClient(t, srv), at, n, 1e-6, 64, func(cfg *Config) { cfg.Pipeline = "wait" }))
	}
	// Stage 0 full to the last ID, in one call: over several, a rate
	// measured could have stage 1 asked for, and made, ahead.
	verdicts(t, fs[0], batchOf("pre", 0, n, at)...)
	lock := fs[0].own.stageKey(0, fs[0].cfg.Window.Bucket(at), 1) + ":making"
	if err := c.Set(t.Context(), lock, 1, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	// Each replica's batch needs stage 1; some of the IDs are shared.
	firsts := make([][]string, replicas)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for r, f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var es []Element
			for i := range batch {
				es = append(es, Element{ID: fmt.Appendf(nil, "spike-%d", (i*7+r*batch/2)%(replicas*batch/2)), Time: at,
					Source: Source{Topic: "spike", Partition: int32(r), Offset: int64(i)}})
			}
			<-start
			v, err := f.TestAndSet(context.Background(), es)
			if err != nil {
				t.Error(err)
				return
			}
			for k, x := range v {
				if x == FirstSeen {
					firsts[r] = append(firsts[r], string(es[k].ID))
				}
			}
		}()
	}
	close(start)
	testenv.Eventually(t, 30*time.Second, "every replica refused for stage 1", func() bool {
		for _, f := range fs {
			if f.GrowthStats().Refused == 0 {
				return false
			}
		}
		return true
	})
	if err := c.Del(t.Context(), lock).Err(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var made, waits, refused int64
	var longest time.Duration
	for _, f := range fs {
		w := f.GrowthStats()
		made += w.Made
		waits += w.Waits
		refused += w.Refused
		longest = max(longest, w.Longest)
		if w.Failed != 0 {
			t.Errorf("a replica's wait failed: %+v", w)
		}
	}
	if made != 1 || waits != replicas {
		t.Errorf("stage 1 made %d times, %d waits: want made once, and waited for by each of %d replicas", made, waits, replicas)
	}
	t.Logf("%d replicas: stage made %d time(s), %d waits (longest %v), %d refusals", replicas, made, waits, longest, refused)
	seen := map[string]int{}
	for _, ids := range firsts {
		for _, id := range ids {
			seen[id]++
		}
	}
	if len(seen) != replicas*batch/2 {
		t.Errorf("%d IDs first seen, want %d", len(seen), replicas*batch/2)
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s first seen %d times", id, k)
		}
	}
	var copies []Element
	for id := range seen {
		copies = append(copies, Element{ID: []byte(id), Time: at, Source: Source{Topic: "copies", Offset: int64(len(copies))}})
	}
	for i, v := range verdicts(t, fs[0], copies...) {
		if v != Duplicate {
			t.Errorf("copy of %s: %v, want duplicate", copies[i].ID, v)
		}
	}
	assertStage(t, fs[0], at, 1, 0)
	assertAllKeysExpire(t, c)
}

// A stage in several keys may be made by several replicas at once, a part
// each, every one of them finding another's lock on some part: it counts
// as made by the replica that made its part 0, once, so the replicas'
// counts add up to the stages made (a count taken only by a maker that
// met no lock missed the stages whose every maker met one).
func TestStageInPartsCountedOnce(t *testing.T) {
	srv := testenv.Redis(t)
	at := testenv.Now()
	const replicas, parts = 4, 5
	var fs []*Filter
	for range replicas {
		fs = append(fs, growingFilter(t, testenv.RedisClient(t, srv), at, 1000, 1e-6, 64, func(cfg *Config) {
			cfg.Pipeline, cfg.Plan = "parts", inParts(cfg.Plan, parts)
		}))
	}
	c := testenv.RedisClient(t, srv)
	b0 := fs[0].cfg.Window.Bucket(at)
	var busy int
	// Every stage after the first, of two windows.
	var refs []stageRef
	for st := 1; st < len(fs[0].own.plan.Stages); st++ {
		refs = append(refs, stageRef{bucket: b0, stage: st}, stageRef{bucket: b0 + 1, stage: st})
	}
	for _, r := range refs {
		res := make([]makeResult, replicas)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j, f := range fs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var err error
				if res[j], err = f.makeStage(context.Background(), r, byBatch); err != nil {
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
		for _, x := range res {
			if x == stageBusy {
				busy++
			}
		}
		for pt := range parts {
			if n, err := c.Exists(t.Context(), fs[0].own.partKey(0, r.bucket, r.stage, pt)).Result(); err != nil || n != 1 {
				t.Fatalf("%+v: part %d exists %d (%v) after every maker returned", r, pt, n, err)
			}
		}
	}
	made := 0
	for _, f := range fs {
		made += int(f.GrowthStats().Made)
	}
	stages := len(refs)
	if stages == 0 || made != stages {
		t.Errorf("%d stages made by %d replicas together, counted %d times", stages, replicas, made)
	}
	t.Logf("%d stages of %d parts made by %d replicas at once: counted %d times, %d makers met another's lock", stages, parts, replicas, made, busy)
}

// A wait for a stage is bounded: while another maker holds the stage's
// lock past Config.GrowthWait, the call fails with ErrGrowthWait, counted
// as a failed wait, and decides nothing: made again, the IDs are first
// seen, not replays. Out of memory the call fails at once with the
// server's error (the script is refused before it runs, as is the SET of
// a stage), and it succeeds once memory is freed.
func TestGrowthWaitRunsOut(t *testing.T) {
	srv := testenv.Redis(t, "--maxmemory-policy", "noeviction")
	c := testenv.RedisClient(t, srv)
	at := testenv.Now()
	f := growingFilter(t, c, at, 1000, 1e-3, 64, func(cfg *Config) { cfg.GrowthWait = 300 * time.Millisecond })
	next := fillStage0(t, f, at, "w")
	b := f.cfg.Window.Bucket(at)
	lock := f.own.stageKey(0, b, 1) + ":making"
	if err := c.Set(t.Context(), lock, 1, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	es := batchOf("w", next, next+100, at)
	start := time.Now()
	if _, err := f.TestAndSet(t.Context(), es); !errors.Is(err, ErrGrowthWait) {
		t.Fatalf("stage locked by another maker: %v, want ErrGrowthWait", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("gave up after %v, before the 300ms bound", d)
	}
	if w := f.GrowthStats(); w.Failed != 1 || w.Made != 0 {
		t.Errorf("%+v: want one failed wait, nothing made", w)
	}

	// Out of memory.
	if err := c.Del(t.Context(), lock).Err(); err != nil {
		t.Fatal(err)
	}
	used := testenv.InfoInt(t, c, "memory", "used_memory")
	configSet(t, c, "maxmemory", fmt.Sprint(used/2))
	if _, err := f.TestAndSet(t.Context(), es); !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("out of memory: %v, want ErrRedis naming OOM", err)
	}
	configSet(t, c, "maxmemory", "0")
	for i, v := range verdicts(t, f, es...) {
		if v != FirstSeen {
			t.Fatalf("%s after the failed waits: %v, want first seen (nothing was decided before)", es[i].ID, v)
		}
	}
	if g, _ := f.growth(t.Context(), f.own, 0, b); g.Stage != 1 || g.Held != 100 {
		t.Errorf("%+v: want the 100 IDs in stage 1", g)
	}
}

// The capacity check says when a window cannot grow to its cap within
// maxmemory, apart from a plan that does not fit at all.
func TestCheckCapacityCountsGrowth(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	f := growingFilter(t, c, testenv.Now(), 100_000, 1e-6, 64)
	base := f.own.plan.Memory * uint64(f.LiveWindows())
	grown, _ := f.own.plan.GrownMemory(64)
	configSet(t, c, "maxmemory", fmt.Sprint(base+(grown-f.own.plan.Memory)/2))
	if err := f.CheckCapacity(t.Context()); !errors.Is(err, ErrGrowthMemory) {
		t.Errorf("room for half the growth: %v", err)
	}
	configSet(t, c, "maxmemory", fmt.Sprint(base+grown))
	if err := f.CheckCapacity(t.Context()); err != nil {
		t.Errorf("room for the growth: %v", err)
	}
}

// inParts splits every stage after the first of plan into k keys per
// shard (k or a little more words in all), as the planner does for stages
// larger than one key: tests see parts without filling gigabytes.
func inParts(plan Plan, k int) Plan {
	plan.Stages = slices.Clone(plan.Stages)
	for i := 1; i < len(plan.Stages); i++ {
		st := &plan.Stages[i]
		if plan.Kind == KindFingerprint {
			per := (st.slots() + uint64(k) - 1) / uint64(k)
			st.Parts, st.PartSlots, st.PartBits = k, per, per*uint64(st.Bytes)*8
			st.ShardBits = st.PartBits * uint64(k)
			continue
		}
		per := (st.ShardBits/WordBits + uint64(k) - 1) / uint64(k)
		st.Parts, st.PartBits, st.ShardBits = k, per*WordBits, per*WordBits*uint64(k)
	}
	return plan
}

// The script places words in stages 1 and up where stageWord says, the
// mapping Go's own readers use: an ID inserted in stage 1 has its bits
// there, in one key or in the part of a stage in several that holds each
// word.
func TestStageWordsMatchTheScript(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	at := testenv.Now()
	for _, parts := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d parts", parts), func(t *testing.T) {
			f := growingFilter(t, c, at, 100, 1e-3, 4, func(cfg *Config) {
				cfg.Pipeline, cfg.Plan = fmt.Sprintf("words-%d", parts), inParts(cfg.Plan, parts)
			})
			fillTo(t, f, at, "s", 0, 100) // stage 0 full: stage 1 asked for
			if made, err := f.Grow(t.Context(), at); err != nil || len(made) != 1 {
				t.Fatalf("made %v, error %v: want stage 1", made, err)
			}
			b := f.cfg.Window.Bucket(at)
			for pt := range parts {
				if n, err := c.Exists(t.Context(), f.own.partKey(0, b, 1, pt)).Result(); err != nil || n != 1 {
					t.Fatalf("part %d of stage 1: exists %d, %v", pt, n, err)
				}
			}
			ids := []string{"in-stage-1", "another", "a third", "a fourth", "a fifth"}
			for i, id := range ids {
				if v := verdicts(t, f, Element{ID: []byte(id), Time: at, Source: Source{Topic: "w", Offset: int64(i)}}); v[0] != FirstSeen {
					t.Fatalf("%s: %v", id, v)
				}
			}
			if g, _ := f.growth(t.Context(), f.own, 0, b); g.Stage != 1 || g.Held != int64(len(ids)) {
				t.Fatalf("growth %+v: want the IDs in stage 1", g)
			}
			usedParts := map[int]bool{}
			for _, id := range ids {
				var loc location
				f.own.locate([]byte(id), &loc)
				if f.own.plan.Kind == KindFingerprint {
					st := f.own.plan.Stages[1]
					pt, off := homeSlot(loc.u[0], st)
					usedParts[pt] = true
					run, err := c.GetRange(t.Context(), f.own.partKey(loc.shard, b, 1, pt), int64(off), int64(off)+fpProbeLimit*int64(st.Bytes)-1).Bytes()
					if err != nil {
						t.Fatal(err)
					}
					if !runHolds(run, fingerprint(loc.fp, st.Bytes)) {
						t.Errorf("%s: its fingerprint is not in the run from its home at %d of part %d in stage 1", id, off, pt)
					}
					continue
				}
				for j := 0; j < f.own.plan.Layout.Words; j++ {
					pt, off := stageWord(loc.u[j], f.own.plan.Stages[1])
					usedParts[pt] = true
					v, err := c.BitField(t.Context(), f.own.partKey(loc.shard, b, 1, pt), "GET", "u52", off).Result()
					if err != nil {
						t.Fatal(err)
					}
					mask := uint64(loc.hi[j])<<26 | uint64(loc.lo[j])
					if uint64(v[0])&mask != mask {
						t.Errorf("%s, word %d at %d of part %d in stage 1: %052b lacks %052b", id, j, off, pt, v[0], mask)
					}
				}
			}
			if len(usedParts) != parts && f.own.plan.Kind == KindBloom {
				t.Errorf("the IDs' words are in parts %v, want every one of %d", usedParts, parts)
			}
			if len(usedParts) == 0 {
				t.Errorf("the IDs are in no part")
			}
		})
	}
}

// In rolling mode the neighbours' stages are tested too: copies in the
// next bucket of IDs that went into stages 1 and 2 of a bucket are
// caught, live (testing the previous bucket) and, read late, the other way
// round (testing the next bucket). Stages in several keys (parts) are
// tested and filled alike.
func TestGrowthNeighboursStages(t *testing.T) {
	for _, parts := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d parts", parts), func(t *testing.T) { testGrowthNeighboursStages(t, parts) })
	}
}

func testGrowthNeighboursStages(t *testing.T, parts int) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	const w = 10 * time.Minute
	cur := testenv.Now().Truncate(w)
	b0, b1 := cur.Add(-2*w+time.Minute), cur.Add(-w+time.Minute)
	clock := cur.Add(time.Second) // b0 and b1 have ended: late input
	f := growingFilter(t, c, clock, 500, 1e-6, 64, func(cfg *Config) {
		cfg.Pipeline, cfg.Plan, cfg.Now = fmt.Sprintf("one-way-%d", parts), inParts(cfg.Plan, parts), func() time.Time { return clock }
	})
	// 10,000 IDs in b0: stages 0 (500), 1 (1,500), 2 (6,000) and 3.
	fillTo(t, f, b0, "n", 0, 10_000)
	if g, _ := f.growth(t.Context(), f.own, 0, f.cfg.Window.Bucket(b0)); g.Stage < 2 {
		t.Fatalf("b0 grew to %+v, want stage 2 or later", g)
	}
	// Copies in b1 of IDs from every stage: b1 tests b0 as its previous.
	var es []Element
	for i := 0; i < 10_000; i += 97 {
		es = append(es, Element{ID: fmt.Appendf(nil, "n-%d", i), Time: b1, Source: Source{Topic: "copies", Offset: int64(len(es))}})
	}
	for i, v := range verdicts(t, f, es...) {
		if v != Duplicate {
			t.Errorf("%s in the next bucket: %v, want duplicate", es[i].ID, v)
		}
	}
	// The other way: 8,000 IDs first in b1 (which grows), then copies
	// stamped in b0, read late: b0 tests b1 as its next bucket.
	g := growingFilter(t, c, clock, 500, 1e-6, 64, func(cfg *Config) {
		cfg.Pipeline, cfg.Plan, cfg.Now = fmt.Sprintf("other-way-%d", parts), inParts(cfg.Plan, parts), func() time.Time { return clock }
	})
	fillTo(t, g, b1, "m", 0, 8000)
	es = es[:0]
	for i := 0; i < 8000; i += 89 {
		es = append(es, Element{ID: fmt.Appendf(nil, "m-%d", i), Time: b0, Source: Source{Topic: "copies", Offset: int64(len(es))}})
	}
	for i, v := range verdicts(t, g, es...) {
		if v != Duplicate {
			t.Errorf("%s in the previous bucket, read late: %v, want duplicate", es[i].ID, v)
		}
	}
	assertAllKeysExpire(t, c)
}

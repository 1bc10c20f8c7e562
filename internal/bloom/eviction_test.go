package bloom

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"dedupe-worker/internal/testenv"
)

// A policy changed while the worker runs: the next maintenance pass finds
// it, the filter is unhealthy (logged once at error level with the server
// and the policy, counted, the gauge at 0) until a pass finds noeviction
// again (logged once). Keys evicted meanwhile show in the gauge as INFO
// counts them.
func TestMaintainWatchesEvictionPolicy(t *testing.T) {
	srv := testenv.Redis(t)
	c := testenv.RedisClient(t, srv)
	clock := testenv.Now()
	f := newClockFilter(t, c, &clock, Window{Length: 10 * time.Minute, MaxLag: time.Hour})
	reg := prometheus.NewRegistry()
	g := NewGauges(reg, "test")
	core, logs := observer.New(zapcore.InfoLevel)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.maintain(ctx, g, zap.New(core), time.Hour, 20*time.Millisecond)
	}()
	defer func() { cancel(); <-done }()
	const limit = 10 * time.Second
	safe := func() (float64, bool) {
		return metricValue(t, reg, "dedupe_redis_eviction_policy_safe", "server", srv.Addr)
	}
	// passes counts maintenance passes by the EXPIREAT calls they make:
	// one per shard, keeping its marker alive (lost.go); no batch runs.
	passes := func() int64 { return testenv.CommandStat(t, c, "expireat", "calls") / int64(f.Plan().Shards) }
	// policyErrors are the error entries about eviction policies (keys
	// evicted are also reported lost, at error level).
	policyErrors := func() []observer.LoggedEntry {
		return logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("eviction policy").All()
	}

	testenv.Eventually(t, limit, "the first pass: the policy gauge at 1", func() bool { v, ok := safe(); return ok && v == 1 })
	if !f.Healthy() {
		t.Fatal("unhealthy at noeviction")
	}
	if v, ok := metricValue(t, reg, "dedupe_redis_evicted_keys", "server", srv.Addr); !ok || v != 0 {
		t.Fatalf("evicted keys: %g (series %v), want 0", v, ok)
	}

	configSet(t, c, "maxmemory-policy", "volatile-lru")
	testenv.Eventually(t, limit, "unhealthy under volatile-lru", func() bool { return !f.Healthy() })
	// Later passes find it still: it stays unhealthy, logged and counted
	// once.
	from := passes()
	testenv.Eventually(t, limit, "three more passes", func() bool { return passes() >= from+3 })
	if f.Healthy() {
		t.Fatal("healthy again while the policy is volatile-lru")
	}
	if v, _ := safe(); v != 0 {
		t.Errorf("policy gauge %g under volatile-lru, want 0", v)
	}
	if n, _ := metricValue(t, reg, "dedupe_redis_eviction_policy_unsafe_total", "", ""); n != 1 {
		t.Errorf("unsafe policies counted %g times, want 1", n)
	}
	errs := policyErrors()
	if len(errs) != 1 {
		t.Fatalf("%d error entries, want 1: %v", len(errs), errs)
	}
	if fs := errs[0].ContextMap(); fs["server"] != srv.Addr || fs["policy"] != "volatile-lru" {
		t.Errorf("error entry %q with %v: want the server and the policy", errs[0].Message, fs)
	}

	// Under an evicting policy at its limit Redis evicts: the gauge shows
	// what INFO counts.
	configSet(t, c, "maxmemory-policy", "allkeys-random")
	used := testenv.InfoInt(t, c, "memory", "used_memory")
	configSet(t, c, "maxmemory", strconv.FormatInt(used+200_000, 10))
	for i := range 100 {
		if err := c.Set(t.Context(), fmt.Sprintf("junk:%d", i), strings.Repeat("x", 10_000), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	configSet(t, c, "maxmemory", "0") // no more evictions from here on
	evicted := testenv.InfoInt(t, c, "stats", "evicted_keys")
	if evicted == 0 {
		t.Fatal("nothing evicted: the test did not fill Redis")
	}
	testenv.Eventually(t, limit, fmt.Sprintf("the evicted keys gauge at %d", evicted), func() bool {
		v, _ := metricValue(t, reg, "dedupe_redis_evicted_keys", "server", srv.Addr)
		return v == float64(evicted)
	})
	// Another policy that evicts: logged and counted again.
	if n, _ := metricValue(t, reg, "dedupe_redis_eviction_policy_unsafe_total", "", ""); n != 2 {
		t.Errorf("after a second evicting policy, counted %g times, want 2", n)
	}

	configSet(t, c, "maxmemory-policy", "noeviction")
	testenv.Eventually(t, limit, "healthy at noeviction", f.Healthy)
	if v, _ := safe(); v != 1 {
		t.Errorf("policy gauge %g at noeviction, want 1", v)
	}
	cleared := logs.FilterLevelExact(zapcore.InfoLevel).FilterMessageSnippet("noeviction again").All()
	if len(cleared) != 1 || cleared[0].ContextMap()["server"] != srv.Addr {
		t.Errorf("cleared: %v; want one entry naming the server", cleared)
	}
	if n := len(policyErrors()); n != 2 {
		t.Errorf("%d error entries for two evicting policies, want 2", n)
	}
}

// Over maxmemory under noeviction, a test-and-set is refused before it
// runs (the script declares no allow-oom flag, so Redis 7 rejects it as a
// whole), and so is preallocation: nothing of either is written. Once
// memory is freed, the same batch is decided as if the refusal had not
// happened.
func TestOutOfMemoryRefusedWhole(t *testing.T) {
	srv := testenv.Redis(t, "--maxmemory-policy", "noeviction", "--maxmemory", "4mb")
	c := testenv.RedisClient(t, srv)
	now := testenv.Now()
	f := newFilter(t, c, now, 10_000, 1e-6, nil)
	ctx := t.Context()
	if err := f.Preallocate(ctx, now); err != nil {
		t.Fatal(err)
	}
	var first, second []Element
	for i := range 200 {
		first = append(first, el(fmt.Sprintf("a%d", i%150), 0, int64(i), now))
	}
	// New IDs, copies of the first batch, and replays of its offsets.
	for i := range 200 {
		second = append(second, el(fmt.Sprintf("b%d", i), 1, int64(i), now))
	}
	for i := range 50 {
		second = append(second, el(fmt.Sprintf("a%d", i), 1, int64(200+i), now))
	}
	second = append(second, first[:50]...)
	verdicts(t, f, first...)

	snapshot := func() map[string]string {
		keys, err := c.Keys(ctx, "dedupe:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, k := range keys {
			v, err := c.Dump(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			exp, err := c.ExpireTime(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			out[k] = fmt.Sprint(exp) + v
		}
		return out
	}
	before := snapshot()
	if len(before) == 0 {
		t.Fatal("no keys after the first batch")
	}

	testenv.FillRedis(t, c)
	rejected := func() int64 {
		return testenv.CommandStat(t, c, "evalsha", "rejected_calls") + testenv.CommandStat(t, c, "eval", "rejected_calls")
	}
	ran := func() int64 {
		return testenv.CommandStat(t, c, "evalsha", "calls") + testenv.CommandStat(t, c, "eval", "calls")
	}
	rejectedBefore, ranBefore := rejected(), ran()
	for range 3 {
		v, err := f.TestAndSet(ctx, second)
		if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "OOM") || v != nil {
			t.Fatalf("over maxmemory: %v, %v; want an OOM error inside ErrRedis", v, err)
		}
	}
	if err := f.Preallocate(ctx, now.Add(f.Window().Length)); !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("preallocating over maxmemory: %v", err)
	}
	if r, n := rejected()-rejectedBefore, ran()-ranBefore; r < 3 || n != 0 {
		t.Errorf("over maxmemory: %d script calls rejected, %d run; want 3 or more rejected before running, none run", r, n)
	}
	if after := snapshot(); !maps.Equal(before, after) {
		t.Fatalf("keys changed while over maxmemory: %d before, %d after", len(before), len(after))
	}

	if err := c.Del(ctx, junkKeys(t, c)...).Err(); err != nil {
		t.Fatal(err)
	}
	got := verdicts(t, f, second...)
	for i, v := range got {
		want := FirstSeen
		switch {
		case i >= 250:
			want = ReplayedFirstSeen
		case i >= 200:
			want = Duplicate
		}
		if v != want {
			t.Fatalf("element %d (%s): %v after the refusals, want %v", i, second[i].ID, v, want)
		}
	}
}

// junkKeys are the keys fillRedis wrote.
func junkKeys(t testing.TB, c *redis.Client) []string {
	t.Helper()
	keys, err := c.Keys(t.Context(), "junk:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("junk keys: %v, %v", keys, err)
	}
	return keys
}

// Over maxmemory under noeviction the maintenance's writes fail too: a
// stage for a window past its capacity, and the next window's keys. Each
// failure is logged, counted by step and tried again at the next pass,
// the loop goes on, and nothing is left behind (no stage, no lock); once
// memory is freed both are made.
func TestMaintenanceRetriesOutOfMemory(t *testing.T) {
	srv := testenv.Redis(t, "--maxmemory-policy", "noeviction", "--maxmemory", "6mb")
	c := testenv.RedisClient(t, srv)
	// The clock is in the last seconds of its 10-minute bucket, so that the
	// next bucket starts within the preallocation lead and the maintenance
	// makes it; a few minutes ahead of Redis's clock at most, which the
	// keys' expiries (a window and more after the bucket ends) allow.
	const length = 10 * time.Minute
	now := testenv.Now().Truncate(length).Add(length - 5*time.Second)
	f := growingFilter(t, c, now, 1000, 1e-6, 4)
	if f.Window().Length != length {
		t.Fatalf("the filter's window is %v, want %v", f.Window().Length, length)
	}
	if ahead := f.Window().Start(f.Window().Bucket(now) + 1).Sub(now); ahead > f.PreallocateLead() {
		t.Fatalf("the next bucket starts %v after the clock, beyond the lead %v", ahead, f.PreallocateLead())
	}
	if err := f.Preallocate(t.Context(), now); err != nil {
		t.Fatal(err)
	}
	// The first stage filled to its capacity: the call asks for the next
	// stage, and no one makes it yet (a call past it would make it).
	for lo := 0; lo < 1000; lo += 100 {
		var es []Element
		for i := lo; i < lo+100; i++ {
			es = append(es, Element{ID: fmt.Appendf(nil, "g-%d", i), Time: now, Source: Source{Topic: "g", Offset: int64(i)}})
		}
		verdicts(t, f, es...)
	}
	select {
	case <-f.GrowthWanted():
	default:
		t.Fatal("1,000 IDs in a window planned for 1,000 and no stage asked for")
	}
	b := f.Window().Bucket(now)
	stageKeys := func() (n int64) {
		for s := range f.Plan().Shards {
			k := f.own.stageKey(s, b, 1)
			m, err := c.Exists(t.Context(), k, k+":making").Result()
			if err != nil {
				t.Fatal(err)
			}
			n += m
		}
		return n
	}
	next := f.own.filterKey(0, f.Window().Bucket(now.Add(f.Window().Length)))

	testenv.FillRedis(t, c)
	reg := prometheus.NewRegistry()
	g := NewGauges(reg, "test")
	core, logs := observer.New(zapcore.WarnLevel)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.maintain(ctx, g, zap.New(core), 20*time.Millisecond, 20*time.Millisecond)
	}()
	defer func() { cancel(); <-done }()
	failed := func(step string) float64 {
		v, _ := metricValue(t, reg, "dedupe_filter_maintenance_errors_total", "step", step)
		return v
	}
	const limit = 10 * time.Second
	testenv.Eventually(t, limit, "growing and preallocating each failed and were tried again", func() bool {
		return failed(stepGrow) >= 2 && failed(stepPreallocate) >= 2
	})
	if n := stageKeys(); n != 0 {
		t.Fatalf("%d stage or lock keys written over maxmemory", n)
	}
	if n, _ := c.Exists(t.Context(), next).Result(); n != 0 {
		t.Fatal("the next window preallocated over maxmemory")
	}
	oom := logs.FilterMessageSnippet("trying again").FilterFieldKey("error").All()
	if len(oom) == 0 || !strings.Contains(fmt.Sprint(oom[0].ContextMap()["error"]), "OOM") {
		t.Fatalf("no warning naming OOM: %v", oom)
	}

	if err := c.Del(t.Context(), junkKeys(t, c)...).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, limit, "the stage made and the next window preallocated", func() bool {
		n, _ := c.Exists(t.Context(), next).Result()
		made, _ := metricValue(t, reg, "dedupe_filter_stages_made_total", "", "")
		return made >= 1 && n == 1
	})
	if !f.Healthy() {
		t.Error("unhealthy: running out of memory under noeviction is no eviction")
	}
}

// metricValue is the value of the series of family name whose label l is
// v (any series when l is empty), and whether there is one.
func metricValue(t testing.TB, reg *prometheus.Registry, name, l, v string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if l == "" || lp.GetName() == l && lp.GetValue() == v {
					if m.Counter != nil {
						return m.Counter.GetValue(), true
					}
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

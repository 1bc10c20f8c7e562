package bloom

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"dedupe-worker/internal/testenv"
)

// slowClient is a client of srv through a link that forwards mibPerSecond
// MiB/s towards it: a window's SET takes seconds while small calls answer
// at once.
func slowClient(t *testing.T, addr string, mibPerSecond int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testenv.SlowLink(t, addr, mibPerSecond<<20), ContextTimeoutEnabled: true,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// assertWindowMade fails unless every shard's stage 0 key of bucket b
// exists at its full size with the bucket's expiry.
func assertWindowMade(t *testing.T, c *redis.Client, f *Filter, b int64) {
	t.Helper()
	st0 := f.own.plan.Stages[0]
	for s := range f.own.plan.Shards {
		for pt := range st0.Parts {
			key := f.own.partKey(s, b, 0, pt)
			n, err := c.StrLen(t.Context(), key).Result()
			if err != nil || uint64(n) != st0.partBytes() {
				t.Errorf("%s: %d bytes (%v), want %d", key, n, err, st0.partBytes())
				continue
			}
			assertExpireTime(t, c, key, f.cfg.Window.ExpireAt(b))
		}
	}
}

// A server that reads a window's value slowly (16 MiB at 16 MiB/s, a
// second, past the call time-out of 300 ms): preallocation is bounded by
// the make time-out its lead budgets (the call time-out plus 100 ms per
// MiB), not by the call time-out, and makes the window.
func TestPreallocateBoundedByTheMakeTimeout(t *testing.T) {
	srv := testenv.Redis(t)
	direct := testenv.RedisClient(t, srv)
	c := slowClient(t, srv.Addr, 16)
	at := testenv.Now()
	f := newFilter(t, c, at, 3_500_000, 1e-6, func(cfg *Config) { cfg.CallTimeout = 300 * time.Millisecond })
	if size := f.own.plan.Stages[0].shardBytes(); size < 12<<20 || f.own.plan.Shards != 1 {
		t.Fatalf("the plan makes %d shards of %d bytes: want one of about 16 MiB", f.own.plan.Shards, size)
	}
	start := time.Now()
	if err := f.Preallocate(t.Context(), at); err != nil {
		t.Fatalf("Preallocate over a slow link: %v", err)
	}
	if took := time.Since(start); took < f.cfg.CallTimeout {
		t.Fatalf("the window was made in %v, within the call time-out: the link did not slow it", took)
	}
	assertWindowMade(t, direct, f, f.cfg.Window.Bucket(at))
}

// A shard that cannot be made (here its keys are outside the ACL of the
// user the filter logs in as, the window's plan record within it): preallocation makes every other shard, and
// its error names the one it could not make.
func TestPreallocateTriesEveryShard(t *testing.T) {
	srv := testenv.Redis(t)
	admin := testenv.RedisClient(t, srv)
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "partial", "on", ">pw", "~dedupe:{test:[1-9]}*", "~dedupe:{test:plans}*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "partial", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	at := testenv.Now()
	plan, err := NewPlan(100_000, 1e-6, PlanOptions{MinShards: 4, Kind: testKind})
	if err != nil {
		t.Fatal(err)
	}
	f := newFilter(t, c, at, 100_000, 1e-6, func(cfg *Config) { cfg.Plan = plan })
	b := f.cfg.Window.Bucket(at)
	perr := f.Preallocate(t.Context(), at)
	if perr == nil || !strings.Contains(perr.Error(), "shard 0 ") || !strings.Contains(perr.Error(), "NOPERM") {
		t.Fatalf("Preallocate with shard 0 out of reach: %v, want an error naming shard 0 and the refusal", perr)
	}
	for s := 1; s < f.own.plan.Shards; s++ {
		n, err := admin.Exists(t.Context(), f.own.filterKey(s, b)).Result()
		if err != nil || n != 1 {
			t.Errorf("shard %d, within reach, was not made (%v)", s, err)
		}
	}
}

// The maintenance makes the current window while a growth that takes
// seconds is under way (a stage of 32 MiB over a link of 16 MiB/s):
// the window is made before the stage, not after it.
func TestPreallocateNotQueuedBehindGrowth(t *testing.T) {
	srv := testenv.Redis(t)
	direct := testenv.RedisClient(t, srv)
	c := slowClient(t, srv.Addr, 16)
	at := testenv.Now()
	f := growingFilter(t, c, at, 2_000_000, 1e-6, 64, func(cfg *Config) { cfg.CallTimeout = time.Second })
	b := f.cfg.Window.Bucket(at)
	if one, zero := f.own.plan.Stages[1].shardBytes(), keyBytes(f.own.plan.ShardBits); one < 3*zero || one < 16<<20 {
		t.Fatalf("stage 1 of %d bytes, stage 0 of %d: want a stage 1 that takes over a second over the link", one, zero)
	}
	// A call asked for stage 1 ahead of need: the maintenance's first
	// growth pass makes it.
	f.want([]stageRef{{bucket: b, shard: 0, stage: 1}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.maintain(ctx, NewGauges(prometheus.NewRegistry(), "test"), zap.NewNop(), time.Hour, time.Hour)
	}()
	defer func() { cancel(); <-done }()
	exists := func(key string) bool {
		n, err := direct.Exists(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	testenv.Eventually(t, 30*time.Second, "the current window made", func() bool { return exists(f.own.filterKey(0, b)) })
	if exists(f.own.stageKey(0, b, 1)) {
		t.Fatal("stage 1 was made before the window: preallocation waited for the growth")
	}
	if !exists(f.own.stageKey(0, b, 1) + ":making") {
		t.Fatal("stage 1 is not being made: the growth did not start")
	}
	testenv.Eventually(t, 30*time.Second, "stage 1 made", func() bool { return exists(f.own.stageKey(0, b, 1)) })
}

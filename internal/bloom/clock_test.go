package bloom

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// scriptBudget is the longest a script call may take here: a batch of 100
// takes about a millisecond, making a window of 128 MiB inside the script
// took 50 ms on the development machine.
const scriptBudget = 20 * time.Millisecond

// slowScripts returns the script calls Redis's SLOWLOG holds that took
// longer than scriptBudget since the last reset.
func slowScripts(t *testing.T, c *redis.Client) []redis.SlowLog {
	t.Helper()
	logs, err := c.SlowLogGet(t.Context(), 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []redis.SlowLog
	for _, l := range logs {
		if len(l.Args) > 0 && strings.HasPrefix(strings.ToLower(l.Args[0]), "eval") && l.Duration > scriptBudget {
			out = append(out, l)
		}
	}
	return out
}

// windowKeys returns the buckets of f whose stage 0 key of shard 0 exists.
func windowKeys(t *testing.T, c *redis.Client, f *Filter) []int64 {
	t.Helper()
	prefix := f.own.filterKey(0, 0)
	prefix = prefix[:len(prefix)-1]
	keys, err := c.Keys(t.Context(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, k := range keys {
		if b, err := strconv.ParseInt(strings.TrimPrefix(k, prefix), 10, 64); err == nil {
			out = append(out, b)
		}
	}
	return out
}

// Events stamped ahead of the clock, as a client with a wrong clock or time
// zone sends them: an hour and a day ahead of a daily window, minutes ahead
// of a 10-minute one. No script call makes a window (none takes longer
// than scriptBudget, where making a 128 MiB key inside one takes 50 ms),
// no window is made past the future skew (by default the preallocation
// lead, so only the next window, which the maintenance makes then anyway),
// the windows made are within LiveWindows, and nothing is lost: every new
// event is first seen or Future (forwarded), and its copy a duplicate when
// it was tested.
func TestFutureEventsMakeNoWindowInTheScript(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	configSet(t, c, "slowlog-log-slower-than", strconv.FormatInt(scriptBudget.Microseconds(), 10))
	now := testenv.Now()
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name  string
		win   Window
		n     int64 // 28M IDs at 1e-6: one key of 128 MiB
		skew  time.Duration
		ahead []time.Duration
	}{
		{"daily, the default skew", Window{Length: day, Mode: Fixed, MaxLag: time.Hour}, 28_000_000, 0, []time.Duration{time.Hour, day}},
		{"daily, a day of skew", Window{Length: day, Mode: Fixed, MaxLag: time.Hour}, 28_000_000, day, []time.Duration{time.Hour, day}},
		{"10 minutes rolling, the default skew", Window{Length: 10 * time.Minute, Mode: Rolling, MaxLag: time.Hour}, 1_000_000, 0,
			[]time.Duration{time.Minute, 3 * time.Minute, 9 * time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.SlowLogReset(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			f := newFilter(t, c, now, tc.n, 1e-6, func(cfg *Config) { cfg.Window, cfg.MaxFutureSkew = tc.win, tc.skew })
			skew := f.cfg.MaxFutureSkew
			if tc.skew == 0 && skew != f.PreallocateLead() {
				t.Fatalf("default future skew %v, want the preallocation lead %v", skew, f.PreallocateLead())
			}
			w := f.Window()
			tested := map[int64]bool{}
			for i, ahead := range tc.ahead {
				at := now.Add(ahead)
				want := FirstSeen
				if w.Bucket(at) > w.Bucket(now.Add(skew)) {
					want = Future
				} else {
					tested[w.Bucket(at)] = true
				}
				es := batchOf(fmt.Sprint("ahead", i), 0, 100, at)
				for k, v := range verdicts(t, f, es...) {
					if v != want {
						t.Fatalf("%s stamped %v ahead: %v, want %v", es[k].ID, ahead, v, want)
					}
				}
				copies := batchOf(fmt.Sprint("ahead", i), 0, 100, at)
				for k := range copies {
					copies[k].Source.Offset += 100
				}
				wantCopy := Duplicate
				if want == Future {
					wantCopy = Future
				}
				for k, v := range verdicts(t, f, copies...) {
					if v != wantCopy {
						t.Fatalf("copy of %s stamped %v ahead: %v, want %v", copies[k].ID, ahead, v, wantCopy)
					}
				}
			}
			if slow := slowScripts(t, c); len(slow) > 0 {
				t.Errorf("%d script calls over %v, the first %v: a window was made inside the script", len(slow), scriptBudget, slow[0].Duration)
			}
			made := windowKeys(t, c, f)
			if len(made) != len(tested) || len(made) > f.LiveWindows() {
				t.Errorf("windows made for buckets %v; want those tested, %v, and at most %d (LiveWindows)", made, tested, f.LiveWindows())
			}
			for _, b := range made {
				if !tested[b] {
					t.Errorf("a window was made for bucket %d, where no event was tested", b)
				}
			}
			if tc.skew == day && f.LiveWindows() < 3 {
				t.Errorf("a day of skew on a daily window keeps three windows live (yesterday's within the lag bound, today's, tomorrow's); LiveWindows says %d", f.LiveWindows())
			}
		})
	}
}

// Two replicas whose clocks differ by 3 s decide copies of one event
// stamped on either side of a rolling window's boundary. The one whose
// clock has passed the boundary inserts the copy stamped after it, in the
// next bucket; the one whose clock has not, deciding the copy stamped
// before it, still reads the next bucket and drops it. The same holds for
// one clock, when the copy stamped after the boundary came first as an
// event ahead of the clock (within the future skew).
func TestRollingBoundaryWithSkewedClocks(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	const L = 10 * time.Minute
	win := Window{Length: L, Mode: Rolling, MaxLag: time.Hour}
	// The next boundary of the real clock: the replicas' clocks stand
	// around it, at most one window ahead of Redis's.
	boundary := testenv.Now().Truncate(L).Add(L)
	for _, tc := range []struct {
		name         string
		first, other time.Time // the replicas' clocks
	}{
		{"replica clocks 3s apart across the boundary", boundary.Add(time.Second), boundary.Add(-2 * time.Second)},
		{"one clock, the later copy first, ahead of it", boundary.Add(-30 * time.Second), boundary.Add(-30 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			first, other := tc.first, tc.other
			a := newClockFilter(t, c, &first, win)
			b := newClockFilter(t, c, &other, win)
			after := el("x", 0, 0, boundary.Add(500*time.Millisecond))
			before := el("x", 1, 0, boundary.Add(-500*time.Millisecond))
			if v := verdicts(t, a, after); v[0] != FirstSeen {
				t.Fatalf("the copy stamped after the boundary, decided first: %v", v)
			}
			if v := verdicts(t, b, before); v[0] != Duplicate {
				t.Errorf("the copy stamped before the boundary, decided by a clock %v behind: %v, want duplicate", first.Sub(other), v)
			}
		})
	}
}

// A batch waiting for the next stage of a window whose end this replica's
// clock passes while it waits, where the server's clock has not (the
// server's clock is behind): the stage is not made (its keys would expire
// at once), the batch is placed anew by the clock and decided Late at
// once, instead of calling the script back to back until the growth wait
// runs out.
func TestRefusedForAnEndedWindowDoesNotSpin(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	const L = 10 * time.Second
	// Bucket b starts 10 to 20 s after the real clock. The replica's clock
	// reads a second before its end while stage 0 fills; then, for the
	// batch that needs stage 1, just before its end when the batch is
	// placed, and just after it from then on.
	end := testenv.Now().Truncate(L).Add(2 * L)
	var phase, calls atomic.Int64
	clock := func() time.Time {
		switch {
		case phase.Load() == 0:
			return end.Add(-time.Second)
		case calls.Add(1) == 1:
			return end.Add(-100 * time.Millisecond)
		}
		return end.Add(100 * time.Millisecond)
	}
	f := growingFilter(t, c, end, 1000, 1e-3, 64, func(cfg *Config) {
		cfg.Window = Window{Length: L, Mode: Fixed}
		cfg.Now = clock
		cfg.GrowthWait = 2 * time.Second
	})
	at := end.Add(-2 * time.Second)
	next := fillStage0(t, f, at, "spin")
	phase.Store(1)
	es := batchOf("spin", next, next+100, at)
	calls0 := testenv.CommandStat(t, c, "evalsha", "calls")
	v, err := f.TestAndSet(t.Context(), es)
	if err != nil {
		t.Fatalf("a batch whose window ended while it waited: %v, want Late verdicts", err)
	}
	for i, x := range v {
		if x != Late {
			t.Fatalf("%s: %v, want late", es[i].ID, x)
		}
	}
	if n := testenv.CommandStat(t, c, "evalsha", "calls") - calls0; n > 3 {
		t.Errorf("%d script calls for one batch: the refused call was made again and again", n)
	}
}

// A batch that waits for a stage longer than the call time-out makes the
// filter unhealthy (the worker not ready) until the wait ends.
func TestLongWaitIsUnhealthy(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	at := testenv.Now()
	f := growingFilter(t, c, at, 1000, 1e-3, 64, func(cfg *Config) {
		cfg.CallTimeout = 200 * time.Millisecond
		cfg.GrowthWait = time.Minute
	})
	next := fillStage0(t, f, at, "h")
	lock := f.own.stageKey(0, f.cfg.Window.Bucket(at), 1) + ":making"
	if err := c.Set(t.Context(), lock, 1, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if !f.Healthy() {
		t.Fatal("unhealthy before any wait")
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.TestAndSet(context.Background(), batchOf("h", next, next+10, at))
		done <- err
	}()
	testenv.Eventually(t, 10*time.Second, "unhealthy while a batch waits for a stage another maker holds", func() bool { return !f.Healthy() })
	// The other maker gives up; the batch makes the stage itself.
	if err := c.Del(t.Context(), lock).Err(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the batch after the wait: %v", err)
	}
	if !f.Healthy() {
		t.Error("unhealthy after the wait ended")
	}
}

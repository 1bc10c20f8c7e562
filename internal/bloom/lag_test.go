package bloom

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// The lag bound at its edges. An event is decided first on time; a copy
// of it (same ID and event time, next offset) is decided later, with the
// filter's clock moved on: up to the event's Deadline it is caught, from
// the Deadline on it is Late. The keys it is tested against must live
// exactly until the Deadline, so the verdict and Redis agree on the edge.
func TestLagBoundEdges(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	const (
		w   = 10 * time.Minute
		lag = time.Hour
	)
	// An event time three minutes into a bucket that ended before the
	// present, so the edges below lie within about an hour of the real
	// clock (Redis expires keys by its own).
	at := testenv.Now().Truncate(w).Add(-2 * w).Add(3 * time.Minute)
	end := at.Truncate(w).Add(w)
	type step struct {
		name  string
		clock time.Time
		want  Verdict
	}
	for _, mode := range []Mode{Rolling, Fixed} {
		for _, s := range []step{
			{"exactly MaxLag after the event time", at.Add(lag), Duplicate},
			{"one second before the deadline", end.Add(lag - time.Second), Duplicate},
			{"at the deadline", end.Add(lag), Late},
			{"one second past the deadline", end.Add(lag + time.Second), Late},
		} {
			t.Run(mode.String()+": "+s.name, func(t *testing.T) {
				if err := c.FlushAll(t.Context()).Err(); err != nil {
					t.Fatal(err)
				}
				clock := at
				f := newClockFilter(t, c, &clock, Window{Length: w, Mode: mode, MaxLag: lag})
				if d := f.cfg.Window.Deadline(at); !d.Equal(end.Add(lag)) {
					t.Fatalf("deadline %v, want %v", d, end.Add(lag))
				}
				if got := verdicts(t, f, el("a", 0, 0, at)); got[0] != FirstSeen {
					t.Fatalf("on time: %v", got)
				}
				clock = s.clock
				if got := verdicts(t, f, el("a", 0, 1, at)); got[0] != s.want {
					t.Errorf("copy decided %v after the event time: %v, want %v", s.clock.Sub(at), got[0], s.want)
				}
				// The oldest key the copy is tested against expires at the
				// deadline: in Rolling mode the previous bucket's.
				b := f.cfg.Window.Bucket(at)
				oldest := b
				if mode == Rolling {
					oldest = b - 1
				}
				if got := f.cfg.Window.ExpireAt(oldest); got != end.Add(lag).Unix() {
					t.Errorf("bucket %d expires at %d, want the deadline %d", oldest, got, end.Add(lag).Unix())
				}
				var loc location
				f.own.locate([]byte("a"), &loc)
				assertExpireTime(t, c, f.own.filterKey(loc.shard, b), f.cfg.Window.ExpireAt(b))
				// The decision records outlive every filter key they guard.
				rec, err := c.ExpireTime(t.Context(), f.own.recordKey(loc.shard, "t", 0)).Result()
				if err != nil || rec < time.Duration(f.cfg.Window.ExpireAt(b))*time.Second {
					t.Errorf("record expires at %v (error %v), before the filter key at %d", rec, err, f.cfg.Window.ExpireAt(b))
				}
				// A replay of either offset now gets the recorded decision,
				// or Late for a forwarded one past the deadline.
				got := verdicts(t, f, el("a", 0, 0, at), el("a", 0, 1, at))
				want := []Verdict{ReplayedFirstSeen, ReplayedDuplicate}
				if s.want == Late {
					want = []Verdict{Late, Late}
				}
				if !same(got, want) {
					t.Errorf("replay: %v, want %v", got, want)
				}
			})
		}
	}

	// Rolling mode: a copy in the next bucket, decided one second before
	// its own deadline, is tested against this bucket, whose keys live
	// until then.
	t.Run("rolling: a copy from the next bucket at its deadline", func(t *testing.T) {
		if err := c.FlushAll(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		clock := at
		f := newClockFilter(t, c, &clock, Window{Length: w, Mode: Rolling, MaxLag: lag})
		later := at.Add(w)
		verdicts(t, f, el("a", 0, 0, at))
		clock = f.cfg.Window.Deadline(later).Add(-time.Second)
		if got := verdicts(t, f, el("a", 0, 1, later)); got[0] != Duplicate {
			t.Errorf("%v", got)
		}
	})
}

// A backlog decided long after its event times, within the bound, gets the
// verdicts it gets live: the same elements through two filters, one with
// the clock at the event times, one an hour less a minute later.
func TestBacklogDecidedAsLive(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	at := testenv.Now().Add(-59 * time.Minute)
	es := stream(6000, 4, 5, at)
	for i := range es {
		// Event times spread over ten minutes, so two buckets are involved.
		es[i].Time = at.Add(time.Duration(i) * 100 * time.Millisecond)
	}
	run := func(pipeline string, lateBy time.Duration) []Verdict {
		clock := at
		f := newClockFilter(t, c, &clock, Window{Length: 10 * time.Minute, Mode: Rolling, MaxLag: time.Hour}, func(cfg *Config) { cfg.Pipeline = pipeline })
		var out []Verdict
		for i := 0; i < len(es); i += 500 {
			part := es[i:min(i+500, len(es))]
			clock = part[len(part)-1].Time.Add(lateBy)
			out = append(out, verdicts(t, f, part...)...)
		}
		return out
	}
	live, backlog := run("live", 0), run("backlog", 59*time.Minute)
	dups := 0
	for _, v := range live {
		if v == Duplicate {
			dups++
		}
	}
	if dups == 0 {
		t.Fatal("the stream has no duplicates: nothing compared")
	}
	if !same(live, backlog) {
		t.Errorf("backlog verdicts differ from live ones")
	}
}

// The capacity check counts the buckets the lag bound keeps alive.
func TestCheckCapacityCountsTheLagBound(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	clock := testenv.Now()
	plan, err := NewPlan(1_000_000, 1e-6, PlanOptions{Kind: testKind})
	if err != nil {
		t.Fatal(err)
	}
	win := Window{Length: 10 * time.Minute, Mode: Rolling}
	if n := win.Live(PreallocateLead(plan, win, DefaultCallTimeout)); n != 3 {
		t.Fatalf("live buckets without a lag bound: %d, want 3", n)
	}
	// Room for five buckets: enough without a bound, not with one hour.
	configSet(t, c, "maxmemory", strconv.FormatUint(5*plan.Memory, 10))
	withPlan := func(cfg *Config) { cfg.Plan = plan }
	if err := newClockFilter(t, c, &clock, win, withPlan).CheckCapacity(t.Context()); err != nil {
		t.Errorf("three buckets in room for five: %v", err)
	}
	win.MaxLag = time.Hour
	if n := win.Live(PreallocateLead(plan, win, DefaultCallTimeout)); n != 9 {
		t.Fatalf("live buckets with a 1h bound: %d, want 9", n)
	}
	if err := newClockFilter(t, c, &clock, win, withPlan).CheckCapacity(t.Context()); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("nine buckets in room for five: %v", err)
	}
}

// TestWindowsLive covers the bucket count for the shapes operators use:
// with the next bucket made a whole window ahead (lead = length), and with
// it made shortly before it starts.
func TestWindowsLive(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		w    Window
		lead time.Duration
		want int
	}{
		{Window{Length: 10 * time.Minute, Mode: Rolling}, 10 * time.Minute, 3},
		{Window{Length: 10 * time.Minute, Mode: Rolling, MaxLag: time.Hour}, 10 * time.Minute, 9},
		{Window{Length: 10 * time.Minute, Mode: Rolling, MaxLag: time.Hour + time.Second}, 10 * time.Minute, 10},
		{Window{Length: 10 * time.Minute, Mode: Fixed, MaxLag: 7 * day}, 10 * time.Minute, 2 + 1008},
		{Window{Length: day, Mode: Fixed, MaxLag: time.Hour}, day, 3},
		{Window{Length: day, Mode: Rolling, MaxLag: 7 * day}, day, 10},
		// Made shortly before: a lead under a window's length saves a
		// bucket only when the bound leaves room.
		{Window{Length: 10 * time.Minute, Mode: Rolling}, 2 * time.Minute, 3},
		{Window{Length: 10 * time.Minute, Mode: Rolling, MaxLag: time.Hour}, 2 * time.Minute, 9},
		{Window{Length: 10 * time.Minute, Mode: Fixed}, 2 * time.Minute, 2},
		{Window{Length: day, Mode: Fixed, MaxLag: time.Hour}, 15 * time.Minute, 2},
		{Window{Length: day, Mode: Fixed}, 15 * time.Minute, 2},
		{Window{Length: day, Mode: Fixed}, 0, 1},
		{Window{Length: day, Mode: Rolling, MaxLag: time.Hour}, 15 * time.Minute, 3},
	} {
		if got := tc.w.Live(tc.lead); got != tc.want {
			t.Errorf("%v %v, max lag %v, lead %v: %d live buckets, want %d", tc.w.Length, tc.w.Mode, tc.w.MaxLag, tc.lead, got, tc.want)
		}
	}
}

// The lead covers three maintenance passes and the making of every shard,
// and is never more than a window.
func TestPreallocateLead(t *testing.T) {
	day := Window{Length: 24 * time.Hour, Mode: Fixed, MaxLag: time.Hour}
	small, err := NewPlan(100_000, 1e-6, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	passes := preallocatePasses * (slowEvery + growEvery)
	if got, want := PreallocateLead(small, day, 5*time.Second), passes+time.Duration(small.Shards)*5*time.Second; got != want || small.Shards > 3 {
		t.Errorf("lead of a %d-byte window in %d shards: %v, want %v (three passes and a small make per shard)", small.Memory, small.Shards, got, want)
	}
	big, err := NewPlan(1_000_000_000, 1e-9, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lead := PreallocateLead(big, day, 5*time.Second)
	perShard := 5*time.Second + time.Duration(big.ShardBits/8>>20)*100*time.Millisecond
	if lead != passes+time.Duration(big.Shards)*perShard || lead < 10*time.Minute || lead > time.Hour {
		t.Errorf("lead of a %d GiB window in %d shards: %v, want %v and between 10 minutes and an hour", big.Memory>>30, big.Shards, lead,
			passes+time.Duration(big.Shards)*perShard)
	}
	if n := day.Live(lead); n != 2 {
		t.Errorf("a daily window with a 1h bound and a %v lead keeps %d windows live, want 2", lead, n)
	}
	short := Window{Length: time.Minute, Mode: Rolling}
	if got := PreallocateLead(big, short, 5*time.Second); got != time.Minute {
		t.Errorf("lead of a 1-minute window: %v, want the window", got)
	}
}

// newClockFilter is a filter of pipeline "test" for 10,000 IDs at 1e-6
// whose clock is *clock.
func newClockFilter(t testing.TB, c redis.UniversalClient, clock *time.Time, win Window, mutate ...func(*Config)) *Filter {
	t.Helper()
	return newFilter(t, c, time.Time{}, 10_000, 1e-6, func(cfg *Config) {
		cfg.Window = win
		cfg.Now = func() time.Time { return *clock }
		for _, m := range mutate {
			m(cfg)
		}
	})
}

// assertExpireTime fails unless key exists and expires at the Unix time want.
func assertExpireTime(t testing.TB, c *redis.Client, key string, want int64) {
	t.Helper()
	got, err := c.ExpireTime(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if got != time.Duration(want)*time.Second {
		t.Errorf("%s expires at %v, want %d", key, got, want)
	}
}

// Lateness is judged twice: by the caller's clock before the call, and
// by the Redis server's inside it, since keys expire by the server's
// clock. Here the filter's clock stands still before the deadline while
// the real one passes it: the copy is Late, not taken for new because
// its keys are gone.
func TestDeadlineByTheServersClock(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	for _, mode := range []Mode{Fixed, Rolling} {
		t.Run(mode.String(), func(t *testing.T) {
			at := time.Now()
			clock := at
			if err := c.FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			// One-second windows and bound: the deadline is two seconds
			// away at most.
			f := newClockFilter(t, c, &clock, Window{Length: time.Second, Mode: mode, MaxLag: time.Second})
			deadline := f.cfg.Window.Deadline(at)
			if got := verdicts(t, f, el("a", 0, 0, at)); got[0] != FirstSeen {
				t.Fatalf("before the deadline: %v", got)
			}
			// Waiting for the real clock to pass a point in time is what is
			// tested here, not a stand-in for another event.
			for time.Now().Before(deadline.Add(10 * time.Millisecond)) {
				time.Sleep(time.Until(deadline.Add(10 * time.Millisecond)))
			}
			if f.cfg.Window.Late(at, f.Now()) {
				t.Fatal("the filter's clock moved: the caller-side check would decide")
			}
			if got := verdicts(t, f, el("a", 0, 1, at)); got[0] != Late {
				t.Errorf("a copy after the deadline by the server's clock: %v, want late", got[0])
			}
		})
	}
}

// A batch read late, in rolling mode, meets copies on both sides: IDs
// first decided in the next bucket and IDs in the previous bucket are
// duplicates, new IDs are first seen, and the next bucket's own elements
// of the same batch see this bucket's, whichever batch holds what.
func TestRollingBacklogMeetsCopiesOnBothSides(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	const w = 10 * time.Minute
	cur := testenv.Now().Truncate(w)
	b0, b1, b2 := cur.Add(-2*w).Add(time.Minute), cur.Add(-w).Add(time.Minute), cur.Add(time.Minute)
	clock := cur.Add(time.Second) // every bucket below has ended but b2's
	f := newClockFilter(t, c, &clock, Window{Length: w, Mode: Rolling, MaxLag: time.Hour})

	var first []Element
	for i := range 40 {
		first = append(first, el(fmt.Sprintf("next-%d", i), 0, int64(i), b1), el(fmt.Sprintf("prev-%d", i), 1, int64(i), b0.Add(-w)))
	}
	for i, v := range verdicts(t, f, first...) {
		if v != FirstSeen {
			t.Fatalf("first batch, element %d: %v", i, v)
		}
	}
	var batch []Element
	var want []Verdict
	add := func(id string, at time.Time, v Verdict) {
		batch = append(batch, el(id, 2, int64(len(batch)), at))
		want = append(want, v)
	}
	for i := range 40 {
		add(fmt.Sprintf("next-%d", i), b0, Duplicate) // decided in b1 first
		add(fmt.Sprintf("prev-%d", i), b0, Duplicate) // in b0's previous bucket
		add(fmt.Sprintf("new-%d", i), b0, FirstSeen)
		add(fmt.Sprintf("new-%d", i), b1, Duplicate)     // b1 tests b0, set earlier in this batch
		add(fmt.Sprintf("current-%d", i), b2, FirstSeen) // b2 has not ended: no next-bucket read
	}
	if got := verdicts(t, f, batch...); !same(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("element %d (%s at %v): %v, want %v", i, batch[i].ID, batch[i].Time, got[i], want[i])
			}
		}
	}
}

// The server check reads the version from INFO and refuses anything
// below 7.0; the test server passes it.
func TestCheckServer(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	clock := testenv.Now()
	f := newClockFilter(t, c, &clock, Window{Length: 10 * time.Minute})
	if err := f.CheckServer(t.Context()); err != nil {
		t.Fatalf("the test server: %v", err)
	}
	if f.serverInfo(t.Context(), c, "server")["redis_version"] == "" {
		t.Fatal("no redis_version in INFO server")
	}
	for v, old := range map[string]bool{"6.2.14": true, "5.0.7": true, "7.0.0": false, "7.0.15": false, "8.0.2": false, "7.2.4": false} {
		if tooOld(v) != old {
			t.Errorf("%s: too old %v, want %v", v, tooOld(v), old)
		}
	}
}

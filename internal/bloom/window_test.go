package bloom

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// place is the one classifier of an event time: tested, Late or Future,
// and the buckets a test reads. Here at its edges, in both modes: the
// future limit, the deadline to the nanosecond, and the next bucket read
// from the future skew plus the clock skew before the event's bucket ends.
func TestPlaceAtItsEdges(t *testing.T) {
	const (
		L     = 10 * time.Minute
		lag   = time.Hour
		skew  = 2 * time.Minute
		clock = 5 * time.Second
	)
	// An aligned present, from the clock: buckets and deadlines fall on
	// its multiples of L.
	cur := time.Now().Truncate(L)
	// From reach before a bucket ends, a replica whose clock is clock ahead
	// may insert events of the next bucket.
	reach := cur.Add(L - skew - clock)
	for _, mode := range []Mode{Rolling, Fixed} {
		w := Window{Length: L, Mode: mode, MaxLag: lag}
		rolling := mode == Rolling
		for _, c := range []struct {
			name       string
			t, now     time.Time
			status     Verdict
			prev, next bool
		}{
			{"live, in the current bucket", cur.Add(time.Minute), cur.Add(2 * time.Minute), 0, rolling, false},
			{"live, just before the next bucket may hold copies", cur.Add(time.Minute), reach.Add(-time.Nanosecond), 0, rolling, false},
			{"live, once the next bucket may hold copies", cur.Add(time.Minute), reach, 0, rolling, rolling},
			{"the previous bucket, ended", cur.Add(-time.Minute), cur.Add(time.Minute), 0, rolling, rolling},
			{"one nanosecond before the deadline", cur.Add(-lag - L/2), cur.Add(-time.Nanosecond), 0, rolling, rolling},
			{"at the deadline", cur.Add(-lag - L/2), cur, Late, rolling, rolling},
			{"past the deadline", cur.Add(-lag - L/2), cur.Add(time.Hour), Late, rolling, rolling},
			{"the next bucket, before the skew reaches it", cur.Add(L), cur.Add(L - skew - time.Nanosecond), Future, rolling, false},
			{"the next bucket, once the skew reaches it", cur.Add(2*L - time.Second), cur.Add(L - skew), 0, rolling, false},
			{"the bucket after, beyond the skew", cur.Add(2 * L), cur.Add(L - skew), Future, rolling, false},
		} {
			t.Run(mode.String()+": "+c.name, func(t *testing.T) {
				p := w.place(c.t, c.now, skew, clock)
				want := placement{bucket: w.Bucket(c.t), status: c.status, prev: c.prev, next: c.next}
				if p != want {
					t.Fatalf("place(%v, %v) = %+v, want %+v", c.t, c.now, p, want)
				}
				if p.tested() != (c.status == 0) {
					t.Errorf("tested() = %v for status %v", p.tested(), c.status)
				}
				// Late and Deadline say what place says.
				if late := w.Late(c.t, c.now); late != (c.status == Late) {
					t.Errorf("Late = %v, want %v", late, c.status == Late)
				}
				if late := !c.now.Before(w.Deadline(c.t)); c.status != Future && late != (c.status == Late) {
					t.Errorf("now %v against the deadline %v: late %v, status %v", c.now, w.Deadline(c.t), late, c.status)
				}
				wantBuckets := []int64{p.bucket}
				if c.prev {
					wantBuckets = []int64{p.bucket - 1, p.bucket}
				}
				if c.next {
					wantBuckets = append(wantBuckets, p.bucket+1)
				}
				if got := p.buckets(); !slices.Equal(got, wantBuckets) {
					t.Errorf("buckets %v, want %v", got, wantBuckets)
				}
			})
		}
	}
}

// A bucket's keys expire at the deadline of the last bucket whose events
// test them: its own, or in Rolling mode the next one's.
func TestExpireAtIsTheLastTestersDeadline(t *testing.T) {
	cur := time.Now().Truncate(time.Minute)
	for _, mode := range []Mode{Rolling, Fixed} {
		w := Window{Length: time.Minute, Mode: mode, MaxLag: 5 * time.Minute}
		b := w.Bucket(cur)
		last := cur
		if mode == Rolling {
			last = cur.Add(time.Minute)
		}
		if got, want := w.ExpireAt(b), w.Deadline(last).Unix(); got != want {
			t.Errorf("%v: bucket %d expires at %d, want %d", mode, b, got, want)
		}
	}
}

// The exported limits are the ones the checks apply: each accepted at
// its bound, refused just past it.
func TestLimitsAreTheChecks(t *testing.T) {
	if err := (Window{Length: MaxWindowLength, MaxLag: MaxLagBound}).validate(); err != nil {
		t.Errorf("the longest window and lag bound: %v", err)
	}
	if err := (Window{Length: MaxWindowLength + time.Second}).validate(); err == nil {
		t.Error("a window past MaxWindowLength accepted")
	}
	if err := (Window{Length: time.Minute, MaxLag: MaxLagBound + time.Second}).validate(); err == nil {
		t.Error("a lag bound past MaxLagBound accepted")
	}
	name := strings.Repeat("a", 100)
	for _, ok := range []string{name, "clicks.v2_eu-1"} {
		if !NamePattern.MatchString(ok) {
			t.Errorf("NamePattern refuses %q", ok)
		}
	}
	for _, bad := range []string{"", name + "a", "a b", "a:b", "{a}"} {
		if NamePattern.MatchString(bad) {
			t.Errorf("NamePattern accepts %q", bad)
		}
	}
	plan, err := NewPlan(1000, 1e-6, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Pipeline: name, Plan: plan, Window: Window{Length: time.Minute}}
	cfg.setDefaults()
	if cfg.CallTimeout != DefaultCallTimeout || cfg.KeyPrefix != DefaultKeyPrefix || cfg.ReplayHorizon != DefaultReplayHorizon {
		t.Errorf("defaults: call timeout %v, key prefix %q, replay horizon %d", cfg.CallTimeout, cfg.KeyPrefix, cfg.ReplayHorizon)
	}
	if err := cfg.validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	cfg.Pipeline = name + "a"
	if err := cfg.validate(); err == nil {
		t.Error("a pipeline name NamePattern refuses was accepted")
	}
}

// NewPlan's bounds are the exported constants, and MaxGrowthFactor is
// what MaxStages stages hold.
func TestNewPlanBounds(t *testing.T) {
	if want := math.Pow(GrowthFactor, MaxStages-1); MaxGrowthFactor != want {
		t.Fatalf("MaxGrowthFactor is %d, want GrowthFactor^(MaxStages-1) = %g", MaxGrowthFactor, want)
	}
	for _, c := range []struct {
		name string
		n    int64
		p    float64
		opt  PlanOptions
		ok   bool
	}{
		{"MaxElements", MaxElements, 1e-6, PlanOptions{}, true},
		{"past MaxElements", MaxElements + 1, 1e-6, PlanOptions{}, false},
		{"MinFPR", 1000, MinFPR, PlanOptions{}, true},
		{"below MinFPR", 1000, MinFPR * 0.99, PlanOptions{}, false},
		{"MaxShards", 1000, 1e-6, PlanOptions{MinShards: MaxShards}, true},
		{"past MaxShards", 1000, 1e-6, PlanOptions{MinShards: MaxShards + 1}, false},
		{"MaxGrowthFactor", 1000, 1e-6, PlanOptions{MaxGrowth: MaxGrowthFactor}, true},
		{"past MaxGrowthFactor", 1000, 1e-6, PlanOptions{MaxGrowth: MaxGrowthFactor * 1.001}, false},
	} {
		_, err := NewPlan(c.n, c.p, c.opt)
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrInvalidPlan) {
			t.Errorf("%s: %v, want ErrInvalidPlan", c.name, err)
		}
	}
}

// Late reports whether an event of time t, processed at now, is beyond
// the lag bound: the Late of place, where an event not yet begun is never
// late, so the future skew does not matter.
func (w Window) Late(t, now time.Time) bool { return w.place(t, now, 0, 0).status == Late }

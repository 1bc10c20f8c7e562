package bloom

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"dedupe-worker/internal/testenv"
)

// Two replicas of one pipeline with different plans (a Bloom filter for
// 10,000 IDs, a fingerprint table for 20,000: a new version, a changed
// setting, a switch of kind) across a window boundary: the first window
// is made by one, the next by the other, and each window is tested by the
// plan it was made with, whichever replica decides. Copies of 2,000 IDs
// stamped on both sides of the boundary, decided by either replica in
// either order, are each first seen once: none passes.
func TestWindowsKeepTheirPlan(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	const L = 10 * time.Minute
	now := testenv.Now()
	boundary := now.Truncate(L).Add(L)
	mk := func(n int64, kind Kind) *Filter {
		plan, err := NewPlan(n, 1e-6, PlanOptions{Kind: kind, MaxGrowth: 4})
		if err != nil {
			t.Fatal(err)
		}
		return newFilter(t, c, now, n, 1e-6, func(cfg *Config) {
			cfg.Pipeline, cfg.Plan, cfg.MaxFutureSkew = "plans", plan, L
		})
	}
	a, b := mk(10_000, KindBloom), mk(20_000, KindFingerprint)
	if a.Tag() == b.Tag() {
		t.Fatal("the two plans give one tag: the test needs two plans")
	}
	if err := a.Preallocate(t.Context(), boundary.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := b.Preallocate(t.Context(), boundary); err != nil {
		t.Fatal(err)
	}
	w := a.Window()
	for _, f := range []*Filter{a, b} {
		for bucket, want := range map[int64]string{w.Bucket(boundary) - 1: a.Tag(), w.Bucket(boundary): b.Tag()} {
			wp, err := f.planOf(t.Context(), bucket, false)
			if err != nil || wp.tag != want {
				t.Fatalf("replica %s reads the window of %v by plan %s (%v), want %s, the plan it was made with", f.Tag(), w.Start(bucket), wp.tag, err, want)
			}
		}
	}

	r := rand.New(rand.NewPCG(3, 9))
	replicas := []*Filter{a, b}
	var offsets [2]int64
	passed, first := 0, 0
	for i := range 2000 {
		id := fmt.Sprintf("x-%d", i)
		// One copy a little before the boundary, one a little after,
		// decided in a random order, each by a random replica, in a
		// partition of its own so that each partition's offsets ascend.
		times := []time.Time{boundary.Add(-time.Duration(1+r.IntN(60)) * time.Second), boundary.Add(time.Duration(r.IntN(60)) * time.Second)}
		if r.IntN(2) == 0 {
			times[0], times[1] = times[1], times[0]
		}
		seen := 0
		for k, at := range times {
			f := replicas[r.IntN(2)]
			v := verdicts(t, f, el(id, int32(k), offsets[k], at))
			offsets[k]++
			switch v[0] {
			case FirstSeen:
				seen++
			case Duplicate:
			default:
				t.Fatalf("%s at %v: %v", id, at, v[0])
			}
		}
		if seen == 0 {
			first++ // a false positive of the first copy: counted, rare
		}
		if seen > 1 {
			passed++
		}
	}
	if passed > 0 {
		t.Errorf("%d of 2000 IDs passed twice across the boundary between the two plans' windows", passed)
	}
	if first > 2 {
		t.Errorf("%d of 2000 new IDs taken for duplicates: far above the rate 1e-6", first)
	}
	// Each window holds its plan's keys and no other's.
	for bucket, f := range map[int64]*Filter{w.Bucket(boundary) - 1: a, w.Bucket(boundary): b} {
		other := b
		if f == b {
			other = a
		}
		if n, err := c.Exists(t.Context(), other.own.filterKey(0, bucket)).Result(); err != nil || n != 0 {
			t.Errorf("the window of %v has keys of the other plan (%d, %v)", w.Start(bucket), n, err)
		}
	}
	assertAllKeysExpire(t, c)
}

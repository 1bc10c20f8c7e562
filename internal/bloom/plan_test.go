package bloom

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"
)

func near(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

// The sizing table of the background doc, from the formulas.
func TestStandardFPRReproducesSizingTable(t *testing.T) {
	for _, c := range []struct {
		bitsPerElem float64
		k           int
		p           float64
		gib1e9      float64 // GiB for 1e9 elements
		mib7e6      float64 // MiB for 7e6 elements
	}{
		{30, 8, 9.0e-6, 3.49, 25},
		{30, 16, 7.3e-7, 3.49, 25},
		{50, 8, 2.3e-7, 5.82, 42},
		{50, 16, 1.0e-9, 5.82, 42},
	} {
		if got := StandardFPR(c.bitsPerElem, c.k); !near(got, c.p, 0.03) {
			t.Errorf("m/n=%v k=%d: p = %.3g, want %.2g", c.bitsPerElem, c.k, got, c.p)
		}
		if got := c.bitsPerElem * 1e9 / 8 / (1 << 30); !near(got, c.gib1e9, 0.005) {
			t.Errorf("m/n=%v: %.3f GiB for 1e9, want %.2f", c.bitsPerElem, got, c.gib1e9)
		}
		if got := c.bitsPerElem * 7e6 / 8 / (1 << 20); !near(got, c.mib7e6, 0.02) {
			t.Errorf("m/n=%v: %.1f MiB for 7e6, want %.0f", c.bitsPerElem, got, c.mib7e6)
		}
	}
}

func TestStandardSizingCommonTargets(t *testing.T) {
	for _, c := range []struct {
		p    float64
		bits float64
		k    int
	}{{1e-2, 9.6, 7}, {1e-4, 19.2, 13}, {1e-6, 28.8, 20}, {1e-9, 43.1, 30}} {
		s := StandardSizing(1e6, c.p)
		if got := float64(s.Bits) / 1e6; !near(got, c.bits, 0.005) || s.Hashes != c.k {
			t.Errorf("p=%g: %.2f bits, k=%d; want %.1f, %d", c.p, got, s.Hashes, c.bits, c.k)
		}
		if !near(s.FPR, c.p, 0.1) {
			t.Errorf("p=%g: achieved %.3g after rounding k", c.p, s.FPR)
		}
	}
}

// With one bit per word the blocked formula must agree with the classic
// one (bits in different words are independent; within a word, with one
// bit each, the only loss is words shared by two of an element's bits).
func TestBlockedFPRSingleBitMatchesClassic(t *testing.T) {
	for _, k := range []int{2, 4, 8} {
		got := BlockedFPR(20, Layout{Words: k, BitsPerWord: 1})
		want := StandardFPR(20, k)
		if !near(got, want, 0.02) {
			t.Errorf("k=%d: blocked %.4g, classic %.4g", k, got, want)
		}
	}
}

// The formula against a simulation of the layout itself: m bits in an
// in-memory bitmap, positions from locate.
func TestBlockedFPRMatchesSimulation(t *testing.T) {
	for _, c := range []struct {
		layout Layout
		bpe    float64
	}{
		{Layout{4, 4}, 16},
		{Layout{2, 3}, 12},
		{Layout{3, 2}, 14},
	} {
		const n = 100_000
		plan := Plan{Shards: 1, ShardBits: uint64(c.bpe*n) / WordBits * WordBits, Layout: c.layout, Elements: n}
		f := &Filter{own: &windowPlan{plan: plan}}
		bm := make([]uint64, plan.ShardBits/64+1)
		var loc location
		rng := rand.New(rand.NewPCG(7, uint64(c.layout.Words)))
		id := make([]byte, 16)
		insert := func(set bool) bool {
			for i := range id {
				id[i] = byte(rng.Uint32())
			}
			f.own.locate(id, &loc)
			all := true
			for j := 0; j < c.layout.Words; j++ {
				mask := uint64(loc.hi[j])<<26 | uint64(loc.lo[j])
				for mask != 0 {
					b := bits.TrailingZeros64(mask)
					mask &= mask - 1
					pos := loc.word[j] + uint64(WordBits-1-b)
					if bm[pos/64]>>(pos%64)&1 == 0 {
						all = false
						if set {
							bm[pos/64] |= 1 << (pos % 64)
						}
					}
				}
			}
			return all
		}
		for i := 0; i < n; i++ {
			insert(true)
		}
		const queries = 400_000
		fp := 0
		for i := 0; i < queries; i++ {
			if insert(false) {
				fp++
			}
		}
		want := BlockedFPR(float64(plan.ShardBits)/n, c.layout) * queries
		// Five standard deviations of a binomial count.
		if bound := 5 * math.Sqrt(want); math.Abs(float64(fp)-want) > bound {
			t.Errorf("%+v at %.0f bits: %d false positives in %d, formula expects %.1f ± %.1f", c.layout, c.bpe, fp, queries, want, bound)
		} else {
			t.Logf("%+v at %.0f bits: %d false positives in %d, formula expects %.1f", c.layout, c.bpe, fp, queries, want)
		}
	}
}

func TestNewPlanMeetsTarget(t *testing.T) {
	for _, p := range []float64{1e-2, 1e-3, 1e-4, 1e-6, 1e-9} {
		for _, n := range []int64{100, 1000, 7_000_000, 1_000_000_000} {
			for _, growth := range []float64{4, 64} {
				// With growth every stage meets its rate, stage 0 its share
				// of p, and all together p.
				plan, err := NewPlan(n, p, PlanOptions{MaxGrowth: growth})
				if err != nil {
					t.Fatal(err)
				}
				var sum float64
				for i, st := range plan.Stages {
					if !(st.FPR > 0) || st.Parts < 1 || st.ShardBits != uint64(st.Parts)*st.PartBits ||
						i > 0 && st.Memory/uint64(st.Parts*plan.Shards) > maxStagePartBits/8 {
						t.Errorf("n=%d p=%g growth %g: stage %d: %+v", n, p, growth, i, st)
					}
					sum += st.FPR
				}
				if plan.AchievedFPR > p*StageZeroShare || sum > p || plan.GrownFPR(growth) != sum {
					t.Errorf("n=%d p=%g growth %g: stage 0 at %.3g, %.3g in all (%.3g at %gx)", n, p, growth, plan.AchievedFPR, sum, plan.GrownFPR(growth), growth)
				}
			}
			plan, err := NewPlan(n, p, PlanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if plan.AchievedFPR > p {
				t.Errorf("n=%d p=%g: achieved %.3g", n, p, plan.AchievedFPR)
			}
			if plan.ShardBits > MaxKeyBits || plan.ShardBits%WordBits != 0 {
				t.Errorf("n=%d p=%g: shard of %d bits", n, p, plan.ShardBits)
			}
			if plan.Memory < plan.Bits()/8 || float64(plan.Memory) > 1.3*float64(plan.Standard.Bits)/8*DefaultMemoryFactor+1<<16 {
				t.Errorf("n=%d p=%g: memory %d for %d bits (classic %d)", n, p, plan.Memory, plan.Bits(), plan.Standard.Bits)
			}
		}
	}
	// The seed's window at 1e-6 at its plan costs what a lone filter
	// costs: with growth on, stage 0 takes the same layout and shards. (At
	// 1e-9 a lone filter of 4x5 fills its allocator classes to 99.6%, so
	// stage 0's 0.9p takes it past the memory bound, to 5x5.)
	lone, _ := NewPlan(7_000_000, 1e-6, PlanOptions{})
	grows, _ := NewPlan(7_000_000, 1e-6, PlanOptions{MaxGrowth: 64})
	if grows.Layout != lone.Layout || grows.Shards != lone.Shards || grows.Memory != lone.Memory {
		t.Errorf("7M IDs at 1e-6: %v in %d shards (%d bytes) with growth, %v in %d (%d) without",
			grows.Layout, grows.Shards, grows.Memory, lone.Layout, lone.Shards, lone.Memory)
	}
	// The click-log case: 1e9 a day must be split across keys.
	plan, _ := NewPlan(1e9, 1e-6, PlanOptions{})
	if plan.Shards < 8 {
		t.Errorf("1e9 at 1e-6 in %d shards of %d bits", plan.Shards, plan.ShardBits)
	}
}

func TestNewPlanRejectsNonsense(t *testing.T) {
	for _, c := range []struct {
		n   int64
		p   float64
		opt PlanOptions
	}{
		{0, 1e-6, PlanOptions{}},
		{-5, 1e-6, PlanOptions{}},
		{1000, 0, PlanOptions{}},
		{1000, 1, PlanOptions{}},
		{1000, -0.1, PlanOptions{}},
		{1000, math.NaN(), PlanOptions{}},
		{1000, 1e-6, PlanOptions{MinShards: -1}},
		{1e9, 1e-6, PlanOptions{MaxMemory: 1 << 30}},
	} {
		if _, err := NewPlan(c.n, c.p, c.opt); !errors.Is(err, ErrInvalidPlan) {
			t.Errorf("NewPlan(%d, %g, %+v) = %v, want ErrInvalidPlan", c.n, c.p, c.opt, err)
		}
	}
}

func TestAllocClass(t *testing.T) {
	for _, c := range []struct{ in, want uint64 }{
		{1, 16}, {16 << 10, 16 << 10}, {(16 << 10) + 1, 20 << 10},
		{40 << 20, 40 << 20}, {(40 << 20) + 1, 48 << 20}, {(64 << 20) + 1, 80 << 20},
	} {
		if got := allocClass(c.in); got != c.want {
			t.Errorf("allocClass(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}

// The planner's objective: the fewest words whose window, as allocated,
// is within the memory bound, in the fewest shards; one word fewer or one
// shard fewer is over it, or is not taken only because no layout is within
// it. The bound is a classic filter's memory at stage 0's share of p.
func TestPlanTakesFewestWordsWithinTheMemoryBound(t *testing.T) {
	for _, p := range []float64{1e-3, 1e-6, 1e-9} {
		for _, n := range []int64{100_000, 7_000_000, 1_000_000_000} {
			for _, growth := range []float64{1, 64} {
				for _, factor := range []float64{1.15, DefaultMemoryFactor} {
					opt := PlanOptions{MaxGrowth: growth, MemoryFactor: factor}
					pl, err := NewPlan(n, p, opt)
					if err != nil {
						t.Fatal(err)
					}
					p0 := stageZeroRate(p, growth)
					bound := factor * float64(StandardSizing(n, p0).Bits) / 8
					name := fmt.Sprintf("n=%d p=%g growth %g factor %g: %v in %d shards, %d bytes (bound %.0f)", n, p, growth, factor, pl.Layout, pl.Shards, pl.Memory, bound)
					if float64(pl.Memory) > bound {
						// None within it: the least memory of all.
						for w := 1; w <= MaxWords; w++ {
							l, _ := layoutFor(w, p0)
							alt, _ := NewPlan(n, p, PlanOptions{MaxGrowth: growth, Layout: l})
							if float64(alt.Memory) <= bound || alt.Memory < pl.Memory {
								t.Errorf("%s: over the bound, where %v takes %d bytes", name, l, alt.Memory)
							}
						}
						continue
					}
					for s := 1; s < pl.Shards; s++ {
						// Without a bound, sizePlan takes its least shard count.
						if alt := sizePlan(n, p, pl.Layout, s, growth, math.Inf(1)); alt.Shards == s && float64(alt.Memory) <= bound {
							t.Errorf("%s: %d shards take %d bytes, within the bound", name, s, alt.Memory)
						}
					}
					if pl.Layout.Words == 1 {
						continue
					}
					fewer, _ := layoutFor(pl.Layout.Words-1, p0)
					opt.Layout = fewer
					alt, err := NewPlan(n, p, opt)
					if err != nil {
						t.Fatal(err)
					}
					if float64(alt.Memory) <= bound {
						t.Errorf("%s: %v takes %d bytes, within the bound, with a word fewer", name, fewer, alt.Memory)
					}
				}
			}
		}
	}
	// At the product's defaults, fewer words than the layout a bound of
	// 1.15 takes.
	for _, p := range []float64{1e-6, 1e-9} {
		def, _ := NewPlan(7_000_000, p, PlanOptions{MaxGrowth: 64})
		old, _ := NewPlan(7_000_000, p, PlanOptions{MaxGrowth: 64, MemoryFactor: 1.15})
		if def.Layout.Words >= old.Layout.Words {
			t.Errorf("p=%g: %v by default, %v at 1.15: want fewer words by default", p, def.Layout, old.Layout)
		}
	}
}

package bloom

// The Bloom kind's sizing: a classic filter for comparison, the blocked
// layout's false-positive rate, and the planner's choice of words, bits and
// shards.

import (
	"fmt"
	"math"
)

// WordBits is the width of one filter word. A BITFIELD reply reaches Lua as
// a double, which holds integers exactly up to 2^53; 52 bits split evenly
// into two 26-bit halves for Lua's 32-bit bit library.
const WordBits = 52

// MaxKeyBits is the largest bitmap one Redis string can hold (512 MiB).
const MaxKeyBits = 1 << 32

// Standard is the sizing of a classic Bloom filter: every element sets Hashes
// independent bits anywhere in Bits.
type Standard struct {
	Bits   uint64
	Hashes int
	// FPR is the false-positive rate achieved after rounding Hashes.
	FPR float64
}

// StandardSizing gives the classic optimum for n elements at rate p:
// m = -n ln p / (ln 2)^2, k = round(m/n ln 2).
func StandardSizing(n int64, p float64) Standard {
	m := math.Ceil(-float64(n) * math.Log(p) / (math.Ln2 * math.Ln2))
	k := max(1, int(math.Round(m/float64(n)*math.Ln2)))
	return Standard{Bits: uint64(m), Hashes: k, FPR: StandardFPR(m/float64(n), k)}
}

// StandardFPR is (1 - e^(-k n/m))^k for a classic filter with bitsPerElement
// = m/n.
func StandardFPR(bitsPerElement float64, k int) float64 {
	return math.Pow(-math.Expm1(-float64(k)/bitsPerElement), float64(k))
}

// Layout is how one element's bits are placed: Words words of WordBits bits,
// chosen independently, with BitsPerWord distinct bits set in each. An
// element sets Words*BitsPerWord bits in all.
type Layout struct {
	Words       int
	BitsPerWord int
}

// Hashes is the number of bits one element sets.
func (l Layout) Hashes() int { return l.Words * l.BitsPerWord }

// MaxWords bounds Layout.Words: every word costs one read and one write in
// Redis per element, so layouts that need more are not worth their cost.
const MaxWords = 8

// BlockedFPR is the false-positive rate of layout l at bitsPerElement = m/n.
//
// A query word holds j elements' patterns, j ~ Poisson(λ) with
// λ = Words*WordBits/bitsPerElement. Given j, the chance that all b bits of
// a random b-bit pattern are set is, by inclusion-exclusion,
// Σ_i (-1)^i C(b,i) (C(B-i,b)/C(B,b))^j. The Words words are independent,
// so the rate is that expectation raised to the power Words.
func BlockedFPR(bitsPerElement float64, l Layout) float64 {
	const B = WordBits
	b := l.BitsPerWord
	lambda := float64(l.Words) * B / bitsPerElement
	// q[i] = C(B-i,b)/C(B,b): the chance a pattern avoids i given bits.
	q := make([]float64, b+1)
	coef := make([]float64, b+1)
	for i := 0; i <= b; i++ {
		q[i] = math.Exp(lnChoose(B-i, b) - lnChoose(B, b))
		coef[i] = math.Exp(lnChoose(b, i))
		if i%2 == 1 {
			coef[i] = -coef[i]
		}
	}
	jmax := int(lambda + 12*math.Sqrt(lambda) + 30)
	var word float64
	lnp := -lambda // ln P(j=0)
	for j := 0; j <= jmax; j++ {
		if j > 0 {
			lnp += math.Log(lambda / float64(j))
		}
		var f float64
		for i := 0; i <= b; i++ {
			f += coef[i] * math.Pow(q[i], float64(j))
		}
		word += math.Exp(lnp) * max(f, 0)
	}
	return math.Pow(word, float64(l.Words))
}

func lnChoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// bitsNeeded is the smallest bits per element at which layout l reaches p.
func bitsNeeded(l Layout, p float64) float64 {
	lo, hi := 1.0, 4096.0
	if BlockedFPR(hi, l) > p {
		return math.Inf(1)
	}
	for hi-lo > 1e-3 {
		mid := (lo + hi) / 2
		if BlockedFPR(mid, l) <= p {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// The planner's objective: the least Redis work per element within a
// memory bound. Every word an element sets costs one BITFIELD
// sub-operation to read it and, for a new element, one to write it (about
// 1 us of Redis CPU each inside the script, the largest part of a test-and-
// set's cost), and fewer words need more bits per element for the same
// rate. Each shard costs a script call per batch, with its own fixed
// work. So the planner takes the fewest words, then the fewest shards,
// whose window, as allocated (stage 0 on every shard, rounded up to the
// allocator's size classes), takes at most MemoryFactor times the memory
// of a classic filter for the same n at stage 0's rate: p without growth,
// its share of p with growth.
const (
	// DefaultMemoryFactor takes 3 words at p = 1e-6 and 4 or 5 at 1e-9
	// (5 where the allocator's rounding of 4 goes past the bound), where a
	// bound of 1.15 took 4 and 6: two to four sub-operations per new
	// element fewer.
	DefaultMemoryFactor = 1.5
	// MaxMemoryFactor bounds PlanOptions.MemoryFactor; from about 4 the
	// layout is two words, at any rate from 1e-12 to 1e-3.
	MaxMemoryFactor = 4
)

// layoutFor is the layout of w words whose bits per word need the least
// memory at rate p, and the bits per element it needs.
func layoutFor(w int, p float64) (Layout, float64) {
	best, bestBits := Layout{}, math.Inf(1)
	for b := 1; b <= MaxBitsPerWord; b++ {
		l := Layout{Words: w, BitsPerWord: b}
		if c := bitsNeeded(l, p); c < bestBits {
			best, bestBits = l, c
		}
	}
	return best, bestBits
}

// ParseLayout reads a layout written as words x bits per word ("4x4"), as
// Plan.Layout prints in dedupe-worker plan.
func ParseLayout(s string) (Layout, error) {
	var l Layout
	if _, err := fmt.Sscanf(s, "%dx%d", &l.Words, &l.BitsPerWord); err != nil || l.String() != s {
		return Layout{}, fmt.Errorf("%w: layout %q: want words x bits per word, as 4x4", ErrInvalidPlan, s)
	}
	return l, l.check()
}

// check refuses a layout of words or bits per word out of range.
func (l Layout) check() error {
	if l.Words < 1 || l.Words > MaxWords || l.BitsPerWord < 1 || l.BitsPerWord > MaxBitsPerWord {
		return fmt.Errorf("%w: layout %v: want 1 to %d words of 1 to %d bits", ErrInvalidPlan, l, MaxWords, MaxBitsPerWord)
	}
	return nil
}

func (l Layout) String() string { return fmt.Sprintf("%dx%d", l.Words, l.BitsPerWord) }

// MaxBitsPerWord bounds Layout.BitsPerWord: past it no layout needs less
// memory at any rate the planner takes.
const MaxBitsPerWord = 16

// newBloomPlan is NewPlan for the Bloom kind, its arguments checked: the
// fewest words within the memory bound, then the fewest shards; failing
// that, the least memory.
func newBloomPlan(n int64, p float64, minShards int, growth float64, opt PlanOptions) (Plan, error) {
	factor := opt.MemoryFactor
	if factor == 0 {
		factor = DefaultMemoryFactor
	}
	if err := CheckMemoryFactor(factor); err != nil {
		return Plan{}, fmt.Errorf("%w: %w", ErrInvalidPlan, err)
	}
	// The bound is a classic filter's memory at the rate stage 0 must
	// meet (p itself without growth), so that growth's share of the rate
	// weighs on layouts and shards as much as on a classic filter.
	p0 := stageZeroRate(p, growth)
	bound := factor * float64(StandardSizing(n, p0).Bits) / 8
	if opt.Layout != (Layout{}) {
		if err := opt.Layout.check(); err != nil {
			return Plan{}, err
		}
		pl := sizePlan(n, p, opt.Layout, minShards, growth, bound)
		return pl, checkMemory(pl, opt)
	}
	var least Plan
	for w := 1; w <= MaxWords; w++ {
		l, _ := layoutFor(w, p0)
		pl := sizePlan(n, p, l, minShards, growth, bound)
		if float64(pl.Memory) <= bound {
			return pl, checkMemory(pl, opt)
		}
		if least.Shards == 0 || pl.Memory < least.Memory {
			least = pl
		}
	}
	return least, checkMemory(least, opt)
}

// sizePlan sizes a window of n elements at rate p in layout: the fewest
// shards whose stage 0 takes at most bound bytes, as allocated, or else
// the shard count that takes the least. Each shard is one more script call
// per batch, each with its own reads and writes of records and growth
// state: a 7M-ID window in 8 shards cost 9% more Redis CPU per ID than in
// one (bloom-bench -case seed -p 1e-6 -growth 1 -shards 8 against 1).
func sizePlan(n int64, p float64, layout Layout, minShards int, growth, bound float64) Plan {
	// The layout is the same in every stage, so that a window that does
	// not grow costs what it did; stage 0 buys its share of the rate with
	// bits.
	stages := stageCount(growth)
	p0 := stageZeroRate(p, growth)
	perElem := bitsNeeded(layout, p0)
	need := uint64(math.Ceil(perElem * float64(n)))
	// A shard must fit one Redis string; beyond that the allocator's
	// rounding is what the search weighs. Stage 0 alone sets the count:
	// later stages take several keys per shard instead, so that a window
	// that does not grow is not split over shards it does not need.
	lo := max(minShards, int((need+MaxKeyBits/2-1)/(MaxKeyBits/2)))
	best := Plan{}
	for s := lo; s < lo+8; s++ {
		perShard := (need + uint64(s) - 1) / uint64(s)
		if stages > 1 {
			// A shard counts its share with room for the hash's spread
			// (perShardCount), and is sized for it.
			perShard = uint64(math.Ceil(perElem * float64(perShardCount(n, s))))
		}
		class, shardBits := keyBits(perShard, MaxKeyBits)
		try := Plan{Shards: s, ShardBits: shardBits, Memory: class * uint64(s)}
		if float64(try.Memory) <= bound {
			best = try
			break
		}
		if best.Shards == 0 || try.Memory < best.Memory {
			best = try
		}
	}
	best.Elements, best.TargetFPR, best.Layout = n, p, layout
	best.AchievedFPR = BlockedFPR(best.BitsPerElement(), layout)
	best.Standard = StandardSizing(n, p)
	best.Stages = []Stage{{Capacity: n, CapacityPerShard: perShardCount(n, best.Shards), FPR: best.AchievedFPR,
		ShardBits: best.ShardBits, Parts: 1, PartBits: best.ShardBits, Memory: best.Memory}}
	if stages == 1 {
		return best
	}
	// A shard's stage holds its share with room (CapacityPerShard) before
	// the next is made: its rate then is the stage's.
	best.Stages[0].FPR = fullShardFPR(best.Stages[0], layout)
	// Later stages keep the layout and the shard count and buy their lower
	// rate with bits, in keys of at most maxStagePartBits; a stage that
	// would need more than MaxShards keys over all shards ends the chain
	// there. They share what stage 0 leaves of p when full: stage i at
	// rest(1-r)/(1-r^(S-1)) r^(i-1).
	rest := (p - best.Stages[0].FPR) * (1 - TighteningRatio) / (1 - math.Pow(TighteningRatio, float64(stages-1)))
	for i := 1; i < stages; i++ {
		capacity := n * (int64(math.Pow(GrowthFactor, float64(i))) - int64(math.Pow(GrowthFactor, float64(i-1))))
		rate := rest * math.Pow(TighteningRatio, float64(i-1))
		bits := math.Ceil(bitsNeeded(layout, rate) * float64(perShardCount(capacity, best.Shards)))
		// A part's bits are rounded up to whole words: up to 7 bytes more.
		const partBytes = maxStagePartBits/8 - shardOverhead - 8
		parts := int(math.Ceil(bits / 8 / partBytes))
		if parts*best.Shards > MaxShards {
			break
		}
		class, partBits := keyBits(uint64(math.Ceil(bits/float64(parts))), maxStagePartBits)
		shardBits := partBits * uint64(parts)
		st := Stage{Capacity: capacity, CapacityPerShard: perShardCount(capacity, best.Shards),
			ShardBits: shardBits, Parts: parts, PartBits: partBits, Memory: class * uint64(parts*best.Shards)}
		st.FPR = fullShardFPR(st, layout)
		best.Stages = append(best.Stages, st)
	}
	return best
}

// fullShardFPR is the rate of a shard's stage st holding CapacityPerShard.
func fullShardFPR(st Stage, layout Layout) float64 {
	return BlockedFPR(float64(st.ShardBits)/float64(st.CapacityPerShard), layout)
}

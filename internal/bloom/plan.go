package bloom

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
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

// ErrInvalidPlan is wrapped by every sizing error.
var ErrInvalidPlan = errors.New("invalid filter plan")

// PlanOptions are the limits a plan is made within.
type PlanOptions struct {
	// MinShards is the least number of shards (keys) per window; more spread
	// a window over the masters of a Redis Cluster. Default: 1.
	MinShards int
	// MaxMemory caps the bytes of one window's filter, 0 for no cap.
	MaxMemory uint64
	// MaxGrowth is how far a window may grow past n, as a factor: 1 (the
	// default) sizes one filter for n; above 1 the window is a chain of
	// stages (see Stages) holding at least MaxGrowth*n at the rate p.
	MaxGrowth float64
	// MemoryFactor bounds the memory of a window's stage 0, as allocated,
	// as a multiple of a classic filter's for the same n at stage 0's
	// rate; within it the planner takes the fewest words per element, then
	// the fewest shards (the least Redis work), or the plan that needs the
	// least memory when none is within it. Default: DefaultMemoryFactor,
	// from 1 to MaxMemoryFactor.
	MemoryFactor float64
	// Layout, when set, is the layout to use instead of the planner's
	// choice: the one of an earlier version keeps its keys.
	Layout Layout
}

// The growth of a window's chain of stages: each stage takes the window to
// GrowthFactor times the elements of the stages before it. Stage 0 is
// sized for StageZeroShare of p; the later stages share what it leaves of
// p when full, each at TighteningRatio times the rate of the one before,
// normalised over the stages the cap allows, so that all sum to p. See
// the package doc, Growth.
const (
	GrowthFactor    = 4
	TighteningRatio = 0.5
	// StageZeroShare gives stage 0 nearly all of p, so that a window at its
	// plan costs what a lone filter costs: 0.4 bits per element more at
	// 1e-6, where the classic split (p(1-r)/(1-r^S), 8/15 of p with 4
	// stages) cost 2.6, and the allocator's rounding took that from 32 MiB
	// in 1 shard to 35 MiB in 5 for the seed's 7M IDs. The later stages,
	// paid for only by windows that grow, share at least a tenth of p:
	// 3 to 4 bits per element more than at the classic split.
	StageZeroShare = 0.9
	// MaxStages bounds the chain: 4^7 is 16384 times n.
	MaxStages = 8
	// MaxGrowthFactor is the largest PlanOptions.MaxGrowth, what MaxStages
	// stages hold: GrowthFactor^(MaxStages-1) (a test keeps the two in
	// step).
	MaxGrowthFactor = 16384
)

// The bounds of NewPlan's arguments.
const (
	// MaxElements is the most elements per window a plan is made for.
	MaxElements = 1e12
	// MinFPR is the lowest false-positive rate a plan is made for.
	MinFPR = 1e-12
	// MaxShards is the most shards a plan may be asked for
	// (PlanOptions.MinShards), and the most keys a stage of a growing
	// window may take over all shards: a longer chain would need more, and
	// ends earlier instead.
	MaxShards = 1024
)

// Stage is one filter of a window's chain.
type Stage struct {
	// Capacity is the elements the stage holds at its rate, over all
	// shards; CapacityPerShard is its share on one shard.
	Capacity, CapacityPerShard int64
	// FPR is the stage's rate when it is full: with growth, a shard's
	// stage holding CapacityPerShard (the shard's share with room for the
	// hash's spread); without, the one filter holding Capacity.
	FPR float64
	// ShardBits is the stage's bits on one shard, in Parts keys of
	// PartBits each (a multiple of WordBits). Stage 0 is one key per
	// shard; a later stage takes as many keys, under the shard's hash
	// tag, as its size needs.
	ShardBits uint64
	Parts     int
	PartBits  uint64
	// Memory is the bytes of the stage over all shards.
	Memory uint64
}

// Plan is the sizing of one window's filter.
type Plan struct {
	Elements  int64   // n: distinct elements expected per window
	TargetFPR float64 // p: the rate asked for
	Layout    Layout
	Shards    int
	// ShardBits is the bit count of each shard, a multiple of WordBits. It is
	// rounded up to fill the allocator size class the shard occupies anyway.
	ShardBits uint64
	// AchievedFPR is the rate of this layout at ShardBits*Shards/Elements.
	AchievedFPR float64
	// Memory is the bytes Redis allocates for one window's shards.
	Memory uint64
	// Standard is a classic filter for the same n and p, for comparison.
	Standard Standard
	// Stages is the chain one window grows through: Stages[0] is the
	// filter above (ShardBits, Memory); each next one is made when the one
	// before is past its capacity. One stage when growth is off.
	Stages []Stage
}

// Growth reports whether windows grow past Elements.
func (p Plan) Growth() bool { return len(p.Stages) > 1 }

// Capacity is the elements a window holds at its rate with every stage.
func (p Plan) Capacity() int64 {
	var c int64
	for _, s := range p.Stages {
		c += s.Capacity
	}
	return c
}

// GrownMemory is the bytes of one window holding load times Elements:
// the stages it has grown into. Past the last stage it is the whole chain.
func (p Plan) GrownMemory(load float64) (bytes uint64, stages int) {
	var held float64
	for _, s := range p.Stages {
		bytes += s.Memory
		stages++
		held += float64(s.Capacity)
		if held >= load*float64(p.Elements) {
			break
		}
	}
	return bytes, stages
}

// FPRHolding is the false-positive rate of a window that holds i
// elements: its stages filled in order, each tested. With growth, past the
// chain's capacity the window only tests, so the rate stays at the full
// chain's; a lone filter takes every element.
func (p Plan) FPRHolding(i float64) float64 {
	pass := 1.0
	for k, st := range p.Stages {
		held := min(i, float64(st.Capacity))
		if k == len(p.Stages)-1 && !p.Growth() {
			held = i
		}
		if held > 0 {
			pass *= 1 - BlockedFPR(float64(st.ShardBits)*float64(p.Shards)/held, p.Layout)
		}
		i -= held
	}
	return 1 - pass
}

// GrownFPR is the bound on a window's false-positive rate holding load
// times Elements: the sum of the rates of the stages it has grown into,
// each at most its own when full. Past the capacity it is the chain's sum:
// the window is then test-only, so the rate stays there.
func (p Plan) GrownFPR(load float64) float64 {
	var held, sum float64
	for _, s := range p.Stages {
		sum += s.FPR
		held += float64(s.Capacity)
		if held >= load*float64(p.Elements) {
			break
		}
	}
	return sum
}

// Bits is the filter size m over all shards.
func (p Plan) Bits() uint64 { return p.ShardBits * uint64(p.Shards) }

// BitsPerElement is m/n.
func (p Plan) BitsPerElement() float64 { return float64(p.Bits()) / float64(p.Elements) }

// NewPlan sizes a window filter for n distinct elements at rate p.
func NewPlan(n int64, p float64, opt PlanOptions) (Plan, error) {
	if n <= 0 || n > MaxElements {
		return Plan{}, fmt.Errorf("%w: expected elements per window is %d, want 1 to %g", ErrInvalidPlan, n, float64(MaxElements))
	}
	if !(p >= MinFPR && p < 1) {
		return Plan{}, fmt.Errorf("%w: false-positive rate is %g, want at least %g and less than 1", ErrInvalidPlan, p, MinFPR)
	}
	minShards := opt.MinShards
	if minShards == 0 {
		minShards = 1
	}
	if minShards < 0 || minShards > MaxShards {
		return Plan{}, fmt.Errorf("%w: shards is %d, want 1 to %d", ErrInvalidPlan, minShards, MaxShards)
	}
	growth := opt.MaxGrowth
	if growth == 0 {
		growth = 1
	}
	if !(growth >= 1 && growth <= MaxGrowthFactor) {
		return Plan{}, fmt.Errorf("%w: growth is %g, want 1 to %d", ErrInvalidPlan, growth, MaxGrowthFactor)
	}
	factor := opt.MemoryFactor
	if factor == 0 {
		factor = DefaultMemoryFactor
	}
	if !(factor >= 1 && factor <= MaxMemoryFactor) {
		return Plan{}, fmt.Errorf("%w: memory factor is %g, want 1 to %d", ErrInvalidPlan, factor, MaxMemoryFactor)
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
	// The fewest words within the bound; failing that, the least memory.
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

// checkMemory refuses a plan whose window is over PlanOptions.MaxMemory.
func checkMemory(pl Plan, opt PlanOptions) error {
	if opt.MaxMemory > 0 && pl.Memory > opt.MaxMemory {
		return fmt.Errorf("%w: one window needs %d bytes for %d elements at rate %g, more than the %d bytes allowed; lower the expected elements or raise the rate",
			ErrInvalidPlan, pl.Memory, pl.Elements, pl.TargetFPR, opt.MaxMemory)
	}
	return nil
}

// stageCount is the stages of a window that grows to growth times n.
// Stage i >= 1 holds n(4^i - 4^(i-1)), so that stages 0..i hold 4^i n in
// all: a window 4, 16 or 64 times its plan fills its stages exactly.
func stageCount(growth float64) int {
	stages := 1
	for held := 1.0; held < growth; stages++ {
		held *= GrowthFactor
	}
	return stages
}

// stageZeroRate is the rate stage 0 is sized for: p without growth,
// StageZeroShare of it with growth.
func stageZeroRate(p, growth float64) float64 {
	if stageCount(growth) == 1 {
		return p
	}
	return p * StageZeroShare
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

// shardBytes is the bytes of the stage's keys on one shard, as made.
func (st Stage) shardBytes() uint64 { return uint64(st.Parts) * keyBytes(st.PartBits) }

// fullShardFPR is the rate of a shard's stage st holding CapacityPerShard.
func fullShardFPR(st Stage, layout Layout) float64 {
	return BlockedFPR(float64(st.ShardBits)/float64(st.CapacityPerShard), layout)
}

// keyBits sizes one key of at least bits bits (up to limit): the
// allocator's class it takes, and the bits that fill it, a multiple of
// WordBits. Filling the class costs no memory and lowers the rate.
func keyBits(bits, limit uint64) (class, filled uint64) {
	words := (bits + WordBits - 1) / WordBits
	class = allocClass((words*WordBits+7)/8 + shardOverhead)
	return class, min((class-shardOverhead)*8, limit) / WordBits * WordBits
}

// keyBytes is the length of a key of bits bits: a bitmap's last byte may
// be partly used (bits is a multiple of WordBits, which 8 does not divide).
// A key made shorter would grow, and be reallocated, by the first write to
// its last word.
func keyBytes(bits uint64) uint64 { return (bits + 7) / 8 }

// maxStagePartBits bounds one key of a stage past the first: 128 MiB.
// Each key of a stage is made in one SET, which Redis passes whole to its
// replicas, and a replica's output buffer has a hard limit of 256 MB by
// default.
const maxStagePartBits = MaxKeyBits / 4

// perShardCount is what one shard counts as its share of n elements:
// elements are spread over the shards by hash, evenly on average, with a
// standard deviation of about the square root of the share. Three of them
// are added, so that a window at its planned size does not make any shard
// grow; the shard's rate at that fill is above its target by a few
// percent of it at most for shares of thousands.
func perShardCount(n int64, shards int) int64 {
	if shards == 1 {
		return n
	}
	m := float64(n) / float64(shards)
	return int64(math.Ceil(m + 3*math.Sqrt(m)))
}

// shardOverhead is the bytes beside the bitmap in one allocation: the sds
// header and terminator, with room to spare.
const shardOverhead = 64

// allocClass is the size jemalloc (Redis's default allocator) hands out for
// a request of size bytes: above 16 KiB its classes are spaced at a quarter
// of the enclosing power of two. Filling the class costs no memory and
// lowers the false-positive rate.
func allocClass(size uint64) uint64 {
	if size <= 16<<10 {
		return (size + 15) &^ 15
	}
	// Classes in (2^k, 2^(k+1)] are 2^k + i*2^(k-2), i = 1..4.
	k := 63 - bits.LeadingZeros64(size-1)
	step := uint64(1) << (k - 2)
	return (size + step - 1) / step * step
}

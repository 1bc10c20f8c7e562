package bloom

import (
	"errors"
	"fmt"
)

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
	// choice: the one of an earlier version keeps its keys. Bloom kind
	// only.
	Layout Layout
	// Kind is what the window's filter is made of. Default: KindBloom.
	Kind Kind
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
	// Bytes is the width of a fingerprint and PartSlots the slots of one
	// part, past which each part has fpProbeLimit slots more, so that a
	// probe never leaves its key (KindFingerprint; 0 for KindBloom, whose
	// parts are PartBits long). PartBits is then PartSlots*Bytes*8.
	Bytes     int
	PartSlots uint64
}

// Plan is the sizing of one window's filter.
type Plan struct {
	Kind      Kind
	Elements  int64   // n: distinct elements expected per window
	TargetFPR float64 // p: the rate asked for
	// Layout is the Bloom kind's: words and bits per word.
	Layout Layout
	Shards int
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

// valid reports whether p has the shape NewPlan gives a plan of its kind.
func (p Plan) valid() bool {
	if p.Shards < 1 || len(p.Stages) == 0 {
		return false
	}
	if p.Kind == KindFingerprint {
		for _, st := range p.Stages {
			if st.Bytes < fpMinBytes || st.Bytes > fpMaxBytes || st.Parts < 1 || st.PartSlots < 1 ||
				st.partBytes() > MaxKeyBits/8 {
				return false
			}
		}
		return true
	}
	return p.Kind == KindBloom && p.ShardBits >= WordBits && p.ShardBits%WordBits == 0 && p.ShardBits <= MaxKeyBits &&
		p.Layout.Words >= 1 && p.Layout.Words <= MaxWords && p.Layout.BitsPerWord >= 1 && p.Layout.BitsPerWord <= WordBits
}

// counts reports whether the script counts each shard's inserts in a
// growth record: to hand over from a stage to the next, and for a
// fingerprint table, which stops inserting at fpHardLoad, always.
func (p Plan) counts() bool { return p.Growth() || p.Kind == KindFingerprint }

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
			pass *= 1 - p.stageFPR(st, held)
		}
		i -= held
	}
	return 1 - pass
}

// stageFPR is the rate of stage st of the plan holding held elements over
// all shards.
func (p Plan) stageFPR(st Stage, held float64) float64 {
	if p.Kind == KindFingerprint {
		load := held / float64(p.Shards) / float64(st.slots())
		if !p.Growth() {
			load = min(load, fpHardLoad) // past it, new elements are only tested
		}
		return FingerprintFPR(st.Bytes, load)
	}
	return BlockedFPR(float64(st.ShardBits)*float64(p.Shards)/held, p.Layout)
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
	minShards := opt.MinShards
	if minShards == 0 {
		minShards = 1
	}
	growth := opt.MaxGrowth
	if growth == 0 {
		growth = 1
	}
	for _, err := range []error{CheckElements(n), CheckFPR(p), CheckShards(minShards), CheckGrowth(growth)} {
		if err != nil {
			return Plan{}, fmt.Errorf("%w: %w", ErrInvalidPlan, err)
		}
	}
	if opt.Kind == KindFingerprint {
		if opt.Layout != (Layout{}) {
			return Plan{}, fmt.Errorf("%w: a layout of words and bits is the Bloom kind's; the fingerprint kind sizes its own", ErrInvalidPlan)
		}
		pl, err := newFingerprintPlan(n, p, minShards, growth)
		if err != nil {
			return Plan{}, err
		}
		return pl, checkMemory(pl, opt)
	}
	if opt.Kind != KindBloom {
		return Plan{}, fmt.Errorf("%w: filter kind %d", ErrInvalidPlan, opt.Kind)
	}
	return newBloomPlan(n, p, minShards, growth, opt)
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

// shardBytes is the bytes of the stage's keys on one shard, as made.
func (st Stage) shardBytes() uint64 { return uint64(st.Parts) * st.partBytes() }

// partBytes is the length of one key of the stage, as made: a bitmap's
// bits rounded up to whole bytes, or a fingerprint table's slots and its
// probe tail.
func (st Stage) partBytes() uint64 {
	if st.Bytes > 0 {
		return (st.PartSlots + fpProbeLimit) * uint64(st.Bytes)
	}
	return keyBytes(st.PartBits)
}

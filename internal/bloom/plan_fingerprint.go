package bloom

// The fingerprint kind's sizing. A shard's table of one stage holds M
// slots of b bytes; an element's home is slot floor(u*M), u in [0, 1) from
// its hash, and it is stored in the first empty slot at or after its home
// (linear probing). A lookup reads from the home to the first empty slot
// and compares its fingerprint with each slot before it. At load a (the
// share of slots used), the expected number of used slots it compares
// with is (1/(1-a)^2 - 1)/2 (Knuth's unsuccessful search, less the empty
// slot that ends it), and each matches a fingerprint it is not with
// probability 1/(2^(8b)-1) (fingerprints are never zero, which marks an
// empty slot). So the rate at load a is
//
//	fpr(b, a) = ((1/(1-a)^2 - 1) / 2) / (2^(8b) - 1)
//
// and the planner takes, for each stage, the width b and the number of
// slots whose memory as allocated is least with fpr(b, a) at most the
// stage's rate when the stage holds its capacity, and a at most
// fpMaxLoad. Tests check the formula against measured rates.

import (
	"fmt"
	"math"
)

// The fingerprint table's bounds.
const (
	// fpMaxLoad is the highest load a stage is planned to reach: there a
	// lookup compares 7.5 slots on average and finds the end of the run
	// within its first read of fpFirstRead slots 96% of the time. Measured
	// on the seed's case at 1e-6 (bloom-bench -case seed -filter
	// fingerprint -p 1e-6, Redis 7.0): at 0.8 the planner took 13 parts at
	// a load of 0.79, 3.9 bytes and 4.2 us of Redis CPU per ID; at 0.75 one
	// part at 0.73, 4.2 bytes and 4.0 us.
	fpMaxLoad = 0.75
	// fpFirstRead is how many slots a lookup reads at first; a run longer
	// than that is read on, fpFirstRead*4 slots at a time.
	fpFirstRead = 32
	// fpProbeLimit bounds a probe: an element is stored within that many
	// slots of its home, or the stage counts as full for it (at load 0.8
	// a run that long comes about once in 10^10 inserts). Every part has
	// that many slots past its own, so that a probe never leaves its key.
	fpProbeLimit = 512
	// fpMinBytes and fpMaxBytes bound a fingerprint's width: the Go side
	// sends fpMaxBytes of hash per element, a stage takes its first bytes.
	fpMinBytes = 2
	fpMaxBytes = 8
	// fpHardLoad is where a window that does not grow stops inserting
	// (its new elements are then only tested and counted, as past the
	// growth cap): the rate has grown to fpr(b, 0.9), 4 times the planned
	// one at 0.8, and probes would lengthen without bound.
	fpHardLoad = 0.9
	// fpMaxParts bounds the keys of one shard's stage: a stage takes
	// several only to fill the allocator's size classes or to keep each key
	// within maxStagePartBits.
	fpMaxParts = 64
)

// FingerprintMaxLoad is the highest load a fingerprint stage is planned
// to reach at its capacity (fpMaxLoad).
const FingerprintMaxLoad = fpMaxLoad

// FingerprintFPR is the rate of a table of b-byte fingerprints at load
// (used slots over all slots), by the formula above.
func FingerprintFPR(b int, load float64) float64 {
	if load <= 0 {
		return 0
	}
	if load >= 1 {
		return 1
	}
	compared := (1/((1-load)*(1-load)) - 1) / 2
	return compared / (math.Exp2(float64(8*b)) - 1)
}

// fpLoadFor is the highest load at which b-byte fingerprints keep rate p.
func fpLoadFor(b int, p float64) float64 {
	return 1 - 1/math.Sqrt(2*p*(math.Exp2(float64(8*b))-1)+1)
}

// newFingerprintPlan is NewPlan for the fingerprint kind, its arguments
// checked. Each stage takes the least memory that keeps its rate (see
// fingerprintStage); the shard count is the least asked for, since a
// stage larger than one key is split into parts under its shard's hash
// tag.
func newFingerprintPlan(n int64, p float64, shards int, growth float64) (Plan, error) {
	stages := stageCount(growth)
	p0 := stageZeroRate(p, growth)
	st0, ok := fingerprintStage(n, perShardCount(n, shards), p0, shards)
	if !ok {
		return Plan{}, fmt.Errorf("%w: no fingerprint table keeps rate %g for %d elements in %d keys", ErrInvalidPlan, p0, n, MaxShards)
	}
	pl := Plan{Kind: KindFingerprint, Elements: n, TargetFPR: p, Shards: shards, ShardBits: st0.ShardBits,
		AchievedFPR: FingerprintFPR(st0.Bytes, float64(n)/float64(shards)/float64(st0.slots())), Memory: st0.Memory,
		Standard: StandardSizing(n, p), Stages: []Stage{st0}}
	// The later stages share what stage 0 leaves of p when full, as the
	// Bloom kind's do.
	rest := (p - st0.FPR) * (1 - TighteningRatio) / (1 - math.Pow(TighteningRatio, float64(stages-1)))
	for i := 1; i < stages; i++ {
		capacity := n * (int64(math.Pow(GrowthFactor, float64(i))) - int64(math.Pow(GrowthFactor, float64(i-1))))
		st, ok := fingerprintStage(capacity, perShardCount(capacity, shards), rest*math.Pow(TighteningRatio, float64(i-1)), shards)
		if !ok || st.Parts*shards > MaxShards {
			break
		}
		pl.Stages = append(pl.Stages, st)
	}
	return pl, nil
}

// fingerprintStage sizes one stage holding capacity elements over shards,
// perShard on each, at rate p: for every width, the fewest slots at its
// highest load, in the number of parts whose allocation (rounded up to
// jemalloc's size classes, and then filled with slots) takes the least
// memory (partCost: a part must save half a percent); the narrower width
// wins a tie. It reports false when no width reaches p.
func fingerprintStage(capacity, perShard int64, p float64, shards int) (Stage, bool) {
	var best Stage
	for b := fpMinBytes; b <= fpMaxBytes; b++ {
		load := min(fpMaxLoad, fpLoadFor(b, p))
		if load < 0.05 {
			continue // too wide a table for this width
		}
		minSlots := uint64(math.Ceil(float64(perShard) / load))
		for parts := 1; parts <= fpMaxParts; parts++ {
			partSlots := (minSlots + uint64(parts) - 1) / uint64(parts)
			size := (partSlots+fpProbeLimit)*uint64(b) + shardOverhead
			if size > maxStagePartBits/8 {
				continue
			}
			class := allocClass(size)
			partSlots = (class-shardOverhead)/uint64(b) - fpProbeLimit
			st := Stage{Capacity: capacity, CapacityPerShard: perShard, Bytes: b, Parts: parts, PartSlots: partSlots,
				PartBits: partSlots * uint64(b) * 8, Memory: class * uint64(parts*shards)}
			st.ShardBits = st.PartBits * uint64(parts)
			st.FPR = FingerprintFPR(b, float64(perShard)/float64(st.slots()))
			if best.Bytes == 0 || partCost(st) < partCost(best) {
				best = st
			}
		}
	}
	return best, best.Bytes > 0
}

// partCost weighs a stage's memory against its parts: every part is one
// more key name in each call that reads the window (and one more key in
// the check that a stage is made), so a part must save half a percent of
// the memory to be taken.
func partCost(st Stage) float64 { return float64(st.Memory) * (1 + 0.005*float64(st.Parts)) }

// slots is the slots of the stage on one shard (fingerprint kind).
func (st Stage) slots() uint64 { return st.PartSlots * uint64(st.Parts) }

// scriptCap is the most elements the script inserts into one shard's
// stage st of a plan before it hands over to the next stage (or, past
// the last, only tests): its capacity per shard; a Bloom filter that does
// not grow takes every element, a fingerprint table that does not grow
// takes elements up to fpHardLoad.
func (p Plan) scriptCap(st int) float64 {
	switch {
	case len(p.Stages) > 1:
		return float64(p.Stages[st].CapacityPerShard)
	case p.Kind == KindFingerprint:
		return math.Floor(fpHardLoad * float64(p.Stages[0].slots()))
	}
	return math.Inf(1)
}

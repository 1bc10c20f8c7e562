package bloom

// The names of the filter's keys in Redis.

import (
	"fmt"
	"hash/fnv"
	"strconv"
)

// layoutTag names the layout in every key: a change of anything that moves
// bits or decisions (the layout, the shard size and count, the window
// length, the replay horizon, the stages' sizes and capacities) gives new
// keys instead of corrupting live ones.
func layoutTag(cfg Config, plan Plan) string {
	if plan.Kind == KindFingerprint {
		return fingerprintTag(cfg, plan)
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d/%d/%d/%d/%d", plan.Layout.Words, plan.Layout.BitsPerWord,
		plan.ShardBits, plan.Shards, cfg.Window.seconds(), cfg.ReplayHorizon)
	// A plan without growth keeps the tag it had before stages existed.
	for _, st := range plan.Stages[1:] {
		fmt.Fprintf(h, "/%d:%d", st.ShardBits, st.CapacityPerShard)
		// A stage in one key per shard keeps the tag it had before parts.
		if st.Parts > 1 {
			fmt.Fprintf(h, "x%d", st.Parts)
		}
	}
	return fmt.Sprintf("v1-%08x", h.Sum32())
}

// fingerprintTag is layoutTag for the fingerprint kind: "f1-", so that no
// key of one kind is ever read as the other's, and a hash of what places
// fingerprints and decisions: each stage's width, slots, parts and
// capacity, the shard count, the window length and the replay horizon.
func fingerprintTag(cfg Config, plan Plan) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d/%d", plan.Shards, cfg.Window.seconds(), cfg.ReplayHorizon)
	for i, st := range plan.Stages {
		fmt.Fprintf(h, "/%d:%d:%dx%d:%g", st.CapacityPerShard, st.Bytes, st.Parts, st.PartSlots, plan.scriptCap(i))
	}
	return fmt.Sprintf("f1-%08x", h.Sum32())
}

// shardPrefixes are the key prefixes of a plan's shards, each with its
// hash tag {pipeline:shard}: every key of a shard starts with one, so that
// all of them are in one Cluster slot.
func shardPrefixes(cfg Config, plan Plan, tag string) []string {
	out := make([]string, plan.Shards)
	for s := range out {
		out[s] = fmt.Sprintf("%s:{%s:%d}:%s", cfg.KeyPrefix, cfg.Pipeline, s, tag)
	}
	return out
}

// The keys of a window's plan (windowPlan): its filters, stages, parts,
// growth records and the decision records of its elements.

// filterKey is the key of one shard of bucket b.
func (w *windowPlan) filterKey(shard int, b int64) string {
	return w.prefixes[shard] + ":f:" + strconv.FormatInt(b, 10)
}

// stageKey is the key of stage st of one shard of bucket b: filterKey for
// stage 0.
func (w *windowPlan) stageKey(shard int, b int64, st int) string {
	if st == 0 {
		return w.filterKey(shard, b)
	}
	return w.filterKey(shard, b) + ":" + strconv.Itoa(st)
}

// partKey is the key of part pt of stage st of one shard of bucket b:
// stageKey for part 0. A Bloom stage's word w of the shard is in part
// w / (PartBits/WordBits), a fingerprint stage's slot s in s / PartSlots.
func (w *windowPlan) partKey(shard int, b int64, st, pt int) string {
	if pt == 0 {
		return w.stageKey(shard, b, st)
	}
	return w.stageKey(shard, b, st) + "." + strconv.Itoa(pt)
}

// stageKeys are the keys of stage st of one shard of bucket b, in part
// order.
func (w *windowPlan) stageKeys(shard int, b int64, st int) []string {
	keys := make([]string, w.plan.Stages[st].Parts)
	for pt := range keys {
		keys[pt] = w.partKey(shard, b, st, pt)
	}
	return keys
}

// growthKey is the key of one shard's growth record of bucket b: the
// stage inserts go to and the elements it holds (see the script).
func (w *windowPlan) growthKey(shard int, b int64) string { return w.filterKey(shard, b) + ":g" }

// recordKey is the key of the decision record of one shard and partition
// for the elements of windows of this plan.
func (w *windowPlan) recordKey(shard int, topic string, partition int32) string {
	return w.prefixes[shard] + ":r:" + topic + ":" + strconv.FormatInt(int64(partition), 10)
}

// shardKey is a key of shard s of the pipeline that no plan owns: s's
// hash tag and then name.
func (f *Filter) shardKey(shard int, name string) string {
	return fmt.Sprintf("%s:{%s:%d}:%s", f.cfg.KeyPrefix, f.cfg.Pipeline, shard, name)
}

// syncKey is the key of a shard that every call with Config.MinReplicas
// above zero writes after its script ("Replicas and failover" in the
// package doc says why).
func (f *Filter) syncKey(shard int) string { return f.shardKey(shard, "w") }

// markerKey is the key of a shard's marker (see lost.go).
func (f *Filter) markerKey(shard int) string { return f.shardKey(shard, "m") }

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
func layoutTag(cfg Config) string {
	if cfg.Plan.Kind == KindFingerprint {
		return fingerprintTag(cfg)
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d/%d/%d/%d/%d", cfg.Plan.Layout.Words, cfg.Plan.Layout.BitsPerWord,
		cfg.Plan.ShardBits, cfg.Plan.Shards, cfg.Window.seconds(), cfg.ReplayHorizon)
	// A plan without growth keeps the tag it had before stages existed.
	for _, st := range cfg.Plan.Stages[1:] {
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
func fingerprintTag(cfg Config) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d/%d", cfg.Plan.Shards, cfg.Window.seconds(), cfg.ReplayHorizon)
	for i, st := range cfg.Plan.Stages {
		fmt.Fprintf(h, "/%d:%d:%dx%d:%g", st.CapacityPerShard, st.Bytes, st.Parts, st.PartSlots, cfg.Plan.scriptCap(i))
	}
	return fmt.Sprintf("f1-%08x", h.Sum32())
}

// shardPrefixes are the key prefixes of the shards, each with its hash
// tag {pipeline:shard}: every key of a shard starts with one, so that all
// of them are in one Cluster slot.
func shardPrefixes(cfg Config, tag string) []string {
	out := make([]string, cfg.Plan.Shards)
	for s := range out {
		out[s] = fmt.Sprintf("%s:{%s:%d}:%s", cfg.KeyPrefix, cfg.Pipeline, s, tag)
	}
	return out
}

// Tag returns the layout tag that every key of this filter carries.
func (f *Filter) Tag() string { return f.tag }

// FilterKey is the key of one shard of bucket b.
func (f *Filter) FilterKey(shard int, b int64) string {
	return f.prefixes[shard] + ":f:" + strconv.FormatInt(b, 10)
}

// StageKey is the key of stage st of one shard of bucket b: FilterKey for
// stage 0.
func (f *Filter) StageKey(shard int, b int64, st int) string {
	if st == 0 {
		return f.FilterKey(shard, b)
	}
	return f.FilterKey(shard, b) + ":" + strconv.Itoa(st)
}

// PartKey is the key of part pt of stage st of one shard of bucket b:
// StageKey for part 0. A stage's word w of the shard is in part
// w / (PartBits/WordBits).
func (f *Filter) PartKey(shard int, b int64, st, pt int) string {
	if pt == 0 {
		return f.StageKey(shard, b, st)
	}
	return f.StageKey(shard, b, st) + "." + strconv.Itoa(pt)
}

// stageKeys are the keys of stage st of one shard of bucket b, in part
// order.
func (f *Filter) stageKeys(shard int, b int64, st int) []string {
	keys := make([]string, f.plan.Stages[st].Parts)
	for pt := range keys {
		keys[pt] = f.PartKey(shard, b, st, pt)
	}
	return keys
}

// GrowthKey is the key of one shard's growth record of bucket b: the
// stage inserts go to and the elements it holds (see the script).
func (f *Filter) GrowthKey(shard int, b int64) string { return f.FilterKey(shard, b) + ":g" }

// RecordKey is the key of the decision record of one shard and partition.
func (f *Filter) RecordKey(shard int, topic string, partition int32) string {
	return f.prefixes[shard] + ":r:" + topic + ":" + strconv.FormatInt(int64(partition), 10)
}

// SyncKey is the key of a shard that every call with Config.MinReplicas
// above zero writes after its script ("Replicas and failover" in the
// package doc says why).
func (f *Filter) SyncKey(shard int) string { return f.prefixes[shard] + ":w" }

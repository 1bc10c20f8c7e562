package bloom

import (
	"context"
	"testing"

	"dedupe-worker/internal/testenv"
)

// What Recorded reads back is what TestAndSet decided, on several shards
// and partitions; offsets not decided yet and offsets past the horizon
// read as such.
func TestRecordedMatchesVerdicts(t *testing.T) {
	t0 := testenv.Now()
	c := testenv.RedisClient(t, testenv.Redis(t))
	f := newFilter(t, c, t0, 20_000, 1e-6, func(cfg *Config) {
		p, _ := NewPlan(20_000, 1e-6, PlanOptions{MinShards: 3, Kind: testKind})
		cfg.Plan = p
		cfg.ReplayHorizon = 1024
	})
	if f.Plan().Shards < 3 {
		t.Fatalf("%d shards, want 3 or more", f.Plan().Shards)
	}
	es := stream(4000, 2, 4, t0) // two partitions of 2000 offsets, a repeat in every four
	got := runBatches(t, f, es[:3000], 250)
	rec, err := f.Recorded(context.Background(), es)
	if err != nil {
		t.Fatal(err)
	}
	// Each shard's record of a partition has its own watermark: the
	// highest offset decided in that shard, plus one.
	type rk struct {
		shard     int
		partition int32
	}
	shardOf := func(e Element) int {
		var loc location
		f.own.locate(e.ID, &loc)
		return loc.shard
	}
	marks := map[rk]int64{}
	for _, e := range es[:3000] {
		k := rk{shardOf(e), e.Source.Partition}
		marks[k] = max(marks[k], e.Source.Offset+1)
	}
	var forwards, drops, forgotten int
	for i, v := range got {
		// Offsets more than 1024 below the watermark are forgotten.
		want := Forgotten
		if es[i].Source.Offset >= marks[rk{shardOf(es[i]), es[i].Source.Partition}]-1024 {
			want = RecordedDrop
			if v.Forward() {
				want = RecordedForward
			}
		}
		if rec[i] != want {
			t.Fatalf("element %d (partition %d offset %d, verdict %v): recorded %v, want %v",
				i, es[i].Source.Partition, es[i].Source.Offset, v, rec[i], want)
		}
		switch rec[i] {
		case RecordedForward:
			forwards++
		case RecordedDrop:
			drops++
		case Forgotten:
			forgotten++
		}
	}
	if forwards == 0 || drops == 0 || forgotten == 0 {
		t.Fatalf("%d forwards, %d drops and %d forgotten read back: a case is not exercised", forwards, drops, forgotten)
	}
	for i := 3000; i < len(es); i++ {
		if rec[i] != NotDecided {
			t.Fatalf("element %d, never decided: recorded %v", i, rec[i])
		}
	}
}

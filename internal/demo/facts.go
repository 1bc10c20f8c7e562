package demo

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/redisproc"
)

// redisFacts fills in the memory and the filter statistics.
func redisFacts(ctx context.Context, rc redis.UniversalClient, f *bloom.Filter, o Options, tr *truth, res *Result, memBefore int64) error {
	memAfter, err := usedMemory(ctx, rc)
	if err != nil {
		return err
	}
	res.UsedMemoryGrowth = memAfter - memBefore
	w := bloom.Window{Length: o.Window, Mode: bloom.Rolling}
	var newest int64
	shards := f.Plan().Shards
	for b := range tr.perBucket(o.Window) {
		newest = max(newest, b)
		// The stages each shard inserts into and those before it: the
		// keys holding the run's IDs (a stage made ahead holds none).
		st, err := f.Stats(ctx, w.Start(b))
		if err != nil {
			return err
		}
		for _, x := range st {
			if x.Bucket != b || !x.Exists {
				continue // the bucket before, or expired already: a window shorter than the run
			}
			res.FilterKeyBytes += x.Memory
			res.FilterKeys += x.Keys
			for stage := range max(x.Stages, 1) {
				res.PlannedKeyBytes += int64(f.Plan().Stages[stage].Memory) / int64(shards)
			}
		}
	}
	// The newest bucket's shards come first.
	st, err := f.Stats(ctx, w.Start(newest))
	if err != nil {
		return err
	}
	var set, all uint64
	for _, x := range st[:min(shards, len(st))] {
		res.Stages = max(res.Stages, x.Stages)
		res.Overfilled += x.Overfilled
		res.TestOnly += x.TestOnly
		set += x.BitsSet
		all += x.Bits
		res.EstElements += x.Elements
		res.EstFPR += x.FPR / float64(shards)
	}
	if all > 0 {
		res.Fill = float64(set) / float64(all)
	}
	return nil
}

func usedMemory(ctx context.Context, rc redis.UniversalClient) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return redisproc.UsedMemory(ctx, rc)
}

package bloom

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// ShardStats describes one shard of one window bucket, read from Redis.
type ShardStats struct {
	Bucket int64
	Start  time.Time // first instant of the bucket
	Shard  int
	Key    string
	Exists bool
	Bits   uint64 // m of the shard
	// BitsSet is X, the set bits (BITCOUNT).
	BitsSet uint64
	// Fill is X/m.
	Fill float64
	// Elements is the estimate n* = -(m/k) ln(1 - X/m). Every element sets
	// each bit with probability k/m in this layout as in a classic filter,
	// so the classic estimate holds.
	Elements float64
	// FPR is the false-positive rate at the estimated count, by the
	// layout's own formula.
	FPR float64
	// TTL is the time the key has left.
	TTL time.Duration
	// Memory is what Redis reports for the key (MEMORY USAGE), 0 if that
	// command is not allowed.
	Memory int64
}

// Stats reads every shard of the bucket of t and of the bucket before it.
// BITCOUNT reads the whole key: call it for monitoring, not per batch.
func (f *Filter) Stats(ctx context.Context, t time.Time) ([]ShardStats, error) {
	b := f.cfg.Windows.Bucket(t)
	var out []ShardStats
	for _, bucket := range []int64{b, b - 1} {
		for s := 0; s < f.plan.Shards; s++ {
			st, err := f.shardStats(ctx, bucket, s)
			if err != nil {
				return nil, err
			}
			out = append(out, st)
		}
	}
	return out, nil
}

func (f *Filter) shardStats(ctx context.Context, bucket int64, shard int) (ShardStats, error) {
	key := f.FilterKey(shard, bucket)
	st := ShardStats{Bucket: bucket, Start: f.cfg.Windows.Start(bucket), Shard: shard, Key: key, Bits: f.plan.ShardBits}
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	var count *redis.IntCmd
	var ttl *redis.DurationCmd
	var mem *redis.IntCmd
	// Pipelined per key; on a Cluster all three go to the key's node.
	_, err := f.client.Pipelined(cctx, func(p redis.Pipeliner) error {
		count = p.BitCount(cctx, key, nil)
		ttl = p.PTTL(cctx, key)
		mem = p.MemoryUsage(cctx, key)
		return nil
	})
	if err != nil && count.Err() != nil {
		return st, fmt.Errorf("%w: reading stats of %s: %w", ErrRedis, key, count.Err())
	}
	if ttl.Err() != nil {
		return st, fmt.Errorf("%w: reading TTL of %s: %w", ErrRedis, key, ttl.Err())
	}
	st.BitsSet = uint64(count.Val())
	st.TTL = ttl.Val()
	st.Exists = st.TTL != -2 // PTTL of a missing key
	if st.TTL < 0 {
		st.TTL = 0
	}
	st.Memory = mem.Val()
	m := float64(st.Bits)
	k := float64(f.plan.Layout.Hashes())
	st.Fill = float64(st.BitsSet) / m
	st.Elements = -(m / k) * math.Log1p(-st.Fill)
	if st.Elements > 0 {
		// The plan's rate is for the whole window; shards share it evenly.
		st.FPR = BlockedFPR(m/st.Elements, f.plan.Layout)
	}
	return st, nil
}

package bloom

import (
	"context"
	"fmt"
	"math"
	"time"
)

// ShardStats describes one shard of one window bucket, read from Redis.
type ShardStats struct {
	Bucket int64
	Start  time.Time // first instant of the bucket
	Shard  int
	Key    string
	// Kind is the kind of the window's plan (a window keeps the plan it
	// was made with); Keys the keys read, every part of every stage.
	Kind   Kind
	Keys   int
	Exists bool
	// Missing: the key is absent although its window is due to live (it
	// has begun and not expired): lost (see Maintain), or made by no
	// replica because none ran then.
	Missing bool
	Bits    uint64 // m of the shard
	// BitsSet is X, the set bits (BITCOUNT; Bloom kind only).
	BitsSet uint64
	// Fill is X/m.
	Fill float64
	// Elements is the estimate n* = -(m/k) ln(1 - X/m) (Bloom kind: every
	// element sets each bit with probability k/m in this layout as in a
	// classic filter, so the classic estimate holds), or the count the
	// growth record keeps (fingerprint kind, exact).
	Elements float64
	// FPR is the false-positive rate at the estimated count, by the
	// layout's own formula.
	FPR float64
	// TTL is the time the key has left.
	TTL time.Duration
	// Memory is what Redis reports for the key (MEMORY USAGE), 0 if that
	// command is not allowed.
	Memory int64
	// Stages is how many stages the window has grown into (1 without
	// growth); Elements, FPR and Memory sum over them, Fill is the newest
	// stage's. Overfilled and TestOnly are from the growth record.
	Stages               int
	Overfilled, TestOnly int64
}

// Stats reads every shard of the bucket of t and of the bucket before it.
// BITCOUNT reads the whole key: call it for monitoring, not per batch.
func (f *Filter) Stats(ctx context.Context, t time.Time) ([]ShardStats, error) {
	b := f.cfg.Window.Bucket(t)
	var out []ShardStats
	for _, bucket := range []int64{b, b - 1} {
		wp, err := f.planOf(ctx, bucket, false)
		if err != nil {
			return nil, err
		}
		for s := 0; s < wp.plan.Shards; s++ {
			st, err := f.shardStats(ctx, wp, bucket, s)
			if err != nil {
				return nil, err
			}
			out = append(out, st)
		}
	}
	return out, nil
}

func (f *Filter) shardStats(ctx context.Context, wp *windowPlan, bucket int64, shard int) (ShardStats, error) {
	key := wp.filterKey(shard, bucket)
	st := ShardStats{Bucket: bucket, Start: f.cfg.Window.Start(bucket), Shard: shard, Key: key, Kind: wp.plan.Kind, Bits: wp.plan.ShardBits, Stages: 1}
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	ttl, err := f.client.PTTL(cctx, key).Result()
	if err != nil {
		return st, fmt.Errorf("%w: reading TTL of %s: %w", ErrRedis, key, err)
	}
	st.TTL = max(ttl, 0)
	st.Exists = ttl != -2 // PTTL of a missing key
	st.Missing = !st.Exists && f.alive(bucket)
	if !st.Exists {
		return st, nil
	}
	f.lost.saw(shardBucket{shard, bucket})
	g := Growth{}
	if wp.plan.counts() {
		if g, err = f.growth(ctx, wp, shard, bucket); err != nil {
			return st, err
		}
	}
	st.Stages, st.Overfilled, st.TestOnly = g.Stage+1, g.Overfilled, g.TestOnly
	st.Bits = 0
	for i := 0; i <= g.Stage && i < len(wp.plan.Stages); i++ {
		stage := wp.plan.Stages[i]
		var set, used int64
		for _, sk := range wp.stageKeys(shard, bucket, i) {
			st.Keys++
			cctx, cancel := f.callCtx(ctx)
			if wp.plan.Kind == KindBloom {
				c, err := f.client.BitCount(cctx, sk, nil).Result()
				if err != nil {
					cancel()
					return st, fmt.Errorf("%w: reading stats of %s: %w", ErrRedis, sk, err)
				}
				set += c
			}
			u, _ := f.client.MemoryUsage(cctx, sk).Result() // 0 where the command is not allowed
			cancel()
			used += u
		}
		var fill, elems, fpr float64
		if wp.plan.Kind == KindFingerprint {
			// Counted exactly: a full stage holds its capacity, the newest
			// what its record says.
			held := float64(stage.CapacityPerShard)
			if i == g.Stage {
				held = float64(g.Held)
			}
			fill, elems = held/float64(stage.slots()), held
			fpr = FingerprintFPR(stage.Bytes, fill)
		} else {
			fill, elems, fpr = estimate(wp.plan.Layout, uint64(set), stage.ShardBits)
		}
		st.Fill, st.Elements, st.FPR, st.Memory = fill, st.Elements+elems, st.FPR+fpr, st.Memory+used
		st.BitsSet += uint64(set)
		st.Bits += stage.ShardBits
	}
	return st, nil
}

// estimate gives, for a Bloom key of m bits of layout l with set bits
// set, its fill, the elements it holds, n* = -(m/k) ln(1 - X/m) (every
// element sets each bit with probability k/m in this layout as in a
// classic filter, so the classic estimate holds), and its false-positive
// rate at n* by the layout's own formula.
func estimate(l Layout, set, bits uint64) (fill, elements, fpr float64) {
	m := float64(bits)
	fill = float64(set) / m
	elements = -(m / float64(l.Hashes())) * math.Log1p(-fill)
	if elements > 0 {
		fpr = BlockedFPR(m/elements, l)
	}
	return fill, elements, fpr
}

package bloom

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Preallocate creates the keys of the bucket of t at full size with their
// TTL, unless they exist. Growing a string of hundreds of megabytes stalls
// Redis; doing it ahead of the bucket's first event keeps the stall off the
// hot path, and a key made in one piece takes no more memory than its size
// class. Each shard's key is sent as a zero-filled value.
func (f *Filter) Preallocate(ctx context.Context, t time.Time) error {
	b := f.cfg.Window.Bucket(t)
	exp := time.Unix(f.cfg.Window.ExpireAt(b), 0)
	if !exp.After(f.cfg.Now()) {
		return nil
	}
	var zeros []byte
	for s := 0; s < f.plan.Shards; s++ {
		key := f.FilterKey(s, b)
		cctx, cancel := f.callCtx(ctx)
		n, err := f.client.Exists(cctx, key).Result()
		cancel()
		if err != nil {
			return fmt.Errorf("%w: checking %s: %w", ErrRedis, key, err)
		}
		if n == 1 {
			continue
		}
		if zeros == nil {
			zeros = make([]byte, keyBytes(f.plan.ShardBits))
		}
		cctx, cancel = f.callCtx(ctx)
		err = f.client.SetArgs(cctx, key, zeros, redis.SetArgs{Mode: "NX", ExpireAt: exp}).Err()
		cancel()
		if err != nil && err != redis.Nil {
			return fmt.Errorf("%w: preallocating %s: %w", ErrRedis, key, err)
		}
	}
	return nil
}

// preallocatePasses is how many maintenance passes a bucket's keys are
// made ahead of its start: two passes may fail and the third still makes
// them in time.
const preallocatePasses = 3

// PreallocateLead is how long before a bucket starts the maintenance makes
// its keys (Preallocate): preallocatePasses of its slow passes (each at
// most slowEvery plus growEvery apart) plus the time making every shard of
// the bucket may take, one after the other (the call time-out plus 100 ms
// per MiB each, as for a stage), and at most the window's length. Made
// earlier, the next bucket's memory is held for nothing: a daily window
// made a day ahead holds two windows all day.
func PreallocateLead(p Plan, w Window, callTimeout time.Duration) time.Duration {
	lead := preallocatePasses*(slowEvery+growEvery) + time.Duration(p.Shards)*makeTimeout(callTimeout, keyBytes(p.ShardBits))
	return min(lead, w.Length)
}

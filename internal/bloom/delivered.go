package bloom

// Delivered marks: after a caller's output for a batch is acknowledged,
// every decision record the batch read learns that its partition was
// delivered up to there, so that a replay of those offsets (read again by
// another replica after a rebalance, before the commit) is committed
// without being forwarded again. The package doc tells the contract under
// "Delivered marks".

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

//go:embed lua/delivered.lua
var deliveredSource string

var deliveredScript = redis.NewScript(deliveredSource)

// homeShard is the shard of a partition's home record under this plan:
// the record every Delivered writes and every probe reads.
func (w *windowPlan) homeShard(partition int32) int {
	return int(partition) % w.plan.Shards
}

// Delivered raises the delivered mark of every partition in upTo to one
// past its offset there (the highest offset of the batch the caller
// delivered, dead letters and skipped replays included), in each decision
// record d read for that partition and in the partition's home record. It
// never lowers a mark. The caller calls it once the batch's output is
// acknowledged and before its offsets are committed; one call per shard
// touched (one in all on a single server). It writes no filter and waits
// for no replica: a mark lost in a failover only lets a replay be
// forwarded again, as before marks.
func (f *Filter) Delivered(ctx context.Context, d Decision, upTo []Source) error {
	if len(upTo) == 0 {
		return nil
	}
	type mark struct {
		key string
		at  int64
	}
	// marks per shard, each key once.
	byShard := map[int][]mark{}
	seen := map[string]bool{}
	add := func(shard int, key string, at int64) {
		if !seen[key] {
			seen[key] = true
			byShard[shard] = append(byShard[shard], mark{key, at})
		}
	}
	for _, src := range upTo {
		if src.Topic == "" || src.Partition < 0 || src.Offset < 0 || src.Offset > MaxOffset {
			return fmt.Errorf("%w: delivered up to %v, want a topic, a partition >= 0 and an offset from 0 to 2^52-1", ErrInvalidElement, src)
		}
		for _, r := range d.records {
			if r.topic == src.Topic && r.partition == src.Partition {
				add(r.shard, r.wp.recordKey(r.shard, r.topic, r.partition), src.Offset+1)
			}
		}
		home := f.own.homeShard(src.Partition)
		add(home, f.own.recordKey(home, src.Topic, src.Partition), src.Offset+1)
	}
	w := f.cfg.Window
	expire := strconv.FormatInt(f.cfg.Now().Unix()+int64((w.Retention()+w.Length)/time.Second), 10)
	bit := strconv.FormatInt(deliveredBit(f.cfg.ReplayHorizon), 10)
	call := func(ctx context.Context, marks []mark) error {
		keys := make([]string, len(marks))
		argv := make([]any, 2, 2+len(marks))
		argv[0], argv[1] = bit, expire
		for i, m := range marks {
			keys[i] = m.key
			argv = append(argv, strconv.FormatInt(m.at, 10))
		}
		cctx, cancel := f.callCtx(ctx)
		defer cancel()
		if err := deliveredScript.Run(cctx, f.client, keys, argv...).Err(); err != nil {
			return fmt.Errorf("%w: marking %d decision records delivered: %w", ErrRedis, len(keys), err)
		}
		return nil
	}
	if !f.cluster {
		var all []mark
		for _, ms := range byShard {
			all = append(all, ms...)
		}
		return call(ctx, all)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, ms := range byShard {
		g.Go(func() error { return call(gctx, ms) })
	}
	return g.Wait()
}

// Ping asks the server, or every master of a Cluster, for an answer within
// the call timeout: whether the filter can be reached at all, for a caller
// that has nothing to decide.
func (f *Filter) Ping(ctx context.Context) error {
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	if cc, ok := f.client.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(cctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() })
		if err != nil {
			return fmt.Errorf("%w: ping: %w", ErrRedis, err)
		}
		return nil
	}
	if err := f.client.Ping(cctx).Err(); err != nil {
		return fmt.Errorf("%w: ping: %w", ErrRedis, err)
	}
	return nil
}

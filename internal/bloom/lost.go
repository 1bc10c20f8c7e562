package bloom

// Windows whose keys were lost: a Redis server restarted without
// persistence, a replica promoted before it had caught up, a FLUSHALL. The
// next batch would quietly make the missing window again and duplicates
// would pass until it refilled; this is how the loss is noticed instead.
//
// A replica remembers the windows it saw made (the stage 0 key of a shard
// of a bucket, made or found by the maintenance or made by a batch) and,
// per shard, a marker key holding a random token, made once (SET NX) and
// kept alive by every replica's maintenance. A window that this replica
// saw made is lost when, before its keys were due to expire:
//   - the shard's marker is gone or holds another token: the server lost
//     its data (every window this replica saw on that shard is lost);
//   - its stage 0 key is missing;
//   - a batch or the maintenance makes its stage 0 again.
// Each loss is counted per server and logged once, naming the server and
// the windows. Every replica that saw the windows counts the loss.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// lostWatch is what a replica saw of its windows and markers.
type lostWatch struct {
	mu sync.Mutex
	// seen holds the windows this replica saw made, and when it first saw
	// each.
	seen map[shardBucket]time.Time
	// markers holds, per shard, the marker token last read.
	markers map[int]string
}

// saw notes that sb's stage 0 exists, and when, the first time.
func (w *lostWatch) saw(sb shardBucket) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == nil {
		w.seen = map[shardBucket]time.Time{}
	}
	if _, ok := w.seen[sb]; !ok {
		w.seen[sb] = time.Now()
	}
}

// madeAgain reports whether sb, which this replica has just made, was
// seen made before it began making it (before) and is still due to live
// (alive): its keys were lost. It then forgets it. A sighting since
// before is another of this replica's goroutines finding the key just
// made, not a loss.
func (w *lostWatch) madeAgain(sb shardBucket, before time.Time, alive func(b int64) bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.seen[sb]
	if !ok || !at.Before(before) {
		return false
	}
	delete(w.seen, sb)
	return alive(sb.bucket)
}

// forget drops the windows of shard that were seen made, are still due to
// live at least until alive, and pass keep; it returns their buckets.
// keep nil drops all of them.
func (w *lostWatch) forget(shard int, alive func(b int64) bool, keep func(b int64) bool) []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []int64
	for sb := range w.seen {
		if sb.shard != shard {
			continue
		}
		if !alive(sb.bucket) {
			delete(w.seen, sb) // expired as planned
			continue
		}
		if keep == nil || !keep(sb.bucket) {
			delete(w.seen, sb)
			out = append(out, sb.bucket)
		}
	}
	slices.Sort(out)
	return out
}

// shards is the shards to look at: those of own plan, and any shard a
// window seen made has past them (a window of another plan).
func (w *lostWatch) shards(own int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := own
	for sb := range w.seen {
		n = max(n, sb.shard+1)
	}
	return n
}

// windows lists the buckets of shard seen made.
func (w *lostWatch) windows(shard int) []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []int64
	for sb := range w.seen {
		if sb.shard == shard {
			out = append(out, sb.bucket)
		}
	}
	slices.Sort(out)
	return out
}

// alive reports whether bucket b's keys are due to live on, with room for
// the clocks' skew: a key that Redis expired by a clock ahead of this
// replica's is not a loss.
func (f *Filter) alive(b int64) bool {
	return time.Unix(f.cfg.Window.ExpireAt(b), 0).After(f.cfg.Now().Add(f.cfg.MaxClockSkew))
}

// markerTTL is how long a marker lives without a maintenance pass: as long
// as the keys it vouches for, and at least an hour.
func (f *Filter) markerTTL() time.Duration {
	return max(f.cfg.Window.Retention()+f.cfg.Window.Length, time.Hour)
}

// windowMade counts a window (one shard's stage 0) made by by, whose
// making began took ago, and reports it lost if this replica had seen it
// made before that.
func (f *Filter) windowMade(ctx context.Context, sb shardBucket, by maker, took time.Duration) {
	if o := f.obs.Load(); o != nil {
		o.g.windowsMade.WithLabelValues(by.String()).Inc()
		if by == byBatch {
			o.log.Info("a batch made the window it needed: the maintenance had not made it (a backlog, an event ahead of the clock, or preallocation behind)",
				zap.Time("window", f.cfg.Window.Start(sb.bucket)), zap.Int("shard", sb.shard), zap.Duration("took", took))
		}
	}
	if f.lost.madeAgain(sb, time.Now().Add(-took), f.alive) {
		f.reportLost(ctx, sb.shard, f.checkMarker(ctx, sb.shard, []int64{sb.bucket}), "a window already made was made again")
	}
	f.lost.saw(sb)
}

// checkMarker reads shard's marker, makes it if missing and keeps it
// alive. When it is not the one this replica read last, the server lost
// its data: every window of the shard seen made is lost, and is returned
// with also. Errors are returned as is; the marker then stays unknown.
func (f *Filter) checkMarker(ctx context.Context, shard int, also []int64) []int64 {
	lost, _ := f.readMarker(ctx, shard)
	for _, b := range also {
		if !slices.Contains(lost, b) {
			lost = append(lost, b)
		}
	}
	slices.Sort(lost)
	return lost
}

// readMarker is checkMarker's call: it returns the windows the marker
// says are lost.
func (f *Filter) readMarker(ctx context.Context, shard int) ([]int64, error) {
	key := f.markerKey(shard)
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	tok, err := f.client.Get(cctx, key).Result()
	if err == redis.Nil {
		b := make([]byte, 8)
		rand.Read(b)
		if err := f.client.SetNX(cctx, key, hex.EncodeToString(b), f.markerTTL()).Err(); err != nil {
			return nil, fmt.Errorf("%w: making %s: %w", ErrRedis, key, err)
		}
		// Another replica may have made it first.
		tok, err = f.client.Get(cctx, key).Result()
	} else if err == nil {
		// EXPIREAT, which the worker's ACL allows for the script's keys.
		err = f.client.ExpireAt(cctx, key, time.Now().Add(f.markerTTL())).Err()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %w", ErrRedis, key, err)
	}
	f.lost.mu.Lock()
	if f.lost.markers == nil {
		f.lost.markers = map[int]string{}
	}
	known := f.lost.markers[shard]
	f.lost.markers[shard] = tok
	f.lost.mu.Unlock()
	if known == "" || known == tok {
		return nil, nil
	}
	return f.lost.forget(shard, f.alive, nil), nil
}

// watchLost is the maintenance's look for lost keys: every shard's marker,
// and the stage 0 key of every window this replica saw made and that is
// still due to live. It returns the first error; the other shards are
// still looked at.
func (f *Filter) watchLost(ctx context.Context) error {
	var errs []error
	for s := range f.lost.shards(f.own.plan.Shards) {
		lost, err := f.readMarker(ctx, s)
		if err != nil {
			errs = append(errs, err)
		}
		bs := f.lost.windows(s)
		if len(bs) > 0 {
			missing, err := f.missingWindows(ctx, s, bs)
			if err != nil {
				errs = append(errs, err)
			}
			lost = append(lost, f.lost.forget(s, f.alive, func(b int64) bool { return !slices.Contains(missing, b) })...)
		}
		if len(lost) > 0 {
			slices.Sort(lost)
			f.reportLost(ctx, s, slices.Compact(lost), "the shard's marker or window keys are gone")
		}
	}
	return errors.Join(errs...)
}

// missingWindows returns the buckets of bs whose stage 0 key of shard is
// missing, in one pipeline (the keys share the shard's slot).
func (f *Filter) missingWindows(ctx context.Context, shard int, bs []int64) ([]int64, error) {
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	keys := make([]string, len(bs))
	for i, b := range bs {
		wp, err := f.planOf(ctx, b, false)
		if err != nil {
			return nil, err
		}
		keys[i] = wp.filterKey(shard, b)
	}
	cmds := make([]*redis.IntCmd, len(bs))
	_, err := f.client.Pipelined(cctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Exists(cctx, k)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: looking for the windows of shard %d: %w", ErrRedis, shard, err)
	}
	var out []int64
	for i, c := range cmds {
		if c.Val() == 0 {
			out = append(out, bs[i])
		}
	}
	return out, nil
}

// reportLost counts and logs, once, windows of shard found lost.
func (f *Filter) reportLost(ctx context.Context, shard int, buckets []int64, why string) {
	if len(buckets) == 0 {
		return
	}
	f.stats.lost.Add(int64(len(buckets)))
	o := f.obs.Load()
	if o == nil {
		return
	}
	server := f.serverOf(ctx, shard)
	o.g.keysLost.WithLabelValues(server).Add(float64(len(buckets)))
	starts := make([]time.Time, len(buckets))
	for i, b := range buckets {
		starts[i] = f.cfg.Window.Start(b)
	}
	o.log.Error("filter keys lost: duplicates of the events these windows held pass until the windows expire; check whether the Redis server restarted without persistence, was flushed, or failed over to a replica that had not caught up",
		zap.String("server", server), zap.Int("shard", shard), zap.Times("windows", starts), zap.String("found", why))
}

// serverOf names the server that holds shard's keys: the client's address,
// or on a Cluster the master serving the shard's slot ("unknown" when
// the slot map cannot say).
func (f *Filter) serverOf(ctx context.Context, shard int) string {
	if cc, ok := f.client.(*redis.ClusterClient); ok {
		cctx, cancel := f.callCtx(ctx)
		defer cancel()
		node, err := cc.MasterForKey(cctx, f.markerKey(shard))
		if err != nil {
			return "unknown"
		}
		return node.Options().Addr
	}
	return f.client.(*redis.Client).Options().Addr
}

func (m maker) String() string {
	if m == byBatch {
		return "batch"
	}
	return "maintenance"
}

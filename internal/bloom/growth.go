package bloom

// Growth past the plan (see Growth in the package doc): stages made ahead
// of need, the wait of a batch that needs a stage not made yet, and what a
// shard's growth record says.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// ErrGrowthWait is returned by TestAndSet when a stage its batch needs was
// not made within Config.GrowthWait. Nothing of the batch was decided or
// written: calling again is safe, and waits again.
var ErrGrowthWait = errors.New("the next stage of a growing window was not made in time")

// The lead of a stage: it is asked for once the stage before has room
// for no more than the rate at which that one fills times the lead.
// leadBase covers the reply reaching the maker and the calls around the
// SET (a batch that waited for a small stage waited about 10 ms in all);
// leadPerMiB the SET itself, per MiB of the stage over all shards (made
// one shard after another). A SET of 128 MiB took 75 to 97 ms on the
// development machine, about 0.7 ms per MiB: leadPerMiB is about 3 times
// that, for a loaded server. A longer lead makes fewer batches wait and
// more windows pay for a stage they may not fill: a lead too short costs
// a wait, bounded and counted, not a duplicate.
const (
	leadBase   = 100 * time.Millisecond
	leadPerMiB = 2 * time.Millisecond
)

// StageLead is how long before stage st is needed it is asked for, at the
// rate at which the stage before it fills.
func StageLead(st Stage) time.Duration {
	return leadBase + time.Duration(st.Memory>>20)*leadPerMiB
}

// makeTimeout bounds the making of one key of size bytes: a
// stage of hundreds of MiB takes a while to send (100 ms per MiB is a
// link of 10 MB/s).
func makeTimeout(callTimeout time.Duration, size uint64) time.Duration {
	return callTimeout + time.Duration(size>>20)*100*time.Millisecond
}

// stageMakeTimeout bounds the making of one shard's stage st: its parts,
// one after the other.
func stageMakeTimeout(callTimeout time.Duration, st Stage) time.Duration {
	return time.Duration(st.Parts) * makeTimeout(callTimeout, st.partBytes())
}

// stageRef names one stage of one shard of a bucket.
type stageRef struct {
	bucket int64
	shard  int
	stage  int
}

// ShardStage is one stage of one shard of a bucket, made.
type ShardStage struct {
	Bucket int64
	Shard  int
	Stage  int
	Bytes  uint64
}

// makeResult is what makeStage found.
type makeResult int

const (
	stageExists makeResult = iota // made before
	stageMade                     // made by this call
	stageBusy                     // another maker holds its lock
)

// maker says who makes a stage: the maintenance, ahead of need
// (Preallocate for stage 0, Grow for the others), or a batch that needed it.
type maker uint8

const (
	byMaintenance maker = iota
	byBatch
)

// makeStage makes one shard's stage of a bucket: each of its parts, in
// order (makePart). The stage is made once every part is: it is busy while
// another maker holds a part's lock, and made when this call made a part
// (and counted as made by this replica when that part is part 0).
// Stage 0 is the window itself: a stage 0 made where this replica had seen
// it made before is a window whose keys were lost (noteRemade).
func (f *Filter) makeStage(ctx context.Context, r stageRef, by maker) (makeResult, error) {
	start := time.Now()
	wp, err := f.planOf(ctx, r.bucket, true)
	if err != nil {
		return 0, err
	}
	// A stage of several parts may be made by several makers together, a
	// part each: it counts as made by the maker of its part 0, so that
	// the replicas' counts add up to the stages made.
	res, first, made := stageExists, stageExists, 0
	for pt := range wp.plan.Stages[r.stage].Parts {
		got, err := f.makePart(ctx, wp, r, pt)
		if err != nil {
			return 0, err
		}
		if got == stageMade {
			made++
		}
		if pt == 0 {
			first = got
		}
		res = max(res, got)
	}
	sb := shardBucket{r.shard, r.bucket}
	switch {
	case r.stage == 0 && first == stageMade:
		f.windowMade(ctx, sb, by, time.Since(start))
	case r.stage == 0 && res == stageExists:
		f.lost.saw(sb)
	case first == stageMade:
		f.stats.made.Add(1)
		if o := f.obs.Load(); o != nil {
			o.g.grown.Inc()
			st := wp.plan.Stages[r.stage]
			o.log.Info("window grew: next stage made", zap.Time("window", f.cfg.Window.Start(r.bucket)), zap.Int("shard", r.shard),
				zap.Int("stage", r.stage), zap.Int("parts", made), zap.Uint64("bytes", uint64(made)*st.partBytes()), zap.Duration("took", time.Since(start)))
		}
	}
	return res, nil
}

// makePart makes one part of one shard's stage of a bucket whole, in one
// SET NX with the bucket's expiry, unless it exists or another maker holds
// its lock. Redis reads a large argument into its own buffer as it
// arrives, between other clients' commands, and keeps that buffer as the
// value, so no command stalls on the allocation. One maker per part:
// makers that find it missing together would each send the whole value,
// which Redis buffers in full before the NX refuses it; the lock expires
// once the maker would have given up. A stage whose bucket has expired is
// not made (reported as existing: nothing is to be waited for).
func (f *Filter) makePart(ctx context.Context, wp *windowPlan, r stageRef, pt int) (makeResult, error) {
	exp := time.Unix(f.cfg.Window.ExpireAt(r.bucket), 0)
	if !exp.After(f.cfg.Now()) {
		return stageExists, nil
	}
	key := wp.partKey(r.shard, r.bucket, r.stage, pt)
	cctx, cancel := f.callCtx(ctx)
	n, err := f.client.Exists(cctx, key).Result()
	cancel()
	if err != nil {
		return 0, fmt.Errorf("%w: checking %s: %w", ErrRedis, key, err)
	}
	if n == 1 {
		return stageExists, nil
	}
	size := wp.plan.Stages[r.stage].partBytes()
	timeout := makeTimeout(f.cfg.CallTimeout, size)
	cctx, cancel = f.callCtx(ctx)
	// The lock outlives the SET's own time-out, which starts after it.
	locked, err := f.client.SetNX(cctx, key+":making", 1, timeout+f.cfg.CallTimeout).Result()
	cancel()
	if err != nil {
		return 0, fmt.Errorf("%w: locking %s: %w", ErrRedis, key, err)
	}
	if !locked {
		return stageBusy, nil
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	ok, err := f.client.SetArgs(sctx, key, make([]byte, size), redis.SetArgs{Mode: "NX", ExpireAt: exp}).Result()
	cancel()
	if err != nil && err != redis.Nil {
		// Another maker may try at once.
		dctx, cancel := f.callCtx(context.WithoutCancel(ctx))
		f.client.Del(dctx, key+":making")
		cancel()
		return 0, fmt.Errorf("%w: making stage %d of %s: %w", ErrRedis, r.stage, wp.filterKey(r.shard, r.bucket), err)
	}
	if ok != "OK" {
		return stageExists, nil
	}
	return stageMade, nil
}

// Grow makes the stages the test-and-sets asked for ahead of need (see
// GrowthWanted), then looks, for every bucket from the one of t less the
// lag bound and one window to the one of t, and every shard, for a newest
// stage that is full or whose growth record asks for the next stage, and
// makes that next stage. A stage is asked for once the room left in the
// stage before is at most what the rate it fills at inserts in the new
// stage's lead (StageLead): windows that grow fast get their stages
// early, windows filled over their length get them at most a lead before
// they are full, and a window that stays below its boundary by more than
// that never pays the memory. It returns the stages it made; on an error
// it returns those made before it.
func (f *Filter) Grow(ctx context.Context, t time.Time) ([]ShardStage, error) {
	made, err := f.makeWanted(ctx)
	if err != nil {
		return made, err
	}
	w := f.cfg.Window
	for b := w.Bucket(t.Add(-w.MaxLag - w.Length)); b <= w.Bucket(t.Add(f.cfg.MaxFutureSkew)); b++ {
		if !time.Unix(w.ExpireAt(b), 0).After(f.cfg.Now()) {
			continue
		}
		wp, err := f.planOf(ctx, b, false)
		if err != nil {
			return made, err
		}
		if !wp.plan.Growth() {
			continue
		}
		for s := 0; s < wp.plan.Shards; s++ {
			g, err := f.growth(ctx, wp, s, b)
			if err != nil {
				return made, err
			}
			next := g.Stage + 1
			if next >= len(wp.plan.Stages) || (g.Held < wp.plan.Stages[g.Stage].CapacityPerShard && g.Wanted < next) {
				continue
			}
			r := stageRef{bucket: b, shard: s, stage: next}
			res, err := f.makeStage(ctx, r, byMaintenance)
			if err != nil {
				return made, err
			}
			if res == stageMade {
				made = append(made, ShardStage{Bucket: b, Shard: s, Stage: next, Bytes: wp.plan.Stages[next].shardBytes()})
			}
		}
	}
	return made, nil
}

// makeWanted makes the stages calls asked for ahead of need since it last
// ran. A stage another maker holds is left to it; on an error the rest
// are left to the next scan of Grow, which finds them in the growth
// records.
func (f *Filter) makeWanted(ctx context.Context) ([]ShardStage, error) {
	f.pendingMu.Lock()
	want := make([]stageRef, 0, len(f.pending))
	for r := range f.pending {
		want = append(want, r)
	}
	clear(f.pending)
	f.pendingMu.Unlock()
	var made []ShardStage
	for _, r := range want {
		res, err := f.makeStage(ctx, r, byMaintenance)
		if err != nil {
			return made, err
		}
		if res == stageMade {
			wp, err := f.planOf(ctx, r.bucket, true)
			if err != nil {
				return made, err
			}
			made = append(made, ShardStage{Bucket: r.bucket, Shard: r.shard, Stage: r.stage, Bytes: wp.plan.Stages[r.stage].shardBytes()})
		}
	}
	return made, nil
}

// want notes stages a call asked for ahead of need and signals
// GrowthWanted.
func (f *Filter) want(rs []stageRef) {
	f.pendingMu.Lock()
	for _, r := range rs {
		f.pending[r] = struct{}{}
	}
	f.pendingMu.Unlock()
	select {
	case f.growWanted <- struct{}{}:
	default:
	}
}

// GrowthWanted receives a value after a test-and-set found a window whose
// newest stage will be full within the next stage's lead, or is, and
// whose next stage is not made: Grow then makes it. The maintenance does
// so at once instead of at its next tick.
func (f *Filter) GrowthWanted() <-chan struct{} { return f.growWanted }

// awaitStages makes the stages a refused call needs, or waits until
// another maker has made them, until deadline, and reports whether any of
// them was made meanwhile (false: all were made before, so the call was
// refused for another reason). It returns ErrGrowthWait when a stage is
// still being made by another at the deadline, ErrRedis when a call fails
// (making the stage included: Redis out of memory, say), and ctx's error
// when ctx ends first.
func (f *Filter) awaitStages(ctx context.Context, needs []stageRef, deadline time.Time) (bool, error) {
	madeAny := false
	for _, r := range needs {
		// A small stage is made within a few milliseconds: look often.
		pause := time.Millisecond
		for {
			res, err := f.makeStage(ctx, r, byBatch)
			if err != nil {
				return madeAny, err
			}
			if res == stageMade {
				madeAny = true
			}
			if res != stageBusy {
				break
			}
			madeAny = true // by another maker, while this one waited
			left := time.Until(deadline)
			if left <= 0 {
				return madeAny, fmt.Errorf("%w: stage %d of %s still being made by another maker after %v", ErrGrowthWait, r.stage,
					f.windowName(r), f.cfg.GrowthWait)
			}
			if err := pauseUntil(ctx, pause, deadline); err != nil {
				return madeAny, fmt.Errorf("waiting for stage %d of %s: %w", r.stage, f.windowName(r), err)
			}
			pause = min(2*pause, 10*time.Millisecond)
		}
	}
	return madeAny, nil
}

// parseStages reads the script's "ref:stage,..." list, refs being the
// 1-based numbers of the buckets the call reads (b.refs).
func (b *batch) parseStages(s string) ([]stageRef, error) {
	var out []stageRef
	for item := range strings.SplitSeq(s, ",") {
		ref, st, ok := strings.Cut(item, ":")
		r, err1 := strconv.Atoi(ref)
		n, err2 := strconv.Atoi(st)
		if !ok || err1 != nil || err2 != nil || r < 1 || r > len(b.refs) {
			return nil, fmt.Errorf("%w: test-and-set named stage %q", ErrRedis, item)
		}
		sb := b.refs[r-1]
		out = append(out, stageRef{bucket: sb.bucket, shard: sb.shard, stage: n})
	}
	return out, nil
}

// GrowthStats is what this Filter did for windows that grow since it
// was made.
type GrowthStats struct {
	// Made counts the stages it made, by the maintenance or for a batch.
	Made int64
	// Refused counts script calls refused because a stage they needed
	// was not made; Waits the test-and-set calls that waited (once each,
	// however many refusals), Failed those whose wait ran out or whose
	// stage could not be made.
	Refused, Waits, Failed int64
	// Total and Longest are the time waited, summed and the longest.
	Total, Longest time.Duration
}

// growthStats are the counters behind GrowthStats.
type growthStats struct {
	made, refused, waits, failed, total, longest atomic.Int64
	// lost counts the windows found lost (lost.go).
	lost atomic.Int64
}

// GrowthStats returns what this Filter did for windows that grow.
func (f *Filter) GrowthStats() GrowthStats {
	w := &f.stats
	return GrowthStats{Made: w.made.Load(), Refused: w.refused.Load(), Waits: w.waits.Load(), Failed: w.failed.Load(),
		Total: time.Duration(w.total.Load()), Longest: time.Duration(w.longest.Load())}
}

// refused counts a refused call.
func (f *Filter) refused() {
	f.stats.refused.Add(1)
	if o := f.obs.Load(); o != nil {
		o.g.refused.Inc()
	}
}

// waited records a wait that began at start, for needs, and whether it
// ended with the stages made.
func (f *Filter) waited(start time.Time, needs []stageRef, ok bool) {
	d := time.Since(start)
	w := &f.stats
	w.waits.Add(1)
	w.total.Add(int64(d))
	for {
		l := w.longest.Load()
		if int64(d) <= l || w.longest.CompareAndSwap(l, int64(d)) {
			break
		}
	}
	if !ok {
		w.failed.Add(1)
	}
	o := f.obs.Load()
	if o == nil {
		return
	}
	o.g.growthWait.Observe(d.Seconds())
	fields := []zap.Field{zap.Duration("waited", d), zap.Int("shard", needs[0].shard), zap.Int("stage", needs[0].stage),
		zap.Time("window", f.cfg.Window.Start(needs[0].bucket))}
	if ok {
		o.log.Info("a batch waited for the next stage of its window", fields...)
	} else {
		o.log.Warn("a batch waited for the next stage of its window in vain; retrying", fields...)
	}
}

// reporter is where the filter's own figures go once Maintain runs.
type reporter struct {
	g   *Gauges
	log *zap.Logger
}

// Growth is what a shard's growth record of one bucket says.
type Growth struct {
	// Stage is the stage inserts go to, Held the elements inserted into it.
	Stage int
	Held  int64
	// Overfilled are inserts past a stage's capacity, which only versions
	// before back-pressure made (see Growth in the package doc); TestOnly
	// new elements not inserted because the last stage was full.
	Overfilled, TestOnly int64
	// Inserted are the elements inserted into all stages; Rate how many
	// per second between the last two samples; Wanted the stage asked for
	// ahead of need (0: none).
	Inserted int64
	Rate     float64
	Wanted   int
}

func (f *Filter) growth(ctx context.Context, wp *windowPlan, shard int, b int64) (Growth, error) {
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	r, err := f.client.HMGet(cctx, wp.growthKey(shard, b), "k", "n", "o", "c", "a", "r", "w").Result()
	if err != nil {
		return Growth{}, fmt.Errorf("%w: reading the growth of %s: %w", ErrRedis, wp.filterKey(shard, b), err)
	}
	str := func(v any) string { s, _ := v.(string); return s }
	num := func(v any) int64 {
		n, _ := strconv.ParseInt(str(v), 10, 64)
		return n
	}
	rate, _ := strconv.ParseFloat(str(r[5]), 64)
	return Growth{Stage: int(num(r[0])), Held: num(r[1]), Overfilled: num(r[2]), TestOnly: num(r[3]),
		Inserted: num(r[4]), Rate: rate, Wanted: int(num(r[6]))}, nil
}

// pendingStages are the stages calls asked for ahead of need, until the
// maintenance makes them.
type pendingStages struct {
	pendingMu sync.Mutex
	pending   map[stageRef]struct{}
}

// waits are the waits for a stage under way, each by its start: a wait
// that lasts makes the replica not ready (Healthy).
type waits struct {
	mu      sync.Mutex
	next    int
	started map[int]time.Time
}

// begin notes a wait that starts now and returns its number for end.
func (w *waits) begin() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started == nil {
		w.started = map[int]time.Time{}
	}
	w.next++
	w.started[w.next] = time.Now()
	return w.next
}

// end notes that wait n is over.
func (w *waits) end(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.started, n)
}

// longest is how long the oldest wait under way has lasted, 0 for none.
func (w *waits) longest() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for _, t := range w.started {
		d = max(d, time.Since(t))
	}
	return d
}

// windowName names the window of r in messages: its shard's first key,
// by the plan this replica has for it.
func (f *Filter) windowName(r stageRef) string {
	f.windows.mu.Lock()
	wp, ok := f.windows.byBucket[r.bucket]
	f.windows.mu.Unlock()
	if !ok {
		wp = f.own
	}
	return wp.filterKey(r.shard, r.bucket)
}

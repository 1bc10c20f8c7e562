package bloom

import (
	"cmp"
	"context"
	"embed"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// The script is its four files in order (lua/prelude.lua says why).
//
//go:embed lua/prelude.lua lua/bloom.lua lua/fingerprint.lua lua/testandset.lua
var scriptFiles embed.FS

// scriptOrder is the order the script's files run in.
var scriptOrder = []string{"lua/prelude.lua", "lua/bloom.lua", "lua/fingerprint.lua", "lua/testandset.lua"}

var testAndSetScript = redis.NewScript(scriptSource())

// scriptSource is the script: its files, in order.
func scriptSource() string {
	var b strings.Builder
	for _, name := range scriptOrder {
		src, err := scriptFiles.ReadFile(name)
		if err != nil {
			panic(err) // embedded above: cannot happen
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return b.String()
}

// TestAndSet decides for each element whether it is seen for the first time
// in its window, and marks it seen, in one atomic Lua script call per batch
// (one per shard on a Cluster, run concurrently). Its contract (verdicts,
// errors and retries, cancellation, the order of offsets a caller keeps,
// the wait for a growing window's stage) is told once, in the package doc
// under "Replay-safe decisions". It is Decide without probes.
func (f *Filter) TestAndSet(ctx context.Context, elems []Element) ([]Verdict, error) {
	d, err := f.Decide(ctx, elems, nil)
	return d.Verdicts, err
}

// Decision is what Decide answers for a batch.
type Decision struct {
	// Verdicts has one verdict per element, in their order.
	Verdicts []Verdict
	// Probes has one answer per probe, in their order.
	Probes []ProbeAnswer
	// records are the decision records the call read: Filter.Delivered
	// raises their marks.
	records []shardPartition
}

// Decide is TestAndSet with probes: sources the caller does not test
// (input it dead-letters) but asks, in the same call, whether they were
// decided or delivered before (see "Delivered marks" in the package doc).
// A probe is read from, and noted as decided in, its partition's home
// record, which every Delivered marks; it counts as a source of the batch,
// so it must not be one of elems'.
func (f *Filter) Decide(ctx context.Context, elems []Element, probes []Source) (Decision, error) {
	if len(elems)+len(probes) == 0 {
		return Decision{}, nil
	}
	b := getBatch()
	defer putBatch(b)
	if err := f.prepare(ctx, b, elems, probes); err != nil {
		return Decision{}, err
	}
	out := make([]Verdict, len(b.items))
	if !f.cluster {
		if err := f.run(ctx, b, b.order, out); err != nil {
			return Decision{}, err
		}
		return b.decision(out, len(elems)), nil
	}
	// One call per shard; b.order is sorted by shard first.
	g, gctx := errgroup.WithContext(ctx)
	for lo := 0; lo < len(b.order); {
		hi := lo
		shard := b.items[b.order[lo]].loc.shard
		for hi < len(b.order) && b.items[b.order[hi]].loc.shard == shard {
			hi++
		}
		part := b.order[lo:hi]
		g.Go(func() error {
			sb := getBatch()
			own := sb.items
			sb.items, sb.now = b.items, b.now // shared, read-only here; the parent returns it
			defer func() { sb.items = own; putBatch(sb) }()
			return f.run(gctx, sb, part, out)
		})
		lo = hi
	}
	if err := g.Wait(); err != nil {
		return Decision{}, err
	}
	return b.decision(out, len(elems)), nil
}

// decision splits the verdicts of b's items (elements first, then
// probes) into a Decision, with the records the call read.
func (b *batch) decision(out []Verdict, nElems int) Decision {
	d := Decision{Verdicts: out[:nElems:nElems]}
	if n := len(out) - nElems; n > 0 {
		d.Probes = make([]ProbeAnswer, n)
		for i, v := range out[nElems:] {
			switch v {
			case ReplayedDelivered:
				d.Probes[i] = ProbeDelivered
			case answerDecided:
				d.Probes[i] = ProbeDecided
			}
		}
	}
	d.records = make([]shardPartition, len(b.runs))
	for i, r := range b.runs {
		d.records[i] = r.key
	}
	return d
}

// prepare validates elems and probes, places the elements, finds their
// windows' plans and locates them under each, puts each probe in its
// partition's home record, and sorts them all into call order: shard,
// plan, topic, partition, offset.
func (f *Filter) prepare(ctx context.Context, b *batch, elems []Element, probes []Source) error {
	b.now, b.planned = f.cfg.Now(), b.planned[:0]
	b.items = slices.Grow(b.items[:0], len(elems)+len(probes))[:len(elems)+len(probes)]
	clear(b.sources)
	// Every element is checked before any is placed: placing one may
	// record its window's plan, and a batch refused writes nothing.
	for i := range elems {
		e := &elems[i]
		if len(e.ID) == 0 {
			return fmt.Errorf("%w: element %d (%v) has an empty ID", ErrInvalidElement, i, e.Source)
		}
		if e.Time.IsZero() {
			return fmt.Errorf("%w: element %d (%v) has no event time", ErrInvalidElement, i, e.Source)
		}
		if err := b.checkSource(e.Source, "element", i); err != nil {
			return err
		}
	}
	for i, src := range probes {
		if err := b.checkSource(src, "probe", i); err != nil {
			return err
		}
	}
	for i := range elems {
		e := &elems[i]
		it := &b.items[i]
		it.src, it.t, it.id = &e.Source, e.Time, e.ID
		if err := f.place(ctx, b, it); err != nil {
			return err
		}
	}
	for i := range probes {
		it := &b.items[len(elems)+i]
		it.src, it.at, it.wp = &probes[i], placement{status: probed}, f.own
		it.loc.shard = f.own.homeShard(probes[i].Partition)
	}
	return b.sortForCall()
}

// checkSource refuses a source out of its bounds or seen before in the
// batch; what and i name it.
func (b *batch) checkSource(src Source, what string, i int) error {
	if src.Topic == "" || src.Partition < 0 || src.Offset < 0 || src.Offset > MaxOffset {
		return fmt.Errorf("%w: %s %d has source %v, want a topic, a partition >= 0 and an offset from 0 to 2^52-1", ErrInvalidElement, what, i, src)
	}
	if _, twice := b.sources[src]; twice {
		return fmt.Errorf("%w: source %v appears twice in the batch", ErrInvalidElement, src)
	}
	b.sources[src] = struct{}{}
	return nil
}

// place places an item by the clock now: its bucket and neighbours, the
// plan of each window the test reads (making its record for the item's
// own window when the item is tested), and its location under each plan.
func (f *Filter) place(ctx context.Context, b *batch, it *item) error {
	if it.at.status == probed {
		return nil // a probe stays in its home record
	}
	it.at = f.cfg.Window.place(it.t, b.now, f.cfg.MaxFutureSkew, f.cfg.MaxClockSkew)
	if it.wp == nil { // placed again (run): its window and shard stay
		wp, err := f.planFor(ctx, b, it.at.bucket, it.at.tested())
		if err != nil {
			return err
		}
		it.wp = wp
		wp.locate(it.id, &it.loc)
	}
	wp := it.wp
	it.nbWP = [2]*windowPlan{}
	for i, on := range [2]bool{it.at.prev, it.at.next} {
		if !on || !it.at.tested() {
			continue
		}
		nb, err := f.planFor(ctx, b, it.at.bucket-1+2*int64(i), false)
		if err != nil {
			return err
		}
		if nb != wp {
			it.nbWP[i] = nb
			nb.locate(it.id, &it.nb[i])
		}
	}
	return nil
}

// planFor is planOf(ctx, bucket, make) as found before for this batch
// (placed by the same clock): planOf takes a lock and two map lookups, an
// item asks for up to three windows, and a batch's items share a few. A
// window found made serves both kinds of asking; one found without making
// it is asked again when it is to be made.
func (f *Filter) planFor(ctx context.Context, b *batch, bucket int64, make bool) (*windowPlan, error) {
	for i := range b.planned {
		if p := &b.planned[i]; p.bucket == bucket && (p.made || !make) {
			return p.wp, nil
		}
	}
	wp, err := f.planOf(ctx, bucket, make)
	if err != nil {
		return nil, err
	}
	// A window made now replaces what was found of it without making it.
	b.planned = slices.DeleteFunc(b.planned, func(p planned) bool { return p.bucket == bucket })
	b.planned = append(b.planned, planned{bucket: bucket, made: make, wp: wp})
	return wp, nil
}

// planned is a window's plan as a batch found it (planFor).
type planned struct {
	bucket int64
	made   bool // asked with make: the window's record exists
	wp     *windowPlan
}

// run makes one script call for the items in order (sorted by shard,
// topic, partition, offset) and writes their verdicts into out. A call
// refused for a stage it needs is made again once the stage is made
// (awaitStages), within Config.GrowthWait from the first refusal, with the
// items placed anew by the clock each time: a batch that waited may have
// become Late. A call refused although the stages it named were made
// already (the server's clock and this replica's disagree about a
// window's end) is made again after a pause that doubles, from 1 ms to
// 100 ms, so that it never spins. While the wait lasts longer than the
// call time-out the filter is not Healthy.
func (f *Filter) run(ctx context.Context, b *batch, order []int, out []Verdict) error {
	sc := f.encode(b, order)
	shard := b.items[order[0]].loc.shard
	var waitStart time.Time
	var needs []stageRef
	// grew: a refusal named a stage past the first, so the wait counts as
	// one for growth (GrowthStats); a wait for a window alone is counted
	// as the window a batch made.
	grew := false
	pause := time.Millisecond
	for {
		res, err := f.call(ctx, shard, sc)
		if err != nil {
			if grew && ctx.Err() == nil {
				f.waited(waitStart, needs, false)
			}
			return fmt.Errorf("%w: test-and-set of %d elements on shard %d: %w", ErrRedis, len(order), shard, err)
		}
		if list, refused := strings.CutPrefix(res, string(replyRefused)); refused {
			if needs, err = b.parseStages(list); err != nil {
				return err
			}
			if slices.ContainsFunc(needs, func(r stageRef) bool { return r.stage > 0 }) {
				grew = true
				f.refused()
			}
			if waitStart.IsZero() {
				waitStart = time.Now()
				defer f.waiting.end(f.waiting.begin())
			}
			deadline := waitStart.Add(f.cfg.GrowthWait)
			made := false
			if !time.Now().Before(deadline) {
				err = fmt.Errorf("%w: refused for stage %d of %s after %v", ErrGrowthWait, needs[0].stage,
					f.windowName(needs[0]), f.cfg.GrowthWait)
			} else if made, err = f.awaitStages(ctx, needs, deadline); err == nil && !made {
				err = pauseUntil(ctx, pause, deadline)
				pause = min(2*pause, 100*time.Millisecond)
			}
			if err != nil {
				if grew && ctx.Err() == nil {
					f.waited(waitStart, needs, false)
				}
				return fmt.Errorf("test-and-set of %d elements on shard %d: %w", len(order), shard, err)
			}
			if err := f.replace(ctx, b, order); err != nil {
				return err
			}
			sc = f.encode(b, order)
			continue
		}
		if grew {
			f.waited(waitStart, needs, true)
		}
		if verdicts, list, ok := strings.Cut(res, string(replyWanted)); ok {
			res = verdicts
			wanted, err := b.parseStages(list)
			if err != nil {
				return err
			}
			f.want(wanted)
		}
		return f.decode(b, order, res, out)
	}
}

// pauseUntil waits d, or until deadline if sooner, or until ctx ends.
func pauseUntil(ctx context.Context, d time.Duration, deadline time.Time) error {
	t := time.NewTimer(min(d, max(time.Until(deadline), 0)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// replace places the items in order anew by the clock (see run). An
// item's own window stays where it was: its event time does.
func (f *Filter) replace(ctx context.Context, b *batch, order []int) error {
	b.now, b.planned = f.cfg.Now(), b.planned[:0]
	for _, i := range order {
		if err := f.place(ctx, b, &b.items[i]); err != nil {
			return err
		}
	}
	return nil
}

// call runs the script once for shard.
func (f *Filter) call(ctx context.Context, shard int, sc scriptCall) (string, error) {
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	if f.cfg.MinReplicas > 0 {
		return f.runReplicated(cctx, shard, sc)
	}
	return testAndSetScript.Run(cctx, f.client, sc.keys, sc.argv...).Text()
}

// decode turns the script's verdict characters into out.
func (f *Filter) decode(b *batch, order []int, res string, out []Verdict) error {
	if len(res) != len(order) {
		return fmt.Errorf("%w: test-and-set returned %d verdicts for %d elements", ErrRedis, len(res), len(order))
	}
	for k, i := range order {
		var v Verdict
		switch res[k] {
		case codeNew:
			v = FirstSeen
		case codeDuplicate:
			v = Duplicate
		case codeReplayedNew:
			// Decided forward before, and now beyond the bound: Late (or
			// Future) again, so that what the caller does with such events
			// is the same on a replay.
			v = cmp.Or(b.items[i].at.status, ReplayedFirstSeen)
		case codeUntested:
			// Not tested: by the caller's clock, or because the server's
			// clock had passed the bucket's deadline (keys may be gone).
			v = cmp.Or(b.items[i].at.status, Late)
		case codeReplayedDup:
			v = ReplayedDuplicate
		case codeReplayUnknown:
			v = ReplayUnknown
		case codeDelivered:
			v = ReplayedDelivered
		case codeProbeNew:
			v = probed
		case codeProbeDecided:
			v = answerDecided
		default:
			return fmt.Errorf("%w: test-and-set returned verdict %q", ErrRedis, res[k])
		}
		out[i] = v
	}
	return nil
}

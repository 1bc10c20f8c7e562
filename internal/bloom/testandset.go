package bloom

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tinylib/msgp/msgp"
	"golang.org/x/sync/errgroup"
)

//go:embed testandset.lua
var testAndSetLua string

var testAndSetScript = redis.NewScript(testAndSetLua)

// TestAndSet decides for each element whether it is seen for the first time
// in its window, and marks it seen, in one atomic Lua script call per batch
// (one per shard on a Cluster, run concurrently). Its contract (verdicts,
// errors and retries, cancellation, the order of offsets a caller keeps,
// the wait for a growing window's stage) is told once, in the package doc
// under "Replay-safe decisions".
func (f *Filter) TestAndSet(ctx context.Context, elems []Element) ([]Verdict, error) {
	if len(elems) == 0 {
		return nil, nil
	}
	b := getBatch()
	defer putBatch(b)
	if err := f.prepare(b, elems); err != nil {
		return nil, err
	}
	out := make([]Verdict, len(elems))
	if !f.cluster || f.plan.Shards == 1 {
		if err := f.run(ctx, b, b.order, out); err != nil {
			return nil, err
		}
		return out, nil
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
		return nil, err
	}
	return out, nil
}

// prepare validates elems, places and hashes them, and sorts them into
// call order: shard, topic, partition, offset.
func (f *Filter) prepare(b *batch, elems []Element) error {
	b.now = f.cfg.Now()
	b.items = slices.Grow(b.items[:0], len(elems))[:len(elems)]
	for i := range elems {
		e := &elems[i]
		if len(e.ID) == 0 {
			return fmt.Errorf("%w: element %d (%v) has an empty ID", ErrInvalidElement, i, e.Source)
		}
		if e.Time.IsZero() {
			return fmt.Errorf("%w: element %d (%v) has no event time", ErrInvalidElement, i, e.Source)
		}
		if e.Source.Topic == "" || e.Source.Partition < 0 || e.Source.Offset < 0 || e.Source.Offset > MaxOffset {
			return fmt.Errorf("%w: element %d has source %v, want a topic, a partition >= 0 and an offset from 0 to 2^52-1", ErrInvalidElement, i, e.Source)
		}
		it := &b.items[i]
		it.src, it.t = &e.Source, e.Time
		it.at = f.cfg.Window.place(e.Time, b.now, f.cfg.MaxFutureSkew, f.cfg.MaxClockSkew)
		f.locate(e.ID, &it.loc)
	}
	return b.sortForCall()
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
		if list, refused := strings.CutPrefix(res, "!"); refused {
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
					f.FilterKey(needs[0].shard, needs[0].bucket), f.cfg.GrowthWait)
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
			f.replace(b, order)
			sc = f.encode(b, order)
			continue
		}
		if grew {
			f.waited(waitStart, needs, true)
		}
		if verdicts, list, ok := strings.Cut(res, "+"); ok {
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

// replace places the items in order anew by the clock (see run).
func (f *Filter) replace(b *batch, order []int) {
	b.now = f.cfg.Now()
	for _, i := range order {
		it := &b.items[i]
		it.at = f.cfg.Window.place(it.t, b.now, f.cfg.MaxFutureSkew, f.cfg.MaxClockSkew)
	}
}

// scriptCall is one call of the script: its KEYS and ARGV, as
// testandset.lua describes them.
type scriptCall struct {
	keys []string
	argv []any
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

// encode builds the script's keys and arguments for the items in order.
func (f *Filter) encode(b *batch, order []int) scriptCall {
	b.keys = b.keys[:0]
	clear(b.keyIdx)
	recordExpire := f.encodeGroups(b, order)
	f.encodeParts(b, order)
	f.encodeElements(b, order)
	return scriptCall{keys: b.keys, argv: []any{
		f.cfg.ReplayHorizon, // ARGV[1]
		recordExpire,        // ARGV[2]
		b.partsArg,          // ARGV[3]
		b.elemsArg,          // ARGV[4]
		b.wordsArg,          // ARGV[5]
		f.plan.Layout.Words, // ARGV[6]
		b.groupsArg,         // ARGV[7]
		f.stageTab,          // ARGV[8]
		b.bucketsArg,        // ARGV[9]
	}}
}

// stageTable is the script's stage table (ARGV[8]): the stage count, each
// stage's capacity per shard, then of stages 1 and up the words per shard,
// the lead (ms) and the words per key. It is the same for every call of a
// Filter.
func stageTable(stages []Stage) []byte {
	tab := msgp.AppendArrayHeader(nil, uint32(4*len(stages)-2))
	tab = msgp.AppendInt(tab, len(stages))
	for _, st := range stages {
		tab = msgp.AppendInt64(tab, st.CapacityPerShard)
	}
	for _, st := range stages[1:] {
		tab = msgp.AppendUint64(tab, st.ShardBits/WordBits)
	}
	for _, st := range stages[1:] {
		tab = msgp.AppendInt64(tab, StageLead(st).Milliseconds())
	}
	for _, st := range stages[1:] {
		tab = msgp.AppendUint64(tab, st.PartBits/WordBits)
	}
	return tab
}

// encodeGroups lists the call's bucket groups (ARGV[7]), ascending by
// bucket so that a bucket's writes are seen by the next bucket's test of
// its previous one, and the keys of every bucket they read (ARGV[9]). It
// returns the expiry of the decision records: one window past the
// retention of a bucket started now, and no earlier than any bucket's
// keys.
func (f *Filter) encodeGroups(b *batch, order []int) int64 {
	w := f.cfg.Window
	b.groups = b.groups[:0]
	for _, i := range order {
		it := &b.items[i]
		if g := (bucketGroup{it.loc.shard, it.at}); it.at.tested() && !slices.Contains(b.groups, g) {
			b.groups = append(b.groups, g)
		}
	}
	slices.SortFunc(b.groups, func(x, y bucketGroup) int {
		return cmp.Or(cmp.Compare(x.at.bucket, y.at.bucket), cmp.Compare(x.shard, y.shard))
	})
	clear(b.refOf)
	b.refs = b.refs[:0]
	b.scratch = b.scratch[:0]
	recordExpire := b.now.Unix() + int64((w.Retention()+w.Length)/time.Second)
	b.groupsArg = msgp.AppendArrayHeader(b.groupsArg[:0], uint32(5*len(b.groups)))
	for _, g := range b.groups {
		own, prev, next := f.bucketRef(b, g.own()), 0, 0
		if g.at.prev {
			prev = f.bucketRef(b, shardBucket{g.shard, g.at.bucket - 1})
		}
		if g.at.next {
			next = f.bucketRef(b, shardBucket{g.shard, g.at.bucket + 1})
		}
		b.groupsArg = msgp.AppendInt(b.groupsArg, own)
		b.groupsArg = msgp.AppendInt(b.groupsArg, prev)
		b.groupsArg = msgp.AppendInt(b.groupsArg, next)
		b.groupsArg = msgp.AppendString(b.groupsArg, strconv.FormatInt(w.ExpireAt(g.at.bucket), 10))
		b.groupsArg = msgp.AppendString(b.groupsArg, strconv.FormatInt(w.deadline(g.at.bucket), 10))
		recordExpire = max(recordExpire, w.ExpireAt(g.at.bucket))
	}
	// b.scratch holds the entries bucketRef appended, one bucket each.
	b.bucketsArg = msgp.AppendArrayHeader(b.bucketsArg[:0], uint32(len(b.refs)*(1+len(f.plan.Stages))))
	b.bucketsArg = append(b.bucketsArg, b.scratch...)
	return recordExpire
}

// bucketRef is the 1-based number of sb among the buckets the call reads.
// A bucket new to the call gets its entry of ARGV[9] in b.scratch: the
// key index of its growth record (0 without growth), then of each stage
// (its first part; the others follow it in KEYS, new to the call with
// the bucket).
func (f *Filter) bucketRef(b *batch, sb shardBucket) int {
	if r, ok := b.refOf[sb]; ok {
		return r
	}
	b.refs = append(b.refs, sb)
	b.refOf[sb] = len(b.refs)
	growthRecord := 0
	if f.plan.Growth() {
		growthRecord = b.key(f.GrowthKey(sb.shard, sb.bucket))
	}
	b.scratch = msgp.AppendInt(b.scratch, growthRecord)
	for st, stage := range f.plan.Stages {
		b.scratch = msgp.AppendInt(b.scratch, b.key(f.StageKey(sb.shard, sb.bucket, st)))
		for pt := 1; pt < stage.Parts; pt++ {
			b.key(f.PartKey(sb.shard, sb.bucket, st, pt))
		}
	}
	return len(b.refs)
}

// encodeParts lists the partition runs (ARGV[3]): each one's decision
// record and its count of items, in call order.
func (f *Filter) encodeParts(b *batch, order []int) {
	nparts := 0
	b.scratch = b.scratch[:0]
	for k := 0; k < len(order); {
		first := b.items[order[k]]
		n := 0
		for k+n < len(order) {
			it := &b.items[order[k+n]]
			if it.loc.shard != first.loc.shard || it.src.Topic != first.src.Topic || it.src.Partition != first.src.Partition {
				break
			}
			n++
		}
		b.scratch = msgp.AppendInt(b.scratch, b.key(f.RecordKey(first.loc.shard, first.src.Topic, first.src.Partition)))
		b.scratch = msgp.AppendInt(b.scratch, n)
		nparts++
		k += n
	}
	b.partsArg = msgp.AppendArrayHeader(b.partsArg[:0], uint32(2*nparts))
	b.partsArg = append(b.partsArg, b.scratch...)
}

// encodeElements lists each item (ARGV[4]): its offset, its bucket group
// (0: not tested), each word's mask and, with growth, each word's
// position; and, for the items tested, each word's bit offset (ARGV[5]).
func (f *Filter) encodeElements(b *batch, order []int) {
	W := f.plan.Layout.Words
	perEl := 2 + W
	growth := f.plan.Growth()
	if growth {
		perEl += W
	}
	ntested := 0
	for _, i := range order {
		if b.items[i].at.tested() {
			ntested++
		}
	}
	b.elemsArg = msgp.AppendArrayHeader(b.elemsArg[:0], uint32(len(order)*perEl))
	b.wordsArg = msgp.AppendArrayHeader(b.wordsArg[:0], uint32(ntested*W))
	var num [20]byte
	for _, i := range order {
		it := &b.items[i]
		tested := it.at.tested()
		b.elemsArg = msgp.AppendInt64(b.elemsArg, it.src.Offset)
		g := 0
		if tested {
			g = slices.Index(b.groups, bucketGroup{it.loc.shard, it.at}) + 1
		}
		b.elemsArg = msgp.AppendInt(b.elemsArg, g)
		for j := 0; j < W; j++ {
			if tested {
				b.elemsArg = msgp.AppendUint64(b.elemsArg, uint64(it.loc.hi[j])<<26|uint64(it.loc.lo[j]))
				b.wordsArg = msgp.AppendStringFromBytes(b.wordsArg, strconv.AppendUint(num[:0], it.loc.word[j], 10))
			} else {
				b.elemsArg = msgp.AppendUint32(b.elemsArg, 0)
			}
		}
		if growth {
			for j := 0; j < W; j++ {
				b.elemsArg = msgp.AppendFloat64(b.elemsArg, it.loc.u[j])
			}
		}
	}
}

// decode turns the script's verdict characters into out.
func (f *Filter) decode(b *batch, order []int, res string, out []Verdict) error {
	if len(res) != len(order) {
		return fmt.Errorf("%w: test-and-set returned %d verdicts for %d elements", ErrRedis, len(res), len(order))
	}
	for k, i := range order {
		var v Verdict
		switch res[k] {
		case 'N':
			v = FirstSeen
		case 'D':
			v = Duplicate
		case 'n':
			// Decided forward before, and now beyond the bound: Late (or
			// Future) again, so that what the caller does with such events
			// is the same on a replay.
			v = cmp.Or(b.items[i].at.status, ReplayedFirstSeen)
		case 'U':
			// Not tested: by the caller's clock, or because the server's
			// clock had passed the bucket's deadline (keys may be gone).
			v = cmp.Or(b.items[i].at.status, Late)
		case 'd':
			v = ReplayedDuplicate
		case 'u':
			v = ReplayUnknown
		default:
			return fmt.Errorf("%w: test-and-set returned verdict %q", ErrRedis, res[k])
		}
		out[i] = v
	}
	return nil
}

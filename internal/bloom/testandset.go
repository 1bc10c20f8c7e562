package bloom

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tinylib/msgp/msgp"
	"golang.org/x/sync/errgroup"
)

// TestAndSet decides for each element whether it is seen for the first time
// in its window, and marks it seen, in one atomic Lua script call per batch
// (one per shard on a Cluster, run concurrently). The verdicts are in the
// order of elems.
//
// Decisions are replay-safe: an element whose Source was decided before
// (within Config.ReplayHorizon offsets of the newest offset decided for its
// partition) gets the verdict it got then, whatever the batch boundaries.
// For each partition, call with offsets in ascending order across calls:
// wait for a call to return before sending later offsets of its partitions.
//
// A batch whose new elements need the next stage of a growing window
// when that stage is not made yet is not decided: the call makes the
// stage, or waits while another replica makes it, and decides the batch
// then, within Config.GrowthWait (plus the time-out of a make it started
// itself just before); past that it fails with ErrGrowthWait, having
// decided and written nothing.
//
// On error no verdicts are returned. The batch may have been applied in
// part or in full; calling again with the same elements returns the
// decisions that were recorded. With Config.MinReplicas, a call whose
// writes did not reach enough replicas in time fails too, with
// ErrTooFewReplicas. Cancelling ctx abandons the calls in flight and a
// wait for a stage. Safe for concurrent use.
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
			sb.items = b.items // shared, read-only here; the parent returns it
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

// item is one element with everything derived from it.
type item struct {
	loc      location
	bucket   int64
	filtered bool
	unfilt   Verdict // Late or Future when not filtered
	src      *Source
}

// batch holds the reusable buffers of one call.
type batch struct {
	items   []item
	order   []int
	keys    []string
	keyIdx  map[string]int
	parts   []byte
	els     []byte
	words   []byte
	buckets []byte
	scratch []byte
	bgroups []bucketGroup
	// brefs numbers the buckets the call references (1-based), refList
	// lists them by number, btab describes them to the script: growth
	// record and stage keys.
	brefs   map[bucketGroup]int
	refList []bucketGroup
	btab    []byte
	btabBuf []byte
	groupOf map[groupKey]int
	groups  []groupCount
	member  []int
}

type bucketGroup struct {
	shard  int
	bucket int64
}

var batchPool = sync.Pool{New: func() any {
	return &batch{keyIdx: map[string]int{}, groupOf: map[groupKey]int{}, brefs: map[bucketGroup]int{}}
}}

func getBatch() *batch { return batchPool.Get().(*batch) }

// putBatch returns b to the pool. Its items keep their capacity but drop
// their pointers into the caller's elements.
func putBatch(b *batch) {
	clear(b.items)
	b.items = b.items[:0]
	clear(b.keyIdx)
	batchPool.Put(b)
}

// prepare validates elems, hashes them and sorts them into call order:
// shard, topic, partition, offset.
func (f *Filter) prepare(b *batch, elems []Element) error {
	now := f.cfg.Now()
	w := f.cfg.Windows
	futureLimit := w.Bucket(now.Add(f.cfg.MaxFutureSkew))
	// An element is Late from its Deadline on, its bucket's end plus MaxLag:
	// when its bucket ended by lateEnd. Both are whole seconds, so comparing
	// with the clock's second is exact.
	lateEnd := now.Unix() - int64(w.MaxLag/time.Second)
	b.items = slices.Grow(b.items[:0], len(elems))[:len(elems)]
	b.order = slices.Grow(b.order[:0], len(elems))[:len(elems)]
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
		it.src = &e.Source
		it.bucket = w.Bucket(e.Time)
		switch {
		case it.bucket > futureLimit:
			it.filtered, it.unfilt = false, Future
		case (it.bucket+1)*w.seconds() <= lateEnd:
			it.filtered, it.unfilt = false, Late
		default:
			it.filtered, it.unfilt = true, 0
		}
		f.locate(e.ID, &it.loc)
		b.order[i] = i
	}
	// Order by (shard, topic, partition), keeping arrival order inside a
	// group (a stable counting sort: a batch has few groups), then by offset,
	// which Kafka input already has.
	clear(b.groupOf)
	b.groups = b.groups[:0]
	b.member = slices.Grow(b.member[:0], len(elems))[:len(elems)]
	for i := range b.items {
		it := &b.items[i]
		k := groupKey{it.loc.shard, it.src.Topic, it.src.Partition}
		g, ok := b.groupOf[k]
		if !ok {
			g = len(b.groups)
			b.groupOf[k] = g
			b.groups = append(b.groups, groupCount{key: k})
		}
		b.groups[g].n++
		b.member[i] = g
	}
	rank := make([]int, len(b.groups))
	for i := range rank {
		rank[i] = i
	}
	slices.SortFunc(rank, func(x, y int) int {
		a, c := b.groups[x].key, b.groups[y].key
		return cmp.Or(cmp.Compare(a.shard, c.shard), cmp.Compare(a.topic, c.topic), cmp.Compare(a.partition, c.partition))
	})
	start := 0
	for _, g := range rank {
		b.groups[g].start = start
		start += b.groups[g].n
	}
	for i := range b.items {
		g := &b.groups[b.member[i]]
		b.order[g.start+g.placed] = i
		g.placed++
	}
	for _, g := range b.groups {
		part := b.order[g.start : g.start+g.n]
		sorted := true
		for k := 1; k < len(part); k++ {
			if b.items[part[k]].src.Offset <= b.items[part[k-1]].src.Offset {
				sorted = false
				break
			}
		}
		if !sorted {
			slices.SortStableFunc(part, func(x, y int) int { return cmp.Compare(b.items[x].src.Offset, b.items[y].src.Offset) })
			for k := 1; k < len(part); k++ {
				if b.items[part[k]].src.Offset == b.items[part[k-1]].src.Offset {
					return fmt.Errorf("%w: source %v appears twice in the batch", ErrInvalidElement, *b.items[part[k]].src)
				}
			}
		}
	}
	return nil
}

type groupKey struct {
	shard     int
	topic     string
	partition int32
}

type groupCount struct {
	key              groupKey
	n, start, placed int
}

func (b *batch) key(k string) int {
	if i, ok := b.keyIdx[k]; ok {
		return i
	}
	b.keys = append(b.keys, k)
	b.keyIdx[k] = len(b.keys)
	return len(b.keys)
}

// run makes one script call for the items in order (sorted by shard,
// topic, partition, offset) and writes their verdicts into out. A call
// refused for a stage it needs is made again once the stage is made
// (awaitStages), within Config.GrowthWait from the first refusal.
func (f *Filter) run(ctx context.Context, b *batch, order []int, out []Verdict) error {
	recordExpire := f.encode(b, order)
	shard := b.items[order[0]].loc.shard
	var waitStart time.Time
	var needs []stageRef
	for {
		res, err := f.call(ctx, b, shard, recordExpire)
		if err != nil {
			if !waitStart.IsZero() && ctx.Err() == nil {
				f.waited(waitStart, needs, false)
			}
			return fmt.Errorf("%w: test-and-set of %d elements on shard %d: %w", ErrRedis, len(order), shard, err)
		}
		if list, refused := strings.CutPrefix(res, "!"); refused {
			f.refused()
			if needs, err = b.parseStages(list); err != nil {
				return err
			}
			if waitStart.IsZero() {
				waitStart = time.Now()
			}
			deadline := waitStart.Add(f.cfg.GrowthWait)
			if !time.Now().Before(deadline) {
				err = fmt.Errorf("%w: refused for stage %d of %s after %v", ErrGrowthWait, needs[0].stage,
					f.FilterKey(needs[0].shard, needs[0].bucket), f.cfg.GrowthWait)
			} else {
				err = f.awaitStages(ctx, needs, deadline)
			}
			if err != nil {
				if ctx.Err() == nil {
					f.waited(waitStart, needs, false)
				}
				return fmt.Errorf("test-and-set of %d elements on shard %d: %w", len(order), shard, err)
			}
			continue
		}
		if !waitStart.IsZero() {
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

// call runs the script once.
func (f *Filter) call(ctx context.Context, b *batch, shard int, recordExpire int64) (string, error) {
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	if f.cfg.MinReplicas > 0 {
		return f.runReplicated(cctx, shard, b.keys,
			f.cfg.ReplayHorizon, recordExpire, b.parts, b.els, b.words, f.plan.Layout.Words, b.buckets, f.stageTab, b.btab)
	}
	return testAndSetScript.Run(cctx, f.client, b.keys,
		f.cfg.ReplayHorizon, recordExpire, b.parts, b.els, b.words, f.plan.Layout.Words, b.buckets, f.stageTab, b.btab).Text()
}

// encode builds the script's keys and arguments for the items in order
// and returns the expiry of the decision records.
func (f *Filter) encode(b *batch, order []int) int64 {
	W := f.plan.Layout.Words
	w := f.cfg.Windows
	b.keys = b.keys[:0]
	clear(b.keyIdx)

	// Bucket groups, ascending by bucket so that a bucket's writes are seen
	// by the next bucket's test of its previous one.
	b.bgroups = b.bgroups[:0]
	for _, i := range order {
		it := &b.items[i]
		if it.filtered {
			g := bucketGroup{it.loc.shard, it.bucket}
			if !slices.Contains(b.bgroups, g) {
				b.bgroups = append(b.bgroups, g)
			}
		}
	}
	slices.SortFunc(b.bgroups, func(x, y bucketGroup) int {
		return cmp.Or(cmp.Compare(x.bucket, y.bucket), cmp.Compare(x.shard, y.shard))
	})
	lastByte := strconv.FormatUint(f.plan.ShardBits-8, 10)
	clear(b.brefs)
	b.refList = b.refList[:0]
	b.btabBuf = b.btabBuf[:0]
	ref := func(shard int, bucket int64) int {
		k := bucketGroup{shard, bucket}
		if r, ok := b.brefs[k]; ok {
			return r
		}
		r := len(b.brefs) + 1
		b.brefs[k] = r
		b.refList = append(b.refList, k)
		meta := 0
		if f.plan.Growth() {
			meta = b.key(f.GrowthKey(shard, bucket))
		}
		b.btabBuf = msgp.AppendInt(b.btabBuf, meta)
		for st := range f.plan.Stages {
			b.btabBuf = msgp.AppendInt(b.btabBuf, b.key(f.StageKey(shard, bucket, st)))
		}
		return r
	}
	now := f.cfg.Now()
	recordExpire := now.Unix() + int64((w.Retention()+w.Length)/1e9)
	current := w.Bucket(now)
	b.buckets = msgp.AppendArrayHeader(b.buckets[:0], uint32(6*len(b.bgroups)))
	for _, g := range b.bgroups {
		// Rolling mode tests the previous bucket, where an earlier copy
		// may be. Once the next bucket has begun by the clock, a later
		// copy may have been decided first (partitions of a backlog are
		// read at different paces), so the next bucket is tested too: the
		// same IDs are then forwarded in whatever order copies are decided.
		// Live input, decided within its bucket, skips that read.
		own, prev, next := ref(g.shard, g.bucket), 0, 0
		if w.Mode == Rolling {
			prev = ref(g.shard, g.bucket-1)
			if g.bucket < current {
				next = ref(g.shard, g.bucket+1)
			}
		}
		b.buckets = msgp.AppendInt(b.buckets, own)
		b.buckets = msgp.AppendInt(b.buckets, prev)
		b.buckets = msgp.AppendInt(b.buckets, next)
		b.buckets = msgp.AppendString(b.buckets, strconv.FormatInt(w.ExpireAt(g.bucket), 10))
		b.buckets = msgp.AppendString(b.buckets, lastByte)
		b.buckets = msgp.AppendString(b.buckets, strconv.FormatInt(w.Deadline(w.Start(g.bucket)).Unix(), 10))
		recordExpire = max(recordExpire, w.ExpireAt(g.bucket))
	}
	b.btab = msgp.AppendArrayHeader(b.btab[:0], uint32(len(b.brefs)*(1+len(f.plan.Stages))))
	b.btab = append(b.btab, b.btabBuf...)

	// Partition groups, elements and word offsets.
	nparts := 0
	b.scratch = b.scratch[:0]
	nfiltered := 0
	for k := 0; k < len(order); {
		first := b.items[order[k]]
		n := 0
		for k+n < len(order) {
			it := &b.items[order[k+n]]
			if it.loc.shard != first.loc.shard || it.src.Topic != first.src.Topic || it.src.Partition != first.src.Partition {
				break
			}
			if it.filtered {
				nfiltered++
			}
			n++
		}
		b.scratch = msgp.AppendInt(b.scratch, b.key(f.RecordKey(first.loc.shard, first.src.Topic, first.src.Partition)))
		b.scratch = msgp.AppendInt(b.scratch, n)
		nparts++
		k += n
	}
	b.parts = msgp.AppendArrayHeader(b.parts[:0], uint32(2*nparts))
	b.parts = append(b.parts, b.scratch...)

	perEl := 2 + W
	growth := f.plan.Growth()
	if growth {
		perEl += W
	}
	b.els = msgp.AppendArrayHeader(b.els[:0], uint32(len(order)*perEl))
	b.words = msgp.AppendArrayHeader(b.words[:0], uint32(nfiltered*W))
	var num [20]byte
	for _, i := range order {
		it := &b.items[i]
		b.els = msgp.AppendInt64(b.els, it.src.Offset)
		g := 0
		if it.filtered {
			g = slices.Index(b.bgroups, bucketGroup{it.loc.shard, it.bucket}) + 1
		}
		b.els = msgp.AppendInt(b.els, g)
		for j := 0; j < W; j++ {
			if it.filtered {
				b.els = msgp.AppendUint64(b.els, uint64(it.loc.hi[j])<<26|uint64(it.loc.lo[j]))
				b.words = msgp.AppendStringFromBytes(b.words, strconv.AppendUint(num[:0], it.loc.word[j], 10))
			} else {
				b.els = msgp.AppendUint32(b.els, 0)
			}
		}
		if growth {
			for j := 0; j < W; j++ {
				b.els = msgp.AppendFloat64(b.els, it.loc.u[j])
			}
		}
	}

	return recordExpire
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
			v = cmp.Or(b.items[i].unfilt, ReplayedFirstSeen)
		case 'U':
			// Not filtered: by the caller's choice, or because the server's
			// clock had passed the bucket's deadline (keys may be gone).
			v = cmp.Or(b.items[i].unfilt, Late)
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

package bloom

// The arguments of one script call, as protocol.go lays them out.

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/tinylib/msgp/msgp"
)

// scriptCall is one call of the script: its KEYS and ARGV.
type scriptCall struct {
	keys []string
	argv []any
}

// encode builds the script's keys and arguments for the items in order.
func (f *Filter) encode(b *batch, order []int) scriptCall {
	b.keys = b.keys[:0]
	clear(b.keyIdx)
	b.plans = b.plans[:0]
	recordExpire := f.encodeGroups(b, order)
	f.encodeRuns(b, order)
	f.encodeElements(b, order)
	b.plansArg = msgp.AppendArrayHeader(b.plansArg[:0], uint32(len(b.plans)))
	for _, wp := range b.plans {
		b.plansArg = append(b.plansArg, wp.arg...)
	}
	argv := make([]any, argLocations-1+2*len(b.plans))
	argv[argRing-1] = f.cfg.ReplayHorizon
	argv[argRecordExpire-1] = recordExpire
	argv[argPlans-1] = b.plansArg
	argv[argBuckets-1] = b.bucketsArg
	argv[argGroups-1] = b.groupsArg
	argv[argRuns-1] = b.runsArg
	argv[argElements-1] = b.elemsArg
	b.locArgs = slices.Grow(b.locArgs[:0], 2*len(b.plans))[:2*len(b.plans)]
	for k, wp := range b.plans {
		b.locArgs[2*k], b.locArgs[2*k+1] = encodeLocations(b, order, wp, b.locArgs[2*k][:0], b.locArgs[2*k+1][:0])
		argv[argLocations-1+2*k] = b.locArgs[2*k]
		argv[argLocations+2*k] = b.locArgs[2*k+1]
	}
	return scriptCall{keys: b.keys, argv: argv}
}

// planRef is the 1-based number of wp among the call's plans, added if
// new.
func (b *batch) planRef(wp *windowPlan) int {
	if i := slices.Index(b.plans, wp); i >= 0 {
		return i + 1
	}
	b.plans = append(b.plans, wp)
	return len(b.plans)
}

// planArg is a plan's entry in the script's argPlans: its kind, stage
// count and, per stage, the entries planField* names. It is the same for
// every call.
func planArg(p Plan) []byte {
	tab := msgp.AppendArrayHeader(nil, planFieldWidths)
	kind := kindCodeBloom
	if p.Kind == KindFingerprint {
		kind = kindCodeFingerprint
	}
	tab = msgp.AppendInt(tab, kind)
	tab = msgp.AppendInt(tab, len(p.Stages))
	stages := func(v func(st int, s Stage) int64) {
		tab = msgp.AppendArrayHeader(tab, uint32(len(p.Stages)))
		for i, s := range p.Stages {
			tab = msgp.AppendInt64(tab, v(i, s))
		}
	}
	stages(func(i int, _ Stage) int64 {
		if c := p.scriptCap(i); !math.IsInf(c, 1) {
			return int64(c)
		}
		return -1
	})
	stages(func(_ int, s Stage) int64 {
		if p.Kind == KindFingerprint {
			return int64(s.slots())
		}
		return int64(s.ShardBits / WordBits)
	})
	stages(func(_ int, s Stage) int64 {
		if p.Kind == KindFingerprint {
			return int64(s.PartSlots)
		}
		return int64(s.PartBits / WordBits)
	})
	stages(func(i int, s Stage) int64 {
		if i == 0 {
			return 0
		}
		return StageLead(s).Milliseconds()
	})
	stages(func(_ int, s Stage) int64 {
		if p.Kind == KindFingerprint {
			return int64(s.Bytes)
		}
		return int64(p.Layout.Words)
	})
	return tab
}

// groupOf is the bucket group of a tested item: its shard and placement,
// and the shard of each neighbour it reads under that neighbour's plan.
// On a Cluster a neighbour whose shard is another (a plan of another shard
// count) is in another slot and is not read (see the package doc, Plans).
func (f *Filter) groupOf(it *item) bucketGroup {
	g := bucketGroup{shard: it.loc.shard, at: it.at, prev: -1, next: -1}
	for i, on := range [2]bool{it.at.prev, it.at.next} {
		if !on {
			continue
		}
		_, loc := it.neighbour(i)
		s := loc.shard
		if f.cluster && s != g.shard {
			s = -1
		}
		if i == 0 {
			g.prev = s
		} else {
			g.next = s
		}
	}
	return g
}

// encodeGroups lists the call's bucket groups (argGroups), ascending by
// bucket so that a bucket's writes are seen by the next bucket's test of
// its previous one, and every bucket they read (argBuckets). It returns
// the expiry of the decision records: one window past the retention of a
// bucket started now, and no earlier than any bucket's keys.
func (f *Filter) encodeGroups(b *batch, order []int) int64 {
	w := f.cfg.Window
	b.groups = b.groups[:0]
	b.groupWP = b.groupWP[:0]
	for _, i := range order {
		it := &b.items[i]
		if !it.at.tested() {
			continue
		}
		if g := f.groupOf(it); !slices.Contains(b.groups, g) {
			b.groups = append(b.groups, g)
			b.groupWP = append(b.groupWP, [3]*windowPlan{it.wp, it.nbPlan(0), it.nbPlan(1)})
		}
	}
	idx := make([]int, len(b.groups))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(x, y int) int {
		return cmp.Or(cmp.Compare(b.groups[x].at.bucket, b.groups[y].at.bucket), cmp.Compare(b.groups[x].shard, b.groups[y].shard))
	})
	groups, plans := slices.Clone(b.groups), slices.Clone(b.groupWP)
	for k, i := range idx {
		b.groups[k], b.groupWP[k] = groups[i], plans[i]
	}
	clear(b.refOf)
	b.refs = b.refs[:0]
	b.scratch = b.scratch[:0]
	recordExpire := b.now.Unix() + int64((w.Retention()+w.Length)/time.Second)
	b.groupsArg = msgp.AppendArrayHeader(b.groupsArg[:0], uint32(groupStride*len(b.groups)))
	for k, g := range b.groups {
		wps := b.groupWP[k]
		own, prev, next := f.bucketRef(b, wps[0], g.own()), 0, 0
		if g.prev >= 0 {
			prev = f.bucketRef(b, wps[1], shardBucket{g.prev, g.at.bucket - 1})
		}
		if g.next >= 0 {
			next = f.bucketRef(b, wps[2], shardBucket{g.next, g.at.bucket + 1})
		}
		b.groupsArg = msgp.AppendInt(b.groupsArg, own)
		b.groupsArg = msgp.AppendInt(b.groupsArg, prev)
		b.groupsArg = msgp.AppendInt(b.groupsArg, next)
		b.groupsArg = msgp.AppendString(b.groupsArg, strconv.FormatInt(w.ExpireAt(g.at.bucket), 10))
		b.groupsArg = msgp.AppendString(b.groupsArg, strconv.FormatInt(w.deadline(g.at.bucket), 10))
		recordExpire = max(recordExpire, w.ExpireAt(g.at.bucket))
	}
	// b.scratch holds the entries bucketRef appended, one bucket each.
	b.bucketsArg = msgp.AppendArrayHeader(b.bucketsArg[:0], uint32(len(b.refs)))
	b.bucketsArg = append(b.bucketsArg, b.scratch...)
	return recordExpire
}

// bucketRef is the 1-based number of sb, a window of plan wp, among the
// buckets the call reads. A bucket new to the call gets its entry of
// argBuckets in b.scratch: its plan, the key index of its growth record
// (0 for a plan that keeps none), then of each stage (its first part; the
// others follow it in KEYS, new to the call with the bucket).
func (f *Filter) bucketRef(b *batch, wp *windowPlan, sb shardBucket) int {
	if r, ok := b.refOf[sb]; ok {
		return r
	}
	b.refs = append(b.refs, sb)
	b.refOf[sb] = len(b.refs)
	growthRecord := 0
	if wp.plan.counts() {
		growthRecord = b.key(wp.growthKey(sb.shard, sb.bucket))
	}
	b.scratch = msgp.AppendArrayHeader(b.scratch, uint32(2+len(wp.plan.Stages)))
	b.scratch = msgp.AppendInt(b.scratch, b.planRef(wp))
	b.scratch = msgp.AppendInt(b.scratch, growthRecord)
	for st, stage := range wp.plan.Stages {
		b.scratch = msgp.AppendInt(b.scratch, b.key(wp.stageKey(sb.shard, sb.bucket, st)))
		for pt := 1; pt < stage.Parts; pt++ {
			b.key(wp.partKey(sb.shard, sb.bucket, st, pt))
		}
	}
	return len(b.refs)
}

// encodeRuns lists the partition runs (argRuns): each one's decision
// record and its count of items, in call order.
func (f *Filter) encodeRuns(b *batch, order []int) {
	nruns := 0
	b.scratch = b.scratch[:0]
	for k := 0; k < len(order); {
		first := b.items[order[k]]
		n := 0
		for k+n < len(order) {
			it := &b.items[order[k+n]]
			if it.wp != first.wp || it.loc.shard != first.loc.shard || it.src.Topic != first.src.Topic || it.src.Partition != first.src.Partition {
				break
			}
			n++
		}
		b.scratch = msgp.AppendInt(b.scratch, b.key(first.wp.recordKey(first.loc.shard, first.src.Topic, first.src.Partition)))
		b.scratch = msgp.AppendInt(b.scratch, n)
		nruns++
		k += n
	}
	b.runsArg = msgp.AppendArrayHeader(b.runsArg[:0], uint32(runStride*nruns))
	b.runsArg = append(b.runsArg, b.scratch...)
}

// encodeElements lists each item (argElements): its offset in 7 bytes and
// its bucket group (0: not tested) in 2, big-endian.
func (f *Filter) encodeElements(b *batch, order []int) {
	b.elemsArg = slices.Grow(b.elemsArg[:0], elementBytes*len(order))
	for _, i := range order {
		it := &b.items[i]
		g := 0
		switch {
		case it.at.tested():
			g = slices.Index(b.groups, f.groupOf(it)) + 1
		case it.at.status == probed:
			g = probeGroup
		}
		var e [8 + 2]byte
		binary.BigEndian.PutUint64(e[:8], uint64(it.src.Offset))
		binary.BigEndian.PutUint16(e[8:], uint16(g))
		b.elemsArg = append(b.elemsArg, e[1:]...)
	}
}

// encodeLocations lists where each item is under plan wp (argLocations
// and the slot after it, for wp's place among the call's plans), appended
// to a and c: for the Bloom kind each word's mask and, with stages, its
// position, then each word's bit offset in stage 0; for the fingerprint
// kind its position, fingerprint and first read. An item that reads no
// window of wp (not tested, or tested only elsewhere) gets zeros.
func encodeLocations(b *batch, order []int, wp *windowPlan, a, c []byte) ([]byte, []byte) {
	p := &wp.plan
	under := func(it *item) *location {
		if !it.at.tested() {
			return nil
		}
		if it.wp == wp {
			return &it.loc
		}
		for i := range 2 {
			if it.nbWP[i] == wp {
				return &it.nb[i]
			}
		}
		return nil
	}
	if p.Kind == KindFingerprint {
		a = slices.Grow(a, fpLocationBytes*len(order))
		st := p.Stages[0]
		for _, i := range order {
			var e [fpLocationBytes]byte
			if loc := under(&b.items[i]); loc != nil {
				binary.BigEndian.PutUint64(e[fpLocPosition:], math.Float64bits(loc.u[0]))
				binary.BigEndian.PutUint64(e[fpLocFingerprint:], loc.fp)
				part, off := homeSlot(loc.u[0], st)
				binary.BigEndian.PutUint16(e[fpLocPart:], uint16(part))
				binary.BigEndian.PutUint32(e[fpLocHome:], uint32(off))
				putText(e[fpLocFrom:fpLocTo], off)
				putText(e[fpLocTo:], off+fpFirstRead*uint64(st.Bytes)-1)
			}
			a = append(a, e[:]...)
		}
		return a, c
	}
	W := p.Layout.Words
	stride := W
	growth := p.Growth()
	if growth {
		stride += W
	}
	a = msgp.AppendArrayHeader(a, uint32(len(order)*stride))
	c = msgp.AppendArrayHeader(c, uint32(len(order)*W))
	var num [20]byte
	for _, i := range order {
		loc := under(&b.items[i])
		for j := 0; j < W; j++ {
			if loc != nil {
				a = msgp.AppendUint64(a, uint64(loc.hi[j])<<26|uint64(loc.lo[j]))
				c = msgp.AppendStringFromBytes(c, strconv.AppendUint(num[:0], loc.word[j], 10))
			} else {
				a = msgp.AppendUint32(a, 0)
				c = msgp.AppendString(c, "0")
			}
		}
		if growth {
			for j := 0; j < W; j++ {
				u := 0.0
				if loc != nil {
					u = loc.u[j]
				}
				a = msgp.AppendFloat64(a, u)
			}
		}
	}
	return a, c
}

// putText writes n into field as a length byte and its decimal digits.
func putText(field []byte, n uint64) {
	d := strconv.AppendUint(field[1:1], n, 10)
	field[0] = byte(len(d))
}

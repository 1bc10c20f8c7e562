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
	recordExpire := f.encodeGroups(b, order)
	f.encodeRuns(b, order)
	f.encodeElements(b, order)
	f.encodeLocations(b, order)
	argv := make([]any, argLocations+1)
	argv[argRing-1] = f.cfg.ReplayHorizon
	argv[argRecordExpire-1] = recordExpire
	argv[argPlans-1] = f.plansArg
	argv[argBuckets-1] = b.bucketsArg
	argv[argGroups-1] = b.groupsArg
	argv[argRuns-1] = b.runsArg
	argv[argElements-1] = b.elemsArg
	argv[argLocations-1] = b.locArg
	argv[argLocations] = b.offsArg
	return scriptCall{keys: b.keys, argv: argv}
}

// plansArg is the script's argPlans for plan: its kind, stage count and,
// per stage, the entries planField* names. It is the same for every call
// of a Filter.
func plansArg(p Plan) []byte {
	tab := msgp.AppendArrayHeader(nil, 1)
	tab = msgp.AppendArrayHeader(tab, planFieldWidths)
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

// encodeGroups lists the call's bucket groups (argGroups), ascending by
// bucket so that a bucket's writes are seen by the next bucket's test of
// its previous one, and every bucket they read (argBuckets). It returns
// the expiry of the decision records: one window past the retention of a
// bucket started now, and no earlier than any bucket's keys.
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
	b.groupsArg = msgp.AppendArrayHeader(b.groupsArg[:0], uint32(groupStride*len(b.groups)))
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
	b.bucketsArg = msgp.AppendArrayHeader(b.bucketsArg[:0], uint32(len(b.refs)))
	b.bucketsArg = append(b.bucketsArg, b.scratch...)
	return recordExpire
}

// bucketRef is the 1-based number of sb among the buckets the call reads.
// A bucket new to the call gets its entry of argBuckets in b.scratch: its
// plan, the key index of its growth record (0 for a plan that keeps
// none), then of each stage (its first part; the others follow it in
// KEYS, new to the call with the bucket).
func (f *Filter) bucketRef(b *batch, sb shardBucket) int {
	if r, ok := b.refOf[sb]; ok {
		return r
	}
	b.refs = append(b.refs, sb)
	b.refOf[sb] = len(b.refs)
	growthRecord := 0
	if f.plan.counts() {
		growthRecord = b.key(f.GrowthKey(sb.shard, sb.bucket))
	}
	b.scratch = msgp.AppendArrayHeader(b.scratch, uint32(2+len(f.plan.Stages)))
	b.scratch = msgp.AppendInt(b.scratch, 1)
	b.scratch = msgp.AppendInt(b.scratch, growthRecord)
	for st, stage := range f.plan.Stages {
		b.scratch = msgp.AppendInt(b.scratch, b.key(f.StageKey(sb.shard, sb.bucket, st)))
		for pt := 1; pt < stage.Parts; pt++ {
			b.key(f.PartKey(sb.shard, sb.bucket, st, pt))
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
			if it.loc.shard != first.loc.shard || it.src.Topic != first.src.Topic || it.src.Partition != first.src.Partition {
				break
			}
			n++
		}
		b.scratch = msgp.AppendInt(b.scratch, b.key(f.RecordKey(first.loc.shard, first.src.Topic, first.src.Partition)))
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
		if it.at.tested() {
			g = slices.Index(b.groups, bucketGroup{it.loc.shard, it.at}) + 1
		}
		var e [8 + 2]byte
		binary.BigEndian.PutUint64(e[:8], uint64(it.src.Offset))
		binary.BigEndian.PutUint16(e[8:], uint16(g))
		b.elemsArg = append(b.elemsArg, e[1:]...)
	}
}

// encodeLocations lists where each item is under the plan (argLocations
// and the slot after it): for the Bloom kind each word's mask and, with
// stages, its position, then each word's bit offset in stage 0; for the
// fingerprint kind its position and fingerprint. An item not tested gets
// zeros.
func (f *Filter) encodeLocations(b *batch, order []int) {
	if f.plan.Kind == KindFingerprint {
		b.locArg = slices.Grow(b.locArg[:0], fpLocationBytes*len(order))
		b.offsArg = b.offsArg[:0]
		st := f.plan.Stages[0]
		for _, i := range order {
			it := &b.items[i]
			var e [fpLocationBytes]byte
			if it.at.tested() {
				binary.BigEndian.PutUint64(e[fpLocPosition:], math.Float64bits(it.loc.u[0]))
				binary.BigEndian.PutUint64(e[fpLocFingerprint:], it.loc.fp)
				part, off := homeSlot(it.loc.u[0], st)
				binary.BigEndian.PutUint16(e[fpLocPart:], uint16(part))
				binary.BigEndian.PutUint32(e[fpLocHome:], uint32(off))
				putText(e[fpLocFrom:fpLocTo], off)
				putText(e[fpLocTo:], off+fpFirstRead*uint64(st.Bytes)-1)
			}
			b.locArg = append(b.locArg, e[:]...)
		}
		return
	}
	W := f.plan.Layout.Words
	stride := W
	growth := f.plan.Growth()
	if growth {
		stride += W
	}
	b.locArg = msgp.AppendArrayHeader(b.locArg[:0], uint32(len(order)*stride))
	b.offsArg = msgp.AppendArrayHeader(b.offsArg[:0], uint32(len(order)*W))
	var num [20]byte
	for _, i := range order {
		it := &b.items[i]
		tested := it.at.tested()
		for j := 0; j < W; j++ {
			if tested {
				b.locArg = msgp.AppendUint64(b.locArg, uint64(it.loc.hi[j])<<26|uint64(it.loc.lo[j]))
				b.offsArg = msgp.AppendStringFromBytes(b.offsArg, strconv.AppendUint(num[:0], it.loc.word[j], 10))
			} else {
				b.locArg = msgp.AppendUint32(b.locArg, 0)
				b.offsArg = msgp.AppendString(b.offsArg, "0")
			}
		}
		if growth {
			for j := 0; j < W; j++ {
				b.locArg = msgp.AppendFloat64(b.locArg, it.loc.u[j])
			}
		}
	}
}

// putText writes n into field as a length byte and its decimal digits.
func putText(field []byte, n uint64) {
	d := strconv.AppendUint(field[1:1], n, 10)
	field[0] = byte(len(d))
}

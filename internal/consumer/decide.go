package consumer

// The decide stage: from a batch of messages to the messages to forward
// and to dead-letter. The Extractor reads each message's ID and event time,
// one test-and-set (the Filter) decides the batch, and each verdict becomes
// a forwarded message with the record format's headers, a dead letter with
// its reason, or nothing.

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/record"
)

// decide extracts the IDs of a batch and runs its test-and-set, retrying
// until it succeeds or ctx ends. Input it cannot deduplicate goes with the
// call as probes: a replay of a dead letter delivered before is not
// dead-lettered again. Replays another replica may still be delivering
// wait for it (awaitHandoff) until stopping ends.
func (w *Worker) decide(ctx, stopping context.Context, b *buffers) error {
	batch := b.batch
	w.m.eventsIn.Add(float64(len(batch)))
	elems, idx, undecided, probes := b.elems[:0], b.idx[:0], b.undecided[:0], b.probes[:0]
	// After a rebalance or a re-fetch kafka-go can deliver an offset twice
	// in one batch; the copy is decided once (and committed with the rest).
	offsets := &b.offsets
	offsets.reset()
	// Composite and value IDs are made in the header blocks, which live
	// as long as the batch's messages.
	headers := &b.headers
	headers.reset()
	for i := range batch {
		m := &batch[i]
		if !offsets.first(batch, i) {
			continue
		}
		src := bloom.Source{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset}
		if size := messageBytes(m); size > w.maxMessageBytes {
			// It could be produced neither forward nor as a dead letter, and
			// would stop the partition: dead-letter it without its value.
			undecided = append(undecided, undecidable{i, fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, size, w.maxMessageBytes), true})
			probes = append(probes, src)
			continue
		}
		id, at, err := w.cfg.Extractor.extract(m, headers)
		if err != nil {
			undecided = append(undecided, undecidable{i, err, false})
			probes = append(probes, src)
			continue
		}
		elems = append(elems, bloom.Element{ID: id, Time: at, Source: src})
		idx = append(idx, i)
	}
	b.elems, b.idx, b.undecided, b.probes = elems, idx, undecided, probes

	// Before the call, what this worker asked before of each partition:
	// a replay above it was decided by another replica.
	askedBefore := w.noteAsked(elems, probes)
	d, unchecked, err := w.callFilter(ctx, elems, probes)
	if err != nil {
		return err
	}
	b.decision, b.unchecked = d, unchecked
	if unchecked {
		w.forwardUnchecked(b)
		return nil
	}
	if w.cfg.HandoffWait > 0 {
		if err := w.awaitHandoff(ctx, stopping, elems, probes, d, askedBefore); err != nil {
			return err
		}
	}
	verdicts := d.Verdicts
	// skipped are replays delivered before: committed, nothing else.
	skipped, replayed := 0, 0
	dead := b.dead[:0]
	for k, u := range undecided {
		if d.Probes[k] == bloom.ProbeDelivered {
			skipped++
			continue
		}
		m := &batch[u.i]
		if u.noValue {
			noValue := *m
			noValue.Value = nil
			m = &noValue
		}
		dead = w.deadLetter(dead, m, u.why)
	}
	out, dups := b.out[:0], b.dups[:0]
	keepDups := w.cfg.Duplicates != nil && !w.cfg.Shadow
	// counts are by verdict: any value of the type has a place.
	var counts [math.MaxUint8 + 1]int
	// Per input partition, first and duplicate verdicts: a batch holds a
	// few partitions, mostly in runs.
	var perPartitionBuf [16]partitionCount
	perPartition := perPartitionBuf[:0]
	shadow := w.cfg.Shadow
	deadLetterLate := w.cfg.DeadLetterLate && !shadow
	now := w.cfg.Now()
	firstLate := -1
	for k, v := range verdicts {
		counts[v]++
		switch v {
		case bloom.ReplayedDelivered:
			skipped++
			continue
		case bloom.ReplayedFirstSeen, bloom.ReplayUnknown:
			replayed++
		}
		w.m.eventLag.Observe(max(now.Sub(elems[k].Time), 0).Seconds())
		m := &batch[idx[k]]
		id := kafka.Header{Key: record.IDHeader, Value: elems[k].ID}
		if v == bloom.Late || v == bloom.Future {
			if firstLate < 0 {
				firstLate = k
			}
			if deadLetterLate {
				dead = w.deadLetter(dead, m, fmt.Errorf("%w; event time %s", beyondBound(v), elems[k].Time.UTC().Format(time.RFC3339Nano)))
				continue
			}
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: headers.with(m, id, kafka.Header{Key: record.UndeduplicatedHeader, Value: []byte(v.String())})})
			continue
		}
		verdict := record.First
		if !v.Forward() {
			verdict = record.Duplicate
		}
		perPartition = countPartition(perPartition, int32(m.Partition), verdict)
		switch {
		case shadow:
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: headers.with(m, id, kafka.Header{Key: record.VerdictHeader, Value: verdict.Value()})})
		case verdict == record.First:
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time, Headers: headers.with(m, id)})
		case keepDups:
			dups = append(dups, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: headers.with(m, id, kafka.Header{Key: record.VerdictHeader, Value: record.Duplicate.Value()})})
		}
	}
	b.out, b.dead, b.dups = out, dead, dups
	for v, n := range counts {
		if n > 0 {
			w.m.verdicts.WithLabelValues(bloom.Verdict(v).String()).Add(float64(n))
		}
	}
	for _, c := range perPartition {
		w.m.addPartitionVerdicts(w.cfg.Topic, c.partition, c.n)
	}
	if skipped > 0 {
		w.m.replays.WithLabelValues(ReplaySkipped).Add(float64(skipped))
	}
	if replayed > 0 {
		w.m.replays.WithLabelValues(ReplayForwarded).Add(float64(replayed))
	}
	if firstLate >= 0 {
		e := elems[firstLate]
		action := "forwarded undeduplicated"
		if deadLetterLate {
			action = "dead-lettered"
		}
		w.lateLog.Warn("events beyond the lag bound "+action, zap.Int("late", counts[bloom.Late]), zap.Int("future", counts[bloom.Future]),
			zap.Stringer("first", e.Source), zap.Time("first_event_time", e.Time), zap.Duration("first_lag", now.Sub(e.Time)))
	}
	return nil
}

// batchOffsets finds the offsets a batch holds more than once. A
// partition's offsets come in ascending order unless kafka-go fetched
// again, so while they do, the highest offset per partition tells that an
// offset is new; from the first that does not on, every offset is noted in
// a set.
type batchOffsets struct {
	// highest is each partition's highest offset so far, while they ascend.
	highest []partitionOffset
	// seen holds the batch's offsets once one did not ascend (any is set).
	seen map[[2]int64]struct{}
	any  bool
}

type partitionOffset struct {
	partition int
	offset    int64
}

// reset readies o for a new batch.
func (o *batchOffsets) reset() {
	o.highest = o.highest[:0]
	if o.any {
		clear(o.seen)
		o.any = false
	}
}

// first reports whether batch[i] is the first message of the batch with
// its partition and offset; batch[:i] went through first before it.
func (o *batchOffsets) first(batch []kafka.Message, i int) bool {
	m := &batch[i]
	if !o.any {
		h := len(o.highest) - 1 // a batch holds a few partitions, mostly in runs
		for h >= 0 && o.highest[h].partition != m.Partition {
			h--
		}
		switch {
		case h < 0:
			o.highest = append(o.highest, partitionOffset{m.Partition, m.Offset})
			return true
		case m.Offset > o.highest[h].offset:
			o.highest[h].offset = m.Offset
			return true
		}
		// The first offset that does not ascend: batch[:i] are all new.
		o.any = true
		if o.seen == nil {
			o.seen = make(map[[2]int64]struct{}, len(batch))
		}
		for j := range batch[:i] {
			o.seen[[2]int64{int64(batch[j].Partition), batch[j].Offset}] = struct{}{}
		}
	}
	k := [2]int64{int64(m.Partition), m.Offset}
	if _, dup := o.seen[k]; dup {
		return false
	}
	o.seen[k] = struct{}{}
	return true
}

// partitionCount counts a batch's verdicts of one input partition, by
// record.Verdict.
type partitionCount struct {
	partition int32
	n         [2]int
}

// countPartition counts verdict v of partition p into perPartition, which it
// returns.
func countPartition(perPartition []partitionCount, p int32, v record.Verdict) []partitionCount {
	if n := len(perPartition); n > 0 && perPartition[n-1].partition == p {
		perPartition[n-1].n[v]++
		return perPartition
	}
	for i := range perPartition {
		if perPartition[i].partition == p {
			perPartition[i].n[v]++
			return perPartition
		}
	}
	c := partitionCount{partition: p}
	c.n[v]++
	return append(perPartition, c)
}

// undecidable is input that is not tested (batch[i], dead-lettered for
// why, without its value when noValue), unless it was delivered before.
type undecidable struct {
	i       int
	why     error
	noValue bool
}

// beyondBound is the dead-letter reason of a Late or Future verdict.
func beyondBound(v bloom.Verdict) error {
	if v == bloom.Future {
		return ErrFuture
	}
	return ErrLate
}

// The dead-letter reasons of events beyond the lag bound, under
// DeadLetterLate.
var (
	ErrLate   = record.Late.Err("late: processed after the lag bound (max lag past the end of its event time's window), not deduplicated")
	ErrFuture = record.Future.Err("future: event time so far ahead of the clock that its window starts after the next window's preallocation lead, not deduplicated")
)

// ErrTooLarge dead-letters a message too large to produce again with the
// headers the worker adds (headerAllowance less than the Producers'
// MaxMessageBytes); its dead letter has no value, and its dedupe-source
// header says where the original is.
var ErrTooLarge = record.TooLarge.Err(fmt.Sprintf("message is larger than the producer's limit less %d bytes for the headers the worker adds; the value is left out, see dedupe-source",
	headerAllowance))

// headerAllowance is room left for the headers the worker adds.
const headerAllowance = 4096

// deadLetter appends to dead the dead letter of m: the input unchanged,
// with its source and reason, and counts it.
func (w *Worker) deadLetter(dead []kafka.Message, m *kafka.Message, reason error) []kafka.Message {
	r := record.ReasonOf(reason)
	w.m.deadLettered.WithLabelValues(r.String()).Inc()
	h := make([]kafka.Header, 0, len(m.Headers)+3)
	h = append(h, m.Headers...)
	h = append(h, kafka.Header{Key: record.SourceHeader, Value: record.AppendSource(nil, m.Topic, m.Partition, m.Offset)},
		kafka.Header{Key: record.ErrorHeader, Value: []byte(reason.Error())},
		kafka.Header{Key: record.ReasonHeader, Value: []byte(r.String())})
	return append(dead, kafka.Message{Key: m.Key, Value: m.Value, Headers: h, Time: m.Time})
}

package consumer

// The decide stage: from a batch of messages to the messages to forward
// and to dead-letter. The Extractor reads each message's ID and event time,
// one test-and-set (the Filter) decides the batch, and each verdict becomes
// a forwarded message with the event format's headers, a dead letter with
// its reason, or nothing.

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/event"
)

// decide takes a batch through the four steps of the stage: extract, one
// test-and-set (retried until it succeeds or ctx ends), route and count.
// Replays another replica may still be delivering wait for it
// (awaitHandoff) until stopping ends.
func (w *Worker) decide(ctx, stopping context.Context, b *buffers) error {
	w.m.eventsIn.Add(float64(len(b.batch)))
	w.extractBatch(b)
	if err := w.testAndSet(ctx, stopping, b); err != nil {
		return err
	}
	if b.unchecked {
		w.forwardUnchecked(b)
		return nil
	}
	t := w.route(b)
	w.count(t, b)
	return nil
}

// extractBatch reads the ID and event time of each message of b (the
// Extractor) into b.elems, and sets aside as b.undecided, with their
// sources as b.probes, the messages that cannot be deduplicated: a probe
// tells whether a dead letter was delivered before, so that a replay of
// it is not dead-lettered again.
func (w *Worker) extractBatch(b *buffers) {
	batch := b.batch
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
		src := sourceOf(m)
		if size := inputBytes(m); size > w.maxMessageBytes {
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
}

// sourceOf is where m was read.
func sourceOf(m *kafka.Message) event.Source {
	return event.Source{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset}
}

// testAndSet is the batch's one test-and-set (callFilter): b.decision, or
// b.unchecked when failing open. Replays another replica decided then wait
// for its delivered marks (HandoffWait).
func (w *Worker) testAndSet(ctx, stopping context.Context, b *buffers) error {
	// Before the call, what this worker asked before of each partition:
	// a replay above it was decided by another replica.
	askedBefore := w.noteAsked(b.elems, b.probes)
	d, unchecked, err := w.callFilter(ctx, b.elems, b.probes)
	if err != nil {
		return err
	}
	b.decision, b.unchecked = d, unchecked
	if unchecked || w.cfg.HandoffWait == 0 {
		return nil
	}
	return w.awaitHandoff(ctx, stopping, b.elems, b.probes, d, askedBefore)
}

// tally is what route found, for count.
type tally struct {
	// verdicts counts the batch's verdicts: any value of the type has a
	// place.
	verdicts [math.MaxUint8 + 1]int
	// partitions counts first and duplicate verdicts per input partition.
	partitions partitionVerdicts
	// skipped are replays delivered before (committed, nothing else),
	// replayed the replays forwarded again.
	skipped, replayed int
	// firstLate is the index in b.elems of the first event beyond the lag
	// bound, -1 when none is.
	firstLate int
}

// route turns each verdict of b's decision into a message: forwarded
// (b.out) with the event format's headers, kept as a copy (b.dups), dead-
// lettered (b.dead) with its reason, or nothing; and each undecided
// message into a dead letter unless it was delivered before.
func (w *Worker) route(b *buffers) *tally {
	t := &b.tally
	*t = tally{firstLate: -1, partitions: t.partitions}
	t.partitions.reset()
	dead, skipped := w.deadLetterUndecided(b, b.decision.Probes)
	t.skipped = skipped
	out, dups := b.out[:0], b.dups[:0]
	keepDups := w.cfg.Duplicates != nil && !w.cfg.Shadow
	shadow := w.cfg.Shadow
	deadLetterLate := w.cfg.DeadLetterLate && !shadow
	for k, v := range b.decision.Verdicts {
		t.verdicts[v]++
		switch v {
		case bloom.ReplayedDelivered:
			t.skipped++
			continue
		case bloom.ReplayedFirstSeen, bloom.ReplayUnknown:
			t.replayed++
		}
		m := &b.batch[b.idx[k]]
		id := kafka.Header{Key: event.IDHeader, Value: b.elems[k].ID}
		if v == bloom.Late || v == bloom.Future {
			if t.firstLate < 0 {
				t.firstLate = k
			}
			if deadLetterLate {
				dead = w.deadLetter(dead, m, fmt.Errorf("%w; event time %s", beyondBound(v), b.elems[k].Time.UTC().Format(time.RFC3339Nano)))
				continue
			}
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: b.headers.with(m, id, kafka.Header{Key: event.UndeduplicatedHeader, Value: []byte(v.String())})})
			continue
		}
		verdict := v.Label()
		t.partitions.add(m.Partition, verdict)
		switch {
		case shadow:
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: b.headers.with(m, id, kafka.Header{Key: event.VerdictHeader, Value: verdict.Value()})})
		case verdict == event.First:
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time, Headers: b.headers.with(m, id)})
		case keepDups:
			dups = append(dups, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: b.headers.with(m, id, kafka.Header{Key: event.VerdictHeader, Value: event.Duplicate.Value()})})
		}
	}
	b.out, b.dead, b.dups = out, dead, dups
	return t
}

// deadLetterUndecided returns b.dead holding the dead letters of b's
// undecided messages, but those whose probe answer (answers, nil when
// failing open) says they were delivered before: it returns how many it
// skipped.
func (w *Worker) deadLetterUndecided(b *buffers, answers []bloom.ProbeAnswer) (dead []kafka.Message, skipped int) {
	dead = b.dead[:0]
	for k, u := range b.undecided {
		if answers != nil && answers[k] == bloom.ProbeDelivered {
			skipped++
			continue
		}
		m := &b.batch[u.i]
		if u.noValue {
			noValue := *m
			noValue.Value = nil
			m = &noValue
		}
		dead = w.deadLetter(dead, m, u.why)
	}
	return dead, skipped
}

// count adds what route found in b to the metrics, and reports events
// beyond the lag bound (sampled).
func (w *Worker) count(t *tally, b *buffers) {
	now := w.cfg.Now()
	for k, v := range b.decision.Verdicts {
		if v != bloom.ReplayedDelivered {
			w.m.eventLag.Observe(max(now.Sub(b.elems[k].Time), 0).Seconds())
		}
	}
	for v, n := range t.verdicts {
		if n > 0 {
			w.m.verdicts.WithLabelValues(bloom.Verdict(v).String()).Add(float64(n))
		}
	}
	for i, n := range t.partitions.n {
		w.m.addPartitionVerdicts(w.cfg.Topic, int32(t.partitions.slots.parts[i]), n)
	}
	if t.skipped > 0 {
		w.m.replays.WithLabelValues(ReplaySkipped).Add(float64(t.skipped))
	}
	if t.replayed > 0 {
		w.m.replays.WithLabelValues(ReplayForwarded).Add(float64(t.replayed))
	}
	if t.firstLate >= 0 {
		e := b.elems[t.firstLate]
		action := "forwarded undeduplicated"
		if w.cfg.DeadLetterLate && !w.cfg.Shadow {
			action = "dead-lettered"
		}
		w.lateLog.Warn("events beyond the lag bound "+action, zap.Int("late", t.verdicts[bloom.Late]), zap.Int("future", t.verdicts[bloom.Future]),
			zap.Stringer("first", e.Source), zap.Time("first_event_time", e.Time), zap.Duration("first_lag", now.Sub(e.Time)))
	}
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
	ErrLate   = event.Late.Err("late: processed after the lag bound (max lag past the end of its event time's window), not deduplicated")
	ErrFuture = event.Future.Err("future: event time so far ahead of the clock that its window starts after the next window's preallocation lead, not deduplicated")
)

// ErrTooLarge dead-letters a message too large to produce again with the
// headers the worker adds (headerAllowance less than the Producers'
// MaxMessageBytes); its dead letter has no value, and its dedupe-source
// header says where the original is.
var ErrTooLarge = event.TooLarge.Err(fmt.Sprintf("message is larger than the producer's limit less %d bytes for the headers the worker adds; the value is left out, see dedupe-source",
	headerAllowance))

// headerAllowance is room left for the headers the worker adds.
const headerAllowance = 4096

// deadLetter appends to dead the dead letter of m: the input unchanged,
// with its source and reason, and counts it.
func (w *Worker) deadLetter(dead []kafka.Message, m *kafka.Message, reason error) []kafka.Message {
	r := event.ReasonOf(reason)
	w.m.deadLettered.WithLabelValues(r.String()).Inc()
	h := make([]kafka.Header, 0, len(m.Headers)+3)
	h = append(h, m.Headers...)
	h = append(h, kafka.Header{Key: event.SourceHeader, Value: sourceOf(m).Append(nil)},
		kafka.Header{Key: event.ErrorHeader, Value: []byte(reason.Error())},
		kafka.Header{Key: event.ReasonHeader, Value: []byte(r.String())})
	return append(dead, kafka.Message{Key: m.Key, Value: m.Value, Headers: h, Time: m.Time})
}

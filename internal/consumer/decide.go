package consumer

// The decide stage: from a batch of messages to the messages to forward
// and to dead-letter. The Extractor reads each message's ID and event time,
// one test-and-set (the Filter) decides the batch, and each verdict becomes
// a forwarded message with the record format's headers, a dead letter with
// its reason, or nothing.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/record"
	"dedupe-worker/internal/retry"
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

// callFilter is the batch's test-and-set, retried until it succeeds or
// ctx ends; with FailOpenAfter, until the filter has failed for that long
// (unchecked is then true, and the decision empty). While the episode
// lasts the filter is tried again at most every failOpenRetry, each batch
// in between going unchecked at once; the first call that succeeds ends
// it. The worker is not ready while the filter fails, unchecked or not.
func (w *Worker) callFilter(ctx context.Context, elems []bloom.Element, probes []bloom.Source) (d bloom.Decision, unchecked bool, err error) {
	call := func(ctx context.Context) error {
		t := time.Now()
		var err error
		d, err = w.filter.Decide(ctx, elems, probes)
		w.m.redisSeconds.Observe(time.Since(t).Seconds())
		return err
	}
	if w.cfg.FailOpenAfter == 0 {
		return d, false, w.retry(ctx, &w.deciding, StepDecide, "", call)
	}
	fo := &w.failOpen
	if fo.open && time.Since(fo.tried) < failOpenRetry {
		return bloom.Decision{}, true, nil
	}
	err = retry.Do(ctx, retry.Calls, call, func(err error, wait time.Duration) error {
		w.deciding.Store(false)
		if permanent(err) {
			return w.stageError(StepDecide, "", err)
		}
		w.m.errors.WithLabelValues(StepDecide).Inc()
		now := time.Now()
		if fo.since.IsZero() {
			fo.since = now
		}
		if fo.open || now.Sub(fo.since) >= w.cfg.FailOpenAfter {
			fo.tried = now
			if !fo.open {
				fo.open = true
				w.log.Error("the filter has failed for DEDUPE_FAIL_OPEN_AFTER: forwarding valid events unchecked (dedupe-verdict: unchecked; copies pass) until Redis answers",
					zap.Duration("failing_for", now.Sub(fo.since)), zap.Error(err))
			}
			return errFailOpen
		}
		w.log.Warn(stepPhrase(StepDecide)+" failed; retrying", zap.Error(err), zap.Duration("backoff", wait))
		return nil
	})
	switch {
	case err == nil:
		w.deciding.Store(true)
		if fo.open {
			w.log.Warn("Redis answers again: checking resumed", zap.Duration("failed_for", time.Since(fo.since)))
		}
		*fo = failOpenState{}
		return d, false, nil
	case errors.Is(err, errFailOpen):
		return bloom.Decision{}, true, nil
	}
	if se, ok := errors.AsType[*StageError](err); ok {
		return d, false, se
	}
	return d, false, fmt.Errorf("%s: %w", stepPhrase(StepDecide), err)
}

// failOpenState is a failure of the filter as callFilter follows it.
type failOpenState struct {
	since time.Time // the first failure of the episode; zero: none
	open  bool      // events go unchecked
	tried time.Time // the filter's last try while open
}

// tryFilter, for an idle worker failing open, asks the filter for an
// answer at most every failOpenRetry; one ends the episode, as a batch's
// test-and-set that succeeds would.
func (w *Worker) tryFilter(ctx context.Context) {
	fo := &w.failOpen
	if time.Since(fo.tried) < failOpenRetry {
		return
	}
	fo.tried = time.Now()
	if err := w.filter.Ping(ctx); err != nil {
		return
	}
	w.deciding.Store(true)
	w.log.Warn("Redis answers again: checking resumed", zap.Duration("failed_for", time.Since(fo.since)))
	*fo = failOpenState{}
}

// errFailOpen ends callFilter's retries once the filter has failed for
// FailOpenAfter.
var errFailOpen = errors.New("failing open")

// failOpenRetry is how often a worker failing open tries the filter.
const failOpenRetry = time.Second

// forwardUnchecked fills b's output from a batch decided without the
// filter: every valid event forwarded, marked unchecked and counted; what
// cannot be deduplicated dead-lettered.
func (w *Worker) forwardUnchecked(b *buffers) {
	dead, out := b.dead[:0], b.out[:0]
	for _, u := range b.undecided {
		m := &b.batch[u.i]
		if u.noValue {
			noValue := *m
			noValue.Value = nil
			m = &noValue
		}
		dead = w.deadLetter(dead, m, u.why)
	}
	for k := range b.elems {
		m := &b.batch[b.idx[k]]
		out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
			Headers: b.headers.with(m, kafka.Header{Key: record.IDHeader, Value: b.elems[k].ID},
				kafka.Header{Key: record.VerdictHeader, Value: uncheckedValue})})
	}
	b.out, b.dead, b.dups = out, dead, b.dups[:0]
	w.m.unchecked.Add(float64(len(b.elems)))
}

// uncheckedValue is record.Unchecked as a header value, shared.
var uncheckedValue = []byte(record.Unchecked)

// noteAsked records, per partition, the highest offset of elems and
// probes this worker asked the filter about (asked), and returns what it
// held before.
func (w *Worker) noteAsked(elems []bloom.Element, probes []bloom.Source) map[int32]int64 {
	before := map[int32]int64{}
	note := func(src *bloom.Source) {
		if _, ok := before[src.Partition]; !ok {
			high, seen := w.asked[src.Partition]
			if !seen {
				high = -1
			}
			before[src.Partition] = high
		}
		if high, seen := w.asked[src.Partition]; !seen || src.Offset > high {
			w.asked[src.Partition] = src.Offset
		}
	}
	for i := range elems {
		note(&elems[i].Source)
	}
	for i := range probes {
		note(&probes[i])
	}
	return before
}

// awaitHandoff waits for the replays to write of a batch that another
// replica decided (above askedBefore): that replica may be delivering
// them still, having had the partition until the last rebalance. They are
// the elements ReplayedFirstSeen (ReplayedDuplicate too in shadow mode or
// with Config.Duplicates) and the probes ProbeDecided (dead letters). It
// asks the filter again about those alone, after pauses from
// handoffPause doubling to handoffPauseMax, until each is marked delivered
// (its answer in d becomes ReplayedDelivered or ProbeDelivered: it is
// skipped), HandoffWait has passed, or stopping ends (a shutdown begins);
// the rest are written again, as a crashed replica's are. Asking again is
// safe: each is below its record's watermark and gets its recorded
// decision.
func (w *Worker) awaitHandoff(ctx, stopping context.Context, elems []bloom.Element, probes []bloom.Source, d bloom.Decision, askedBefore map[int32]int64) error {
	dupsWritten := w.cfg.Shadow || w.cfg.Duplicates != nil
	var waitEl, waitPr []int
	for k, v := range d.Verdicts {
		if (v == bloom.ReplayedFirstSeen || v == bloom.ReplayedDuplicate && dupsWritten) && elems[k].Source.Offset > askedBefore[elems[k].Source.Partition] {
			waitEl = append(waitEl, k)
		}
	}
	for k, a := range d.Probes {
		if a == bloom.ProbeDecided && probes[k].Offset > askedBefore[probes[k].Partition] {
			waitPr = append(waitPr, k)
		}
	}
	if len(waitEl)+len(waitPr) == 0 {
		return nil
	}
	deadline := time.Now().Add(w.cfg.HandoffWait)
	pause := handoffPause
	var againEl []bloom.Element
	var againPr []bloom.Source
	for len(waitEl)+len(waitPr) > 0 {
		t := time.NewTimer(min(pause, max(time.Until(deadline), 0)))
		select {
		case <-t.C:
		case <-stopping.Done():
			t.Stop()
			return nil
		}
		if !time.Now().Before(deadline) {
			w.log.Info("replays another replica decided were not marked delivered in time: writing them again",
				zap.Int("replays", len(waitEl)+len(waitPr)), zap.Duration("waited", w.cfg.HandoffWait))
			return nil
		}
		pause = min(2*pause, handoffPauseMax)
		againEl, againPr = againEl[:0], againPr[:0]
		for _, k := range waitEl {
			againEl = append(againEl, elems[k])
		}
		for _, k := range waitPr {
			againPr = append(againPr, probes[k])
		}
		var again bloom.Decision
		err := w.retry(ctx, &w.deciding, StepDecide, "", func(ctx context.Context) error {
			var err error
			again, err = w.filter.Decide(ctx, againEl, againPr)
			return err
		})
		if err != nil {
			return err
		}
		waitEl = settled(waitEl, again.Verdicts, d.Verdicts, bloom.ReplayedDelivered)
		waitPr = settled(waitPr, again.Probes, d.Probes, bloom.ProbeDelivered)
	}
	return nil
}

// settled sets answers[k] to delivered for each k of wait whose answer
// asked again (again, in wait's order) is delivered, and returns the rest
// of wait, in place.
func settled[T comparable](wait []int, again, answers []T, delivered T) []int {
	left := wait[:0]
	for i, k := range wait {
		if again[i] == delivered {
			answers[k] = delivered
		} else {
			left = append(left, k)
		}
	}
	return left
}

// The pauses of awaitHandoff: a replica delivers a batch in milliseconds
// when Kafka answers.
const (
	handoffPause    = 5 * time.Millisecond
	handoffPauseMax = 200 * time.Millisecond
)

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

package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/retry"
)

// deliver produces a decided batch's output, its copies dropped (to
// Config.Duplicates, when set) and its dead letters, retrying what is not
// acknowledged until it is or ctx ends, marks the batch delivered, then
// commits its offsets. A forwarded event or a copy its topic refuses for
// its content is dead-lettered instead; a dead letter the dead-letter
// topic refuses stops the worker.
func (w *Worker) deliver(ctx context.Context, r *kafka.Reader, d *buffers) error {
	batch, fetched := d.batch, d.fetched
	refused, err := w.produce(ctx, d, w.out, StepProduce, d.out)
	if err != nil {
		return err
	}
	for _, f := range refused {
		d.dead = append(d.dead, refusedLetter(f))
		w.m.deadLettered.WithLabelValues(f.reason().String()).Inc()
	}
	forwarded := len(d.out) - len(refused)
	if dups := w.cfg.Duplicates; dups != nil && len(d.dups) > 0 {
		refused, err := w.produce(ctx, d, dups, StepDuplicates, d.dups)
		if err != nil {
			return err
		}
		for _, f := range refused {
			d.dead = append(d.dead, refusedLetter(f))
			w.m.deadLettered.WithLabelValues(f.reason().String()).Inc()
		}
	}
	refused, err = w.produce(ctx, d, w.dlq, StepDeadLetter, d.dead)
	if err != nil {
		return err
	}
	if len(refused) > 0 {
		f := refused[0]
		return w.stageError(StepDeadLetter, topicOf(w.dlq), fmt.Errorf("%w: %d of them, the first from %s: %w",
			ErrDeadLetterRefused, len(refused), sourceHeader(&f.msg), f.err))
	}
	w.m.forwarded.Add(float64(forwarded))
	acked := time.Now()
	latency := acked.Sub(fetched[0])
	for _, f := range fetched {
		w.m.fetchToProduce.Observe(acked.Sub(f).Seconds())
	}
	// A commit is the highest offset read per partition; kafka-go would
	// make and merge an entry per message otherwise.
	d.last = highest(batch, d.last[:0])
	if !d.unchecked {
		if err := w.markDelivered(ctx, d); err != nil {
			return err
		}
	}
	// A failed commit loses nothing: the batch is read again and its
	// decisions are replayed. After a rebalance the commit is refused, so
	// it is tried three times only. A refused authorization stops the
	// worker: it would never commit again.
	tries := 0
	err = retry.Do(ctx, commitBackoff, func(ctx context.Context) error {
		tries++
		cctx, cancel := context.WithTimeout(ctx, w.cfg.Kafka.Timeout)
		defer cancel()
		return r.CommitMessages(cctx, d.last...)
	}, func(err error, _ time.Duration) error {
		if permanent(err) { // counted by Run, which stops
			return w.stageError(StepCommit, w.cfg.Topic, err)
		}
		w.m.errors.WithLabelValues(StepCommit).Inc()
		if tries == 3 {
			return err
		}
		return nil
	})
	if se, ok := errors.AsType[*StageError](err); ok {
		return se
	}
	if err != nil {
		w.log.Warn("committing; the batch will be read again", zap.String("topic", w.cfg.Topic),
			zap.Int("partition", batch[0].Partition), zap.Int64("offset", batch[0].Offset), zap.Error(err))
	}
	w.m.batchSize.Observe(float64(len(batch)))
	w.m.batchSeconds.Observe(latency.Seconds())
	w.setLag(d.last, time.Now())
	return nil
}

// markDelivered tells the filter that the batch is delivered up to its
// highest offset per partition, so that a replay of it (read again by
// whoever owns the partition next, if the commit does not land) is
// committed without being written again. It is retried like every Redis
// call, not ready while it fails: whoever takes the partition over waits
// for the mark (HandoffWait), and the batch is committed after it. With
// FailOpenAfter, it is given up after that long.
func (w *Worker) markDelivered(ctx context.Context, d *buffers) error {
	d.upTo = d.upTo[:0]
	for _, m := range d.last {
		d.upTo = append(d.upTo, bloom.Source{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset})
	}
	mark := func(ctx context.Context) error { return w.filter.Delivered(ctx, d.decision, d.upTo) }
	if w.cfg.FailOpenAfter == 0 {
		return w.retry(ctx, &w.delivering, StepMark, "", mark)
	}
	// Failing open, a mark Redis does not take within FailOpenAfter is
	// given up, so that unchecked batches are not held behind it.
	// While it fails the worker is not ready; given up, the filter still
	// counts as failing (deciding) until a call to it succeeds, so that a
	// worker whose decide stage waited behind the mark does not turn
	// ready before it tries the filter itself.
	var since time.Time
	defer w.delivering.Store(true)
	err := retry.Do(ctx, retry.Calls, mark, func(err error, wait time.Duration) error {
		w.delivering.Store(false)
		w.deciding.Store(false)
		w.m.errors.WithLabelValues(StepMark).Inc()
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(since) >= w.cfg.FailOpenAfter {
			return err
		}
		w.log.Warn(stepPhrase(StepMark)+" failed; retrying", zap.Error(err), zap.Duration("backoff", wait))
		return nil
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("marking a batch delivered failed for DEDUPE_FAIL_OPEN_AFTER: committing it without the mark (were it read again, it would be written again)",
			zap.Int("partition", d.batch[0].Partition), zap.Int64("offset", d.batch[0].Offset), zap.Error(err))
		return nil
	}
	return err
}

// refusal is a message its topic refused for its content, and why: an
// error that carries its dead-letter reason (WriteFailure.Refused).
type refusal struct {
	msg kafka.Message
	err error
}

// reason is the refusal's dead-letter reason: the one its error carries,
// or Refused when it carries none.
func (f refusal) reason() event.Reason {
	if r := event.ReasonOf(f.err); r != event.Other {
		return r
	}
	return event.Refused
}

// produce writes msgs with p, retrying (w.retry) only the messages not yet
// acknowledged, until every one is acknowledged or refused for its
// content; it returns the refused ones. It fails when ctx ends or on a
// failure retrying cannot mend (a *StageError).
func (w *Worker) produce(ctx context.Context, d *buffers, p Producer, step string, msgs []kafka.Message) ([]refusal, error) {
	var refused []refusal
	pending := msgs
	err := w.retry(ctx, &w.delivering, step, topicOf(p), func(ctx context.Context) error {
		err := p.Write(ctx, pending)
		if err == nil {
			return nil
		}
		d.retried = true
		wf, ok := errors.AsType[WriteFailure](err)
		if !ok {
			return err
		}
		for i, why := range wf.Refused() {
			refused = append(refused, refusal{pending[i], why})
		}
		pending, err = wf.Unacknowledged(pending)
		return err
	})
	return refused, err
}

// refusedLetter is the dead letter of a forwarded message its topic
// refused, made so that the dead-letter topic cannot refuse it for the
// same reason: stamped now (the original timestamp, which a topic's
// message.timestamp bounds may refuse, is in dedupe-error), and, when it
// was too large, without its value and without any key or header larger
// than refusedPartMax (an ID taken from a huge key or header). It keeps
// dedupe-source, which says where the original is.
func refusedLetter(f refusal) kafka.Message {
	reason := f.reason()
	tooLarge := reason == event.TooLarge
	h := make([]kafka.Header, 0, len(f.msg.Headers)+2)
	for _, x := range f.msg.Headers {
		if !tooLarge || len(x.Key)+len(x.Value) <= refusedPartMax {
			h = append(h, x)
		}
	}
	h = append(h, kafka.Header{Key: event.ErrorHeader, Value: fmt.Appendf(nil, "the output topic refused it (timestamp %s): %v",
		f.msg.Time.UTC().Format(time.RFC3339Nano), f.err)},
		kafka.Header{Key: event.ReasonHeader, Value: []byte(reason.String())})
	dl := kafka.Message{Key: f.msg.Key, Value: f.msg.Value, Headers: h}
	if tooLarge {
		dl.Value = nil
		if len(dl.Key) > refusedPartMax {
			dl.Key = nil
		}
	}
	return dl
}

// refusedPartMax is the largest key or header a too-large dead letter
// keeps.
const refusedPartMax = 1 << 10

// sourceHeader is the dedupe-source of a message the worker wrote.
func sourceHeader(m *kafka.Message) string {
	for _, h := range m.Headers {
		if h.Key == event.SourceHeader {
			return string(h.Value)
		}
	}
	return "(no dedupe-source)"
}

// ErrDeadLetterRefused stops the worker: the dead-letter topic refused
// dead letters for their content, and they have nowhere else to go.
var ErrDeadLetterRefused = errors.New("the dead-letter topic refused dead letters for their content")

// commitBackoff spaces the three tries of a commit.
var commitBackoff = retry.Backoff{First: 100 * time.Millisecond, Max: 200 * time.Millisecond}

// setLag sets the lag of each partition from last, the message with the
// highest offset read from it (one per partition), and drops partitions
// not read for lagExpiry.
func (w *Worker) setLag(last []kafka.Message, now time.Time) {
	if w.lagSeen == nil {
		w.lagSeen = map[int]time.Time{}
	}
	for _, m := range last {
		w.m.lag.WithLabelValues(strconv.Itoa(m.Partition)).Set(float64(max(m.HighWaterMark-m.Offset-1, 0)))
		w.lagSeen[m.Partition] = now
	}
	// A partition this replica has not read for a while has most likely
	// moved to another replica in a rebalance: its last value would be
	// stale, so it is dropped.
	for p, at := range w.lagSeen {
		if now.Sub(at) > lagExpiry {
			w.m.lag.DeleteLabelValues(strconv.Itoa(p))
			delete(w.lagSeen, p)
		}
	}
}

// lagExpiry is how long a partition's lag is exported after this replica
// last read from it.
const lagExpiry = time.Minute

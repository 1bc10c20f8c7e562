package consumer

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/retry"
)

// deliver produces a decided batch's output and dead letters, retrying
// until acknowledged or ctx ends, then commits its offsets.
func (w *Worker) deliver(ctx context.Context, r *kafka.Reader, d *buffers) error {
	batch, fetched := d.batch, d.fetched
	write := func(p Producer, msgs []kafka.Message) func(context.Context) error {
		return func(ctx context.Context) error {
			err := p.Write(ctx, msgs)
			if err != nil {
				d.retried = true
			}
			return err
		}
	}
	if err := w.retry(ctx, &w.delivering, StepProduce, topicOf(w.out), write(w.out, d.out)); err != nil {
		return err
	}
	if err := w.retry(ctx, &w.delivering, StepDeadLetter, topicOf(w.dlq), write(w.dlq, d.dead)); err != nil {
		return err
	}
	w.m.forwarded.Add(float64(len(d.out)))
	acked := time.Now()
	latency := acked.Sub(fetched[0])
	for _, f := range fetched {
		w.m.fetchToProduce.Observe(acked.Sub(f).Seconds())
	}
	// A commit is the highest offset read per partition; kafka-go would
	// make and merge an entry per message otherwise.
	d.last = highest(batch, d.last[:0])
	// A failed commit loses nothing: the batch is read again and its
	// decisions are replayed. After a rebalance the commit is refused, so
	// it is tried three times only. A refused authorization stops the
	// worker: it would never commit again.
	tries := 0
	err := retry.Do(ctx, commitBackoff, func(ctx context.Context) error {
		tries++
		cctx, cancel := context.WithTimeout(ctx, w.cfg.KafkaTimeout)
		defer cancel()
		return r.CommitMessages(cctx, d.last...)
	}, func(err error, _ time.Duration) error {
		w.m.errors.WithLabelValues(StepCommit).Inc()
		if permanent(err) {
			return w.stageError(StepCommit, w.cfg.Topic, err)
		}
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

// commitBackoff spaces the three tries of a commit.
var commitBackoff = retry.Backoff{First: 100 * time.Millisecond, Max: 200 * time.Millisecond}

// highest appends to into, per partition of batch, the message with the
// highest offset.
func highest(batch []kafka.Message, into []kafka.Message) []kafka.Message {
	for i := range batch {
		m := &batch[i]
		k := slices.IndexFunc(into, func(x kafka.Message) bool { return x.Partition == m.Partition })
		switch {
		case k < 0:
			into = append(into, *m)
		case m.Offset > into[k].Offset:
			into[k] = *m
		}
	}
	return into
}

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

package consumer

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/bloom"
)

// fetch collects up to BatchSize messages or BatchBytes bytes: it waits
// for the first as long as it takes, then at most BatchLinger for the
// rest. Cancelling ctx ends the batch early; the messages fetched so far
// are returned. Errors are retried (the reader backs off), except one that
// retrying cannot mend (a refused authorization, which kafka-go's reader
// hands over after its own attempts at joining or fetching): fetch then
// returns it with nothing fetched, and the batch is abandoned.
func (w *Worker) fetch(ctx context.Context, r *kafka.Reader, b *buffers) ([]kafka.Message, []time.Time, error) {
	batch, fetched := b.batch[:0], b.fetched[:0]
	// The linger timer cancels lctx; one timer per batch, not a deadline
	// context per message.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var linger *time.Timer
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	size, errs := 0, 0
	for len(batch) < w.cfg.BatchSize && size < w.cfg.BatchBytes {
		m, err := r.FetchMessage(lctx)
		if err != nil {
			if lctx.Err() != nil { // ctx cancelled, or the linger is over
				return batch, fetched, nil
			}
			if permanent(err) {
				w.fetching.Store(false)
				return batch[:0], fetched[:0], err
			}
			// kafka-go paces its own fetch retries and queues their errors
			// with the messages, so an error is counted and the next one
			// taken at once: a back-off here as well would drain that queue
			// one error per back-off and hold the partition long after the
			// fault. Only errors that come without kafka-go's pacing (more
			// than 100 in a row) get a short pause, so this never spins.
			w.fetching.Store(false)
			w.m.errors.WithLabelValues(StepFetch).Inc()
			w.kafkaLog.Warn(stepPhrase(StepFetch), zap.Error(err))
			if errs++; errs > 100 {
				select {
				case <-lctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
			continue
		}
		errs = 0
		// Stored only when they change: a load costs less than a store
		// per message.
		if !w.fetching.Load() {
			w.fetching.Store(true)
		}
		if !w.joined.Load() {
			w.joined.Store(true) // a message is proof of membership
		}
		now := time.Now()
		if len(batch) == 0 {
			linger = time.AfterFunc(w.cfg.BatchLinger, cancel)
		}
		batch = append(batch, m)
		fetched = append(fetched, now)
		size += inputBytes(&m)
	}
	return batch, fetched, nil
}

// buffers hold a batch from its fetch to its commit. They are reused:
// at most three batches are in hand at once (one being decided, one
// queued, one being delivered), and a batch's buffers are sized once.
type buffers struct {
	batch   []kafka.Message
	fetched []time.Time
	elems   []bloom.Element
	idx     []int
	out     []kafka.Message
	dead    []kafka.Message
	// dups are the copies dropped, for Config.Duplicates.
	dups []kafka.Message
	// undecided are the input not tested, with their sources as probes.
	undecided []undecidable
	probes    []bloom.Source
	// decision is the test-and-set's answer: its records are marked
	// delivered once the batch is acknowledged.
	decision bloom.Decision
	// unchecked: decided without the filter (fail-open): not marked.
	unchecked bool
	// upTo is, per partition, the highest offset the batch delivered.
	upTo    []bloom.Source
	offsets batchOffsets
	// tally is what route found, for count.
	tally   tally
	headers headerBuf
	last    []kafka.Message // per partition, the message to commit
	// retried is set when a write of the batch failed. kafka-go may still
	// hold its messages in a produce request it abandoned, so the buffers
	// are then left to the garbage collector instead of being reused.
	retried bool
}

// inputBytes is the bytes of m's key, value and headers, without
// kafka-go's framing: what BatchBytes counts, and what is held against the
// producers' limit less headerAllowance.
func inputBytes(m *kafka.Message) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

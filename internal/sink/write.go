package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/event"
	"dedupe-worker/internal/retry"
)

// writeBackoff spaces Write's rounds of retries.
var writeBackoff = retry.Backoff{First: 50 * time.Millisecond, Max: time.Second}

// writeRounds is how many rounds Write sends the messages not acknowledged
// before it returns them (Unacked), about 0.75 s of back-off: the caller
// then knows its writes are failing (the worker turns not ready and counts
// them) and calls again. It is more than corruptTries, so a message
// refused as corrupt alone is rejected within one Write.
const writeRounds = 5

// Write produces msgs and returns nil once the broker has acknowledged
// every one of them (all in-sync replicas). It gives up after writeRounds
// rounds of retries, after Config.Timeout, or when ctx ends.
//
// Until then it retries, itself, only the messages that were not
// acknowledged: a message the broker acknowledged is not sent again by
// Write. A produce request holds one partition's batch and the broker
// writes it or refuses it whole, so when a write partly fails, the failed
// partitions' batches are sent again and the others not. One exception:
// when the deadline or ctx ends while a round's produce requests are under
// way, Write stops waiting for their answers, so the messages of those
// requests count as not acknowledged (Unacked), those the broker did
// acknowledge included, and the caller writes them again. Of a partition's
// batches, only the one on the wire then is finished in the background;
// those not sent yet are never sent, so a Write that gives up leaves at
// most one produce request per partition behind it.
//
// A topic refuses a batch for its content (MESSAGE_TOO_LARGE,
// RECORD_LIST_TOO_LARGE, INVALID_RECORD, INVALID_TIMESTAMP, CORRUPT_MESSAGE)
// without saying which message is at fault, and refuses a batch of small
// messages larger in total than its max.message.bytes. Write then sends
// the refused messages again in halves, each half in produce requests of
// its own, down to single messages. A message refused alone is rejected:
// it is not written, and Write goes on with the others. So is a message
// larger than MaxBatchBytes, without being sent.
//
// On error Write returns a *WriteError:
//   - when every message was acknowledged but the rejected ones, Err is nil
//     and Rejected lists them (index and Reason);
//   - when the rounds or the deadline ran out with messages still failing
//     (a leader move, a time-out, too few in-sync replicas, a lost
//     connection), or ctx was cancelled, Unacked lists the messages neither acknowledged nor
//     rejected, and Err the last failure (with the context's error inside);
//   - on a failure that retrying cannot mend, it returns at once, with
//     ErrPermanent and the broker's error inside Err (errors.Is(err,
//     kafka.TopicAuthorizationFailed), for one).
//
// Rejected may be non-empty in the last two cases too.
//
// A message in Unacked, or one Write retried, may have been written all the
// same: a broker can answer REQUEST_TIMED_OUT or
// NOT_ENOUGH_REPLICAS_AFTER_APPEND after it wrote the batch, a connection
// can be lost with the answer in it, and the produce request on the wire
// when its Write was cancelled is finished in the background. Sending it again (Write
// in its retries, or the caller) then writes a copy. Write does not change
// the messages, so a copy carries the same dedupe-source header as the
// first, and a reader that counts by it counts the message once.
//
// Within one output partition, messages keep their order unless a batch is
// retried or split: the retried messages then follow ones acknowledged
// after them.
//
// After a cancellation a produce request Write gave up on may still read
// the messages, so the caller must not reuse their buffers. Calls from several
// goroutines are made one at a time.
func (w *Writer) Write(ctx context.Context, msgs []kafka.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	s := &send{w: w, msgs: msgs, done: make([]bool, len(msgs))}
	for i := range msgs {
		if n := recordSize(&msgs[i]); n > MaxBatchBytes {
			s.reject(i, event.TooLarge, fmt.Errorf("%w: %d bytes, more than the writer's limit of %d; not sent", kafka.MessageSizeTooLarge, n, MaxBatchBytes))
			continue
		}
		s.next = append(s.next, i)
	}
	rounds := 0
	err := retry.Do(ctx, writeBackoff, s.round, func(err error, wait time.Duration) error {
		if rounds++; errors.Is(err, ErrPermanent) || rounds >= writeRounds {
			return err
		}
		w.log.Debug("write failed; retrying the messages not acknowledged", zap.Int("messages", len(s.next)),
			zap.Duration("backoff", wait), zap.Error(err))
		return nil
	})
	if s.splits > 0 {
		w.sampled.Warn("the topic refused batches for their size or content; split them to find the refused messages",
			zap.Int("messages", len(msgs)), zap.Int("splits", s.splits), zap.Int("requests", s.calls), zap.Int("rejected", len(s.rejected)))
	}
	return s.result(ctx, err)
}

// send is the state of one Write.
type send struct {
	w    *Writer
	msgs []kafka.Message
	// done is set for a message acknowledged or rejected.
	done     []bool
	rejected []Rejection
	// next are the messages to send in the next round, ascending.
	next []int
	// last is the last failure that was retried.
	last error
	// corrupt counts, per message, refusals with CORRUPT_MESSAGE alone.
	corrupt       map[int]int
	calls, splits int
}

// round sends the messages in next, splits what is refused for its content
// until it is acknowledged or rejected, and returns the last retryable
// failure if messages are left for the next round (in next), nil when
// none is. It returns early, with the error, when ctx ends or on a failure
// with ErrPermanent.
func (s *send) round(ctx context.Context) error {
	work := [][]int{s.next} // a stack: the first half of a split goes first
	s.next = nil
	var stop error
	for len(work) > 0 && stop == nil {
		g := work[len(work)-1]
		work = work[:len(work)-1]
		answers, err := s.call(ctx, g)
		if err != nil {
			return err
		}
		var refused []int
		var refusal error
		for k, i := range g {
			switch o := classify(answers[k]); o {
			case acked:
				s.done[i] = true
			case retryable:
				s.next = append(s.next, i)
				s.last = answers[k]
			case permanent:
				stop = fmt.Errorf("%w (%w)", answers[k], ErrPermanent)
			default:
				refused = append(refused, i)
				refusal = answers[k]
			}
		}
		switch {
		case len(refused) == 0:
		case len(g) == 1:
			if s.refusedAlone(g[0], refusal) {
				s.last = refusal
			}
		case len(refused) == 1:
			work = append(work, refused)
		default:
			s.splits++
			h := len(refused) / 2
			work = append(work, refused[h:], refused[:h])
		}
	}
	if stop != nil {
		return stop
	}
	if len(s.next) == 0 {
		return nil
	}
	slices.Sort(s.next)
	return s.last
}

// refusedAlone handles message i refused for its content when sent alone
// with err: it is rejected, or, for CORRUPT_MESSAGE until corruptTries, put
// back for the next round, which refusedAlone reports.
func (s *send) refusedAlone(i int, err error) (again bool) {
	switch classify(err) {
	case tooLarge:
		s.reject(i, event.TooLarge, err)
	case corrupt:
		if s.corrupt == nil {
			s.corrupt = map[int]int{}
		}
		s.corrupt[i]++
		if s.corrupt[i] < corruptTries {
			s.next = append(s.next, i)
			return true
		}
		s.reject(i, event.Refused, err)
	default:
		s.reject(i, event.Refused, err)
	}
	return false
}

func (s *send) reject(i int, r event.Reason, err error) {
	s.done[i] = true
	s.rejected = append(s.rejected, Rejection{Index: i, Reason: r, Err: err})
	m := &s.msgs[i]
	s.w.sampled.Warn("the topic refused a message for its content; it is not written", zap.Int("index", i),
		zap.Stringer("reason", r), zap.ByteString("source", header(m, event.SourceHeader)), zap.Int("bytes", recordSize(m)), zap.Error(err))
}

// result is Write's answer once retrying ended with err.
func (s *send) result(ctx context.Context, err error) error {
	var unacked []int
	for i, d := range s.done {
		if !d {
			unacked = append(unacked, i)
		}
	}
	if len(unacked) == 0 && len(s.rejected) == 0 {
		return nil
	}
	slices.SortFunc(s.rejected, func(a, b Rejection) int { return a.Index - b.Index })
	e := &WriteError{Topic: s.w.topic, Total: len(s.msgs), Rejected: s.rejected, Unacked: unacked}
	if len(unacked) > 0 {
		cerr := ctx.Err()
		switch {
		case cerr == nil || errors.Is(err, ErrPermanent):
			e.Err = err
		case s.last != nil:
			e.Err = fmt.Errorf("%w; the last failure: %w", cerr, s.last)
		default:
			e.Err = cerr
		}
	}
	return e
}

// header is the value of m's header key, nil without one.
func header(m *kafka.Message, key string) []byte {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

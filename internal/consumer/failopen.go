package consumer

// Failing open (Config.FailOpenAfter): the test-and-set retried until the
// filter has failed that long, then batches forwarded unchecked until it
// answers again.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/retry"
)

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
	dead, _ := w.deadLetterUndecided(b, nil)
	out := b.out[:0]
	for k := range b.elems {
		m := &b.batch[b.idx[k]]
		out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
			Headers: b.headers.with(m, kafka.Header{Key: event.IDHeader, Value: b.elems[k].ID},
				kafka.Header{Key: event.VerdictHeader, Value: uncheckedValue})})
	}
	b.out, b.dead, b.dups = out, dead, b.dups[:0]
	w.m.unchecked.Add(float64(len(b.elems)))
}

// uncheckedValue is event.Unchecked as a header value, shared.
var uncheckedValue = []byte(event.Unchecked)

package consumer

// The pipeline of one Run. Three stages run at once, each started by name
// in Run:
//
//   - watch (watchReader, reader.go): the group's joins and rebalances;
//   - fetch and decide (fetchAndDecide, this file; fetch.go, decide.go):
//     a batch read, its IDs extracted, one test-and-set, its messages
//     routed and counted;
//   - deliver (deliverAll, this file; deliver.go): each decided batch
//     produced, marked delivered and committed, in the order decided.
//
// A decided batch goes from the second to the third over a channel of
// one, so batch n+1 is read and decided while batch n is written.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

// pipeline is the state one Run's stages share: the contexts that end
// them, the failure that stops them, the shutdown deadline and the
// batches between decide and deliver.
type pipeline struct {
	// ctx is Run's: once it ends, nothing more is fetched.
	ctx context.Context
	// fctx, fetching's, ends with ctx or a failure.
	fctx    context.Context
	fcancel context.CancelFunc
	// wctx outlives ctx by ShutdownTimeout, so the batches in hand are
	// finished on shutdown; it ends at once on a failure.
	wctx    context.Context
	wcancel context.CancelFunc
	// stopTimer stops the shutdown timer that ctx's end starts.
	stopTimer func() bool
	failOnce  sync.Once
	failure   *StageError // set once, before wctx ends
	// finishBy is when the batches in hand must be finished (UnixNano; 0
	// until ctx ends).
	finishBy atomic.Int64

	// decided carries each decided batch to deliver, which sends its
	// last error on delivered once decided is closed.
	decided   chan *buffers
	delivered chan error
	// finished counts the batches deliver is done with, and progress
	// tells of each; sent counts those handed to it, and inFlight holds,
	// per partition, the highest offset handed (fetch and decide only).
	finished atomic.Int64
	progress chan struct{}
	sent     int64
	inFlight map[int]int64
}

func (w *Worker) newPipeline(ctx context.Context) *pipeline {
	p := &pipeline{ctx: ctx, decided: make(chan *buffers, 1), delivered: make(chan error, 1),
		progress: make(chan struct{}, 1), inFlight: map[int]int64{}}
	p.wctx, p.wcancel = context.WithCancel(context.WithoutCancel(ctx))
	p.fctx, p.fcancel = context.WithCancel(ctx)
	p.stopTimer = context.AfterFunc(ctx, func() {
		p.finishBy.Store(time.Now().Add(w.cfg.ShutdownTimeout).UnixNano())
		time.AfterFunc(w.cfg.ShutdownTimeout, p.wcancel)
	})
	return p
}

// end releases what the pipeline holds once Run is done with it.
func (p *pipeline) end() {
	p.stopTimer()
	p.fcancel()
	p.wcancel()
}

// stop ends every stage at once for a failure that retrying cannot mend:
// the first one is kept, counted and makes the worker not ready.
func (w *Worker) stop(p *pipeline, se *StageError) {
	p.failOnce.Do(func() {
		p.failure = se
		w.failed.Store(true)
		w.m.errors.WithLabelValues(se.Step).Inc()
		p.fcancel()
		p.wcancel()
	})
}

// deliverAll is the deliver stage: it delivers each decided batch in
// order until decided is closed, then sends its error on delivered. After
// a failure, or once the shutdown budget ran out, later batches are not
// delivered (out of order, or at all): Run reports them.
func (w *Worker) deliverAll(p *pipeline, r *kafka.Reader) {
	var err error
	defer close(p.progress)
	for d := range p.decided {
		if err == nil {
			if err = p.wctx.Err(); err == nil {
				err = w.deliver(p.wctx, r, d)
			}
			if se, ok := errors.AsType[*StageError](err); ok {
				w.stop(p, se)
			}
		}
		if err == nil && !d.retried {
			w.bufs.Put(d)
		}
		p.finished.Add(1)
		select {
		case p.progress <- struct{}{}:
		default:
		}
	}
	p.delivered <- err
}

// fetchAndDecide is the fetch and decide stage: it reads and decides
// batches and hands them to deliver until Run's context ends, a stage
// fails for good or the shutdown budget runs out. It returns the error of
// a batch it could not finish at shutdown.
func (w *Worker) fetchAndDecide(p *pipeline, r *kafka.Reader) error {
	for p.wctx.Err() == nil {
		b := w.bufs.Get().(*buffers)
		if err := w.fetchBatch(p, r, b); err != nil {
			w.stop(p, w.stageError(StepFetch, w.cfg.Topic, err))
			return nil
		}
		batch := b.batch
		if len(batch) == 0 {
			w.bufs.Put(b)
		} else {
			if p.wctx.Err() != nil {
				if !w.failed.Load() { // the shutdown budget ran out with a batch fetched
					return p.wctx.Err()
				}
				return nil
			}
			// kafka-go starts a partition again from its committed offset
			// after a rebalance, even when it stays here: a batch that reads
			// an offset in flight again waits for deliver, so that the
			// delivered marks are set before it is decided and its replays
			// are skipped.
			if readsAgain(batch, p.inFlight) {
				w.awaitDelivered(p)
			}
			if err := w.decide(p.wctx, p.fctx, b); err != nil {
				if se, ok := errors.AsType[*StageError](err); ok {
					w.stop(p, se)
				} else if p.ctx.Err() != nil {
					return err // the shutdown budget ran out
				}
				return nil
			}
			for i := range batch {
				p.inFlight[batch[i].Partition] = max(p.inFlight[batch[i].Partition], batch[i].Offset)
			}
			p.sent++
			p.decided <- b
		}
		if p.ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

// fetchBatch fetches a batch into b. Failing open, an idle worker still
// tries the filter every failOpenRetry, so that it knows when Redis is
// back.
func (w *Worker) fetchBatch(p *pipeline, r *kafka.Reader, b *buffers) error {
	fetchCtx, fetchCancel := p.fctx, context.CancelFunc(func() {})
	if w.failOpen.open {
		fetchCtx, fetchCancel = context.WithTimeout(p.fctx, failOpenRetry)
	}
	batch, fetched, err := w.fetch(fetchCtx, r, b)
	fetchCancel()
	b.batch, b.fetched = batch, fetched
	if err == nil && len(batch) == 0 && w.failOpen.open && p.fctx.Err() == nil {
		w.tryFilter(p.fctx)
	}
	return err
}

// awaitDelivered waits until deliver is done with every batch handed to
// it, or the shutdown budget runs out.
func (w *Worker) awaitDelivered(p *pipeline) {
	for p.finished.Load() < p.sent && p.wctx.Err() == nil {
		select {
		case <-p.progress:
		case <-p.wctx.Done():
		}
	}
}

// readsAgain reports whether batch holds an offset at or below the
// highest one handed to deliver for its partition (inFlight).
func readsAgain(batch []kafka.Message, inFlight map[int]int64) bool {
	for i := range batch {
		if high, ok := inFlight[batch[i].Partition]; ok && batch[i].Offset <= high {
			return true
		}
	}
	return false
}

// result is Run's error: the failure that stopped the stages, else the
// batches in hand that could not be finished at shutdown.
func (p *pipeline) result(fetchErr, deliverErr error) error {
	if p.failure != nil {
		return p.failure
	}
	err := fetchErr
	if err == nil {
		err = deliverErr
	}
	if err != nil {
		return fmt.Errorf("finishing the batches in hand at shutdown: %w", err)
	}
	return nil
}

// closeReader leaves the group. Nothing is fetching or committing now, so
// Close cannot hang on a commit in flight. It takes what is left of the
// shutdown budget, and at most ReaderCloseTimeout past it: a broker that
// does not answer must not hold the shutdown.
func (w *Worker) closeReader(p *pipeline, r *kafka.Reader, log *zap.Logger) {
	wait := ReaderCloseTimeout
	if by := p.finishBy.Load(); by != 0 && p.failure == nil {
		wait += max(time.Until(time.Unix(0, by)), 0)
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			log.Warn("closing the reader", zap.Error(err))
		}
	case <-time.After(wait):
		log.Warn("the reader did not close in time: leaving the group to the session timeout", zap.Duration("waited", wait))
	}
}

// Package consumer reads a topic in a Kafka consumer group, deduplicates
// each batch with one test-and-set, forwards first-seen events, sends
// input that cannot be deduplicated to a dead-letter topic, and commits
// offsets only after both are acknowledged.
//
// A Worker runs two stages in two goroutines, so that the next batch is
// read and decided while the last one is written: an event goes through
//
//   - fetch.go: the reader, and a batch of up to BatchSize messages;
//   - decide.go: its ID and event time (the Extractor, extract.go), one
//     test-and-set per batch (the Filter), and the messages to forward and
//     to dead-letter, with the headers of the record format (package
//     record);
//   - deliver.go: both written (the Producer, producer.go), the batch
//     marked delivered, then the offsets committed.
//
// handoff.go holds the wait for replays another replica may still be
// delivering; failopen.go the test-and-set's retries and, with
// FailOpenAfter, the batches forwarded unchecked.
//
// worker.go holds the lifecycle: Run, the shutdown budget, readiness and
// the retries; config.go the Config, its defaults and limits. start.go
// places a new group's first offsets; idsource.go reads where the ID is.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/logs"
	"dedupe-worker/internal/retry"
)

// Filter decides which elements are seen for the first time, and learns
// which batches were delivered. Its contract (verdicts in order or none,
// retries that give the first application's decisions, cancellation,
// offsets in ascending order per partition, the bounded wait for a growing
// window, probes and delivered marks) is bloom.Filter's, told once in the
// bloom package doc under "Replay-safe decisions" and "Delivered marks".
// The worker retries every error of Decide but one:
// bloom.ErrInvalidElement stops it.
type Filter interface {
	Decide(ctx context.Context, elems []bloom.Element, probes []bloom.Source) (bloom.Decision, error)
	Delivered(ctx context.Context, d bloom.Decision, upTo []bloom.Source) error
	// Ping asks every Redis master the filter uses for an answer.
	Ping(ctx context.Context) error
}

// Worker is one consumer-group member.
type Worker struct {
	cfg    Config
	filter Filter
	out    Producer
	dlq    Producer
	log    *zap.Logger
	m      *Metrics
	// running is set while Run consumes; each stage sets its own health,
	// false while its calls fail (Ready is all of them).
	running                        atomic.Bool
	fetching, deciding, delivering atomic.Bool
	// failed is set when a stage failed for good (a *StageError).
	failed atomic.Bool
	// joined is set once the reader has joined the group (watchReader).
	joined atomic.Bool
	bufs   sync.Pool // of *buffers
	// maxMessageBytes is the largest input message forwarded or
	// dead-lettered with its value: the Producers' limit less the headers
	// the worker adds.
	maxMessageBytes int
	// kafkaLog logs what kafka-go reports, sampled (logs.Sampled).
	kafkaLog *zap.Logger
	// lateLog reports events beyond the lag bound, sampled.
	lateLog *zap.Logger
	// lagSeen is when each partition's lag was last set (deliver only).
	lagSeen map[int]time.Time
	// asked is, per partition, the highest offset this worker asked the
	// filter about (decide only).
	asked map[int32]int64
	// failOpen is the state of a failure of the filter (decide only).
	failOpen failOpenState
}

// New returns a Worker; Run starts it. The error says which field of cfg
// is out of its limits, that a producer is missing, or that the producers
// take no message the worker can write.
func New(cfg Config, filter Filter, out, dlq Producer) (*Worker, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if out == nil || dlq == nil {
		return nil, errors.New("consumer: both producers are required")
	}
	limit := min(out.MaxMessageBytes(), dlq.MaxMessageBytes()) - headerAllowance
	if cfg.Duplicates != nil {
		limit = min(limit, cfg.Duplicates.MaxMessageBytes()-headerAllowance)
	}
	if limit < 1 {
		return nil, fmt.Errorf("consumer: the producers take messages of up to %d bytes, no more than the %d the worker adds in headers",
			limit+headerAllowance, headerAllowance)
	}
	w := &Worker{cfg: cfg, filter: filter, out: out, dlq: dlq, log: cfg.Logger, m: cfg.Metrics, maxMessageBytes: limit,
		lateLog: logs.Sampled(cfg.Logger), asked: map[int32]int64{}}
	w.fetching.Store(true)
	w.deciding.Store(true)
	w.delivering.Store(true)
	w.bufs.New = func() any {
		n := cfg.BatchSize
		return &buffers{batch: make([]kafka.Message, 0, n), fetched: make([]time.Time, 0, n),
			elems: make([]bloom.Element, 0, n), idx: make([]int, 0, n), out: make([]kafka.Message, 0, n)}
	}
	return w, nil
}

// Ready reports whether the worker can make progress: false before Run
// starts and its reader first joins the group, while Redis or Kafka calls
// are failing, and from a failure that stops it on. An idle worker (no messages to read) is ready.
func (w *Worker) Ready() bool {
	return w.running.Load() && w.joined.Load() && !w.failed.Load() && w.fetching.Load() && w.deciding.Load() && w.delivering.Load()
}

// Run consumes until ctx is cancelled, then stops fetching, finishes the
// batches in hand (decide, forward, dead-letter, commit) within
// ShutdownTimeout, leaves the group and returns nil, all within
// ShutdownTimeout plus ReaderCloseTimeout. It returns an error when a batch
// in hand could not be finished at shutdown; its offsets are then not
// committed and it is read again by whoever owns the partitions.
//
// A failure that retrying cannot mend in any stage (a *StageError: a
// refused authorization on fetch, join, commit or produce, an element the
// filter refuses) stops both stages at once: the batch being decided is
// abandoned, nothing more is fetched or test-and-set, nothing more is
// delivered or committed, and Run leaves the group and returns the
// *StageError within ReaderCloseTimeout of the failure (plus the return of
// the calls it cancels). Ready is false from the failure on. Batches
// decided and not delivered are read again after the restart and get their
// recorded decisions.
func (w *Worker) Run(ctx context.Context) error {
	groupLog := w.log.With(zap.String("topic", w.cfg.Topic), zap.String("group", w.cfg.GroupID))
	w.kafkaLog = logs.Sampled(groupLog)
	if err := w.retry(ctx, &w.fetching, StepStart, w.cfg.Topic, func(ctx context.Context) error {
		// The Transport asks for the input topic by name: from a cache of
		// all topics, a topic the user may not read would just be missing
		// (unknown), not refused, and would be retried for ever.
		cl := &kafka.Client{Addr: kafka.TCP(w.cfg.Brokers...), Timeout: w.cfg.KafkaTimeout,
			Transport: &kafka.Transport{DialTimeout: w.cfg.KafkaTimeout, TLS: w.cfg.TLS, SASL: w.cfg.SASL, ClientID: ClientID(w.cfg.GroupID),
				MetadataTopics: []string{w.cfg.Topic}}}
		defer cl.Transport.(*kafka.Transport).CloseIdleConnections()
		set, err := SetStart(ctx, cl, w.cfg.GroupID, w.cfg.Topic, w.cfg.Start, w.cfg.KafkaTimeout)
		if set {
			groupLog.Info("new consumer group: start offsets committed", zap.Stringer("start", w.cfg.Start))
		}
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if se, ok := errors.AsType[*StageError](err); ok {
			w.failed.Store(true)
			w.m.errors.WithLabelValues(se.Step).Inc()
		}
		return err
	}
	r := w.newReader(w.kafkaLog)
	w.running.Store(true)
	// Two stages: this goroutine fetches and decides batch n+1 while
	// deliver produces and commits batch n, in order. wctx outlives ctx by
	// ShutdownTimeout, so the batches in hand are finished on shutdown;
	// fctx, the fetch's, ends with ctx. A stage that fails for good ends
	// both at once (stop).
	wctx, wcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer wcancel()
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	joinDone := make(chan struct{})
	go func() { defer close(joinDone); w.watchReader(fctx, r) }()
	defer func() { fcancel(); <-joinDone }()
	var (
		failOnce sync.Once
		failure  *StageError // set once, before wctx ends
	)
	stop := func(se *StageError) {
		failOnce.Do(func() {
			failure = se
			w.failed.Store(true)
			w.m.errors.WithLabelValues(se.Step).Inc()
			fcancel()
			wcancel()
		})
	}
	var finishBy atomic.Int64 // when the batches in hand must be finished
	stopTimer := context.AfterFunc(ctx, func() {
		finishBy.Store(time.Now().Add(w.cfg.ShutdownTimeout).UnixNano())
		time.AfterFunc(w.cfg.ShutdownTimeout, wcancel)
	})
	defer stopTimer()
	decidedCh := make(chan *buffers, 1)
	delivered := make(chan error, 1)
	// finished counts the batches deliver is done with, and progress tells
	// the loop of each (see inFlight).
	var finished atomic.Int64
	progress := make(chan struct{}, 1)
	go func() {
		var err error
		defer close(progress)
		for d := range decidedCh {
			// After a failure, or once the shutdown budget ran out, later
			// batches are not delivered (out of order, or at all): Run
			// reports them.
			if err == nil {
				if err = wctx.Err(); err == nil {
					err = w.deliver(wctx, r, d)
				}
				if se, ok := errors.AsType[*StageError](err); ok {
					stop(se)
				}
			}
			if err == nil && !d.retried {
				w.bufs.Put(d)
			}
			finished.Add(1)
			select {
			case progress <- struct{}{}:
			default:
			}
		}
		delivered <- err
	}()
	var runErr error
	// sent counts the batches handed to deliver; inFlight holds, per
	// partition, the highest offset handed. A batch that reads one of
	// those offsets again (kafka-go starts a partition again from its
	// committed offset after a rebalance, even when it stays here) waits
	// for the batches in flight, so that their delivered marks are set
	// before it is decided and its replays are skipped.
	var sent int64
	inFlight := map[int]int64{}
	for wctx.Err() == nil {
		b := w.bufs.Get().(*buffers)
		// Failing open, an idle worker still tries the filter every
		// failOpenRetry, so that it knows when Redis is back.
		fetchCtx, fetchCancel := fctx, context.CancelFunc(func() {})
		if w.failOpen.open {
			fetchCtx, fetchCancel = context.WithTimeout(fctx, failOpenRetry)
		}
		batch, fetched, err := w.fetch(fetchCtx, r, b)
		fetchCancel()
		b.batch, b.fetched = batch, fetched
		if err == nil && len(batch) == 0 && w.failOpen.open && fctx.Err() == nil {
			w.tryFilter(fctx)
		}
		if err != nil {
			stop(w.stageError(StepFetch, w.cfg.Topic, err))
			break
		}
		if len(batch) > 0 && wctx.Err() != nil {
			if !w.failed.Load() && runErr == nil { // the shutdown budget ran out with a batch fetched
				runErr = wctx.Err()
			}
			break
		}
		if len(batch) > 0 {
			if readsAgain(batch, inFlight) {
				for finished.Load() < sent && wctx.Err() == nil {
					select {
					case <-progress:
					case <-wctx.Done():
					}
				}
			}
			if err := w.decide(wctx, fctx, b); err != nil {
				if se, ok := errors.AsType[*StageError](err); ok {
					stop(se)
				} else if ctx.Err() != nil {
					runErr = err // the shutdown budget ran out
				}
				break
			}
			for i := range batch {
				inFlight[batch[i].Partition] = max(inFlight[batch[i].Partition], batch[i].Offset)
			}
			sent++
			decidedCh <- b
		} else {
			w.bufs.Put(b)
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(decidedCh)
	if err := <-delivered; err != nil && runErr == nil {
		runErr = err
	}
	if runErr != nil {
		runErr = fmt.Errorf("finishing the batches in hand at shutdown: %w", runErr)
	}
	if failure != nil {
		runErr = failure
	}
	w.running.Store(false)
	// Nothing is fetching or committing now, so Close cannot hang on a
	// commit in flight; it leaves the group.
	// Leaving the group takes what is left of the budget, and at most
	// ReaderCloseTimeout past it: a broker that does not answer must not
	// hold the shutdown.
	wait := ReaderCloseTimeout
	if by := finishBy.Load(); by != 0 && failure == nil {
		wait += max(time.Until(time.Unix(0, by)), 0)
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			groupLog.Warn("closing the reader", zap.Error(err))
		}
	case <-time.After(wait):
		groupLog.Warn("the reader did not close in time: leaving the group to the session timeout", zap.Duration("waited", wait))
	}
	return runErr
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

// ReaderCloseTimeout is how long Run waits, past its ShutdownTimeout, for
// the reader to leave the group.
const ReaderCloseTimeout = 2 * time.Second

// ClientID names this process to the brokers: "dedupe-worker.", the
// group, the host name and the process ID. A group member's ID starts with
// its client ID, so broker-side tools show which pod holds which
// partitions.
func ClientID(group string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("dedupe-worker.%s.%s.%d", group, host, os.Getpid())
}

// retry calls f until it succeeds, fails for good (permanent) or ctx
// ends, backing off between tries (retry.Calls). While it fails, the
// stage whose health is ok is not ready and each failure is logged and
// counted under step. A permanent failure is returned as a *StageError
// (with what to check for topic, the topic the step reads or writes),
// not logged: Run stops and returns it.
func (w *Worker) retry(ctx context.Context, ok *atomic.Bool, step, topic string, f func(context.Context) error) error {
	err := retry.Do(ctx, retry.Calls, f, func(err error, wait time.Duration) error {
		if permanent(err) {
			ok.Store(false)
			return w.stageError(step, topic, err)
		}
		ok.Store(false)
		w.m.errors.WithLabelValues(step).Inc()
		w.log.Warn(stepPhrase(step)+" failed; retrying", zap.Error(err), zap.Duration("backoff", wait))
		return nil
	})
	if err != nil {
		if se, isStage := errors.AsType[*StageError](err); isStage {
			return se
		}
		return fmt.Errorf("%s: %w", stepPhrase(step), err)
	}
	ok.Store(true)
	return nil
}

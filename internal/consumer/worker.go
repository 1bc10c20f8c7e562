// Package consumer reads a topic in a Kafka consumer group, deduplicates
// each batch with one test-and-set, forwards first-seen events, sends
// input that cannot be deduplicated to a dead-letter topic, and commits
// offsets only after both are acknowledged.
//
// Run starts three stages, named where they start (pipeline.go): watch
// the group's joins (reader.go), fetch and decide, and deliver, so that
// the next batch is read and decided while the last one is written. An
// event goes through
//
//   - fetch.go: the reader, and a batch of up to BatchSize messages;
//   - decide.go: extract (its ID and event time, the Extractor of
//     extract.go), one test-and-set per batch (the Filter), route (the
//     messages to forward and to dead-letter, with the headers of the
//     event format, package event) and count;
//   - deliver.go: both written (the Producer, producer.go), the batch
//     marked delivered, then the offsets committed.
//
// partitions.go is the one scan of a batch's partitions the stages share;
// handoff.go holds the wait for replays another replica may still be
// delivering; failopen.go the test-and-set's retries and, with
// FailOpenAfter, the batches forwarded unchecked.
//
// worker.go holds the Worker: New, Run, readiness and the retries;
// config.go the Config, its defaults and limits. start.go places a new
// group's first offsets; idsource.go reads where the ID is.
package consumer

import (
	"context"
	"errors"
	"fmt"
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
	if err := w.placeStart(ctx, groupLog); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r := w.newReader(w.kafkaLog)
	w.running.Store(true)
	p := w.newPipeline(ctx)
	defer p.end()
	watching := make(chan struct{})
	go func() { defer close(watching); w.watchReader(p.fctx, r) }()
	go w.deliverAll(p, r)
	fetchErr := w.fetchAndDecide(p, r)
	close(p.decided)
	err := p.result(fetchErr, <-p.delivered)
	w.running.Store(false)
	w.closeReader(p, r, groupLog)
	p.fcancel()
	<-watching
	return err
}

// placeStart commits a new group's first offsets (SetStart), retrying
// until it can. A failure that retrying cannot mend is returned as a
// *StageError and makes the worker not ready.
func (w *Worker) placeStart(ctx context.Context, groupLog *zap.Logger) error {
	err := w.retry(ctx, &w.fetching, StepStart, w.cfg.Topic, func(ctx context.Context) error {
		tr := w.cfg.Kafka.Transport(startIdle, w.cfg.Topic)
		defer tr.CloseIdleConnections()
		set, err := SetStart(ctx, w.cfg.Kafka.Client(tr), w.cfg.GroupID, w.cfg.Topic, w.cfg.Start, w.cfg.Kafka.Timeout)
		if set {
			groupLog.Info("new consumer group: start offsets committed", zap.Stringer("start", w.cfg.Start))
		}
		return err
	})
	if se, ok := errors.AsType[*StageError](err); ok && ctx.Err() == nil {
		w.failed.Store(true)
		w.m.errors.WithLabelValues(se.Step).Inc()
	}
	return err
}

// ReaderCloseTimeout is how long Run waits, past its ShutdownTimeout, for
// the reader to leave the group.
const ReaderCloseTimeout = 2 * time.Second

// startIdle is how long placeStart's connections stay open unused: it
// closes them itself once done.
const startIdle = 30 * time.Second

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

// Package consumer reads a topic in a Kafka consumer group, deduplicates
// each batch with one test-and-set, forwards first-seen events, sends
// input that cannot be deduplicated to a dead-letter topic, and commits
// offsets only after both are acknowledged.
package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/record"
	"dedupe-worker/internal/sink"
)

// Filter decides which elements are seen for the first time. The worker
// depends on this contract (bloom.Filter keeps it):
//   - On success it returns one verdict per element, in their order.
//   - On error it returns no verdicts, and the call may have been applied
//     in part or in full: calling again with the same elements must be
//     safe and give the decisions of the first application (the worker
//     retries a failed batch as it is, and after a crash another replica
//     sends the same offsets).
//   - Cancelling ctx makes it return promptly with an error; what it had
//     applied is as after any error.
//   - For each partition, offsets come in ascending order, and a call
//     returns before later offsets of its partitions are sent. A worker
//     makes one call at a time; other replicas call at the same time.
//   - bloom.ErrInvalidElement (inside the error) marks input the filter
//     refuses whatever the retries: the worker stops rather than retry it.
type Filter interface {
	TestAndSet(ctx context.Context, elems []bloom.Element) ([]bloom.Verdict, error)
}

// Producer writes messages. The worker depends on this contract
// (sink.Writer keeps it):
//   - Write returns nil only once every message is acknowledged by the
//     broker (all in-sync replicas): the worker commits the input offsets
//     after it.
//   - On error some messages may have been written and others not; the
//     worker writes the whole batch again, so copies are possible and
//     carry the same dedupe-source (downstream counts by it).
//   - Cancelling ctx makes Write return promptly with an error; it may
//     still hold the messages in a request it abandoned, so the caller
//     does not reuse their buffers.
//   - The worker calls Write from one goroutine at a time.
type Producer interface {
	Write(ctx context.Context, msgs []kafka.Message) error
}

// Config configures a Worker.
type Config struct {
	Brokers []string
	Topic   string
	GroupID string
	// BatchSize is the most messages per batch. Default: 1000.
	BatchSize int
	// BatchLinger flushes a partial batch this long after its first
	// message. Default: 100ms.
	BatchLinger time.Duration
	// BatchBytes ends a batch once its keys, values and headers reach this
	// many bytes, so that large messages do not make huge batches.
	// Default: 16 MiB.
	BatchBytes int
	// KafkaTimeout bounds each Kafka call. Default: 10s.
	KafkaTimeout time.Duration
	// ShutdownTimeout bounds finishing the batch in hand and leaving the
	// group once Run's context is cancelled. Default: 30s.
	ShutdownTimeout time.Duration
	// SessionTimeout of the consumer group. Default: 10s.
	SessionTimeout time.Duration
	// Start is where the group begins when it has no committed offsets.
	// Default: the earliest offset.
	Start Start
	// DeadLetterLate sends events the filter finds Late or Future to the
	// dead-letter topic (reasons late and future) instead of forwarding
	// them undeduplicated with the UndeduplicatedHeader.
	DeadLetterLate bool
	// Now is the clock of the event-time lag, the filter's. Default: time.Now.
	Now func() time.Time

	Extractor *Extractor
	Logger    *zap.Logger
	Metrics   *Metrics

	// TLS and SASL, when set, secure every connection of the reader.
	TLS  *tls.Config
	SASL sasl.Mechanism
}

func (c *Config) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.BatchLinger == 0 {
		c.BatchLinger = 100 * time.Millisecond
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = 16 << 20
	}
	if c.KafkaTimeout == 0 {
		c.KafkaTimeout = 10 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil, "")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Worker is one consumer-group member.
type Worker struct {
	cfg    Config
	filter Filter
	out    Producer
	dlq    Producer
	log    *zap.Logger
	m      *Metrics
	ready  atomic.Bool
	bufs   sync.Pool // of *buffers
	// kafkaLog logs what kafka-go reports, sampled (see Sampled).
	kafkaLog *zap.Logger
	// lateLog reports events beyond the lag bound, sampled.
	lateLog *zap.Logger
	// lagSeen is when each partition's lag was last set (deliver only).
	lagSeen map[int]time.Time
}

// New returns a Worker; Run starts it.
func New(cfg Config, filter Filter, out, dlq Producer) (*Worker, error) {
	cfg.setDefaults()
	if cfg.Extractor == nil {
		return nil, errors.New("consumer: no extractor")
	}
	if len(cfg.Brokers) == 0 || cfg.Topic == "" || cfg.GroupID == "" {
		return nil, errors.New("consumer: brokers, topic and group are required")
	}
	w := &Worker{cfg: cfg, filter: filter, out: out, dlq: dlq, log: cfg.Logger, m: cfg.Metrics, lateLog: Sampled(cfg.Logger)}
	w.bufs.New = func() any {
		n := cfg.BatchSize
		return &buffers{batch: make([]kafka.Message, 0, n), fetched: make([]time.Time, 0, n),
			elems: make([]bloom.Element, 0, n), idx: make([]int, 0, n), out: make([]kafka.Message, 0, n),
			seen: make(map[[2]int64]struct{}, n)}
	}
	return w, nil
}

// Ready reports whether the worker can make progress: false before Run
// starts and while Redis or Kafka calls are failing. An idle worker (no
// messages to read) is ready.
func (w *Worker) Ready() bool { return w.ready.Load() }

// Run consumes until ctx is cancelled, then stops fetching, finishes the
// batches in hand (decide, forward, dead-letter, commit) within
// ShutdownTimeout, leaves the group and returns nil, all within
// ShutdownTimeout plus ReaderCloseTimeout. It returns an error only
// when a batch in hand could not be finished; its offsets are then not
// committed and it is read again by whoever owns the partitions.
func (w *Worker) Run(ctx context.Context) error {
	kl := w.log.With(zap.String("topic", w.cfg.Topic), zap.String("group", w.cfg.GroupID))
	gl := Sampled(kl)
	w.kafkaLog = gl
	if err := w.retry(ctx, "setting the start offsets", func(ctx context.Context) error {
		cl := &kafka.Client{Addr: kafka.TCP(w.cfg.Brokers...), Timeout: w.cfg.KafkaTimeout,
			Transport: &kafka.Transport{DialTimeout: w.cfg.KafkaTimeout, TLS: w.cfg.TLS, SASL: w.cfg.SASL, ClientID: ClientID(w.cfg.GroupID)}}
		defer cl.Transport.(*kafka.Transport).CloseIdleConnections()
		set, err := SetStart(ctx, cl, w.cfg.GroupID, w.cfg.Topic, w.cfg.Start, w.cfg.KafkaTimeout)
		if set {
			kl.Info("new consumer group: start offsets committed", zap.Stringer("start", w.cfg.Start))
		}
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:  w.cfg.Brokers,
		GroupID:  w.cfg.GroupID,
		Topic:    w.cfg.Topic,
		MinBytes: 1,
		MaxBytes: 16 << 20,
		// kafka-go also uses MaxWait as the deadline for the start of a
		// fetch response. Tied to a short linger it made a loaded broker
		// miss it on every retry (a fetch that timed out, reconnected and
		// timed out again, for a minute in the fault suite). The broker
		// answers as soon as it has a byte (MinBytes 1), so a longer wait
		// costs nothing when data flows; the linger is kept by fetch.
		MaxWait:           min(500*time.Millisecond, w.cfg.SessionTimeout/2),
		StartOffset:       kafka.FirstOffset,
		CommitInterval:    0, // commits are synchronous, per batch
		QueueCapacity:     w.cfg.BatchSize,
		SessionTimeout:    w.cfg.SessionTimeout,
		RebalanceTimeout:  w.cfg.SessionTimeout,
		HeartbeatInterval: w.cfg.SessionTimeout / 5,
		JoinGroupBackoff:  500 * time.Millisecond,
		ReadBackoffMin:    50 * time.Millisecond,
		ReadBackoffMax:    time.Second,
		MaxAttempts:       3,
		Dialer:            &kafka.Dialer{Timeout: w.cfg.KafkaTimeout, TLS: w.cfg.TLS, SASLMechanism: w.cfg.SASL, ClientID: ClientID(w.cfg.GroupID)},
		Logger:            sink.KafkaLogger(gl, zapcore.DebugLevel),
		ErrorLogger:       sink.KafkaLogger(gl, zapcore.WarnLevel),
	})
	w.ready.Store(true)
	// Two stages: this goroutine fetches and decides batch n+1 while
	// deliver produces and commits batch n, in order. wctx outlives ctx by
	// ShutdownTimeout, so the batches in hand are finished on shutdown.
	wctx, wcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer wcancel()
	var finishBy atomic.Int64 // when the batches in hand must be finished
	stopTimer := context.AfterFunc(ctx, func() {
		finishBy.Store(time.Now().Add(w.cfg.ShutdownTimeout).UnixNano())
		time.AfterFunc(w.cfg.ShutdownTimeout, wcancel)
	})
	defer stopTimer()
	decidedCh := make(chan *buffers, 1)
	delivered := make(chan error, 1)
	go func() {
		var err error
		for d := range decidedCh {
			if err == nil { // after a failure, later batches are not delivered out of order
				err = w.deliver(wctx, r, d)
			}
			if err == nil && !d.retried {
				w.bufs.Put(d)
			}
		}
		delivered <- err
	}()
	var runErr error
	for {
		b := w.bufs.Get().(*buffers)
		batch, fetched := w.fetch(ctx, r, b)
		b.batch, b.fetched = batch, fetched
		if len(batch) > 0 {
			if err := w.decide(wctx, b); err != nil {
				runErr = err
				break
			}
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
	w.ready.Store(false)
	// Nothing is fetching or committing now, so Close cannot hang on a
	// commit in flight; it leaves the group.
	// Leaving the group takes what is left of the budget, and at most
	// ReaderCloseTimeout past it: a broker that does not answer must not
	// hold the shutdown.
	wait := ReaderCloseTimeout
	if by := finishBy.Load(); by != 0 {
		wait += max(time.Until(time.Unix(0, by)), 0)
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			kl.Warn("closing the reader", zap.Error(err))
		}
	case <-time.After(wait):
		kl.Warn("the reader did not close in time: leaving the group to the session timeout", zap.Duration("waited", wait))
	}
	return runErr
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

// Sampled is l for a library's own messages, which repeat: a kafka-go
// reader at the end of a partition reconnects with "unexpected EOF" many
// times a second, go-redis reports every failed dial. Each distinct
// message is logged at most once per 10 s.
func Sampled(l *zap.Logger) *zap.Logger {
	return l.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 1, 0)
	}))
}

// fetch collects up to BatchSize messages or BatchBytes bytes: it waits
// for the first as long as it takes, then at most BatchLinger for the
// rest. Cancelling ctx ends the batch early; the messages fetched so far
// are returned.
func (w *Worker) fetch(ctx context.Context, r *kafka.Reader, b *buffers) ([]kafka.Message, []time.Time) {
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
				return batch, fetched
			}
			// kafka-go backs off between its own fetch retries and queues
			// their errors with the messages; waiting here as well drained
			// a queue of errors one per back-off, which stalled a partition
			// for minutes after a short broker fault. Take the next one.
			// Errors that come without kafka-go's pacing (many in a row)
			// get a short pause, so this never spins.
			w.ready.Store(false)
			w.m.errors.WithLabelValues("fetching").Inc()
			w.kafkaLog.Warn("fetching", zap.Error(err))
			if errs++; errs > 100 {
				select {
				case <-lctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
			continue
		}
		errs = 0
		w.ready.Store(true)
		now := time.Now()
		if len(batch) == 0 {
			linger = time.AfterFunc(w.cfg.BatchLinger, cancel)
		}
		batch = append(batch, m)
		fetched = append(fetched, now)
		size += messageBytes(&m)
	}
	return batch, fetched
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
	seen    map[[2]int64]struct{}
	hb      headerBuf
	last    []kafka.Message // per partition, the message to commit
	// retried is set when a write of the batch failed. kafka-go may still
	// hold its messages in a produce request it abandoned, so the buffers
	// are then left to the garbage collector instead of being reused.
	retried bool
}

// decide extracts the IDs of a batch and runs its test-and-set, retrying
// until it succeeds or ctx ends.
func (w *Worker) decide(ctx context.Context, b *buffers) error {
	batch := b.batch
	w.m.eventsIn.Add(float64(len(batch)))
	elems, idx, dead := b.elems[:0], b.idx[:0], b.dead[:0]
	// After a rebalance or a re-fetch kafka-go can deliver an offset twice
	// in one batch; the copy is decided once (and committed with the rest).
	seen := b.seen
	clear(seen)
	for i := range batch {
		m := &batch[i]
		k := [2]int64{int64(m.Partition), m.Offset}
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if size := messageBytes(m); size > maxMessageBytes {
			// It could be produced neither forward nor as a dead letter, and
			// would stop the partition: dead-letter it without its value.
			tl := *m
			tl.Value = nil
			dead = append(dead, deadLetter(&tl, fmt.Errorf("%w: %d bytes", ErrTooLarge, size)))
			w.m.deadLettered.WithLabelValues(record.TooLarge.String()).Inc()
			continue
		}
		id, at, err := w.cfg.Extractor.Extract(m)
		if err != nil {
			dead = append(dead, deadLetter(m, err))
			w.m.deadLettered.WithLabelValues(reasonOf(err).String()).Inc()
			continue
		}
		elems = append(elems, bloom.Element{ID: id, Time: at, Source: bloom.Source{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset}})
		idx = append(idx, i)
	}
	b.elems, b.idx, b.dead = elems, idx, dead

	var verdicts []bloom.Verdict
	if len(elems) > 0 {
		err := w.retry(ctx, "test-and-set", func(ctx context.Context) error {
			t := time.Now()
			v, err := w.filter.TestAndSet(ctx, elems)
			w.m.redisSeconds.Observe(time.Since(t).Seconds())
			verdicts = v
			return err
		})
		if err != nil {
			return err
		}
	}
	out := b.out[:0]
	hb := &b.hb
	hb.reset()
	var counts [bloom.Future + 1]int
	now := w.cfg.Now()
	firstLate := -1
	for k, v := range verdicts {
		counts[v]++
		w.m.eventLag.Observe(max(now.Sub(elems[k].Time), 0).Seconds())
		m := &batch[idx[k]]
		id := kafka.Header{Key: record.IDHeader, Value: elems[k].ID}
		switch {
		case v == bloom.Late || v == bloom.Future:
			if firstLate < 0 {
				firstLate = k
			}
			if w.cfg.DeadLetterLate {
				dead = append(dead, deadLetter(m, fmt.Errorf("%w; event time %s", beyondBound(v), elems[k].Time.UTC().Format(time.RFC3339Nano))))
				w.m.deadLettered.WithLabelValues(reasonOf(beyondBound(v)).String()).Inc()
				continue
			}
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: hb.with(m, id, kafka.Header{Key: record.UndeduplicatedHeader, Value: []byte(v.String())})})
		case v.Forward():
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time, Headers: hb.with(m, id)})
		}
	}
	b.out, b.dead = out, dead
	for v, n := range counts {
		if n > 0 {
			w.m.verdicts.WithLabelValues(bloom.Verdict(v).String()).Add(float64(n))
		}
	}
	if firstLate >= 0 {
		e := elems[firstLate]
		action := "forwarded undeduplicated"
		if w.cfg.DeadLetterLate {
			action = "dead-lettered"
		}
		w.lateLog.Warn("events beyond the lag bound "+action, zap.Int("late", counts[bloom.Late]), zap.Int("future", counts[bloom.Future]),
			zap.Stringer("first", e.Source), zap.Time("first_event_time", e.Time), zap.Duration("first_lag", now.Sub(e.Time)))
	}
	return nil
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
	ErrLate   = errors.New("late: processed after the lag bound (max lag past the end of its event time's window), not deduplicated")
	ErrFuture = errors.New("future: event time beyond the end of the window after the clock's, not deduplicated")
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
	if err := w.retry(ctx, "producing", write(w.out, d.out)); err != nil {
		return err
	}
	if err := w.retry(ctx, "dead-lettering", write(w.dlq, d.dead)); err != nil {
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
	// it is tried a few times only.
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, w.cfg.KafkaTimeout)
		err := r.CommitMessages(cctx, d.last...)
		cancel()
		if err == nil {
			break
		}
		if attempt == 2 || ctx.Err() != nil {
			w.log.Warn("committing; the batch will be read again", zap.String("topic", w.cfg.Topic),
				zap.Int("partition", batch[0].Partition), zap.Int64("offset", batch[0].Offset), zap.Error(err))
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	w.m.batchSize.Observe(float64(len(batch)))
	w.m.batchSeconds.Observe(latency.Seconds())
	w.setLag(d.last, time.Now())
	return nil
}

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

// retry calls f until it succeeds or ctx ends, backing off between tries;
// the worker is not ready while it fails.
func (w *Worker) retry(ctx context.Context, what string, f func(context.Context) error) error {
	b := newBackoff()
	for {
		err := f(ctx)
		if err == nil {
			w.ready.Store(true)
			return nil
		}
		if permanent(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		w.ready.Store(false)
		w.m.errors.WithLabelValues(what).Inc()
		w.log.Warn(what+" failed; retrying", zap.Error(err), zap.Duration("backoff", b.next))
		if !b.wait(ctx) {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
}

// permanent reports whether retrying err cannot help: an invalid element
// is a bug, and a refused authorization stays refused until an operator
// changes the ACLs.
func permanent(err error) bool {
	return errors.Is(err, bloom.ErrInvalidElement) || errors.Is(err, kafka.TopicAuthorizationFailed) ||
		errors.Is(err, kafka.GroupAuthorizationFailed) || errors.Is(err, kafka.ClusterAuthorizationFailed)
}

type backoff struct{ next time.Duration }

func newBackoff() *backoff { return &backoff{next: 100 * time.Millisecond} }

// wait sleeps for the next back-off with jitter; false if ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, 5*time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func source(m *kafka.Message) kafka.Header {
	return kafka.Header{Key: record.SourceHeader, Value: record.AppendSource(nil, m.Topic, m.Partition, m.Offset)}
}

// headerBuf hands out the headers of forwarded messages from a few large
// blocks instead of several small allocations per message: the input's
// headers, then dedupe-source, then the extra ones. The ID aliases the input
// message, which lives as long as the batch. A block that fills up is
// left to the messages that use it and replaced by one twice as large, so
// after a few batches one block holds a whole batch and reset reuses it.
type headerBuf struct {
	headers []kafka.Header
	bytes   []byte
}

// reset makes the current blocks reusable; call it only once no message
// refers to the headers handed out before.
func (b *headerBuf) reset() {
	b.headers, b.bytes = b.headers[:0], b.bytes[:0]
}

func (b *headerBuf) with(m *kafka.Message, extra ...kafka.Header) []kafka.Header {
	n := len(m.Headers) + 1 + len(extra)
	if cap(b.headers)-len(b.headers) < n {
		b.headers = make([]kafka.Header, 0, max(n, 2*cap(b.headers), 256))
	}
	if need := len(m.Topic) + 42; cap(b.bytes)-len(b.bytes) < need {
		b.bytes = make([]byte, 0, max(need, 2*cap(b.bytes), 8<<10))
	}
	start := len(b.bytes)
	b.bytes = record.AppendSource(b.bytes, m.Topic, m.Partition, m.Offset)
	src := b.bytes[start:len(b.bytes):len(b.bytes)]
	first := len(b.headers)
	b.headers = append(b.headers, m.Headers...)
	b.headers = append(b.headers, kafka.Header{Key: record.SourceHeader, Value: src})
	b.headers = append(b.headers, extra...)
	return b.headers[first:len(b.headers):len(b.headers)]
}

// ErrTooLarge dead-letters a message too large to produce again with the
// headers the worker adds; its dead letter has no value, and its
// dedupe-source header says where the original is.
var ErrTooLarge = fmt.Errorf("message is larger than the producer's limit of %d bytes less %d for headers; the value is left out, see dedupe-source",
	sink.MaxBatchBytes, headerAllowance)

// headerAllowance is room left for the headers the worker adds.
const headerAllowance = 4096

const maxMessageBytes = sink.MaxBatchBytes - headerAllowance

func messageBytes(m *kafka.Message) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// deadLetter is the input unchanged, with the reason and its source.
func deadLetter(m *kafka.Message, reason error) kafka.Message {
	h := make([]kafka.Header, 0, len(m.Headers)+3)
	h = append(h, m.Headers...)
	h = append(h, source(m), kafka.Header{Key: record.ErrorHeader, Value: []byte(reason.Error())},
		kafka.Header{Key: record.ReasonHeader, Value: []byte(reasonOf(reason).String())})
	return kafka.Message{Key: m.Key, Value: m.Value, Headers: h, Time: m.Time}
}

// reasons map the errors a message is dead-lettered for to their reasons.
var reasons = []struct {
	err    error
	reason record.Reason
}{
	{ErrNotJSON, record.NotJSON}, {ErrTooDeep, record.TooDeep}, {ErrNoID, record.NoID}, {ErrEmptyID, record.EmptyID},
	{ErrBadID, record.BadID}, {ErrNoTime, record.NoTime}, {ErrBadTime, record.BadTime}, {ErrInvalidUTF8, record.InvalidUTF8},
	{ErrTooLarge, record.TooLarge}, {ErrLate, record.Late}, {ErrFuture, record.Future},
}

// reasonOf is the reason of a dead-letter error, by its type, never by its
// text.
func reasonOf(err error) record.Reason {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return record.Other
}

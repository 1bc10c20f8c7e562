// Package app wires a worker from its configuration and runs it: the Redis
// client and filter, the sinks, the consumer, and the HTTP endpoints.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/kafkaconn"
	"dedupe-worker/internal/logs"
	"dedupe-worker/internal/sink"
)

// NewRedis returns a client for one server, or for a Cluster when several
// addresses are given, with every call bounded by cfg.RedisTimeout, logged
// in as DEDUPE_REDIS_USERNAME and over TLS when configured. It fails only
// when a TLS file cannot be read.
func NewRedis(cfg config.Config) (redis.UniversalClient, error) {
	tc, err := cfg.RedisTLSConfig()
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 cfg.RedisAddrs,
		IsClusterMode:         len(cfg.RedisAddrs) > 1,
		Username:              cfg.RedisUsername,
		Password:              string(cfg.RedisPassword),
		TLSConfig:             tc,
		ContextTimeoutEnabled: true,
		DialTimeout:           cfg.RedisTimeout,
		ReadTimeout:           cfg.RedisTimeout,
		WriteTimeout:          cfg.RedisTimeout,
		MaxRetries:            2,
		// Nothing on connect beyond HELLO: no CLIENT SETINFO, no
		// maintenance notifications, so the ACL of docs/security.md is the whole list.
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}), nil
}

// NewFilter sizes and builds the pipeline's filter.
func NewFilter(cfg config.Config, rc redis.UniversalClient) (*bloom.Filter, error) {
	return newFilter(cfg, rc, time.Now, nil, nil)
}

// newFilter is NewFilter with the clock, and the gauges and the logger the
// filter reports to (nil: none).
func newFilter(cfg config.Config, rc redis.UniversalClient, now func() time.Time, g *bloom.Gauges, log *zap.Logger) (*bloom.Filter, error) {
	s, err := cfg.Sizing()
	if err != nil {
		return nil, err
	}
	return bloom.New(rc, bloom.Config{
		Pipeline:    cfg.Pipeline,
		Plan:        s.Plan,
		Window:      s.Window,
		CallTimeout: cfg.RedisTimeout,
		MinReplicas: cfg.RedisMinReplicas,
		Now:         now,
		Gauges:      g,
		Logger:      log,
	})
}

// Worker is one replica of the worker, built from its configuration by
// New and run by Run: the Redis client and filter, the producers, the
// consumer, its metrics and its HTTP endpoints.
type Worker struct {
	cfg      config.Config
	log      *zap.Logger
	reg      *prometheus.Registry
	rc       redis.UniversalClient
	filter   *bloom.Filter
	consumer *consumer.Worker
	// out, dlq and dups (nil unless DEDUPE_DUPLICATES_TOPIC) are the
	// producers of the output, the dead letters and the copies dropped.
	out, dlq, dups *sink.Writer
	// kafka is how every Kafka connection of the worker is made: the
	// reader's, the start offsets', the producers' and the start-up
	// check's.
	kafka kafkaconn.Conn
}

// New builds the worker cfg describes, connecting to nothing. It checks cfg
// as config.Load does (Config.Validate), so a configuration built by hand
// is held to the same rules: a setting out of its limits, or a TLS file
// that cannot be read, is returned, naming its variable. Run it once; it closes what New opened. A Worker never
// run holds no connection.
func New(cfg config.Config, log *zap.Logger) (*Worker, error) {
	return newAt(cfg, log, time.Now)
}

// newAt is New with the clock the filter's windows and the event-time lag
// are read from. Redis applies the keys' expiry with its own clock, so now
// must stay near the real time.
func newAt(cfg config.Config, log *zap.Logger, now func() time.Time) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log = log.With(zap.String("pipeline", cfg.Pipeline))
	// go-redis logs (dial failures, mostly) to stderr by itself otherwise.
	redis.SetLogger(redisLogger{logs.Sampled(log.Named("redis"))})
	w := &Worker{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	var err error
	if w.kafka, err = kafkaConn(cfg, log); err != nil {
		return nil, err
	}
	if w.rc, err = NewRedis(cfg); err != nil {
		return nil, err
	}
	if err := w.build(now); err != nil {
		w.rc.Close()
		return nil, err
	}
	return w, nil
}

// build makes the filter, the producers and the consumer of w.
func (w *Worker) build(now func() time.Time) error {
	cfg, log := w.cfg, w.log
	w.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := consumer.NewMetrics(w.reg, cfg.Pipeline)
	filter, err := newFilter(cfg, w.rc, now, bloom.NewGauges(w.reg, cfg.Pipeline), log)
	if err != nil {
		return err
	}
	w.filter = filter
	logPlan(log, cfg, filter)
	modes, err := cfg.Modes()
	if err != nil {
		return err
	}
	ex, err := cfg.Extractor()
	if err != nil {
		return err
	}
	src, _ := cfg.IDSource() // read without error by Extractor
	log.Info("deduplicating", zap.Stringer("id", src), zap.String("mode", cfg.Mode))
	w.out, w.dlq = w.writer(cfg.OutputTopic), w.writer(cfg.DLQTopic)
	if cfg.DuplicatesTopic != "" {
		w.dups = w.writer(cfg.DuplicatesTopic)
	}
	w.consumer, err = consumer.New(consumer.Config{
		Kafka: w.kafka, Topic: cfg.InputTopic, GroupID: cfg.GroupID,
		BatchSize: cfg.BatchSize, BatchLinger: cfg.BatchLinger, ShutdownTimeout: cfg.ShutdownTimeout, SessionTimeout: cfg.KafkaSessionTimeout,
		HandoffWait: cfg.HandoffWait, FailOpenAfter: cfg.FailOpenAfter, Extractor: ex, Logger: log, Metrics: metrics, Now: now,
		DeadLetterLate: modes.DeadLetterLate, Shadow: modes.Shadow, Start: modes.Start.ConsumerStart(now()),
		Duplicates: producerOrNil(w.dups),
	}, filter, w.out, w.dlq)
	if err != nil {
		return err
	}
	RegisterStatus(w.reg, cfg.Pipeline, cfg.FalsePositiveRate, w.Ready)
	return nil
}

// writer is a producer to topic, connected as the reader is.
func (w *Worker) writer(topic string) *sink.Writer {
	return sink.New(sink.Config{Kafka: w.kafka, Topic: topic, BatchSize: w.cfg.BatchSize, Logger: w.log})
}

// logPlan logs the filter's plan: its size, rates and memory.
func logPlan(log *zap.Logger, cfg config.Config, filter *bloom.Filter) {
	plan := filter.Plan()
	log.Info("filter planned", zap.Stringer("filter", plan.Kind), zap.Int64("expected_per_window", plan.Elements), zap.Float64("target_fpr", plan.TargetFPR),
		zap.Float64("achieved_fpr", plan.AchievedFPR), zap.Int("words", plan.Layout.Words), zap.Int("bits_per_word", plan.Layout.BitsPerWord),
		zap.Int("shards", plan.Shards), zap.Uint64("bytes_per_window", plan.Memory), zap.Int("stages", len(plan.Stages)),
		zap.Int64("capacity_per_window", plan.Capacity()), zap.Int("live_windows", filter.LiveWindows()),
		zap.Uint64("bytes_live", plan.Memory*uint64(filter.LiveWindows())), zap.Duration("max_lag", cfg.MaxLag),
		zap.String("late_policy", cfg.LatePolicy), zap.String("key_tag", filter.Tag()))
}

// Ready reports whether the worker makes progress and every Redis master
// keeps the filter's keys (its eviction policy is noeviction): /readyz.
func (w *Worker) Ready() bool { return w.consumer.Ready() && w.filter.Healthy() }

// Registry holds the worker's metrics, those /metrics serves.
func (w *Worker) Registry() *prometheus.Registry { return w.reg }

// Run runs one worker until ctx is cancelled, then shuts down in order:
// stop fetching, finish the batches in hand (decide, produce, commit)
// within cfg.ShutdownTimeout, leave the group (consumer.ReaderCloseTimeout
// more at most), close the producers, Redis and HTTP (CloseTimeout more at
// most). So it returns within ShutdownBound(cfg) of the cancellation,
// whatever Kafka and Redis do; batches that could not be finished are not
// committed, and Run returns their error.
//
// Before joining the group it waits, serving HTTP and not ready, until
// Kafka and Redis accept connections made as configured (TLS, SASL, ACL
// user). A refused login or certificate is returned at once, with the
// variables to check, and so is a Redis master older than 7.0 or whose
// maxmemory-policy is not noeviction (bloom.CheckServer). While it runs,
// it is not ready while a master's policy is one that evicts
// (bloom.Filter.Healthy).
func (w *Worker) Run(ctx context.Context) error {
	defer w.rc.Close()
	srv, addr, err := serve(w.cfg.HTTPAddr, w.reg, w.Ready, w.log)
	if err != nil {
		return err
	}
	w.log.Info("serving", zap.String("http", addr), zap.Duration("shutdown_bound", ShutdownBound(w.cfg)))
	// Not ready until both servers accept the connection as configured.
	// A refused password or certificate ends the start here.
	if err := waitForServers(ctx, w.cfg, w.kafka, w.rc, w.log); err != nil {
		cerr := w.close(srv)
		if ctx.Err() != nil {
			w.log.Info("stopped before the servers were reachable")
			return cerr
		}
		return errors.Join(err, cerr)
	}
	if err := w.checkServers(ctx); err != nil {
		return errors.Join(err, w.close(srv))
	}
	// Maintenance: create the next bucket's keys ahead of time and export
	// filter statistics.
	mctx, stopMaint := context.WithCancel(ctx)
	maintDone := make(chan struct{})
	go func() {
		defer close(maintDone)
		w.filter.Maintain(mctx)
	}()
	runErr := w.consumer.Run(ctx)
	stopMaint()
	<-maintDone
	errs := []error{runErr, w.close(srv)}
	w.log.Info("stopped")
	return errors.Join(errs...)
}

// checkServers ends the start, with one line naming it, on a Redis server
// too old, one whose eviction policy would evict the filter's keys, or
// one too small for the plan.
func (w *Worker) checkServers(ctx context.Context) error {
	if err := w.filter.CheckServer(ctx); err != nil {
		return err
	}
	switch err := w.filter.CheckCapacity(ctx); {
	case errors.Is(err, bloom.ErrInvalidPlan):
		return err
	case err != nil:
		w.log.Warn("checking the filter against Redis maxmemory", zap.Error(err))
	}
	return nil
}

// close closes the producers and the HTTP server within CloseTimeout.
func (w *Worker) close(srv *http.Server) error {
	closeCtx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
	defer cancel()
	// A writer flushes nothing here (every write is waited for), but
	// its Close has no deadline of its own.
	closed := make(chan error, 1)
	go func() {
		err := errors.Join(w.out.Close(), w.dlq.Close())
		if w.dups != nil {
			err = errors.Join(err, w.dups.Close())
		}
		closed <- err
	}()
	var werr error
	select {
	case werr = <-closed:
	case <-closeCtx.Done():
		werr = errors.New("closing the producers: no answer within " + CloseTimeout.String())
	}
	return errors.Join(werr, srv.Shutdown(closeCtx))
}

// producerOrNil is w as a consumer.Producer, nil (no producer) when w is.
func producerOrNil(w *sink.Writer) consumer.Producer {
	if w == nil {
		return nil
	}
	return w
}

// CloseTimeout bounds closing the producers and the HTTP server at the end
// of the shutdown.
const CloseTimeout = 3 * time.Second

// RegisterStatus registers the replica's readiness (dedupe_ready, as
// /readyz says) and the configured false-positive rate
// (dedupe_false_positive_rate_target), which the alerts compare the
// filters' estimates with.
func RegisterStatus(reg prometheus.Registerer, pipeline string, targetFPR float64, ready func() bool) {
	l := prometheus.Labels{"pipeline": pipeline}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dedupe_false_positive_rate_target",
		Help: "The configured false-positive rate, DEDUPE_FALSE_POSITIVE_RATE: the most dedupe_filter_false_positive_rate may reach.", ConstLabels: l},
		func() float64 { return targetFPR }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dedupe_ready",
		Help: "1 while this replica is ready (/readyz answers 200), 0 otherwise.", ConstLabels: l},
		func() float64 {
			if ready() {
				return 1
			}
			return 0
		}))
}

// ShutdownBound is the longest Run takes to return once its context is
// cancelled: DEDUPE_SHUTDOWN_TIMEOUT to finish the batches in hand, then
// leaving the group and closing the clients.
func ShutdownBound(cfg config.Config) time.Duration {
	return cfg.ShutdownTimeout + consumer.ReaderCloseTimeout + CloseTimeout
}

// serve starts the HTTP endpoints on addr and returns the address bound.
func serve(addr string, reg *prometheus.Registry, ready func() bool, log *zap.Logger) (*http.Server, string, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("DEDUPE_HTTP_ADDR %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", zap.Error(err))
		}
	}()
	return srv, l.Addr().String(), nil
}

// redisLogger sends go-redis's own messages to zap, at warn level: they
// are about failed connections.
type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Warn(fmt.Sprintf(format, v...))
}

// Package app wires a worker from its configuration and runs it: the Redis
// client and filter, the sinks, the consumer, and the HTTP endpoints.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
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
	}), nil
}

// NewFilter sizes and builds the pipeline's filter.
func NewFilter(cfg config.Config, rc redis.UniversalClient) (*bloom.Filter, error) {
	return newFilter(cfg, rc, time.Now)
}

func newFilter(cfg config.Config, rc redis.UniversalClient, now func() time.Time) (*bloom.Filter, error) {
	plan, err := bloom.NewPlan(cfg.ExpectedPerWindow, cfg.FalsePositiveRate, bloom.PlanOptions{MinShards: cfg.Shards, MaxGrowth: cfg.MaxGrowth})
	if err != nil {
		return nil, fmt.Errorf("DEDUPE_EXPECTED_PER_WINDOW, DEDUPE_FALSE_POSITIVE_RATE, DEDUPE_MAX_GROWTH: %w", err)
	}
	mode, err := bloom.ParseMode(cfg.WindowMode)
	if err != nil {
		return nil, err
	}
	return bloom.New(rc, bloom.Config{
		Pipeline:    cfg.Pipeline,
		Plan:        plan,
		Windows:     bloom.Windows{Length: cfg.Window, Mode: mode, MaxLag: cfg.MaxLag},
		CallTimeout: cfg.RedisTimeout,
		MinReplicas: cfg.RedisMinReplicas,
		Now:         now,
	})
}

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
// variables to check.
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	return run(ctx, cfg, log, time.Now)
}

// RunAt is Run with the clock now in place of the real one, for the
// decisions that depend on the present (late events, the start offset
// given as a duration, the event-time lag). Tests use it to play an
// outage; keep now near the real clock, which Redis expires keys by.
func RunAt(now func() time.Time) func(context.Context, config.Config, *zap.Logger) error {
	return func(ctx context.Context, cfg config.Config, log *zap.Logger) error { return run(ctx, cfg, log, now) }
}

func run(ctx context.Context, cfg config.Config, log *zap.Logger, now func() time.Time) error {
	log = log.With(zap.String("pipeline", cfg.Pipeline))
	// go-redis logs (dial failures, mostly) to stderr by itself otherwise.
	redis.SetLogger(redisLogger{consumer.Sampled(log.Named("redis"))})
	kafkaTLS, mech, err := kafkaSecurity(cfg, log)
	if err != nil {
		return err
	}
	rc, err := NewRedis(cfg)
	if err != nil {
		return err
	}
	defer rc.Close()
	filter, err := newFilter(cfg, rc, now)
	if err != nil {
		return err
	}
	start, err := config.ParseStartOffset(cfg.StartOffset)
	if err != nil {
		return err
	}
	plan := filter.Plan()
	log.Info("filter planned", zap.Int64("expected_per_window", plan.Elements), zap.Float64("target_fpr", plan.TargetFPR),
		zap.Float64("achieved_fpr", plan.AchievedFPR), zap.Int("words", plan.Layout.Words), zap.Int("bits_per_word", plan.Layout.BitsPerWord),
		zap.Int("shards", plan.Shards), zap.Uint64("bytes_per_window", plan.Memory), zap.Int("stages", len(plan.Stages)),
		zap.Int64("capacity_per_window", plan.Capacity()), zap.Int("live_windows", filter.LiveWindows()),
		zap.Uint64("bytes_live", plan.Memory*uint64(filter.LiveWindows())), zap.Duration("max_lag", cfg.MaxLag),
		zap.String("late_policy", cfg.LatePolicy), zap.String("key_tag", filter.Tag()))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := consumer.NewMetrics(reg, cfg.Pipeline)
	fg := NewFilterGauges(reg, cfg.Pipeline)
	fg.maxLag.Set(cfg.MaxLag.Seconds())

	ex, err := consumer.NewExtractor(cfg.IDField, cfg.TimeField)
	if err != nil {
		return err
	}
	out := sink.New(sink.Config{Brokers: cfg.KafkaBrokers, Topic: cfg.OutputTopic, BatchSize: cfg.BatchSize, Timeout: cfg.KafkaTimeout, Logger: log,
		TLS: kafkaTLS, SASL: mech})
	dlq := sink.New(sink.Config{Brokers: cfg.KafkaBrokers, Topic: cfg.DLQTopic, BatchSize: cfg.BatchSize, Timeout: cfg.KafkaTimeout, Logger: log,
		TLS: kafkaTLS, SASL: mech})
	w, err := consumer.New(consumer.Config{
		Brokers: cfg.KafkaBrokers, Topic: cfg.InputTopic, GroupID: cfg.GroupID,
		BatchSize: cfg.BatchSize, BatchLinger: cfg.BatchLinger, KafkaTimeout: cfg.KafkaTimeout,
		ShutdownTimeout: cfg.ShutdownTimeout, SessionTimeout: cfg.KafkaSessionTimeout, Extractor: ex, Logger: log, Metrics: metrics,
		TLS: kafkaTLS, SASL: mech, Now: now, DeadLetterLate: cfg.LatePolicy == config.LateDeadLetter,
		Start: consumer.Start{Latest: start.Latest, At: start.Time(now())},
	}, filter, out, dlq)
	if err != nil {
		return err
	}

	srv, addr, err := serve(cfg.HTTPAddr, reg, w.Ready, log)
	if err != nil {
		return err
	}
	log.Info("serving", zap.String("http", addr))
	closeAll := func() error {
		closeCtx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
		defer cancel()
		// A writer flushes nothing here (every write is waited for), but
		// its Close has no deadline of its own.
		closed := make(chan error, 1)
		go func() { closed <- errors.Join(out.Close(), dlq.Close()) }()
		var werr error
		select {
		case werr = <-closed:
		case <-closeCtx.Done():
			werr = errors.New("closing the producers: no answer within " + CloseTimeout.String())
		}
		return errors.Join(werr, srv.Shutdown(closeCtx))
	}

	// Not ready until both servers accept the connection as configured.
	// A refused password or certificate ends the start here.
	if err := waitForServers(ctx, cfg, kafkaTLS, mech, rc, log); err != nil {
		cerr := closeAll()
		if ctx.Err() != nil {
			log.Info("stopped before the servers were reachable")
			return cerr
		}
		return errors.Join(err, cerr)
	}
	if err := filter.CheckServer(ctx); err != nil {
		return errors.Join(err, closeAll())
	}
	switch err := filter.CheckCapacity(ctx); {
	case errors.Is(err, bloom.ErrInvalidPlan):
		return errors.Join(err, closeAll())
	case err != nil:
		log.Warn("checking the filter against Redis maxmemory", zap.Error(err))
	}

	// Maintenance: create the next bucket's keys ahead of time and export
	// filter statistics.
	mctx, stopMaint := context.WithCancel(ctx)
	maintDone := make(chan struct{})
	go func() {
		defer close(maintDone)
		maintain(mctx, filter, cfg.Window, fg, log)
	}()

	runErr := w.Run(ctx)
	stopMaint()
	<-maintDone
	errs := []error{runErr, closeAll()}
	log.Info("stopped")
	return errors.Join(errs...)
}

// CloseTimeout bounds closing the producers and the HTTP server at the end
// of the shutdown.
const CloseTimeout = 3 * time.Second

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

// FilterGauges are the filter statistics the worker exports.
type FilterGauges struct {
	fill, fpr, elements, ttl     *prometheus.GaugeVec
	stages, overfilled, testOnly *prometheus.GaugeVec
	maxLag                       prometheus.Gauge
	grown                        prometheus.Counter
}

// NewFilterGauges registers the filter statistics the worker exports per
// window and shard (fill, estimated false-positive rate, estimated
// elements, TTL).
func NewFilterGauges(reg prometheus.Registerer, pipeline string) *FilterGauges {
	l := prometheus.Labels{"pipeline": pipeline}
	labels := []string{"window", "shard"}
	g := &FilterGauges{
		fill: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_fill_ratio",
			Help: "Set bits over all bits, per window (current, previous) and shard.", ConstLabels: l}, labels),
		fpr: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_false_positive_rate",
			Help: "Estimated false-positive rate at the current fill.", ConstLabels: l}, labels),
		elements: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_estimated_elements",
			Help: "Elements estimated from the set bits.", ConstLabels: l}, labels),
		ttl: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_ttl_seconds",
			Help: "Time the window's key has left.", ConstLabels: l}, labels),
	}
	g.stages = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_stages",
		Help: "Stages the window has grown into (1: its planned size).", ConstLabels: l}, labels)
	g.overfilled = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_overfilled",
		Help: "Elements inserted past a full stage because the next was not made in time: the rate is above target.", ConstLabels: l}, labels)
	g.testOnly = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_test_only",
		Help: "New elements only tested, not inserted, because the window reached DEDUPE_MAX_GROWTH: their copies pass.", ConstLabels: l}, labels)
	g.grown = prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupe_filter_stages_made_total",
		Help: "Stages this replica made ahead for windows that grow.", ConstLabels: l})
	g.maxLag = prometheus.NewGauge(prometheus.GaugeOpts{Name: "dedupe_max_lag_seconds",
		Help: "The lag bound, DEDUPE_MAX_LAG: events decided later than this after their event time may not be deduplicated.", ConstLabels: l})
	reg.MustRegister(g.fill, g.fpr, g.elements, g.ttl, g.maxLag, g.stages, g.overfilled, g.testOnly, g.grown)
	return g
}

// growEvery is how often the maintenance looks for windows to grow, and
// slowEvery how often it preallocates and reads the gauges.
const (
	growEvery = 5 * time.Second
	slowEvery = 30 * time.Second
)

func maintain(ctx context.Context, f *bloom.Filter, window time.Duration, g *FilterGauges, log *zap.Logger) {
	tick := time.NewTicker(growEvery)
	defer tick.Stop()
	warned := map[[2]int64]string{} // buckets and shards already warned about
	var lastSlow, growFailed time.Time
	for {
		// After a failure, requests from the script wait for the tick.
		if now := time.Now(); now.Sub(growFailed) >= growEvery {
			made, err := f.Grow(ctx, f.Now())
			for _, m := range made {
				g.grown.Inc()
				log.Info("window grew: next stage made", zap.Time("window", f.Windows().Start(m.Bucket)), zap.Int("shard", m.Shard),
					zap.Int("stage", m.Stage), zap.Uint64("bytes", m.Bytes))
			}
			if err != nil && ctx.Err() == nil {
				growFailed = now
				log.Warn("growing windows", zap.Error(err))
			}
		}
		if now := time.Now(); now.Sub(lastSlow) >= slowEvery {
			lastSlow = now
			maintainSlow(ctx, f, f.Now(), window, g, warned, log)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-f.GrowthWanted():
		}
	}
}

func maintainSlow(ctx context.Context, f *bloom.Filter, now time.Time, window time.Duration, g *FilterGauges, warned map[[2]int64]string, log *zap.Logger) {
	if err := f.Preallocate(ctx, now); err != nil && ctx.Err() == nil {
		log.Warn("preallocating the current window", zap.Error(err))
	}
	if err := f.Preallocate(ctx, now.Add(window)); err != nil && ctx.Err() == nil {
		log.Warn("preallocating the next window", zap.Error(err))
	}
	st, err := f.Stats(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("reading filter stats", zap.Error(err))
		}
		return
	}
	cur := f.Plan().Shards
	for i, s := range st {
		win := "current"
		if i >= cur {
			win = "previous"
		}
		shard := strconv.Itoa(s.Shard)
		g.fill.WithLabelValues(win, shard).Set(s.Fill)
		g.fpr.WithLabelValues(win, shard).Set(s.FPR)
		g.elements.WithLabelValues(win, shard).Set(s.Elements)
		g.ttl.WithLabelValues(win, shard).Set(s.TTL.Seconds())
		g.stages.WithLabelValues(win, shard).Set(float64(s.Stages))
		g.overfilled.WithLabelValues(win, shard).Set(float64(s.Overfilled))
		g.testOnly.WithLabelValues(win, shard).Set(float64(s.TestOnly))
		k := [2]int64{s.Bucket, int64(s.Shard)}
		switch stage := f.Plan().Stages[min(s.Stages, len(f.Plan().Stages))-1]; {
		case s.TestOnly > 0 && warned[k] != "test-only":
			warned[k] = "test-only"
			log.Warn("window only tests new IDs: it reached DEDUPE_MAX_GROWTH, or its next stage could not be made; their copies pass",
				zap.Time("window", s.Start), zap.Int("shard", s.Shard), zap.Int64("test_only", s.TestOnly), zap.Float64("estimated_elements", s.Elements))
		case s.Overfilled > stage.CapacityPerShard/100 && warned[k] == "":
			// A few batches overfill each stage while the next is made;
			// more means it is late.
			warned[k] = "overfilled"
			log.Warn("window overfilled: its next stage was not made in time, the false-positive rate is above target",
				zap.Time("window", s.Start), zap.Int("shard", s.Shard), zap.Int64("overfilled", s.Overfilled))
		}
	}
	// Windows long expired are forgotten.
	for k := range warned {
		if k[0] < f.Windows().Bucket(now.Add(-f.Windows().Retention())) {
			delete(warned, k)
		}
	}
}

// redisLogger sends go-redis's own messages to zap, at warn level: they
// are about failed connections.
type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Warn(fmt.Sprintf(format, v...))
}

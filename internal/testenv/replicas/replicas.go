// Package replicas runs whole workers (the application's Run with a
// config.Config) inside a test's process. It is apart from testenv so that
// the engine's and the worker's own tests, which use testenv, do not link
// the application's settings.
package replicas

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/config"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testenv"
)

// RunFunc runs a whole worker until ctx ends: Runs(app.New).
type RunFunc func(ctx context.Context, cfg config.Config, log *zap.Logger) error

// Runs is the RunFunc of a worker built by build, app.New, then run: a
// test hands it in because this package cannot import app (app's own
// tests use it).
func Runs[W interface{ Run(context.Context) error }](build func(config.Config, *zap.Logger) (W, error)) RunFunc {
	return func(ctx context.Context, cfg config.Config, log *zap.Logger) error {
		w, err := build(cfg, log)
		if err != nil {
			return err
		}
		return w.Run(ctx)
	}
}

// stopSlack is what a replica may take beyond its ShutdownTimeout to
// return after its context ends: closing clients and the HTTP server.
const stopSlack = 10 * time.Second

// Replica is one worker running in the test's process.
type Replica struct {
	Config config.Config
	t      testing.TB
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned err
	err    error
}

// Config is a worker's configuration for tests, on the Kafka brokers and
// the Redis at redisAddrs: the defaults (a 10-minute rolling window at
// 1e-6, a lag bound of 1h), with topics "in", "out" and "dlq", IDs in the
// field "id", 100,000 IDs per window, small batches, short timeouts and a
// free HTTP address.
func Config(pipeline string, brokers []string, redisAddrs ...string) config.Config {
	c := config.Defaults()
	c.Pipeline, c.KafkaBrokers, c.InputTopic, c.OutputTopic, c.DLQTopic = pipeline, brokers, "in", "out", "dlq"
	c.GroupID, c.RedisAddrs, c.IDField = "dedupe-"+pipeline, redisAddrs, "id"
	c.ExpectedPerWindow, c.BatchSize, c.BatchLinger = 100_000, 100, 20*time.Millisecond
	c.HTTPAddr, c.LogLevel, c.Filter = redisproc.FreeAddr(), "warn", testenv.Filter()
	c.RedisTimeout, c.KafkaTimeout, c.KafkaSessionTimeout, c.ShutdownTimeout = 2*time.Second, 5*time.Second, 2*time.Second, 10*time.Second
	return c
}

// Start validates cfg and runs a worker with it until the test
// ends or Stop. log may be nil: warnings and errors then go to the test's
// log.
func Start(t testing.TB, cfg config.Config, run RunFunc, log *zap.Logger) *Replica {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = testenv.Logger(t, zapcore.WarnLevel)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Replica{Config: cfg, t: t, cancel: cancel, done: make(chan struct{})}
	go func() { r.err = run(ctx, cfg, log); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(cfg.ShutdownTimeout + stopSlack):
			t.Errorf("replica %s did not return within %v of the end of the test", cfg.HTTPAddr, cfg.ShutdownTimeout+stopSlack)
		}
	})
	return r
}

// Stop cancels the replica and returns what its run returned; it fails
// the test if that takes longer than ShutdownTimeout plus 10 s.
func (r *Replica) Stop() error {
	r.t.Helper()
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(r.Config.ShutdownTimeout + stopSlack):
		r.t.Fatalf("replica did not return within %v of being stopped", r.Config.ShutdownTimeout+stopSlack)
		return nil
	}
}

// Fails waits until the replica's run returns an error by itself, and
// returns it; it fails the test if run returns nil, does not return within
// limit, or the replica was ready at any moment meanwhile.
func (r *Replica) Fails(limit time.Duration) error {
	r.t.Helper()
	wasReady := false
	returned := testenv.Until(limit, func() bool {
		select {
		case <-r.done:
			return true
		default:
			wasReady = wasReady || r.Ready()
			return false
		}
	})
	switch {
	case !returned:
		r.t.Fatalf("run did not fail within %v", limit)
	case r.err == nil:
		r.t.Fatal("run returned nil; want an error")
	case wasReady:
		r.t.Errorf("ready before failing with %v", r.err)
	}
	return r.err
}

// Done is closed when the replica's run has returned; Err then says what
// it returned.
func (r *Replica) Done() <-chan struct{} { return r.done }

// Err is what the replica's run returned, once Done is closed.
func (r *Replica) Err() error {
	<-r.done
	return r.err
}

// URL is the address of the replica's HTTP endpoint path.
func (r *Replica) URL(path string) string { return "http://" + r.Config.HTTPAddr + path }

// Get is the HTTP status and body of GET path; the status is 0 and the
// body the error if the request failed.
func (r *Replica) Get(path string) (int, string) { return testenv.Get(r.URL(path)) }

// Status is the HTTP status of GET path, 0 if the request failed.
func (r *Replica) Status(path string) int { return testenv.Status(r.URL(path)) }

// Ready reports whether /readyz answers 200.
func (r *Replica) Ready() bool { return r.Status("/readyz") == http.StatusOK }

// Metrics scrapes the replica's /metrics. A replica that does not answer
// (not listening yet, or stopped) has no series: every Value is 0 and Has
// is false, so a wait goes on and an assertion fails.
func (r *Replica) Metrics() testenv.Metrics {
	m, err := testenv.Scrape(context.Background(), r.URL("/metrics"))
	if err != nil {
		return nil
	}
	return m
}

package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
)

// worker is the worker child: the dedupe worker, built from its
// configuration as the dedupe-worker command builds it (app.New), run
// until it has read o.n messages. Its figures are read from its metrics.
func worker(o options) (result, error) {
	cfg := workerConfig(o, o.brokers, o.redis) // app.New checks it
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	log, err := zc.Build()
	if err != nil {
		return result{}, err
	}
	w, err := app.New(cfg, log)
	if err != nil {
		return result{}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := w.Registry()
	var first, last time.Time
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		first, last = watchEventsIn(ctx, reg, o.n)
		cancel()
	}()
	err = w.Run(ctx)
	cancel()
	<-watched
	if err != nil {
		return result{}, err
	}
	res := result{Events: int(counter(reg, "dedupe_events_in_total")), Forwarded: int(counter(reg, "dedupe_events_forwarded_total")),
		Seconds: last.Sub(first).Seconds()}
	if h := histogram(reg, "dedupe_fetch_to_produce_seconds"); h != nil {
		res.P50, res.P99 = quantilesOf(h)
	}
	return res, nil
}

// workerConfig is the worker's configuration, as DEDUPE_* variables would
// give it: the product's defaults, with the bench's topics, batches, IDs
// and mode, and a filter sized for the distinct IDs of the run.
func workerConfig(o options, brokers, redisAddr string) config.Config {
	c := config.Defaults()
	c.Pipeline, c.GroupID = "bench", "dedupe-bench"
	c.KafkaBrokers, c.RedisAddrs = []string{brokers}, []string{redisAddr}
	c.InputTopic, c.OutputTopic, c.DLQTopic = inTopic, outTopic, dlqTopic
	c.BatchSize, c.BatchLinger = o.batch, o.linger
	c.IDFrom, c.Mode = o.idFrom, o.mode
	if o.idFrom == "json" {
		c.IDField, c.TimeField = o.idField, "ts"
	}
	c.ExpectedPerWindow = int64(float64(o.n)*(1-o.dup)) + 1
	c.HTTPAddr, c.LogLevel = "127.0.0.1:0", "warn"
	return c
}

// progressEvery is how often the worker's input counter is read. A read
// gathers the whole registry, the runtime's and the process's metrics too
// (about 0.4 ms of CPU), so not more often: the run's time is known to
// within it at each end, and the reads add about 0.4% of a core.
const progressEvery = 100 * time.Millisecond

// watchEventsIn reads dedupe_events_in_total until it reaches n, and
// returns when it was first above 0 and when it reached n (zero if ctx
// ended first).
func watchEventsIn(ctx context.Context, reg *prometheus.Registry, n int) (first, last time.Time) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return first, last
		case <-t.C:
		}
		in := counter(reg, "dedupe_events_in_total")
		if in > 0 && first.IsZero() {
			first = time.Now()
		}
		if in >= float64(n) {
			return first, time.Now()
		}
	}
}

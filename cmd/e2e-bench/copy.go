package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/kafkaconn"
	"dedupe-worker/internal/sink"
)

// readerConfig is the copy's reader, with the worker's batch settings.
func readerConfig(o options, group string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers: []string{o.brokers}, GroupID: group, Topic: inTopic, MinBytes: 1, MaxBytes: 16 << 20,
		MaxWait: 500 * time.Millisecond, StartOffset: kafka.FirstOffset, QueueCapacity: o.batch,
		SessionTimeout: 10 * time.Second, HeartbeatInterval: 2 * time.Second,
	}
}

// bareCopy consumes o.n messages and produces each unchanged, with the
// worker's batch, producer and commit settings and nothing else.
func bareCopy(o options) (result, error) {
	ctx := context.Background()
	r := kafka.NewReader(readerConfig(o, "bare-copy"))
	w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: []string{o.brokers}}, Topic: copyTopic, BatchSize: o.batch})
	defer w.Close()
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "latency", Buckets: consumer.LatencyBuckets})
	var first time.Time
	var res result
	for res.Events < o.n {
		var batch []kafka.Message
		var fetched []time.Time
		fctx, cancel := ctx, context.CancelFunc(func() {})
		for len(batch) < o.batch && res.Events+len(batch) < o.n {
			m, err := r.FetchMessage(fctx)
			if errors.Is(err, context.DeadlineExceeded) {
				break
			} else if err != nil {
				cancel()
				return res, err
			}
			now := time.Now()
			if len(batch) == 0 {
				fctx, cancel = context.WithDeadline(ctx, now.Add(o.linger))
			}
			if first.IsZero() {
				first = now
			}
			batch = append(batch, m)
			fetched = append(fetched, now)
		}
		cancel()
		out := make([]kafka.Message, len(batch))
		for i, m := range batch {
			out[i] = kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers, Time: m.Time}
		}
		if err := w.Write(ctx, out); err != nil {
			return res, err
		}
		acked := time.Now()
		for _, f := range fetched {
			hist.Observe(acked.Sub(f).Seconds())
		}
		if err := r.CommitMessages(ctx, batch...); err != nil {
			return res, err
		}
		res.Events += len(batch)
		res.Forwarded += len(out)
		res.Seconds = acked.Sub(first).Seconds()
	}
	r.Close()
	res.P50, res.P99 = quantiles(hist)
	return res, nil
}

// Package sink writes events to a Kafka topic and returns only once every
// in-sync replica has them.
package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"dedupe-worker/config"
	"dedupe-worker/internal/record"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// MaxBatchBytes bounds a produce request per partition, which is one
// record batch: a broker refuses batches above its message.max.bytes
// (1048588 by default), and kafka-go refuses, before sending, a single
// message larger than this.
const MaxBatchBytes = 1_040_000

// Config configures a Writer.
type Config struct {
	Brokers []string
	Topic   string
	// BatchSize is the most messages in one produce request per partition.
	// Default: the pipeline's batch size, config.Defaults().BatchSize.
	BatchSize int
	// Timeout bounds one Write, retries included. Default: the pipeline's
	// Kafka timeout, config.Defaults().KafkaTimeout.
	Timeout time.Duration
	Logger  *zap.Logger
	// TLS, when set, is used for every broker connection.
	TLS *tls.Config
	// SASL, when set, authenticates every broker connection.
	SASL sasl.Mechanism
}

// Writer produces to one topic with acks from all in-sync replicas.
// Messages from one input partition go to one output partition (input
// partition modulo the output's partition count), so their order is kept.
type Writer struct {
	w       *kafka.Writer
	timeout time.Duration
}

// New returns a Writer; it connects on first use.
func New(cfg Config) *Writer {
	d := config.Defaults()
	if cfg.BatchSize == 0 {
		cfg.BatchSize = d.BatchSize
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = d.KafkaTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("topic", cfg.Topic))
	return &Writer{
		timeout: cfg.Timeout,
		w: &kafka.Writer{
			Addr:     kafka.TCP(cfg.Brokers...),
			Topic:    cfg.Topic,
			Balancer: sourcePartition{},
			// The defaults (no acks, a one-second linger) lose data and add a
			// second to every batch.
			RequiredAcks:    kafka.RequireAll,
			BatchSize:       cfg.BatchSize,
			BatchTimeout:    2 * time.Millisecond,
			BatchBytes:      MaxBatchBytes,
			MaxAttempts:     5,
			WriteBackoffMin: 50 * time.Millisecond,
			WriteBackoffMax: time.Second,
			ReadTimeout:     cfg.Timeout,
			WriteTimeout:    cfg.Timeout,
			Transport: &kafka.Transport{
				Dial:        (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
				DialTimeout: cfg.Timeout,
				IdleTimeout: time.Minute,
				TLS:         cfg.TLS,
				SASL:        cfg.SASL,
			},
			Logger:      KafkaLogger(log, zapcore.DebugLevel),
			ErrorLogger: KafkaLogger(log, zapcore.WarnLevel),
		},
	}
}

// Write produces msgs and returns when all are acknowledged, or an error.
// On error some may have been written; writing them all again is safe for
// a consumer that drops replays by SourceHeader.
func (w *Writer) Write(ctx context.Context, msgs []kafka.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	if err := w.w.WriteMessages(ctx, msgs...); err != nil {
		var werr kafka.WriteErrors
		if errors.As(err, &werr) {
			return fmt.Errorf("writing to %s: %d of %d messages failed: %w", w.w.Topic, werr.Count(), len(msgs), distinct(werr))
		}
		return fmt.Errorf("writing %d messages to %s: %w", len(msgs), w.w.Topic, err)
	}
	return nil
}

// Close flushes and closes the connections.
func (w *Writer) Close() error { return w.w.Close() }

// sourcePartition sends a message to the partition of its source modulo
// the partition count; messages without the header go to partition 0.
type sourcePartition struct{}

func (sourcePartition) Balance(msg kafka.Message, partitions ...int) int {
	for _, h := range msg.Headers {
		if h.Key != record.SourceHeader {
			continue
		}
		if s, ok := record.ParseSource(h.Value); ok {
			return partitions[s.Partition%len(partitions)]
		}
	}
	return partitions[0]
}

// distinct joins the different errors of a write once each: a batch
// refused for one reason gives one line, not one per message.
func distinct(werr kafka.WriteErrors) error {
	var errs []error
	seen := map[string]bool{}
	for _, e := range werr {
		if e != nil && !seen[e.Error()] {
			seen[e.Error()] = true
			errs = append(errs, e)
		}
	}
	return errors.Join(errs...)
}

// KafkaLogger logs kafka-go's messages at level to l, or is nil when l
// would drop them: kafka-go then skips formatting them (its writer has a
// debug line for every produce).
func KafkaLogger(l *zap.Logger, level zapcore.Level) kafka.Logger {
	if !l.Core().Enabled(level) {
		return nil
	}
	return kafka.LoggerFunc(func(f string, a ...any) { l.Log(level, fmt.Sprintf(f, a...)) })
}

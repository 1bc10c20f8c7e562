package consumer

import (
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/internal/sink"
)

// newReader is the group member that reads the input. Offsets are
// committed by deliver, synchronously, once per batch; gl logs what
// kafka-go reports.
func (w *Worker) newReader(gl *zap.Logger) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{
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
}

// Package sink writes events to a Kafka topic and returns only once every
// in-sync replica has them, or says which ones the topic refused for their
// content. write.go holds Write and its retries, refused.go what a topic
// can refuse and the errors Write returns.
package sink

import (
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"go.uber.org/zap"

	"dedupe-worker/internal/logs"
	"dedupe-worker/internal/record"
)

// MaxBatchBytes bounds a produce request per partition, which is one
// record batch: a broker refuses batches above its message.max.bytes
// (1048588 by default). Write rejects a message larger than this, as
// kafka-go measures it, without sending it (TooLarge).
const MaxBatchBytes = 1_040_000

// The defaults of Config.
const (
	// DefaultBatchSize is Config.BatchSize's default.
	DefaultBatchSize = 1000
	// DefaultTimeout is Config.Timeout's default.
	DefaultTimeout = 10 * time.Second
)

// Config configures a Writer.
type Config struct {
	Brokers []string
	Topic   string
	// BatchSize is the most messages in one produce request per partition.
	// Default: DefaultBatchSize.
	BatchSize int
	// Timeout bounds one Write, retries included. Default: DefaultTimeout.
	Timeout time.Duration
	Logger  *zap.Logger
	// TLS, when set, is used for every broker connection.
	TLS *tls.Config
	// SASL, when set, authenticates every broker connection.
	SASL sasl.Mechanism
}

// Writer produces to one topic with acks from all in-sync replicas.
// Messages from one input partition go to one output partition (input
// partition modulo the output's partition count), so their order is kept
// (but see Write for retries).
type Writer struct {
	// writer is the kafka-go writer that sends the produce requests.
	writer  *kafka.Writer
	timeout time.Duration
	log     *zap.Logger
	// sampled reports refused messages and the batches split to find
	// them: each distinct line at most once per logs.SampleEvery.
	sampled *zap.Logger
	// mu makes Writes one at a time: finding a refused message relies on
	// a message sent alone being alone in its produce request.
	mu sync.Mutex
}

// New returns a Writer; it connects on first use.
func New(cfg Config) *Writer {
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("topic", cfg.Topic))
	return &Writer{
		timeout: cfg.Timeout,
		log:     log,
		sampled: logs.Sampled(log),
		writer: &kafka.Writer{
			Addr:     kafka.TCP(cfg.Brokers...),
			Topic:    cfg.Topic,
			Balancer: sourcePartition{},
			// The defaults (no acks, a one-second linger) lose data and add a
			// second to every batch.
			RequiredAcks: kafka.RequireAll,
			BatchSize:    cfg.BatchSize,
			BatchTimeout: 2 * time.Millisecond,
			BatchBytes:   MaxBatchBytes,
			// One try per request: Write retries what failed itself. kafka-go
			// retries a batch in the background, uncancelled, and writes the
			// partition's next batches only after it, so its own retries
			// would outlive a Write that gave up, hold up the next one, and
			// could write a copy of what the caller writes again.
			MaxAttempts:  1,
			ReadTimeout:  cfg.Timeout,
			WriteTimeout: cfg.Timeout,
			Transport: &kafka.Transport{
				Dial:        (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
				DialTimeout: cfg.Timeout,
				IdleTimeout: time.Minute,
				TLS:         cfg.TLS,
				SASL:        cfg.SASL,
				// Ask for this topic by name. From a cache of all topics, one
				// the user may not write (nor so describe) is simply missing:
				// reported unknown and retried for ever, instead of refused.
				MetadataTopics: []string{cfg.Topic},
			},
			Logger:      logs.Kafka(log, zap.DebugLevel),
			ErrorLogger: logs.Kafka(log, zap.WarnLevel),
		},
	}
}

// Close flushes and closes the connections. A Write after it fails with
// ErrPermanent.
func (w *Writer) Close() error { return w.writer.Close() }

// Topic is the topic w writes: the worker names it when the broker
// refuses the writes for good (the right its Kafka user lacks).
func (w *Writer) Topic() string { return w.writer.Topic }

// MaxMessageBytes is the largest message Write sends, MaxBatchBytes, as
// kafka-go measures it; Write rejects a larger one (TooLarge).
func (w *Writer) MaxMessageBytes() int { return MaxBatchBytes }

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

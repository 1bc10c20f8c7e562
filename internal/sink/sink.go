// Package sink writes events to a Kafka topic and returns only once every
// in-sync replica has them, or says which ones the topic refused for their
// content. write.go holds Write and its retries, produce.go the produce
// requests of one try, refused.go what a topic can refuse and the errors
// Write returns.
package sink

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/event"
	"dedupe-worker/internal/kafkaconn"
	"dedupe-worker/internal/logs"
)

// MaxBatchBytes bounds a produce request per partition, which is one
// record batch: a broker refuses batches above its message.max.bytes
// (1048588 by default). Write rejects a message larger than this, as
// kafka-go measures it, without sending it (event.TooLarge).
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
	// Kafka is where the brokers are and how to connect to them; its
	// Timeout bounds one Write, retries included, and each request in it.
	// Brokers are required. Default Timeout: DefaultTimeout.
	Kafka kafkaconn.Conn
	Topic string
	// BatchSize is the most messages in one produce request per partition.
	// Default: DefaultBatchSize.
	BatchSize int
	Logger    *zap.Logger
}

// Writer produces to one topic with acks from all in-sync replicas.
// Messages from one input partition go to one output partition (input
// partition modulo the output's partition count), so their order is kept
// (but see Write for retries).
type Writer struct {
	// client sends the metadata and produce requests through transport.
	client    *kafka.Client
	transport *kafka.Transport
	topic     string
	batchSize int
	timeout   time.Duration
	log       *zap.Logger
	// sampled reports refused messages and the batches split to find
	// them: each distinct line at most once per logs.SampleEvery.
	sampled *zap.Logger
	// mu makes Writes one at a time: finding a refused message relies on
	// a message sent alone being alone in its produce request.
	mu sync.Mutex
	// requests counts the produce requests under way, those a Write gave
	// up on included: Close waits for them.
	requests sync.WaitGroup
	// state guards closed and tails.
	state  sync.Mutex
	closed bool
	// metadataGen counts the refreshes of the transport's metadata
	// (refreshMetadata).
	metadataGen atomic.Uint64
	// tails holds, per output partition, a channel closed once the last
	// request sent to it has its answer: the next one waits for it, so a
	// partition's requests go one at a time and in order, also after a
	// Write that gave up on one.
	tails map[int]chan struct{}
}

// New returns a Writer; it connects on first use.
func New(cfg Config) *Writer {
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.Kafka.Timeout == 0 {
		cfg.Kafka.Timeout = DefaultTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("topic", cfg.Topic))
	// The metadata asked for is this topic's alone (kafkaconn.Transport).
	transport := cfg.Kafka.Transport(time.Minute, cfg.Topic)
	return &Writer{
		// The client's Timeout bounds each request, and the broker's wait
		// for the acks of all in-sync replicas within it. Write sends each
		// batch once per call and retries what failed itself.
		client:    cfg.Kafka.Client(transport),
		transport: transport,
		topic:     cfg.Topic,
		batchSize: cfg.BatchSize,
		timeout:   cfg.Kafka.Timeout,
		log:       log,
		sampled:   logs.Sampled(log),
		tails:     map[int]chan struct{}{},
	}
}

// Close waits for the produce requests under way, those a Write gave up
// on included, and closes the connections. A Write after it fails with
// ErrPermanent. It always returns nil.
func (w *Writer) Close() error {
	w.state.Lock()
	w.closed = true
	w.state.Unlock()
	w.requests.Wait()
	w.transport.CloseIdleConnections()
	return nil
}

// Topic is the topic w writes: the worker names it when the broker
// refuses the writes for good (the right its Kafka user lacks).
func (w *Writer) Topic() string { return w.topic }

// MaxMessageBytes is the largest message Write sends, MaxBatchBytes, as
// kafka-go measures it; Write rejects a larger one (event.TooLarge).
func (w *Writer) MaxMessageBytes() int { return MaxBatchBytes }

// partitionOf is the output partition of m among n: that of its source
// modulo n, or 0 for a message without a dedupe-source.
func partitionOf(m *kafka.Message, n int) int {
	for _, h := range m.Headers {
		if h.Key != event.SourceHeader {
			continue
		}
		if p, ok := event.SourcePartition(h.Value); ok {
			return p % n
		}
	}
	return 0
}

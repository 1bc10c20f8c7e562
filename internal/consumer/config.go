package consumer

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"dedupe-worker/internal/kafkaconn"
)

// The defaults and limits of Config: New takes a zero field as its
// default and refuses a value out of its limits.
const (
	// DefaultBatchSize is BatchSize's default; MaxBatchSize its largest
	// value.
	DefaultBatchSize = 1000
	MaxBatchSize     = 10000
	// DefaultBatchLinger is BatchLinger's default, from MinBatchLinger to
	// MaxBatchLinger.
	DefaultBatchLinger = 100 * time.Millisecond
	MinBatchLinger     = time.Millisecond
	MaxBatchLinger     = time.Minute
	// DefaultBatchBytes is BatchBytes's default.
	DefaultBatchBytes = 16 << 20
	// DefaultKafkaTimeout is Kafka.Timeout's default, from MinKafkaTimeout
	// to MaxKafkaTimeout.
	DefaultKafkaTimeout = 10 * time.Second
	MinKafkaTimeout     = 100 * time.Millisecond
	MaxKafkaTimeout     = 5 * time.Minute
	// DefaultSessionTimeout is SessionTimeout's default, from
	// MinSessionTimeout to MaxSessionTimeout.
	DefaultSessionTimeout = 10 * time.Second
	MinSessionTimeout     = 500 * time.Millisecond
	MaxSessionTimeout     = 5 * time.Minute
	// DefaultShutdownTimeout is ShutdownTimeout's default.
	DefaultShutdownTimeout = 30 * time.Second
	// MaxHandoffWait is HandoffWait's largest value.
	MaxHandoffWait = time.Minute
)

// Config configures a Worker. A zero field takes its default.
type Config struct {
	// Kafka is where the brokers are and how to connect to them; its
	// Timeout bounds each Kafka call, from MinKafkaTimeout to
	// MaxKafkaTimeout. Brokers are required. Default Timeout:
	// DefaultKafkaTimeout; default ClientID: kafkaconn.ClientID(GroupID).
	Kafka   kafkaconn.Conn
	Topic   string
	GroupID string

	// BatchSize is the most messages per batch, from 1 to MaxBatchSize.
	// Default: DefaultBatchSize.
	BatchSize int
	// BatchLinger flushes a partial batch this long after its first
	// message, from MinBatchLinger to MaxBatchLinger. Default:
	// DefaultBatchLinger.
	BatchLinger time.Duration
	// BatchBytes ends a batch once its keys, values and headers reach this
	// many bytes, so that large messages do not make huge batches.
	// Default: DefaultBatchBytes (16 MiB).
	BatchBytes int
	// ShutdownTimeout bounds finishing the batch in hand and leaving the
	// group once Run's context is cancelled, from MinShutdownTimeout to
	// MaxShutdownTimeout. Default: DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// SessionTimeout of the consumer group, from MinSessionTimeout to
	// MaxSessionTimeout; the other group timings derive from it
	// (GroupTimingsFor). Default: DefaultSessionTimeout.
	SessionTimeout time.Duration
	// Start is where the group begins when it has no committed offsets.
	// Default: the earliest offset.
	Start Start
	// HandoffWait is how long a batch holding replays another replica
	// decided and has not marked delivered (it may be delivering them
	// still, having had their partition until the last rebalance) waits
	// for the marks before forwarding them again; a shutdown ends the wait.
	// Zero (unlike the other fields): no wait, from 0 to MaxHandoffWait.
	HandoffWait time.Duration
	// FailOpenAfter, when not zero, forwards valid events unchecked (with
	// event.VerdictHeader event.Unchecked, counted) once the filter has
	// failed for this long, until it answers again: nothing is lost and
	// copies pass; from MinFailOpenAfter to MaxFailOpenAfter. Zero: the
	// worker waits, not ready, as long as the filter fails.
	FailOpenAfter time.Duration
	// DeadLetterLate sends events the filter finds Late or Future to the
	// dead-letter topic (reasons late and future) instead of forwarding
	// them undeduplicated with the UndeduplicatedHeader.
	DeadLetterLate bool
	// Shadow forwards every valid event, duplicates too, each deduplicated
	// one with the event.VerdictHeader, and events beyond the lag bound
	// undeduplicated whatever DeadLetterLate says; the decisions and what
	// the filter records are those of drop mode.
	Shadow bool
	// Now is the clock of the event-time lag, the filter's. Default: time.Now.
	Now func() time.Time

	// Duplicates, when set, receives every copy dropped as a duplicate
	// (drop mode), unchanged with its source and event.VerdictHeader
	// duplicate, acknowledged before the batch is committed. Default:
	// none, copies are dropped.
	Duplicates Producer

	// Extractor reads each message's ID and event time. Required.
	Extractor *Extractor
	// Logger, Metrics: default, none.
	Logger  *zap.Logger
	Metrics *Metrics
}

// setDefaults fills what is not set with its default.
func (c *Config) setDefaults() {
	orDefault(&c.BatchSize, DefaultBatchSize)
	orDefault(&c.BatchLinger, DefaultBatchLinger)
	orDefault(&c.BatchBytes, DefaultBatchBytes)
	orDefault(&c.Kafka.Timeout, DefaultKafkaTimeout)
	orDefault(&c.Kafka.ClientID, kafkaconn.ClientID(c.GroupID))
	orDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	orDefault(&c.SessionTimeout, DefaultSessionTimeout)
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

// orDefault sets *v to def when *v is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// validate names the first field out of its limits.
func (c *Config) validate() error {
	switch {
	case c.Extractor == nil:
		return fmt.Errorf("consumer: no extractor")
	case len(c.Kafka.Brokers) == 0 || c.Topic == "" || c.GroupID == "":
		return fmt.Errorf("consumer: brokers, topic and group are required")
	case c.BatchBytes < 1:
		return fmt.Errorf("consumer: batch bytes %d: want 1 or more", c.BatchBytes)
	}
	for _, err := range []error{CheckBatchSize(c.BatchSize), CheckBatchLinger(c.BatchLinger), CheckKafkaTimeout(c.Kafka.Timeout),
		CheckSessionTimeout(c.SessionTimeout), CheckShutdownTimeout(c.ShutdownTimeout), CheckFailOpenAfter(c.FailOpenAfter), CheckHandoffWait(c.HandoffWait)} {
		if err != nil {
			return fmt.Errorf("consumer: %w", err)
		}
	}
	return nil
}

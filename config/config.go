// Package config loads a pipeline's settings from DEDUPE_* environment
// variables: one set per pipeline, one Deployment per set. It is the one
// place that knows the variables' names: it maps them onto the settings of
// the libraries (the worker, the producer, the engine), which own their
// defaults and limits, and names the variable at fault when a value is out
// of them. config.go holds the variables and their defaults, load.go
// their loading, validate.go their checks (each limit through the check of
// the library that owns it), modes.go the settings written as words read
// into the values the libraries take, ids.go the ID and the event time,
// plan.go the filter's sizing, security.go TLS and SASL.
package config

import (
	"errors"
	"fmt"
	"time"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
)

// Prefix starts every variable name.
const Prefix = "DEDUPE"

// Config is everything a worker needs. The variable of each field is
// DEDUPE_ and its envconfig name. A setting the application owns has its
// default in a struct tag; one a library owns has no tag and takes the
// library's default (Defaults).
type Config struct {
	// Pipeline names the pipeline: Redis keys, the default consumer group
	// and metric labels derive from it. Required.
	Pipeline string `envconfig:"PIPELINE" required:"true"`
	// KafkaBrokers are host:port, comma-separated. Required.
	KafkaBrokers []string `envconfig:"KAFKA_BROKERS" required:"true"`
	// InputTopic is read. Required.
	InputTopic string `envconfig:"INPUT_TOPIC" required:"true"`
	// OutputTopic receives first-seen events. Required.
	OutputTopic string `envconfig:"OUTPUT_TOPIC" required:"true"`
	// DLQTopic receives input that cannot be deduplicated. Required.
	DLQTopic string `envconfig:"DLQ_TOPIC" required:"true"`
	// DuplicatesTopic, when set, receives every copy dropped as a
	// duplicate, unchanged with dedupe-source and dedupe-verdict:
	// duplicate. Default: empty, copies are dropped.
	DuplicatesTopic string `envconfig:"DUPLICATES_TOPIC"`
	// GroupID is the consumer group. Default: dedupe-<pipeline>.
	GroupID string `envconfig:"GROUP_ID"`
	// RedisAddrs are host:port, comma-separated: one is a standalone server,
	// several are seeds of a Redis Cluster. Required.
	RedisAddrs []string `envconfig:"REDIS_ADDRS" required:"true"`
	// IDFrom is where the element ID comes from: json (the JSON fields
	// IDField names), key (the message key), header (the header IDHeader
	// names) or value (a 128-bit hash of the whole value, which catches
	// byte-identical copies). With key, header and value the value is never
	// parsed, so it may be Avro, Protobuf or anything else. Default: json.
	IDFrom string `envconfig:"ID_FROM" default:"json"`
	// IDField, with IDFrom json, is the JSON field path of the ID (click_id,
	// meta.id), or up to 8 paths separated by commas for a composite ID
	// (tenant_id,meta.click_id). The values "key" and "header:NAME" mean
	// IDFrom key and header with IDHeader NAME, as they did before IDFrom.
	// Required with json; not set otherwise.
	IDField string `envconfig:"ID_FIELD"`
	// IDHeader is the header holding the ID, with IDFrom header. Required
	// with header; not set otherwise.
	IDHeader string `envconfig:"ID_HEADER"`
	// TimeField is a JSON field path holding the event time (Unix seconds,
	// Unix milliseconds or RFC 3339), with IDFrom json only. Default:
	// empty, the message timestamp.
	TimeField string `envconfig:"TIME_FIELD"`
	// TimeHeader is a header holding the event time, in the forms of
	// TimeField; not with TimeField. Default: empty, the message timestamp.
	TimeHeader string `envconfig:"TIME_HEADER"`
	// Mode is drop (duplicates are dropped) or shadow (every valid event is
	// forwarded, each deduplicated one with the dedupe-verdict header,
	// first or duplicate, saying what drop would have done, and events
	// beyond the lag bound undeduplicated whatever LatePolicy says). Both
	// decide and record alike, in the same keys, so a pipeline switched
	// from shadow to drop keeps its windows. Default: drop.
	Mode string `envconfig:"MODE" default:"drop"`
	// Window is the deduplication window, a Go duration, whole seconds up
	// to bloom.MaxWindowLength (744h). Default: 10m.
	Window time.Duration `envconfig:"WINDOW" default:"10m"`
	// WindowMode is rolling or fixed (bloom.ParseMode). Default: rolling.
	WindowMode string `envconfig:"WINDOW_MODE" default:"rolling"`
	// MaxLag is the lag bound: events processed up to this long after their
	// event time (a replica behind, every replica down for a while) are
	// deduplicated as if processed live. Filter keys and decision records
	// live this much longer, which costs memory: one more window's filter
	// per window length of MaxLag. Default: 1h; up to 744h.
	MaxLag time.Duration `envconfig:"MAX_LAG" default:"1h"`
	// LatePolicy is what becomes of an event beyond the bound (decided
	// more than MaxLag after the end of its window, or stamped so far
	// ahead of the clock that its window starts after the next window's
	// preallocation lead): forward
	// (undeduplicated, with the dedupe-undeduplicated header) or
	// dead-letter (reason late or future). Default: forward.
	LatePolicy string `envconfig:"LATE_POLICY" default:"forward"`
	// StartOffset is where a new consumer group (one without committed
	// offsets) starts: earliest, latest, an RFC 3339 time, or a duration
	// back from the start of the worker (1h). Default: earliest.
	StartOffset string `envconfig:"START_OFFSET" default:"earliest"`
	// ExpectedPerWindow is the number of distinct IDs per window the filter
	// is sized for. Default: 1000000.
	ExpectedPerWindow int64 `envconfig:"EXPECTED_PER_WINDOW" default:"1000000"`
	// FalsePositiveRate is the chance that a new event is taken for a
	// duplicate (and dropped), at any load up to MaxGrowth times the
	// expected. Default: 1e-6.
	FalsePositiveRate float64 `envconfig:"FALSE_POSITIVE_RATE" default:"1e-6"`
	// Filter is what the windows' filters are made of: bloom (Bloom
	// filters in Redis bitmaps) or fingerprint (tables of fingerprints:
	// less Redis CPU and memory per ID; see the engine's package doc).
	// Default: bloom.
	Filter string `envconfig:"FILTER" default:"bloom"`
	// MaxGrowth is how far a window may grow past ExpectedPerWindow, as a
	// factor: past it the window only tests new IDs. 1 turns growth off.
	// Default: 64.
	MaxGrowth float64 `envconfig:"MAX_GROWTH" default:"64"`
	// MemoryFactor is the most memory per ID the filter's layout may take,
	// as a multiple of a classic Bloom filter's at the rate of the
	// window's first stage: within it the planner takes the fewest words,
	// then the fewest shards (the least Redis work per ID).
	// Default: bloom.DefaultMemoryFactor, 1.5; from 1 to
	// bloom.MaxMemoryFactor, 4.
	MemoryFactor float64 `envconfig:"MEMORY_FACTOR"`
	// Layout, words x bits per word (4x4), replaces the planner's choice:
	// the layout an earlier version chose keeps its keys. Bloom filters
	// only. Default: empty, the planner's choice.
	Layout string `envconfig:"LAYOUT"`
	// Shards is the least number of keys per window; more spread a window
	// over the masters of a Redis Cluster. Default: 1.
	Shards int `envconfig:"SHARDS" default:"1"`
	// BatchSize is the most events per test-and-set, up to
	// consumer.MaxBatchSize. Default: consumer.DefaultBatchSize, 1000.
	BatchSize int `envconfig:"BATCH_SIZE"`
	// BatchLinger flushes a partial batch after this long. Default:
	// consumer.DefaultBatchLinger, 100ms.
	BatchLinger time.Duration `envconfig:"BATCH_LINGER"`
	// HTTPAddr serves /metrics, /healthz and /readyz. Default: :8080.
	HTTPAddr string `envconfig:"HTTP_ADDR" default:":8080"`
	// LogLevel is debug, info, warn or error. Default: info.
	LogLevel string `envconfig:"LOG_LEVEL" default:"info"`
	// RedisTimeout bounds each Redis call, from bloom.MinCallTimeout to
	// bloom.MaxCallTimeout (10ms to 5m). Default: the engine's,
	// bloom.DefaultCallTimeout (5s).
	RedisTimeout time.Duration `envconfig:"REDIS_TIMEOUT"`
	// KafkaTimeout bounds each Kafka call, and each write to the output
	// and dead-letter topics. Default: consumer.DefaultKafkaTimeout, 10s.
	KafkaTimeout time.Duration `envconfig:"KAFKA_TIMEOUT"`
	// KafkaSessionTimeout is the consumer group session timeout: how long
	// a replica that died holds its partitions; the heartbeat interval (a
	// tenth of it) and the rebalance timeout (a quarter, at least 1 s)
	// derive from it (consumer.GroupTimingsFor). Default:
	// consumer.DefaultSessionTimeout, 10s.
	KafkaSessionTimeout time.Duration `envconfig:"KAFKA_SESSION_TIMEOUT"`
	// ShutdownTimeout bounds the shutdown after SIGTERM, from
	// consumer.MinShutdownTimeout to consumer.MaxShutdownTimeout (1s to
	// 10m). Default: 30s.
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s"`
	// FailOpenAfter, when set, forwards valid events unchecked (with
	// dedupe-verdict: unchecked) once the filter has failed for this long,
	// until Redis answers again: nothing is lost, copies pass. From
	// consumer.MinFailOpenAfter to consumer.MaxFailOpenAfter (1s to 24h).
	// Default: empty, off: the worker waits, not ready, while Redis fails.
	FailOpenAfter time.Duration `envconfig:"FAIL_OPEN_AFTER"`
	// HandoffWait is how long a replica that takes over a partition waits
	// for the batches the previous owner decided to be marked delivered
	// before it forwards them again (consumer.Config.HandoffWait); 0
	// forwards them at once. Default: 2s.
	HandoffWait time.Duration `envconfig:"HANDOFF_WAIT" default:"2s"`

	// KafkaTLS connects to every broker over TLS. A CA or client
	// certificate file turns it on as well. Default: false.
	KafkaTLS bool `envconfig:"KAFKA_TLS" default:"false"`
	// KafkaTLSCAFile is a PEM file of the CAs the brokers' certificates are
	// checked against. Default: empty, the system's CAs.
	KafkaTLSCAFile string `envconfig:"KAFKA_TLS_CA_FILE"`
	// KafkaTLSCertFile and KafkaTLSKeyFile are a client certificate and its
	// key (PEM), for brokers that ask for one: both or neither.
	KafkaTLSCertFile string `envconfig:"KAFKA_TLS_CERT_FILE"`
	KafkaTLSKeyFile  string `envconfig:"KAFKA_TLS_KEY_FILE"`
	// KafkaSASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. Default:
	// empty, no SASL.
	KafkaSASLMechanism string `envconfig:"KAFKA_SASL_MECHANISM"`
	// KafkaSASLUsername and KafkaSASLPassword: the SASL credentials,
	// required with a mechanism.
	KafkaSASLUsername string `envconfig:"KAFKA_SASL_USERNAME"`
	KafkaSASLPassword Secret `envconfig:"KAFKA_SASL_PASSWORD"`

	// RedisUsername is the Redis ACL user. Default: empty, the default
	// user (a password alone is then AUTH <password>).
	RedisUsername string `envconfig:"REDIS_USERNAME"`
	// RedisPassword is the password of RedisUsername, or of the default
	// user. Default: empty, no AUTH.
	RedisPassword Secret `envconfig:"REDIS_PASSWORD"`
	// RedisTLS connects to every Redis node over TLS. A CA or client
	// certificate file turns it on as well. Default: false.
	RedisTLS bool `envconfig:"REDIS_TLS" default:"false"`
	// RedisTLSCAFile is a PEM file of the CAs Redis certificates are
	// checked against. Default: empty, the system's CAs.
	RedisTLSCAFile string `envconfig:"REDIS_TLS_CA_FILE"`
	// RedisTLSCertFile and RedisTLSKeyFile are a client certificate and its
	// key (PEM), for servers started with tls-auth-clients: both or neither.
	RedisTLSCertFile string `envconfig:"REDIS_TLS_CERT_FILE"`
	RedisTLSKeyFile  string `envconfig:"REDIS_TLS_KEY_FILE"`
	// RedisMinReplicas: when above zero, each test-and-set must reach this
	// many replicas of its master (Redis WAIT) before its verdicts are
	// used; up to bloom.MaxMinReplicas (5). Default: 0.
	RedisMinReplicas int `envconfig:"REDIS_MIN_REPLICAS" default:"0"`
}

// Secret is a configuration value that is never shown: fmt, zap and JSON
// print "[redacted]" in its place ("" when unset). string(s) is the value.
type Secret string

const redacted = "[redacted]"

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString is for %#v.
func (s Secret) GoString() string { return fmt.Sprintf("config.Secret(%q)", s.String()) }

// MarshalText is for encoders (JSON, zap's reflection).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ErrInvalid wraps every configuration error.
var ErrInvalid = errors.New("invalid configuration")

// Defaults is the configuration with every variable at its default and
// the required ones empty: the struct tags above for the application's
// own settings, the libraries' constants for theirs. Each is written in
// one place; Load, the plan command, the demo and the tests start from
// here.
func Defaults() Config {
	c := tagDefaults()
	c.BatchSize = consumer.DefaultBatchSize
	c.BatchLinger = consumer.DefaultBatchLinger
	c.KafkaTimeout = consumer.DefaultKafkaTimeout
	c.KafkaSessionTimeout = consumer.DefaultSessionTimeout
	c.RedisTimeout = bloom.DefaultCallTimeout
	c.MemoryFactor = bloom.DefaultMemoryFactor
	return c
}

package config

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
)

var (
	topicPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)
)

// VarError is a variable out of range; it wraps ErrInvalid.
type VarError struct {
	Var string // without the prefix: WINDOW
	Msg string
}

func (e *VarError) Error() string {
	return fmt.Sprintf("%v: %s_%s: %s", ErrInvalid, Prefix, e.Var, e.Msg)
}

func (e *VarError) Unwrap() error { return ErrInvalid }

func bad(name, format string, args ...any) error {
	return &VarError{Var: name, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks every field and names the first variable out of range.
func (c Config) Validate() error {
	switch {
	case !bloom.NamePattern.MatchString(c.Pipeline):
		return bad("PIPELINE", "%q: want 1 to 100 letters, digits, '.', '_' or '-'", c.Pipeline)
	case len(c.KafkaBrokers) == 0 || hasEmpty(c.KafkaBrokers):
		return bad("KAFKA_BROKERS", "want host:port[,host:port...]")
	case !topicPattern.MatchString(c.InputTopic):
		return bad("INPUT_TOPIC", "%q is not a Kafka topic name", c.InputTopic)
	case !topicPattern.MatchString(c.OutputTopic):
		return bad("OUTPUT_TOPIC", "%q is not a Kafka topic name", c.OutputTopic)
	case !topicPattern.MatchString(c.DLQTopic):
		return bad("DLQ_TOPIC", "%q is not a Kafka topic name", c.DLQTopic)
	case c.OutputTopic == c.InputTopic || c.DLQTopic == c.InputTopic:
		return bad("OUTPUT_TOPIC", "output and dead-letter topics must differ from the input topic %q", c.InputTopic)
	case c.DuplicatesTopic != "" && !topicPattern.MatchString(c.DuplicatesTopic):
		return bad("DUPLICATES_TOPIC", "%q is not a Kafka topic name", c.DuplicatesTopic)
	case c.DuplicatesTopic != "" && (c.DuplicatesTopic == c.InputTopic || c.DuplicatesTopic == c.OutputTopic || c.DuplicatesTopic == c.DLQTopic):
		return bad("DUPLICATES_TOPIC", "%q: want a topic of its own, not the input, output or dead-letter topic", c.DuplicatesTopic)
	case c.GroupID == "" || len(c.GroupID) > 255:
		return bad("GROUP_ID", "want 1 to 255 characters")
	case len(c.RedisAddrs) == 0 || hasEmpty(c.RedisAddrs):
		return bad("REDIS_ADDRS", "want host:port[,host:port...]")
	case c.Window < time.Second || c.Window%time.Second != 0 || c.Window > bloom.MaxWindowLength:
		return bad("WINDOW", "%v: want whole seconds from 1s to %s", c.Window, hours(bloom.MaxWindowLength))
	case c.WindowMode != "rolling" && c.WindowMode != "fixed":
		return bad("WINDOW_MODE", "%q: want rolling or fixed", c.WindowMode)
	case c.MaxLag < 0 || c.MaxLag%time.Second != 0 || c.MaxLag > bloom.MaxLagBound:
		return bad("MAX_LAG", "%v: want whole seconds from 0 to %s", c.MaxLag, hours(bloom.MaxLagBound))
	case c.LatePolicy != LateForward && c.LatePolicy != LateDeadLetter:
		return bad("LATE_POLICY", "%q: want %s or %s", c.LatePolicy, LateForward, LateDeadLetter)
	case c.ExpectedPerWindow < 1 || c.ExpectedPerWindow > bloom.MaxElements:
		return bad("EXPECTED_PER_WINDOW", "%d: want 1 to %g", c.ExpectedPerWindow, float64(bloom.MaxElements))
	case !(c.FalsePositiveRate >= bloom.MinFPR && c.FalsePositiveRate < 1):
		return bad("FALSE_POSITIVE_RATE", "%g: want at least %g and less than 1", c.FalsePositiveRate, bloom.MinFPR)
	case !(c.MaxGrowth >= 1 && c.MaxGrowth <= bloom.MaxGrowthFactor):
		return bad("MAX_GROWTH", "%g: want 1 (no growth) to %d", c.MaxGrowth, bloom.MaxGrowthFactor)
	case !(c.MemoryFactor >= 1 && c.MemoryFactor <= bloom.MaxMemoryFactor):
		return bad("MEMORY_FACTOR", "%g: want 1 to %d", c.MemoryFactor, bloom.MaxMemoryFactor)
	case c.Shards < 1 || c.Shards > bloom.MaxShards:
		return bad("SHARDS", "%d: want 1 to %d", c.Shards, bloom.MaxShards)
	case c.BatchSize < 1 || c.BatchSize > consumer.MaxBatchSize:
		return bad("BATCH_SIZE", "%d: want 1 to %d", c.BatchSize, consumer.MaxBatchSize)
	case c.BatchLinger < consumer.MinBatchLinger || c.BatchLinger > consumer.MaxBatchLinger:
		return bad("BATCH_LINGER", "%v: want %s to %s", c.BatchLinger, shortDuration(consumer.MinBatchLinger), shortDuration(consumer.MaxBatchLinger))
	case c.HTTPAddr == "":
		return bad("HTTP_ADDR", "want host:port or :port")
	case c.LogLevel != "debug" && c.LogLevel != "info" && c.LogLevel != "warn" && c.LogLevel != "error":
		return bad("LOG_LEVEL", "%q: want debug, info, warn or error", c.LogLevel)
	case c.RedisTimeout < 10*time.Millisecond || c.RedisTimeout > 5*time.Minute:
		return bad("REDIS_TIMEOUT", "%v: want 10ms to 5m", c.RedisTimeout)
	case c.KafkaTimeout < consumer.MinKafkaTimeout || c.KafkaTimeout > consumer.MaxKafkaTimeout:
		return bad("KAFKA_TIMEOUT", "%v: want %s to %s", c.KafkaTimeout, shortDuration(consumer.MinKafkaTimeout), shortDuration(consumer.MaxKafkaTimeout))
	case c.KafkaSessionTimeout < consumer.MinSessionTimeout || c.KafkaSessionTimeout > consumer.MaxSessionTimeout:
		return bad("KAFKA_SESSION_TIMEOUT", "%v: want %s to %s", c.KafkaSessionTimeout, shortDuration(consumer.MinSessionTimeout),
			shortDuration(consumer.MaxSessionTimeout))
	case c.ShutdownTimeout < time.Second || c.ShutdownTimeout > 10*time.Minute:
		return bad("SHUTDOWN_TIMEOUT", "%v: want 1s to 10m", c.ShutdownTimeout)
	case c.FailOpenAfter != 0 && (c.FailOpenAfter < time.Second || c.FailOpenAfter > 24*time.Hour):
		return bad("FAIL_OPEN_AFTER", "%v: want empty (off) or 1s to 24h", c.FailOpenAfter)
	case c.HandoffWait < 0 || c.HandoffWait > consumer.MaxHandoffWait:
		return bad("HANDOFF_WAIT", "%v: want 0 to %v", c.HandoffWait, consumer.MaxHandoffWait)
	case c.RedisMinReplicas < 0 || c.RedisMinReplicas > 5:
		return bad("REDIS_MIN_REPLICAS", "%d: want 0 to 5", c.RedisMinReplicas)
	case c.RedisUsername != "" && c.RedisPassword == "":
		return bad("REDIS_PASSWORD", "required with DEDUPE_REDIS_USERNAME")
	}
	if _, err := c.KafkaSASL(); err != nil {
		return err
	}
	if _, err := c.KafkaTLSConfig(); err != nil {
		return err
	}
	if _, err := c.RedisTLSConfig(); err != nil {
		return err
	}
	if _, err := ParseStartOffset(c.StartOffset); err != nil {
		return bad("START_OFFSET", "%v", err)
	}
	src, err := c.IDSource()
	if err != nil {
		return err
	}
	switch {
	case c.TimeField != "" && c.TimeHeader != "":
		return bad("TIME_FIELD", "set with %s_TIME_HEADER; the event time comes from one of them", Prefix)
	case c.TimeField != "" && src.Kind != consumer.JSONID:
		return bad("TIME_FIELD", "reads the JSON value, which %s_ID_FROM=%s never parses; use %s_TIME_HEADER or the message timestamp", Prefix, src.Kind, Prefix)
	case c.TimeField != "":
		if _, err := consumer.ParsePath(c.TimeField); err != nil {
			return bad("TIME_FIELD", "%v", err)
		}
	}
	if c.TimeHeader != "" {
		if err := consumer.CheckHeaderName(c.TimeHeader); err != nil {
			return bad("TIME_HEADER", "%v", err)
		}
	}
	if c.Mode != ModeDrop && c.Mode != ModeShadow {
		return bad("MODE", "%q: want %s or %s", c.Mode, ModeDrop, ModeShadow)
	}
	if _, err := c.PlanOptions(); err != nil {
		return err
	}
	return nil
}

// PlanOptions are the options of the filter's plan (bloom.NewPlan): the
// kind, the shards, the growth cap, the memory factor and the layout, if
// set.
func (c Config) PlanOptions() (bloom.PlanOptions, error) {
	opt := bloom.PlanOptions{MinShards: c.Shards, MaxGrowth: c.MaxGrowth, MemoryFactor: c.MemoryFactor}
	kind, err := bloom.ParseKind(c.Filter)
	if err != nil {
		return opt, bad("FILTER", "%q: want bloom or fingerprint", c.Filter)
	}
	opt.Kind = kind
	if c.Layout != "" && kind != bloom.KindBloom {
		return opt, bad("LAYOUT", "%q: a layout of words and bits is for DEDUPE_FILTER=bloom", c.Layout)
	}
	if c.Layout != "" {
		l, err := bloom.ParseLayout(c.Layout)
		if err != nil {
			return opt, bad("LAYOUT", "%v", err)
		}
		opt.Layout = l
	}
	return opt, nil
}

func hasEmpty(xs []string) bool {
	for _, x := range xs {
		if strings.TrimSpace(x) == "" {
			return true
		}
	}
	return false
}

// shortDuration is d as the variables write it: 1m rather than 1m0s, 1h
// rather than 1h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// hours prints a whole number of hours as 744h, not 744h0m0s.
func hours(d time.Duration) string { return fmt.Sprintf("%dh", d/time.Hour) }

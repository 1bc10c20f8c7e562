package config

import (
	"fmt"
	"regexp"
	"strings"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
)

// topicPattern is what Kafka takes as a topic name.
var topicPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

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

// check is a variable (without the prefix) and what the check of its
// value by the library that owns its limits said.
type check struct {
	name string
	err  error
}

// firstBad is the *VarError of the first check that failed: the variable,
// and the library's words for its value and limits.
func firstBad(checks ...check) error {
	for _, c := range checks {
		if c.err != nil {
			return bad(c.name, "%v", c.err)
		}
	}
	return nil
}

// Validate checks every field and names the first variable out of range.
// A limit a library owns is checked by that library's check.
func (c Config) Validate() error {
	for _, validate := range []func() error{c.validateNames, c.validateServers, c.ValidateSizing, c.validateEvents, c.validateWorker} {
		if err := validate(); err != nil {
			return err
		}
	}
	return nil
}

// validateNames checks the pipeline's name, its topics and its group.
func (c Config) validateNames() error {
	switch {
	case !bloom.NamePattern.MatchString(c.Pipeline):
		return bad("PIPELINE", "%q: want 1 to 100 letters, digits, '.', '_' or '-'", c.Pipeline)
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
	}
	return nil
}

// validateServers checks how Kafka and Redis are reached: addresses,
// time-outs, replicas, logins and TLS.
func (c Config) validateServers() error {
	switch {
	case len(c.KafkaBrokers) == 0 || hasEmpty(c.KafkaBrokers):
		return bad("KAFKA_BROKERS", "want host:port[,host:port...]")
	case len(c.RedisAddrs) == 0 || hasEmpty(c.RedisAddrs):
		return bad("REDIS_ADDRS", "want host:port[,host:port...]")
	case c.RedisUsername != "" && c.RedisPassword == "":
		return bad("REDIS_PASSWORD", "required with DEDUPE_REDIS_USERNAME")
	}
	if err := firstBad(check{"KAFKA_TIMEOUT", consumer.CheckKafkaTimeout(c.KafkaTimeout)},
		check{"KAFKA_SESSION_TIMEOUT", consumer.CheckSessionTimeout(c.KafkaSessionTimeout)},
		check{"REDIS_MIN_REPLICAS", bloom.CheckMinReplicas(c.RedisMinReplicas)}); err != nil {
		return err
	}
	if _, err := c.KafkaSASL(); err != nil {
		return err
	}
	if _, err := c.KafkaTLSConfig(); err != nil {
		return err
	}
	_, err := c.RedisTLSConfig()
	return err
}

// ValidateSizing checks the settings the filter is sized from, those of
// dedupe-worker plan: the window, the expected IDs, the rate, the growth,
// the memory factor, the shards, the filter kind and layout, and the
// Redis time-out (which the preallocation lead counts), by the engine's
// checks.
func (c Config) ValidateSizing() error {
	if _, err := c.FilterWindow(); err != nil {
		return err
	}
	if err := firstBad(check{"EXPECTED_PER_WINDOW", bloom.CheckElements(c.ExpectedPerWindow)},
		check{"FALSE_POSITIVE_RATE", bloom.CheckFPR(c.FalsePositiveRate)},
		check{"MAX_GROWTH", bloom.CheckGrowth(c.MaxGrowth)},
		check{"MEMORY_FACTOR", bloom.CheckMemoryFactor(c.MemoryFactor)},
		check{"SHARDS", bloom.CheckShards(c.Shards)},
		check{"REDIS_TIMEOUT", bloom.CheckCallTimeout(c.RedisTimeout)}); err != nil {
		return err
	}
	_, err := c.PlanOptions()
	return err
}

// validateEvents checks how events are read and routed: the ID, the event
// time and the modes.
func (c Config) validateEvents() error {
	if _, err := c.Extractor(); err != nil {
		return err
	}
	_, err := c.Modes()
	return err
}

// validateWorker checks the worker's batches, time-outs and endpoints.
func (c Config) validateWorker() error {
	if err := firstBad(check{"BATCH_SIZE", consumer.CheckBatchSize(c.BatchSize)},
		check{"BATCH_LINGER", consumer.CheckBatchLinger(c.BatchLinger)},
		check{"SHUTDOWN_TIMEOUT", consumer.CheckShutdownTimeout(c.ShutdownTimeout)},
		check{"FAIL_OPEN_AFTER", consumer.CheckFailOpenAfter(c.FailOpenAfter)},
		check{"HANDOFF_WAIT", consumer.CheckHandoffWait(c.HandoffWait)}); err != nil {
		return err
	}
	switch {
	case c.HTTPAddr == "":
		return bad("HTTP_ADDR", "want host:port or :port")
	case c.LogLevel != "debug" && c.LogLevel != "info" && c.LogLevel != "warn" && c.LogLevel != "error":
		return bad("LOG_LEVEL", "%q: want debug, info, warn or error", c.LogLevel)
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

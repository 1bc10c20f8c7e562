package consumer

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/kafkaconn"
	"dedupe-worker/internal/sink"
)

// The producer's writer keeps the contract the worker writes through.
var (
	_ Producer     = (*sink.Writer)(nil)
	_ WriteFailure = (*sink.WriteError)(nil)
)

// validConfig is a Config New takes.
func validConfig(t *testing.T) Config {
	t.Helper()
	ex, err := NewExtractor(IDSource{Kind: KeyID}, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return Config{Kafka: kafkaconn.Conn{Brokers: []string{"127.0.0.1:9"}}, Topic: "in", GroupID: "g", Extractor: ex}
}

// Zero fields take the defaults, which are within the limits; a value out
// of them is refused, naming the field.
func TestConfigDefaultsAndLimits(t *testing.T) {
	c := validConfig(t)
	c.setDefaults()
	if err := c.validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	if c.BatchSize != DefaultBatchSize || c.BatchLinger != DefaultBatchLinger || c.BatchBytes != DefaultBatchBytes ||
		c.Kafka.Timeout != DefaultKafkaTimeout || c.SessionTimeout != DefaultSessionTimeout || c.ShutdownTimeout != DefaultShutdownTimeout {
		t.Errorf("defaults: %+v", c)
	}
	for _, tc := range []struct {
		says string
		set  func(*Config)
	}{
		{"batch size", func(c *Config) { c.BatchSize = MaxBatchSize + 1 }},
		{"batch size", func(c *Config) { c.BatchSize = -1 }},
		{"batch linger", func(c *Config) { c.BatchLinger = MinBatchLinger - 1 }},
		{"batch linger", func(c *Config) { c.BatchLinger = MaxBatchLinger + 1 }},
		{"batch bytes", func(c *Config) { c.BatchBytes = -1 }},
		{"Kafka timeout", func(c *Config) { c.Kafka.Timeout = MinKafkaTimeout - 1 }},
		{"Kafka timeout", func(c *Config) { c.Kafka.Timeout = MaxKafkaTimeout + 1 }},
		{"session timeout", func(c *Config) { c.SessionTimeout = MinSessionTimeout - 1 }},
		{"session timeout", func(c *Config) { c.SessionTimeout = MaxSessionTimeout + 1 }},
		{"shutdown timeout", func(c *Config) { c.ShutdownTimeout = -time.Second }},
		{"extractor", func(c *Config) { c.Extractor = nil }},
		{"required", func(c *Config) { c.GroupID = "" }},
	} {
		c := validConfig(t)
		tc.set(&c)
		out, dlq := newWriters()
		if _, err := New(c, nil, out, dlq); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s out of its limits: %v", tc.says, err)
		}
	}
	if _, err := New(validConfig(t), nil, nil, nil); err == nil || !strings.Contains(err.Error(), "producers") {
		t.Errorf("no producers: %v", err)
	}
	// The limits themselves are taken.
	c = validConfig(t)
	c.BatchSize, c.BatchLinger, c.Kafka.Timeout, c.SessionTimeout = MaxBatchSize, MinBatchLinger, MaxKafkaTimeout, MinSessionTimeout
	out, dlq := newWriters()
	if _, err := New(c, nil, out, dlq); err != nil {
		t.Errorf("the limits: %v", err)
	}
}

// newWriters are producers that never connect: New only asks their limit.
func newWriters() (out, dlq *sink.Writer) {
	return sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: []string{"127.0.0.1:9"}}, Topic: "out"}), sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: []string{"127.0.0.1:9"}}, Topic: "dlq"})
}

// Input larger than the producers take, less room for the worker's
// headers, is dead-lettered by decide; the limit comes from the producers.
func TestLimitFromTheProducers(t *testing.T) {
	out, dlq := newWriters()
	w, err := New(validConfig(t), nil, out, dlq)
	if err != nil {
		t.Fatal(err)
	}
	if want := sink.MaxBatchBytes - headerAllowance; w.maxMessageBytes != want {
		t.Errorf("largest input forwarded: %d bytes, want %d", w.maxMessageBytes, want)
	}
}

// What a producer or the filter says cannot be mended stops the worker;
// a failure the next try may mend does not.
func TestPermanent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("writing: %w", sink.ErrPermanent), true},
		{&sink.WriteError{Topic: "out", Total: 1, Unacked: []int{0}, Err: fmt.Errorf("%w (%w)", kafka.TopicAuthorizationFailed, sink.ErrPermanent)}, true},
		{&StageError{Step: StepCommit, Err: errors.New("x")}, true},
		{fmt.Errorf("element 3: %w", bloom.ErrInvalidElement), true},
		{fmt.Errorf("joining: %w", kafka.GroupAuthorizationFailed), true},
		{&sink.WriteError{Topic: "out", Total: 1, Unacked: []int{0}, Err: kafka.NotEnoughReplicas}, false},
		{errors.New("connection reset"), false},
	} {
		if got := permanent(tc.err); got != tc.want {
			t.Errorf("permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// The step label values are short snake_case words, each with its own
// phrase for logs and errors, and each exists at 0 from the start.
func TestStepLabels(t *testing.T) {
	snake := regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "p")
	phrases := map[string]bool{}
	for _, s := range Steps() {
		p := stepPhrase(s)
		if !snake.MatchString(s) || p == s || phrases[p] {
			t.Errorf("step %q: not snake_case, or its phrase %q is the label or another step's", s, p)
		}
		phrases[p] = true
		if testutil.ToFloat64(m.errors.WithLabelValues(s)) != 0 {
			t.Errorf("step %q: not at 0", s)
		}
	}
	if n := testutil.CollectAndCount(m.errors); n != len(Steps()) || n < 6 {
		t.Errorf("%d step series, want the %d steps", n, len(Steps()))
	}
	se := &StageError{Step: StepDeadLetter, Err: errors.New("refused")}
	if got := se.Error(); got != "dead-lettering failed for good: refused" {
		t.Errorf("StageError says %q", got)
	}
}

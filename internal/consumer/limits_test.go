package consumer

import (
	"strings"
	"testing"
	"time"
)

// Each check takes its limits and refuses one step past them, and New
// applies it, naming the field.
func TestChecksAreTheLimits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ok, bad []error
	}{
		{"batch size", []error{CheckBatchSize(1), CheckBatchSize(MaxBatchSize)}, []error{CheckBatchSize(0), CheckBatchSize(MaxBatchSize + 1)}},
		{"batch linger", []error{CheckBatchLinger(MinBatchLinger), CheckBatchLinger(MaxBatchLinger)},
			[]error{CheckBatchLinger(MinBatchLinger - 1), CheckBatchLinger(MaxBatchLinger + 1)}},
		{"Kafka timeout", []error{CheckKafkaTimeout(MinKafkaTimeout), CheckKafkaTimeout(MaxKafkaTimeout)},
			[]error{CheckKafkaTimeout(MinKafkaTimeout - 1), CheckKafkaTimeout(MaxKafkaTimeout + 1)}},
		{"session timeout", []error{CheckSessionTimeout(MinSessionTimeout), CheckSessionTimeout(MaxSessionTimeout)},
			[]error{CheckSessionTimeout(MinSessionTimeout - 1), CheckSessionTimeout(MaxSessionTimeout + 1)}},
		{"shutdown timeout", []error{CheckShutdownTimeout(MinShutdownTimeout), CheckShutdownTimeout(MaxShutdownTimeout)},
			[]error{CheckShutdownTimeout(MinShutdownTimeout - 1), CheckShutdownTimeout(MaxShutdownTimeout + 1)}},
		{"fail-open delay", []error{CheckFailOpenAfter(0), CheckFailOpenAfter(MinFailOpenAfter), CheckFailOpenAfter(MaxFailOpenAfter)},
			[]error{CheckFailOpenAfter(-time.Second), CheckFailOpenAfter(MinFailOpenAfter - 1), CheckFailOpenAfter(MaxFailOpenAfter + 1)}},
		{"hand-off wait", []error{CheckHandoffWait(0), CheckHandoffWait(MaxHandoffWait)}, []error{CheckHandoffWait(-1), CheckHandoffWait(MaxHandoffWait + 1)}},
	} {
		for i, err := range tc.ok {
			if err != nil {
				t.Errorf("%s: limit %d refused: %v", tc.name, i, err)
			}
		}
		for i, err := range tc.bad {
			if err == nil || !strings.HasPrefix(err.Error(), tc.name) {
				t.Errorf("%s: value %d past the limits: %v, want an error naming it", tc.name, i, err)
			}
		}
	}
	for _, tc := range []struct {
		says string
		set  func(*Config)
	}{
		{"shutdown timeout", func(c *Config) { c.ShutdownTimeout = MaxShutdownTimeout + time.Second }},
		{"fail-open delay", func(c *Config) { c.FailOpenAfter = MinFailOpenAfter / 2 }},
	} {
		c := validConfig(t)
		tc.set(&c)
		out, dlq := newWriters()
		if _, err := New(c, nil, out, dlq); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s out of its limits: %v", tc.says, err)
		}
	}
}

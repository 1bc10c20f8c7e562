// Package logs adapts what libraries log to zap: kafka-go's loggers, and a
// sampled logger for the messages a library repeats many times a second.
package logs

import (
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// SampleEvery is how often Sampled lets each distinct message through.
const SampleEvery = 10 * time.Second

// Sampled is l for messages that repeat: a kafka-go reader at the end of a
// partition reconnects with "unexpected EOF" many times a second, go-redis
// reports every failed dial, a topic refuses every message of a kind. Each
// distinct message is logged at most once per SampleEvery; other messages
// are not held back by it.
func Sampled(l *zap.Logger) *zap.Logger {
	return l.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, SampleEvery, 1, 0)
	}))
}

// Kafka logs kafka-go's messages at level to l, or is nil when l would drop
// them: kafka-go then skips formatting them (its writer has a debug line for
// every produce).
func Kafka(l *zap.Logger, level zapcore.Level) kafka.Logger {
	if !l.Core().Enabled(level) {
		return nil
	}
	return kafka.LoggerFunc(func(f string, a ...any) { l.Log(level, fmt.Sprintf(f, a...)) })
}

package logs

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// kafka-go's repeated messages are logged once per period; other
// messages still get through.
func TestSampledLogsEachMessageOncePerPeriod(t *testing.T) {
	core, logged := observer.New(zap.DebugLevel)
	l := Sampled(zap.New(core))
	for range 100 {
		l.Warn("the kafka reader got an unknown error reading partition 3 of in at offset 34375: unexpected EOF")
	}
	l.Warn("the kafka reader got an unknown error reading partition 4 of in at offset 100: unexpected EOF")
	if n := logged.Len(); n != 2 {
		t.Fatalf("%d entries logged, want 2 (one per distinct message)", n)
	}
}

// kafka-go's messages arrive at the level asked for, formatted; below the
// logger's level there is no logger at all, so kafka-go formats nothing.
func TestKafkaLogsAtItsLevel(t *testing.T) {
	core, logged := observer.New(zap.InfoLevel)
	l := zap.New(core)
	if Kafka(l, zapcore.DebugLevel) != nil {
		t.Error("a debug logger below the core's info level: not nil")
	}
	k := Kafka(l, zapcore.WarnLevel)
	if k == nil {
		t.Fatal("a warn logger at info level: nil")
	}
	k.Printf("partition %d: %s", 3, "unexpected EOF")
	entries := logged.All()
	if len(entries) != 1 || entries[0].Level != zapcore.WarnLevel || entries[0].Message != "partition 3: unexpected EOF" {
		t.Fatalf("logged %+v; want one warning, partition 3: unexpected EOF", entries)
	}
}

package consumer

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// kafka-go's repeated messages are logged once per period; other
// messages still get through.
func TestKafkaLogsSampled(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	l := sampled(zap.New(core))
	for i := 0; i < 100; i++ {
		l.Warn("the kafka reader got an unknown error reading partition 3 of in at offset 34375: unexpected EOF")
	}
	l.Warn("the kafka reader got an unknown error reading partition 4 of in at offset 100: unexpected EOF")
	if n := logs.Len(); n != 2 {
		t.Fatalf("%d entries logged, want 2 (one per distinct message)", n)
	}
}

package sink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"dedupe-worker/internal/kafkaconn"
	"dedupe-worker/internal/sink"
	"dedupe-worker/internal/testenv"
)

// Messages of about a megabyte each, one after another, must each go in a
// record batch the broker accepts (its default limit is 1048588 bytes),
// and small ones around them still share batches.
func TestLargeMessagesFitTheBrokerLimit(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"out": 1})
	w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: 5 * time.Second}, Topic: "out"})
	defer w.Close()
	var msgs []kafka.Message
	for i := 0; i < 3; i++ {
		msgs = append(msgs, kafka.Message{Value: []byte(strings.Repeat("x", sink.MaxBatchBytes-2000))},
			kafka.Message{Value: []byte("small")}, kafka.Message{Value: []byte("small too")})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Write(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	got := k.Read("out")
	if len(got) != len(msgs) {
		t.Fatalf("read %d messages back, wrote %d", len(got), len(msgs))
	}
	for i, r := range got {
		if string(r.Value) != string(msgs[i].Value) {
			t.Fatalf("message %d: %d bytes back, %d written", i, len(r.Value), len(msgs[i].Value))
		}
	}
}

package sink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	kgoplain "github.com/twmb/franz-go/pkg/sasl/plain"

	"dedupe-worker/internal/event"
	"dedupe-worker/internal/kafkaconn"
	"dedupe-worker/internal/sink"
	"dedupe-worker/internal/testenv"
)

// sourced is n messages, each with a unique key ("m-<index>") and the
// dedupe-source of an input message on input partition index modulo
// partitions, which the writer maps to the output partition of the same
// number; values are size bytes.
func sourced(n, partitions, size int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		p := i % partitions
		msgs[i] = kafka.Message{Key: []byte(fmt.Sprintf("m-%d", i)), Value: bytes.Repeat([]byte{'v'}, size),
			Headers: []kafka.Header{{Key: event.SourceHeader, Value: event.Source{Topic: "in", Partition: int32(p), Offset: int64(i)}.Append(nil)}}}
	}
	return msgs
}

// copies counts the records of topic by key, and fails the test if a
// record is on another partition than its source's or has another
// dedupe-source than the message of its key.
func copies(t *testing.T, k *testenv.Kafka, topic string, msgs []kafka.Message) map[string]int {
	t.Helper()
	want := map[string]kafka.Message{}
	for _, m := range msgs {
		want[string(m.Key)] = m
	}
	n := map[string]int{}
	for _, r := range k.Read(topic) {
		m, ok := want[string(r.Key)]
		if !ok {
			t.Fatalf("record with key %q was never written", r.Key)
		}
		var src []byte
		for _, h := range r.Headers {
			if h.Key == event.SourceHeader {
				src = h.Value
			}
		}
		if !bytes.Equal(src, m.Headers[0].Value) {
			t.Fatalf("record %q has dedupe-source %q, want %q", r.Key, src, m.Headers[0].Value)
		}
		s, _ := event.ParseSource(src)
		if int(r.Partition) != int(s.Partition)%partitionsOf(t, k, topic) {
			t.Fatalf("record %q on partition %d, source %s", r.Key, r.Partition, src)
		}
		n[string(r.Key)]++
	}
	return n
}

func partitionsOf(t *testing.T, k *testenv.Kafka, topic string) int {
	t.Helper()
	cl, err := kgo.NewClient(k.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("metadata of %s: %v %+v", topic, err, resp)
	}
	return len(resp.Topics[0].Partitions)
}

// produces counts the broker's produce requests to topic, per partition,
// with the number of records in each request's batch. It observes only:
// the broker answers every request as it would without it.
type produces struct {
	mu    sync.Mutex
	parts map[int32][]int // per partition, the record count of each request
	bytes int             // the largest batch sent, in bytes
}

func countProduces(k *testenv.Kafka, topic string) *produces {
	p := &produces{parts: map[int32][]int{}}
	k.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		pr := req.(*kmsg.ProduceRequest)
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, rt := range pr.Topics {
			if rt.Topic != topic {
				continue
			}
			for _, rp := range rt.Partitions {
				var b kmsg.RecordBatch
				n := -1
				if b.ReadFrom(rp.Records) == nil {
					n = int(b.NumRecords)
				}
				p.parts[rp.Partition] = append(p.parts[rp.Partition], n)
				p.bytes = max(p.bytes, len(rp.Records))
			}
		}
		return nil, nil, false
	})
	return p
}

// requests is the number of produce requests to partition p.
func (p *produces) requests(part int32) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.parts[part])
}

// largest is the size of the largest batch sent, in bytes.
func (p *produces) largest() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// total is the number of produce requests to any partition.
func (p *produces) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, rs := range p.parts {
		n += len(rs)
	}
	return n
}

// withKey is a Fault.When that matches produce requests whose batch holds
// a record with key. The batches are not compressed, and a record's key
// follows its length as a varint, so key and length are found together.
func withKey(key string) func(kmsg.Request) bool {
	framed := append(varint(len(key)), key...)
	return func(req kmsg.Request) bool {
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				if bytes.Contains(rp.Records, framed) {
					return true
				}
			}
		}
		return false
	}
}

// records is the number of records in a produce request of one batch, -1
// if it cannot be read.
func records(req kmsg.Request) int {
	pr := req.(*kmsg.ProduceRequest)
	if len(pr.Topics) != 1 || len(pr.Topics[0].Partitions) != 1 {
		return -1
	}
	var b kmsg.RecordBatch
	if b.ReadFrom(pr.Topics[0].Partitions[0].Records) != nil {
		return -1
	}
	return int(b.NumRecords)
}

// varint is n as a zig-zag varint.
func varint(n int) []byte {
	u := uint64(n) << 1
	var b []byte
	for u >= 0x80 {
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

func write(t *testing.T, w *sink.Writer, msgs []kafka.Message) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	err := w.Write(ctx, msgs)
	return time.Since(start), err
}

// One partition's batch fails and the others' are written: Write sends the
// failed batch again until it is acknowledged and never sends the others
// again. Read back, every message is there exactly once.
func TestPartialFailureRetriesOnlyTheFailedBatches(t *testing.T) {
	const failures = 3
	for _, tc := range []struct {
		name string
		// fail makes the broker fail the first failures produce requests to
		// partition 1 of out, and returns how many it failed so far.
		fail func(k *testenv.Kafka) func() int
	}{
		{"NOT_ENOUGH_REPLICAS", func(k *testenv.Kafka) func() int {
			h := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Partitions: []int32{1}, Err: kerr.NotEnoughReplicas, Count: failures})
			return h.Hits
		}},
		{"LEADER_NOT_AVAILABLE", func(k *testenv.Kafka) func() int {
			h := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Partitions: []int32{1}, Err: kerr.LeaderNotAvailable, Count: failures})
			return h.Hits
		}},
		{"connection dropped", func(k *testenv.Kafka) func() int {
			var mu sync.Mutex
			dropped := 0
			k.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				pr := req.(*kmsg.ProduceRequest)
				if len(pr.Topics) != 1 || pr.Topics[0].Topic != "out" || pr.Topics[0].Partitions[0].Partition != 1 {
					return nil, nil, false
				}
				mu.Lock()
				defer mu.Unlock()
				if dropped == failures {
					k.DropControl()
					return nil, nil, false
				}
				dropped++
				k.KeepControl()
				return nil, errors.New("injected: connection dropped"), true // kfake closes the connection, the batch unwritten
			})
			return func() int { mu.Lock(); defer mu.Unlock(); return dropped }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := testenv.StartKafka(t, testenv.Topics{"out": 3})
			w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: 30 * time.Second}, Topic: "out", Logger: testenv.Logger(t, -1)})
			defer w.Close()
			count := countProduces(k, "out")
			failed := tc.fail(k)
			msgs := sourced(300, 3, 100)

			took, err := write(t, w, msgs)
			if err != nil {
				t.Fatalf("Write: %v", err)
			}
			if n := failed(); n != failures {
				t.Fatalf("the broker failed %d produce requests to partition 1, want %d: the fault did not happen as planned", n, failures)
			}
			for p, want := range map[int32]int{0: 1, 1: failures + 1, 2: 1} {
				if got := count.requests(p); got != want {
					t.Errorf("partition %d: %d produce requests, want %d (%v)", p, got, want, count.parts)
				}
			}
			n := copies(t, k, "out", msgs)
			for _, m := range msgs {
				if c := n[string(m.Key)]; c != 1 {
					t.Errorf("message %s written %d times, want once", m.Key, c)
				}
			}
			t.Logf("%d messages, %d failures of partition 1: written once each in %v", len(msgs), failures, took.Round(time.Millisecond))
		})
	}
}

// A broker that wrote a batch and answered REQUEST_TIMED_OUT: Write sends
// it again and the batch is there twice, with the same dedupe-source, the
// copy Write's contract announces. The other partitions' are there once.
func TestTimeoutAfterTheWriteGivesACopy(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"out": 3})
	w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: 30 * time.Second}, Topic: "out"})
	defer w.Close()
	h := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Partitions: []int32{1}, Err: kerr.RequestTimedOut, Count: 1})
	msgs := sourced(300, 3, 100)
	if _, err := write(t, w, msgs); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if h.Hits() != 1 {
		t.Fatalf("the fault answered %d requests, want 1", h.Hits())
	}
	n := copies(t, k, "out", msgs) // also checks each copy's dedupe-source
	for i, m := range msgs {
		want := 1
		if i%3 == 1 {
			want = 2
		}
		if c := n[string(m.Key)]; c != want {
			t.Errorf("message %s (partition %d) written %d times, want %d", m.Key, i%3, c, want)
		}
	}
}

// A batch that keeps failing: Write gives up after its rounds of retries,
// at its deadline, or when its context is cancelled, and says which
// messages are not acknowledged: exactly the failing partition's. Writing
// those again, once the broker accepts them, leaves every message written
// once.
func TestUnacknowledgedAtTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // Write's
		want    error         // the context's error inside, nil for none
	}{
		// The rounds' back-off comes to about 0.75 s.
		{"rounds", 30 * time.Second, nil},
		{"deadline", 300 * time.Millisecond, context.DeadlineExceeded},
		{"cancelled", 30 * time.Second, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := testenv.StartKafka(t, testenv.Topics{"out": 3})
			timeout := tc.timeout
			cancelled := tc.want == context.Canceled
			w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: timeout}, Topic: "out"})
			defer w.Close()
			count := countProduces(k, "out")
			h := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Partitions: []int32{1}, Err: kerr.NotEnoughReplicas, Count: -1})
			msgs := sourced(90, 3, 100)

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			if cancelled {
				go func() {
					h.Wait(ctx, 2) // Write retries
					cancel()
				}()
			}
			start := time.Now()
			err := w.Write(ctx, msgs)
			took := time.Since(start)
			var we *sink.WriteError
			if !errors.As(err, &we) {
				t.Fatalf("Write returned %v, want a *sink.WriteError", err)
			}
			if !errors.Is(err, kafka.NotEnoughReplicas) {
				t.Errorf("%v: want NOT_ENOUGH_REPLICAS inside", err)
			}
			ctxErr := errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
			if (tc.want == nil && ctxErr) || (tc.want != nil && !errors.Is(err, tc.want)) || errors.Is(err, sink.ErrPermanent) || len(we.Rejected) != 0 {
				t.Errorf("%v: want %v inside, nothing permanent, nothing rejected", err, tc.want)
			}
			var want []int
			for i := 1; i < len(msgs); i += 3 {
				want = append(want, i)
			}
			if !slices.Equal(we.Unacked, want) {
				t.Fatalf("Unacked %v, want partition 1's %v", we.Unacked, want)
			}
			switch {
			case tc.want == context.DeadlineExceeded && (took < timeout || took > timeout+timeout/2):
				t.Errorf("Write took %v with a timeout of %v", took, timeout)
			case tc.want == nil && count.requests(1) != 5:
				t.Errorf("partition 1: %d produce requests, want the 5 rounds", count.requests(1))
			}
			if got := count.requests(1); got < 2 {
				t.Errorf("partition 1: %d produce requests; want it retried", got)
			}
			if count.requests(0) != 1 || count.requests(2) != 1 {
				t.Errorf("partitions 0 and 2: %d and %d produce requests, want 1 each", count.requests(0), count.requests(2))
			}
			t.Logf("gave up after %v, %d requests to partition 1", took.Round(time.Millisecond), count.requests(1))

			// A request the Write abandoned may still be on its way: Close
			// waits for it, and the broker refuses it, before the broker
			// accepts writes again.
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			h.Remove()
			again := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: 30 * time.Second}, Topic: "out"})
			defer again.Close()
			pending, cause := we.Unacknowledged(msgs)
			if len(pending) != len(want) || cause != we.Err || cause == nil {
				t.Fatalf("Unacknowledged: %d messages and %v; want %d and Err, %v", len(pending), cause, len(want), we.Err)
			}
			if _, err := write(t, again, pending); err != nil {
				t.Fatalf("writing the unacknowledged messages again: %v", err)
			}
			n := copies(t, k, "out", msgs)
			for _, m := range msgs {
				if c := n[string(m.Key)]; c != 1 {
					t.Errorf("message %s written %d times, want once", m.Key, c)
				}
			}
		})
	}
}

// createTopic makes topic with partitions and configs through a CreateTopics
// request, as an operator would.

// A topic whose max.message.bytes is 10,000 (set at creation, and enforced
// by the broker on each batch, as Kafka does): small messages far above it
// in total are all written, in smaller batches; a message above it alone
// is rejected, TooLarge, with its index, and every other written once.
// Records the broker refuses as invalid are found the same way.
func TestRefusedForContent(t *testing.T) {
	const limit = 10_000
	for _, tc := range []struct {
		name string
		// size of message i; the big ones are refused.
		size    func(i int) int
		refused []int
		reason  event.Reason
		// deadLetter is the reason of their dead letters.
		deadLetter event.Reason
		code       error
		// fault, if set, makes the broker refuse, with code, the batches that
		// hold message i's key.
		fault *kerr.Error
	}{
		{name: "small ones above the limit in total", size: func(int) int { return 100 }},
		{name: "one too large", size: func(i int) int {
			if i == 37 {
				return 2 * limit
			}
			return 100
		}, refused: []int{37}, reason: event.TooLarge, deadLetter: event.TooLarge, code: kafka.MessageSizeTooLarge},
		{name: "two too large, one just under", size: func(i int) int {
			switch i {
			case 0, 299:
				return limit
			case 150:
				return limit - 200 // the batch header and the record's framing fit
			}
			return 100
		}, refused: []int{0, 299}, reason: event.TooLarge, deadLetter: event.TooLarge, code: kafka.MessageSizeTooLarge},
		{name: "INVALID_RECORD", size: func(int) int { return 100 }, refused: []int{201}, reason: event.Refused, deadLetter: event.Refused, code: kafka.InvalidRecord, fault: kerr.InvalidRecord},
		{name: "CORRUPT_MESSAGE", size: func(int) int { return 100 }, refused: []int{5}, reason: event.Refused, deadLetter: event.Refused, code: kafka.InvalidMessage, fault: kerr.CorruptMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := testenv.StartKafka(t, nil)
			k.CreateTopic("out", 2, map[string]string{"max.message.bytes": fmt.Sprint(limit)})
			w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: 30 * time.Second}, Topic: "out"})
			defer w.Close()
			count := countProduces(k, "out")
			msgs := sourced(300, 2, 0)
			for i := range msgs {
				msgs[i].Value = bytes.Repeat([]byte{'v'}, tc.size(i))
			}
			// alone counts the refused requests that held the marked message
			// alone.
			var alone atomic.Int32
			if tc.fault != nil {
				match := withKey(string(msgs[tc.refused[0]].Key))
				k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Err: tc.fault, Count: -1,
					When: func(req kmsg.Request) bool {
						if !match(req) {
							return false
						}
						if records(req) == 1 {
							alone.Add(1)
						}
						return true
					}})
			}

			took, err := write(t, w, msgs)
			if tc.refused == nil {
				if err != nil {
					t.Fatalf("Write: %v", err)
				}
			} else {
				var we *sink.WriteError
				if !errors.As(err, &we) {
					t.Fatalf("Write returned %v, want a *sink.WriteError", err)
				}
				if we.Err != nil || len(we.Unacked) != 0 || !errors.Is(err, sink.ErrRejected) || errors.Is(err, sink.ErrPermanent) {
					t.Fatalf("%v: want only rejections (Err %v, Unacked %v)", err, we.Err, we.Unacked)
				}
				var idx []int
				for _, r := range we.Rejected {
					idx = append(idx, r.Index)
					if r.Reason != tc.reason || !errors.Is(r.Err, tc.code) {
						t.Errorf("message %d rejected %v with %v, want %v with %v", r.Index, r.Reason, r.Err, tc.reason, tc.code)
					}
				}
				if !slices.Equal(idx, tc.refused) {
					t.Fatalf("rejected %v, want %v", idx, tc.refused)
				}
				// Refused says the same to a caller that knows only errors
				// and dead-letter reasons.
				var refused []int
				for i, rerr := range we.Refused() {
					refused = append(refused, i)
					if got := event.ReasonOf(rerr); got != tc.deadLetter || !errors.Is(rerr, tc.code) {
						t.Errorf("Refused: message %d, reason %v, %v; want %v with %v", i, got, rerr, tc.deadLetter, tc.code)
					}
				}
				if !slices.Equal(refused, tc.refused) {
					t.Fatalf("Refused yields %v, want %v", refused, tc.refused)
				}
				if pending, cause := we.Unacknowledged(msgs); len(pending) != 0 || cause != nil {
					t.Fatalf("Unacknowledged: %d messages and %v; want none", len(pending), cause)
				}
				t.Logf("%v", err)
			}
			n := copies(t, k, "out", msgs)
			for i, m := range msgs {
				want := 1
				if slices.Contains(tc.refused, i) {
					want = 0
				}
				if c := n[string(m.Key)]; c != want {
					t.Errorf("message %d written %d times, want %d", i, c, want)
				}
			}
			switch tc.fault {
			case nil:
				// kfake refuses a batch above max.message.bytes (checked by
				// TestBrokerEnforcesMaxMessageBytes): one was sent and
				// refused, and the messages were written all the same.
				if largest := count.largest(); largest <= limit {
					t.Fatalf("the largest batch sent was %d bytes: the broker refused nothing, the test tests nothing", largest)
				}
			case kerr.CorruptMessage:
				if alone.Load() != 3 {
					t.Errorf("the corrupt message was refused alone %d times, want 3", alone.Load())
				}
			default:
				if alone.Load() != 1 {
					t.Errorf("the invalid message was refused alone %d times, want 1", alone.Load())
				}
			}
			t.Logf("%d messages (%d bytes of values): %d produce requests, %v", len(msgs), total(msgs), count.total(), took.Round(time.Millisecond))
		})
	}
}

func total(msgs []kafka.Message) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Value)
	}
	return n
}

// The broker the tests run against, kfake, enforces a topic's
// max.message.bytes set at creation on each record batch, as Kafka does:
// another client (franz-go's) gets MESSAGE_TOO_LARGE for a record above
// it, and its record below it is written (uncompressed: the broker
// measures the batch as sent, compressed or not).
func TestBrokerEnforcesMaxMessageBytes(t *testing.T) {
	k := testenv.StartKafka(t, nil)
	k.CreateTopic("out", 1, map[string]string{"max.message.bytes": "10000"})
	cl, err := kgo.NewClient(append(k.ClientOptions(), kgo.DefaultProduceTopic("out"), kgo.RecordRetries(1),
		kgo.ProducerBatchCompression(kgo.NoCompression()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	big := cl.ProduceSync(ctx, &kgo.Record{Value: bytes.Repeat([]byte{'v'}, 20_000)}).FirstErr()
	if !errors.Is(big, kerr.MessageTooLarge) {
		t.Fatalf("a record of 20,000 bytes: %v, want MESSAGE_TOO_LARGE", big)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: bytes.Repeat([]byte{'v'}, 9_000)}).FirstErr(); err != nil {
		t.Fatalf("a record of 9,000 bytes: %v", err)
	}
}

// A message larger than MaxBatchBytes, as kafka-go counts, would make a
// record batch the broker refuses. Write rejects such a message without
// sending it and writes the others in one request; a message of exactly
// MaxBatchBytes is sent.
func TestLargerThanTheWriterLimit(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"out": 1})
	w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: 30 * time.Second}, Topic: "out"})
	defer w.Close()
	count := countProduces(k, "out")
	msgs := sourced(3, 1, 10)
	// kafka-go's count for a message with one header: crc, magic,
	// attributes, timestamp (14), key and value with their int32 lengths,
	// and the header count, key and value as varints with theirs.
	fixed := 14 + 4 + len(msgs[0].Key) + 4 + 1 + 1 + len(event.SourceHeader) + 1 + len(msgs[0].Headers[0].Value)
	msgs[0].Value = bytes.Repeat([]byte{'v'}, sink.MaxBatchBytes-fixed+1)
	_, err := write(t, w, msgs)
	var we *sink.WriteError
	if !errors.As(err, &we) || we.Err != nil || len(we.Rejected) != 1 || we.Rejected[0].Index != 0 || we.Rejected[0].Reason != event.TooLarge {
		t.Fatalf("Write returned %v; want message 0 rejected TooLarge, the others written", err)
	}
	if count.total() != 1 {
		t.Fatalf("%d produce requests, want 1: the too large one is not sent", count.total())
	}
	msgs[0].Value = msgs[0].Value[:len(msgs[0].Value)-1]
	if _, err := write(t, w, msgs[:1]); err != nil {
		t.Fatalf("a message of exactly MaxBatchBytes: %v", err)
	}
	n := copies(t, k, "out", msgs)
	if n["m-0"] != 1 || n["m-1"] != 1 || n["m-2"] != 1 {
		t.Fatalf("written %v, want each once", n)
	}
}

// A failure retrying cannot mend returns at once: one produce request per
// partition, no retries, every message unacknowledged, the broker's code
// and ErrPermanent inside.
func TestPermanentFailureReturnsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		code error
		// start starts the broker and returns it and the writer's SASL.
		start func(t *testing.T) (*testenv.Kafka, *plain.Mechanism)
	}{
		{"no Write ACL", kafka.TopicAuthorizationFailed, func(t *testing.T) (*testenv.Kafka, *plain.Mechanism) {
			k := testenv.StartKafka(t, testenv.Topics{"out": 2}, kfake.EnableSASL(), kfake.EnableACLs(),
				kfake.Superuser("PLAIN", "admin", "admin-pw"),
				// Describe lets the writer see the topic's partitions; it may
				// not write.
				kfake.User("PLAIN", "worker", "worker-pw", kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "out",
					Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true}))
			k.WithClientOptions(kgo.SASL(kgoplain.Auth{User: "admin", Pass: "admin-pw"}.AsMechanism()))
			return k, &plain.Mechanism{Username: "worker", Password: "worker-pw"}
		}},
		{"CLUSTER_AUTHORIZATION_FAILED", kafka.ClusterAuthorizationFailed, faulted(kerr.ClusterAuthorizationFailed)},
		{"UNSUPPORTED_FOR_MESSAGE_FORMAT", kafka.UnsupportedForMessageFormat, faulted(kerr.UnsupportedForMessageFormat)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, mech := tc.start(t)
			const timeout = 30 * time.Second
			cfg := sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: timeout}, Topic: "out"}
			if mech != nil {
				cfg.Kafka.SASL = mech
			}
			w := sink.New(cfg)
			defer w.Close()
			count := countProduces(k, "out")
			msgs := sourced(20, 2, 10)
			took, err := write(t, w, msgs)
			var we *sink.WriteError
			if !errors.As(err, &we) {
				t.Fatalf("Write returned %v, want a *sink.WriteError", err)
			}
			if !errors.Is(err, sink.ErrPermanent) || !errors.Is(err, tc.code) {
				t.Fatalf("%v: want ErrPermanent and %v inside", err, tc.code)
			}
			if len(we.Unacked) != len(msgs) || len(we.Rejected) != 0 {
				t.Errorf("Unacked %v, Rejected %v: want every message unacknowledged", we.Unacked, we.Rejected)
			}
			if count.requests(0) != 1 || count.requests(1) != 1 {
				t.Errorf("%v produce requests per partition, want one each: no retry", count.parts)
			}
			if took > timeout/2 {
				t.Errorf("Write took %v: it should not wait for its deadline (%v)", took, timeout)
			}
			t.Logf("returned in %v: %v", took.Round(time.Millisecond), err)
			if !strings.Contains(err.Error(), "retrying cannot help") {
				t.Errorf("%q does not say that retrying cannot help", err)
			}
		})
	}
}

// faulted starts a broker that answers every produce request to out with
// code.
func faulted(code *kerr.Error) func(t *testing.T) (*testenv.Kafka, *plain.Mechanism) {
	return func(t *testing.T) (*testenv.Kafka, *plain.Mechanism) {
		k := testenv.StartKafka(t, testenv.Topics{"out": 2})
		k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Err: code, Count: -1})
		return k, nil
	}
}

// A broker that answers slowly: Writes give up on a partition while the
// first of its batches is on the wire. Only that batch goes out; the
// batches not sent when their Write gave up are never sent, neither by the
// first Write nor by two more that gave up while queued behind it. The
// next Write then writes every message, so each is there once but the
// messages of the batch that was on the wire, twice.
func TestAbandonedBatchesAreNotSent(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"out": 1})
	w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: 30 * time.Second}, Topic: "out", BatchSize: 2, Logger: testenv.Logger(t, -1)})
	defer w.Close()
	count := countProduces(k, "out")
	msgs := sourced(6, 1, 100) // three batches of two, to partition 0

	// The broker holds the first produce request until released.
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the broker closes
	k.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		k.DropControl() // the first request only
		close(arrived)
		k.SleepControl(func() { <-release })
		return nil, nil, false
	})

	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-arrived
		cancel()
	}()
	err := w.Write(ctx, msgs)
	var we *sink.WriteError
	if !errors.As(err, &we) || len(we.Unacked) != len(msgs) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Write cancelled with its first batch on the wire = %v; want every message unacknowledged, context.Canceled", err)
	}
	for i := range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		err := w.Write(ctx, msgs)
		cancel()
		if !errors.As(err, &we) || len(we.Unacked) != len(msgs) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Write %d queued behind the request on the wire = %v; want every message unacknowledged at its deadline", i+2, err)
		}
	}
	once.Do(func() { close(release) })
	if _, err := write(t, w, msgs); err != nil {
		t.Fatalf("Write after the broker answered: %v", err)
	}
	w.Close() // waits for the request left behind

	// One request on the wire when the Writes gave up, then the three of
	// the last Write.
	if got := count.requests(0); got != 4 {
		t.Errorf("%d produce requests to partition 0, want 4: the one on the wire and the last Write's three (%v)", got, count.parts)
	}
	n := copies(t, k, "out", msgs)
	for i, m := range msgs {
		want := 1
		if i < 2 {
			want = 2
		}
		if c := n[string(m.Key)]; c != want {
			t.Errorf("message %s written %d times, want %d", m.Key, c, want)
		}
	}
}

// Every partition's leader moves to another broker: the first produce
// requests to old leaders are answered NOT_LEADER_OR_FOLLOWER, and the
// writer reads the metadata at once instead of on its transport's timer
// (up to 6 s), so the Write goes through on its next round: at most two
// requests per partition to an old leader (one answered, one sent before
// that answer came), every message written once.
func TestLeaderMoveRefreshesMetadata(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"out": 3}, kfake.NumBrokers(3))
	w := sink.New(sink.Config{Kafka: kafkaconn.Conn{Brokers: k.Addrs(), Timeout: 30 * time.Second}, Topic: "out", Logger: testenv.Logger(t, -1)})
	defer w.Close()
	first := sourced(30, 3, 100)
	if _, err := write(t, w, first); err != nil {
		t.Fatalf("Write before the move: %v", err)
	}
	for p := int32(0); p < 3; p++ {
		if err := k.MoveTopicPartition("out", p, (k.LeaderFor("out", p)+1)%3); err != nil {
			t.Fatalf("moving out/%d: %v", p, err)
		}
	}
	var mu sync.Mutex
	refused := map[int32]int{}
	k.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		node := k.CurrentNode()
		mu.Lock()
		defer mu.Unlock()
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				if k.LeaderFor(rt.Topic, rp.Partition) != node {
					refused[rp.Partition]++
				}
			}
		}
		return nil, nil, false
	})
	msgs := sourced(300, 3, 100)
	for i := range msgs {
		msgs[i].Key = fmt.Appendf(nil, "after-%d", i)
	}
	if _, err := write(t, w, msgs); err != nil {
		t.Fatalf("Write after the move: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for p := int32(0); p < 3; p++ {
		total += refused[p]
		if refused[p] > 2 {
			t.Errorf("partition %d: %d requests sent to a broker that no longer leads it, want at most 2 (one answered, one already under way then): %v",
				p, refused[p], refused)
		}
	}
	if total == 0 {
		t.Fatal("no request went to an old leader: the move was not met")
	}
	n := copies(t, k, "out", append(first, msgs...))
	for _, m := range msgs {
		if c := n[string(m.Key)]; c != 1 {
			t.Errorf("message %s written %d times, want once", m.Key, c)
		}
	}
}

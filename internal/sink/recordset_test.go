package sink

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// kafkaGoRecordSet is the record set kafka-go writes for the messages of
// msgs at order, with now for the messages it stamps itself.
func kafkaGoRecordSet(t *testing.T, msgs []kafka.Message, order []int, now int64) []byte {
	t.Helper()
	var recs []kafka.Record
	for _, i := range order {
		m := msgs[i]
		if millis(m.Time, 0) == 0 { // kafka-go stamps it with its clock: give it ours
			m.Time = time.UnixMilli(now)
		}
		recs = append(recs, kafka.Record{Time: m.Time, Key: kafka.NewBytes(m.Key), Value: kafka.NewBytes(m.Value), Headers: m.Headers})
	}
	rs := protocol.RecordSet{Version: 2, Records: kafka.NewRecordReader(recs...)}
	var b bytes.Buffer
	if _, err := rs.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// The record set Write sends is, byte for byte, the one kafka-go writes for
// the same messages: keys and values nil, empty or long (lengths in one to
// three varint bytes), headers with nil and empty values, times out of
// order, before 1970, zero and within 1970's first millisecond (stamped
// now), records in an order other than msgs'.
func TestRecordSetAsKafkaGoWritesIt(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	bytesOf := func() []byte {
		switch rng.IntN(5) {
		case 0:
			return nil
		case 1:
			return []byte{}
		case 2:
			return bytes.Repeat([]byte{'x'}, 100+rng.IntN(20_000))
		}
		return bytes.Repeat([]byte{'v'}, rng.IntN(70))
	}
	base := time.Now()
	now := nowMillis()
	for round := range 50 {
		msgs := make([]kafka.Message, 1+rng.IntN(40))
		for i := range msgs {
			m := &msgs[i]
			m.Key, m.Value = bytesOf(), bytesOf()
			kind := rng.IntN(6)
			if round%10 == 9 {
				kind = 2 // every record before 1970: the batch's max time stays at kafka-go's 0
			}
			switch kind {
			case 0: // zero: stamped now
			case 1:
				m.Time = time.Unix(0, int64(rng.IntN(int(time.Millisecond)))) // comes to 0 ms: stamped now
			case 2:
				m.Time = time.Unix(-86400*int64(1+rng.IntN(1000)), 0)
			default:
				m.Time = base.Add(time.Duration(rng.IntN(2_000_000)-1_000_000) * time.Millisecond)
			}
			for range rng.IntN(4) {
				m.Headers = append(m.Headers, kafka.Header{Key: string(bytes.Repeat([]byte{'h'}, rng.IntN(200))), Value: bytesOf()})
			}
		}
		order := rng.Perm(len(msgs))[:1+rng.IntN(len(msgs))]
		got := appendRecordSet([]byte("prefix"), msgs, order, now)
		want := kafkaGoRecordSet(t, msgs, order, now)
		if !bytes.Equal(got[len("prefix"):], want) || string(got[:len("prefix")]) != "prefix" {
			t.Fatalf("round %d, %d records: %d bytes, kafka-go writes %d; first difference at %d", round, len(order),
				len(got)-len("prefix"), len(want), firstDifference(got[len("prefix"):], want))
		}
	}
}

func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

package app

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// fate is what the worker is to make of one input record: forwarded with
// the ID id, dropped as a duplicate (dup), or dead-lettered for reason.
type fate struct {
	id     string
	dup    bool
	reason event.Reason
}

func first(id string) fate             { return fate{id: id} }
func dropped() fate                    { return fate{dup: true} }
func deadFor(reason event.Reason) fate { return fate{reason: reason} }

// sourceCase is one ID source and an input with the fate of each record.
type sourceCase struct {
	name                     string
	from, field, idHeader    string
	timeField, timeHeader    string
	recs                     []*kgo.Record
	fates                    []fate
	forwardedValuesUnchanged bool
}

func header(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }

// Each ID source through the real worker (kfake over TCP, real Redis):
// the IDs it forwards, the copies it drops, and each kind of bad input
// dead-lettered with its own reason and counted. With the key, a header
// or the value, the payload is never parsed: binary payloads, and one
// nested far deeper than the JSON limit, are forwarded byte for byte.
func TestIDSources(t *testing.T) {
	k := testenv.StartKafka(t, nil)
	srv := testenv.Redis(t)
	now := time.Now()
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	// An Avro record in the Confluent framing (magic byte, schema ID, then
	// Avro): not JSON, not UTF-8.
	avro := func(n byte) []byte {
		return []byte{0x00, 0x00, 0x00, 0x01, 0x2c, 0x0c, 'c', 'l', 'i', 'c', 'k', n, 0xff, 0xfe}
	}
	deep := []byte(strings.Repeat("[", 100_000))
	blob := []byte{0x0a, 0x07, 'c', '-', '0', '0', '0', '0', '1', 0x10, 0x96, 0x01}
	valueID := func(v []byte) string { return string(consumer.AppendValueID(nil, v)) }

	cases := []sourceCase{
		{
			name: "composite", from: "json", field: "tenant, meta.id", timeField: "ts",
			recs: []*kgo.Record{
				{Value: fmt.Appendf(nil, `{"tenant":"a","meta":{"id":"bc"},"ts":%s}`, ms)},
				{Value: fmt.Appendf(nil, `{"tenant":"ab","meta":{"id":"c"},"ts":%s}`, ms)}, // the same bytes split elsewhere
				{Value: fmt.Appendf(nil, `{"meta":{"id":"bc"},"tenant":"a","ts":%s,"retry":1}`, ms)},
				{Value: fmt.Appendf(nil, `{"tenant":7,"meta":{"id":"bc"},"ts":%s}`, ms)},
				{Value: fmt.Appendf(nil, `{"meta":{"id":"bc"},"ts":%s}`, ms)},
				{Value: fmt.Appendf(nil, `{"tenant":"","meta":{"id":"bc"},"ts":%s}`, ms)},
				{Value: fmt.Appendf(nil, `{"tenant":null,"meta":{"id":"bc"},"ts":%s}`, ms)},
				{Value: []byte(`tenant=a id=bc`)},
				{Value: []byte(`{"tenant":"a","meta":{"id":"bc"}}`)},
			},
			fates: []fate{first("1:a,2:bc,"), first("2:ab,1:c,"), dropped(), first("1:7,2:bc,"), deadFor(event.NoIDPart),
				deadFor(event.EmptyID), deadFor(event.BadID), deadFor(event.NotJSON), deadFor(event.NoTime)},
		},
		{
			name: "key", from: "key", forwardedValuesUnchanged: true,
			recs: []*kgo.Record{
				{Key: []byte("conv-1"), Value: avro(1)},
				{Key: []byte("conv-1"), Value: avro(2)}, // a key shared by two events: the second is taken for a copy
				{Key: []byte("conv-2"), Value: deep},
				{Key: avro(3), Value: []byte("not json at all")},
				{Value: avro(4)},
				{Key: []byte{}, Value: avro(5)},
				{Key: []byte("conv-2"), Value: deep},
			},
			fates: []fate{first("conv-1"), dropped(), first("conv-2"), first(string(avro(3))), deadFor(event.NoKey), deadFor(event.NoKey), dropped()},
		},
		{
			name: "header", from: "header", idHeader: "x-click-id", timeHeader: "event-time", forwardedValuesUnchanged: true,
			recs: []*kgo.Record{
				{Value: blob, Headers: []kgo.RecordHeader{header("x-click-id", "h-1"), header("event-time", ms)}},
				{Value: deep, Headers: []kgo.RecordHeader{header("event-time", now.Format(time.RFC3339)), header("x-click-id", "h-2")}},
				{Value: blob, Headers: []kgo.RecordHeader{header("x-click-id", "h-1"), header("event-time", ms)}},
				{Value: blob, Headers: []kgo.RecordHeader{header("event-time", ms)}},
				{Value: blob, Headers: []kgo.RecordHeader{header("X-Click-Id", "h-3"), header("event-time", ms)}},
				{Value: blob, Headers: []kgo.RecordHeader{header("x-click-id", ""), header("event-time", ms)}},
				{Value: blob, Headers: []kgo.RecordHeader{header("x-click-id", "h-4")}},
				{Value: blob, Headers: []kgo.RecordHeader{header("x-click-id", "h-5"), header("event-time", "noon")}},
			},
			fates: []fate{first("h-1"), first("h-2"), dropped(), deadFor(event.NoHeader), deadFor(event.NoHeader), deadFor(event.EmptyHeader),
				deadFor(event.NoTime), deadFor(event.BadTime)},
		},
		{
			name: "value", from: "value", forwardedValuesUnchanged: true,
			recs: []*kgo.Record{
				{Key: []byte("u1"), Value: blob},
				{Key: []byte("u2"), Value: blob}, // a producer's retry: the same bytes under another key
				{Key: []byte("u1"), Value: append(bytes.Clone(blob[:len(blob)-1]), 0x97)},
				{Key: []byte("u3"), Value: avro(1)},
				{Key: []byte("u3"), Value: nil},
				{Key: []byte("u4"), Value: avro(1)},
				{Key: []byte("u5"), Value: deep},
			},
			fates: []fate{first(valueID(blob)), dropped(), first(valueID(append(bytes.Clone(blob[:len(blob)-1]), 0x97))), first(valueID(avro(1))),
				deadFor(event.EmptyValue), dropped(), first(valueID(deep))},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runSourceCase(t, k, srv.Addr, tc)
		})
	}
}

// runSourceCase runs one replica over tc's records, alone on topics of its
// own with one partition (so the first copy is the first produced), and
// checks the fate of each record in the output, the dead letters and the
// metrics.
func runSourceCase(t *testing.T, k *testenv.Kafka, redisAddr string, tc sourceCase) {
	if len(tc.recs) != len(tc.fates) {
		t.Fatalf("%d records, %d fates", len(tc.recs), len(tc.fates))
	}
	in, out, dlq := "in-"+tc.name, "out-"+tc.name, "dlq-"+tc.name
	for _, topic := range []string{in, out, dlq} {
		k.CreateTopic(topic, 1, nil)
	}
	cfg := replicas.Config("src-"+tc.name, k.Addrs(), redisAddr)
	cfg.InputTopic, cfg.OutputTopic, cfg.DLQTopic = in, out, dlq
	cfg.IDFrom, cfg.IDField, cfg.IDHeader, cfg.TimeField, cfg.TimeHeader = tc.from, tc.field, tc.idHeader, tc.timeField, tc.timeHeader
	r := replicas.Start(t, cfg, runWorker, nil)
	k.Produce(in, tc.recs...)

	var dups, firsts int
	reasons := map[event.Reason]int{}
	for _, f := range tc.fates {
		switch {
		case f.dup:
			dups++
		case f.id != "":
			firsts++
		default:
			reasons[f.reason]++
		}
	}
	n := len(tc.recs)
	// Every event read is forwarded, dropped as a duplicate or
	// dead-lettered: none is left out.
	testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d events decided and delivered", n), func() bool {
		m := r.Metrics()
		return m.Value("dedupe_events_in_total") == float64(n) && m.Value("dedupe_events_forwarded_total")+
			m.Value("dedupe_verdicts_total", "verdict", "duplicate")+m.Value("dedupe_events_dead_lettered_total") == float64(n)
	})
	m := r.Metrics()
	if got := m.Value("dedupe_events_forwarded_total"); got != float64(firsts) {
		t.Errorf("%g events forwarded, want %d", got, firsts)
	}
	if got := m.Value("dedupe_verdicts_total", "verdict", "duplicate"); got != float64(dups) {
		t.Errorf("%g duplicate verdicts, want %d", got, dups)
	}
	for _, reason := range event.Reasons() {
		if got := m.Value("dedupe_events_dead_lettered_total", "reason", reason.String()); got != float64(reasons[reason]) {
			t.Errorf("dead letters %s: %g, want %d", reason, got, reasons[reason])
		}
	}
	if got := m.Value("dedupe_partition_verdicts_total", "topic", in, "partition", "0", "verdict", "duplicate"); got != float64(dups) {
		t.Errorf("partition 0: %g duplicate verdicts, want %d", got, dups)
	}

	byOffset := map[int64]int{}
	for i, rec := range tc.recs {
		byOffset[rec.Offset] = i
	}
	seen := make([]bool, n)
	check := func(topic string, rec *kgo.Record) (int, bool) {
		src, ok := event.ParseSource([]byte(clickstream.Header(rec, event.SourceHeader)))
		i, known := byOffset[src.Offset]
		if !ok || src.Topic != in || src.Partition != 0 || !known {
			t.Errorf("%s: a record with dedupe-source %q, not one of the input", topic, clickstream.Header(rec, event.SourceHeader))
			return 0, false
		}
		if seen[i] {
			t.Errorf("%s: input %d written twice", topic, i)
		}
		seen[i] = true
		orig := tc.recs[i]
		if !bytes.Equal(rec.Key, orig.Key) {
			t.Errorf("%s: input %d: key %q, want %q", topic, i, rec.Key, orig.Key)
		}
		for _, h := range orig.Headers {
			if clickstream.Header(rec, h.Key) != string(h.Value) {
				t.Errorf("%s: input %d: header %s %q lost", topic, i, h.Key, h.Value)
			}
		}
		return i, true
	}
	outRecs := k.Read(out)
	if len(outRecs) != firsts {
		t.Errorf("%d records forwarded, want %d", len(outRecs), firsts)
	}
	for _, rec := range outRecs {
		i, ok := check(out, rec)
		if !ok {
			continue
		}
		want := tc.fates[i]
		if want.id == "" {
			t.Errorf("input %d forwarded; want it %+v", i, want)
			continue
		}
		if got := clickstream.Header(rec, event.IDHeader); got != want.id {
			t.Errorf("input %d forwarded with ID %q, want %q", i, got, want.id)
		}
		if !bytes.Equal(rec.Value, tc.recs[i].Value) {
			t.Errorf("input %d: forwarded value differs from the input (%d bytes, input %d)", i, len(rec.Value), len(tc.recs[i].Value))
		}
	}
	deadRecs := k.Read(dlq)
	for _, rec := range deadRecs {
		i, ok := check(dlq, rec)
		if !ok {
			continue
		}
		got := event.ParseReason(clickstream.Header(rec, event.ReasonHeader))
		if want := tc.fates[i]; want.id != "" || want.dup || got != want.reason {
			t.Errorf("input %d dead-lettered for %s (%s); want it %+v", i, got, clickstream.Header(rec, event.ErrorHeader), want)
		}
		if !bytes.Equal(rec.Value, tc.recs[i].Value) {
			t.Errorf("input %d: dead letter's value differs from the input", i)
		}
	}
	for i, f := range tc.fates {
		if !seen[i] && !f.dup {
			t.Errorf("input %d neither forwarded nor dead-lettered; want it %+v", i, f)
		}
	}
	if err := r.Stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	t.Logf("%s: %d forwarded, %d dropped, dead letters %v", cfg.IDFrom, firsts, dups, reasons)
}

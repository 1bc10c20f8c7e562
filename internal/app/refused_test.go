package app

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// The output topic refuses the 600 kB events (its max.message.bytes is
// 100,000): they are dead-lettered as too_large without their value; every
// other event is forwarded once.
func TestOutputRefusesLargeEvents(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "dlq": 1})
	k.CreateTopic("out", 2, map[string]string{"max.message.bytes": "100000"})
	srv := testenv.Redis(t)
	recs, tr := clickstream.Generate(3000, 0.07, 0.01, 7)
	k.Produce("in", recs...)
	cfg := replicas.Config("refused", k.Addrs(), srv.Addr)
	cfg.IDField, cfg.TimeField = "click_id", "ts"
	r := replicas.Start(t, cfg, runWorker, nil)
	want := len(tr.Valid) - 1 // "big" is refused
	var nout, ndead int
	ok := testenv.Until(30*time.Second, func() bool {
		nout, ndead = clickstream.DistinctSources(k.Read("out")), len(k.Read("dlq"))
		return nout >= want && ndead >= tr.Malformed+1
	})
	if !ok {
		t.Errorf("out %d distinct sources (want %d), dlq %d (want %d)", nout, want, ndead, tr.Malformed+1)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	out, dead := k.Read("out"), k.Read("dlq")
	ids := map[string]int{}
	for _, rec := range out {
		ids[clickstream.Header(rec, event.IDHeader)]++
	}
	for id := range tr.Valid {
		if id == "big" {
			if ids[id] != 0 {
				t.Errorf("big forwarded %d times", ids[id])
			}
			continue
		}
		if ids[id] != 1 {
			t.Errorf("%q forwarded %d times", id, ids[id])
		}
	}
	big := 0
	for _, rec := range dead {
		if event.ParseReason(clickstream.Header(rec, event.ReasonHeader)) != event.TooLarge {
			continue
		}
		big++
		if len(rec.Value) != 0 || clickstream.Header(rec, event.SourceHeader) == "" || clickstream.Header(rec, event.IDHeader) != "big" {
			t.Errorf("too_large dead letter: %d bytes of value, source %q, id %q", len(rec.Value), clickstream.Header(rec, event.SourceHeader), clickstream.Header(rec, event.IDHeader))
		}
		t.Logf("dead letter: %s", clickstream.Header(rec, event.ErrorHeader))
	}
	if big != 1 { // the second copy of "big" is a duplicate
		t.Errorf("%d too_large dead letters, want 1", big)
	}
	t.Logf("out %d records, dlq %d (malformed %d)", len(out), len(dead), tr.Malformed)
}

// The dead-letter topic refuses a dead letter for its content: the worker
// stops with a StageError naming it.
func TestDeadLetterRefusedStopsTheWorker(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
	srv := testenv.Redis(t)
	recs, _ := clickstream.Generate(1000, 0.07, 0.01, 7)
	k.Produce("in", recs...)
	h := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "dlq", Err: kerr.InvalidRecord, Count: -1, When: func(req kmsg.Request) bool {
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				if bytes.Contains(rp.Records, []byte("not json")) {
					return true
				}
			}
		}
		return false
	}})
	cfg := replicas.Config("dlqrefused", k.Addrs(), srv.Addr)
	cfg.IDField, cfg.TimeField = "click_id", "ts"
	r := replicas.Start(t, cfg, runWorker, nil)
	select {
	case <-r.Done():
	case <-time.After(time.Minute):
		t.Fatalf("the worker did not stop (%d refusals)", h.Hits())
	}
	err := r.Err()
	var se *consumer.StageError
	if !errors.As(err, &se) || se.Step != consumer.StepDeadLetter || !errors.Is(err, consumer.ErrDeadLetterRefused) {
		t.Fatalf("Run returned %v; want a StageError of %s with ErrDeadLetterRefused", err, consumer.StepDeadLetter)
	}
	t.Logf("%v", err)
}

// An ID too large for the output topic (a 150 kB click_id, with the
// output and dead-letter topics both limited to 100,000 bytes): the event
// is refused by the output, and its dead letter leaves out the value and
// the 150 kB dedupe-id, so the dead-letter topic takes it and the worker
// goes on instead of stopping on the same offset after every restart.
func TestHugeIDRefusedByBothTopics(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 1})
	k.CreateTopic("out", 1, map[string]string{"max.message.bytes": "100000"})
	k.CreateTopic("dlq", 1, map[string]string{"max.message.bytes": "100000"})
	srv := testenv.Redis(t)
	huge := strings.Repeat("h", 150_000)
	recs := []*kgo.Record{{Value: fmt.Appendf(nil, `{"click_id":"a","ts":%d}`, time.Now().UnixMilli())},
		{Value: fmt.Appendf(nil, `{"click_id":%q,"ts":%d}`, huge, time.Now().UnixMilli())},
		{Value: fmt.Appendf(nil, `{"click_id":"b","ts":%d}`, time.Now().UnixMilli())}}
	k.Produce("in", recs...)
	cfg := replicas.Config("hugeid", k.Addrs(), srv.Addr)
	cfg.IDField, cfg.TimeField = "click_id", "ts"
	r := replicas.Start(t, cfg, runWorker, nil)
	ok := testenv.Until(30*time.Second, func() bool {
		return clickstream.DistinctSources(k.Read("out")) >= 2 && len(k.Read("dlq")) >= 1
	})
	select {
	case <-r.Done():
		t.Fatalf("the worker stopped: %v", r.Err())
	default:
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	out, dead := k.Read("out"), k.Read("dlq")
	if !ok || len(out) != 2 || len(dead) != 1 {
		t.Fatalf("out %d records, dlq %d; want the 2 small events forwarded and the huge one dead-lettered", len(out), len(dead))
	}
	d := dead[0]
	if event.ParseReason(clickstream.Header(d, event.ReasonHeader)) != event.TooLarge || len(d.Value) != 0 ||
		clickstream.Header(d, event.SourceHeader) != "in/0/1" || clickstream.Header(d, event.IDHeader) != "" {
		t.Errorf("dead letter: reason %q, %d bytes of value, source %q, %d bytes of dedupe-id; want too_large, none, in/0/1, none",
			clickstream.Header(d, event.ReasonHeader), len(d.Value), clickstream.Header(d, event.SourceHeader), len(clickstream.Header(d, event.IDHeader)))
	}
}

package app

import (
	"testing"
	"time"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// Two replicas share the work of one group; one is stopped while busy and
// the other takes over its partitions. The output holds each distinct
// valid click once (by dedupe-source), the dead-letter topic every
// malformed record with a reason, and each input partition's order.
func TestTwoReplicasEndToEnd(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 4, "out": 4, "dlq": 1})
	srv := testenv.Redis(t)
	recs, tr := clickstream.Generate(20_000, 0.07, 0.01, 1)
	next := 0
	feed := func(n int) {
		end := min(next+n, len(recs))
		k.Produce("in", recs[next:end]...)
		next = end
	}
	start := func() *replicas.Replica {
		c := replicas.Config("e2e", k.Addrs(), srv.Addr)
		c.IDField, c.TimeField = "click_id", "ts"
		c.BatchSize, c.BatchLinger = 500, 50*time.Millisecond
		return replicas.Start(t, c, runWorker, nil)
	}
	forwarded := func(r *replicas.Replica) float64 { return r.Metrics().Value("dedupe_events_forwarded_total") }
	a, b := start(), start()

	// Input trickles in until both replicas forward: each then holds some
	// of the partitions (a replica that joins after the other has read
	// everything would have nothing to do).
	testenv.Eventually(t, 60*time.Second, "both replicas forwarding", func() bool {
		if forwarded(a) > 0 && forwarded(b) > 0 {
			return true
		}
		if next > len(recs)/2 {
			t.Fatalf("half the input produced and the replicas do not both forward (a %g, b %g)", forwarded(a), forwarded(b))
		}
		feed(250)
		return false
	})
	// Stop a while it is busy with new input: it must finish its batch and
	// leave the group cleanly.
	before := forwarded(a)
	feed((len(recs) - next) / 2)
	testenv.Eventually(t, 60*time.Second, "replica a forwarding the new input", func() bool { return forwarded(a) > before })
	if err := a.Stop(); err != nil {
		t.Fatalf("replica a: %v", err)
	}
	// The rest lands on every partition, a's former ones too: b must take
	// them over.
	feed(len(recs))
	// Every input record decided: as many distinct sources in the output
	// and dead-letter topics as the input holds. Should something be lost,
	// the wait gives up and Check below says what.
	decided := testenv.Until(90*time.Second, func() bool {
		return clickstream.DistinctSources(k.Read("out")) >= len(tr.Valid) && clickstream.DistinctSources(k.Read("dlq")) >= tr.Malformed
	})
	if err := b.Stop(); err != nil {
		t.Fatalf("replica b: %v", err)
	}
	rep := clickstream.Check(tr, k.Read("out"), k.Read("dlq"))
	if !decided || !rep.OK() {
		t.Errorf("decided everything: %v; %v", decided, rep)
	}
	t.Logf("input %d: %v", tr.Total, rep)
}

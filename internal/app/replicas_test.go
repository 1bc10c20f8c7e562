package app

import (
	"testing"
	"time"

	"dedupe-worker/internal/clicktest"
	"dedupe-worker/internal/testenv"
)

// Two replicas share the work of one group; one is stopped while busy and
// the other takes over its partitions. The output holds each distinct
// valid click once (by dedupe-source), the dead-letter topic every
// malformed record with a reason, and each input partition's order.
func TestTwoReplicasEndToEnd(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 4, "out": 4, "dlq": 1})
	srv := testenv.Redis(t)
	recs, tr := clicktest.Generate(20_000, 0.07, 0.01, 1)
	k.Produce("in", recs...)

	start := func() *testenv.Replica {
		c := testenv.Config("e2e", k.Addrs(), srv.Addr)
		c.IDField, c.TimeField = "click_id", "ts"
		c.BatchSize, c.BatchLinger = 500, 50*time.Millisecond
		return testenv.StartReplica(t, c, Run, nil)
	}
	a, b := start(), start()
	// Stop one replica while it is busy: it must finish its batch and leave
	// the group cleanly.
	testenv.Eventually(t, 60*time.Second, "a quarter of the input forwarded by replica a", func() bool {
		return a.Metrics().Value("dedupe_events_forwarded_total") >= float64(len(tr.Valid)/4)
	})
	if err := a.Stop(); err != nil {
		t.Fatalf("replica a: %v", err)
	}
	// Every input record decided: as many distinct sources in the output
	// and dead-letter topics as the input holds. Should something be lost,
	// the wait fails and Check below says what.
	decided := testenv.Until(90*time.Second, func() bool {
		return clicktest.DistinctSources(k.Read("out")) >= len(tr.Valid) && clicktest.DistinctSources(k.Read("dlq")) >= tr.Malformed
	})
	if err := b.Stop(); err != nil {
		t.Fatalf("replica b: %v", err)
	}
	rep := clicktest.Check(tr, k.Read("out"), k.Read("dlq"))
	if !decided || !rep.OK() {
		t.Errorf("decided everything: %v; %v", decided, rep)
	}
	t.Logf("input %d: %v", tr.Total, rep)
}

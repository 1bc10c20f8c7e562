package app

import (
	"testing"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/testenv"
)

// The worker at 9 times its planned IDs per window: the window grows, and
// no new event is taken for a duplicate (at p = 1e-6 over about 18,000
// IDs, 0.02 are expected). The same input through a window that may not
// grow drops a large share of them.
func TestNineTimesThePlan(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 4, "out-grow": 4, "out-flat": 4, "dlq": 1})
	srv := testenv.Redis(t)
	recs, tr := clickstream.Generate(20_000, 0.07, 0, 9)
	k.Produce("in", recs...)
	run := func(pipeline, out string, growth float64) (clickstream.Report, *testenv.Replica) {
		cfg := testenv.Config(pipeline, k.Addrs(), srv.Addr)
		cfg.IDField, cfg.TimeField, cfg.OutputTopic = "click_id", "ts", out
		cfg.ExpectedPerWindow, cfg.MaxGrowth = int64(len(tr.Valid)/9), growth
		r := testenv.StartReplica(t, cfg, Run, nil)
		settle(t, len(recs), r)
		return clickstream.Check(tr, k.Read(out), nil), r
	}
	grown, r := run("grow", "out-grow", 64)
	if grown.Lost != 0 || grown.DuplicatesPass != 0 {
		t.Errorf("growing window: %v", grown)
	}
	if made := r.Metrics().Value("dedupe_filter_stages_made_total"); made < 2 {
		t.Errorf("%g stages made for 9 times the plan, want 2 (stage 1 holds 4x, stage 2 16x)", made)
	}
	flat, _ := run("flat", "out-flat", 1)
	if flat.Lost < len(tr.Valid)/100 {
		t.Errorf("a window that may not grow lost %d of %d IDs at 9x; the comparison shows nothing", flat.Lost, len(tr.Valid))
	}
	t.Logf("%d distinct IDs, planned %d per window: growing window lost %d, flat window lost %d", len(tr.Valid), len(tr.Valid)/9, grown.Lost, flat.Lost)
}

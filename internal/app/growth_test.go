package app

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"dedupe-worker/config"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// The worker at 9 times its planned IDs per window: the window grows, and
// no new event is taken for a duplicate (at p = 1e-6 over about 18,000
// IDs, 0.02 are expected). The same input through a window that may not
// grow drops a large share of them (Bloom) or passes copies (fingerprint).
func TestNineTimesThePlan(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 4, "out-grow": 4, "out-flat": 4, "dlq": 1})
	srv := testenv.Redis(t)
	recs, tr := clickstream.Generate(20_000, 0.07, 0, 9)
	k.Produce("in", recs...)
	run := func(pipeline, out string, growth float64) (clickstream.Report, *replicas.Replica) {
		cfg := replicas.Config(pipeline, k.Addrs(), srv.Addr)
		cfg.IDField, cfg.TimeField, cfg.OutputTopic = "click_id", "ts", out
		cfg.ExpectedPerWindow, cfg.MaxGrowth = int64(len(tr.Valid)/9), growth
		r := replicas.Start(t, cfg, runWorker, nil)
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
	copies := len(recs) - len(tr.Valid)
	switch testenv.Filter() {
	case "fingerprint":
		// A table of fingerprints that may not grow stops taking IDs at
		// 0.9 of its slots and only tests: copies pass, nothing is lost.
		if flat.Lost > len(tr.Valid)/1000 || flat.DuplicatesPass < copies/10 {
			t.Errorf("a fingerprint table that may not grow, at 9x: lost %d of %d IDs and passed %d of %d copies; want few lost and many passed",
				flat.Lost, len(tr.Valid), flat.DuplicatesPass, copies)
		}
	default:
		// A Bloom filter that may not grow takes every ID, and its rate
		// rises: first-seen IDs are dropped.
		if flat.Lost < len(tr.Valid)/100 {
			t.Errorf("a window that may not grow lost %d of %d IDs at 9x; the comparison shows nothing", flat.Lost, len(tr.Valid))
		}
	}
	t.Logf("%d distinct IDs, %d copies, planned %d per window: growing window lost %d, passed %d copies; flat window lost %d, passed %d copies",
		len(tr.Valid), copies, len(tr.Valid)/9, grown.Lost, grown.DuplicatesPass, flat.Lost, flat.DuplicatesPass)
}

// A spike: 100,000 click events (7% exact repeats) read at full speed by
// two replicas, into windows planned for 10,000 and 2,000 distinct IDs
// (9 and 46 times the plan), at p = 1e-9. Every duplicate is caught and
// nothing is lost: no batch decides an ID it does not insert, because a
// batch that needs a stage not made yet waits for it. The figures that
// say what the spike cost are logged: stages made, calls refused, the
// waits (from the replicas' own log lines), overfill and test-only (from
// the growth records).
func TestSpikeAboveThePlan(t *testing.T) {
	for _, c := range []struct {
		name     string
		expected int64
	}{{"9x", 10_000}, {"46x", 2_000}} {
		t.Run(c.name, func(t *testing.T) {
			// The same input each time; a record produced once is not
			// produced again.
			recs, tr := clickstream.Generate(100_000, 0.07, 0, 20)
			k := testenv.StartKafka(t, testenv.Topics{"in": 8, "out": 8, "dlq": 1})
			srv := testenv.Redis(t)
			k.Produce("in", recs...)
			core, logs := observer.New(zapcore.InfoLevel)
			log := zap.New(zapcore.NewTee(testenv.Logger(t, zapcore.WarnLevel).Core(), core))
			cfg := replicas.Config("spike", k.Addrs(), srv.Addr)
			cfg.IDField, cfg.TimeField = "click_id", "ts"
			cfg.ExpectedPerWindow, cfg.MaxGrowth, cfg.FalsePositiveRate = c.expected, 64, 1e-9
			cfg.BatchSize = config.Defaults().BatchSize
			start := time.Now()
			a := replicas.Start(t, cfg, runWorker, log)
			cfg.HTTPAddr = redisproc.FreeAddr()
			b := replicas.Start(t, cfg, runWorker, log)
			settle(t, len(recs), a, b)
			took := time.Since(start)

			rep := clickstream.Check(tr, k.Read("out"), nil)
			if rep.Lost != 0 || rep.DuplicatesPass != 0 || rep.Unknown != 0 || rep.Conflicts != 0 {
				t.Errorf("%s the plan: %v", c.name, rep)
			}
			load := float64(len(tr.Valid)) / float64(c.expected)

			// What the spike cost.
			var made, refused float64
			var decided []float64
			for _, r := range []*replicas.Replica{a, b} {
				m := r.Metrics()
				made += m.Value("dedupe_filter_stages_made_total")
				refused += m.Value("dedupe_filter_growth_refused_total")
				decided = append(decided, m.Value("dedupe_verdicts_total", "verdict", "first_seen")+m.Value("dedupe_verdicts_total", "verdict", "duplicate"))
			}
			var waits []time.Duration
			for _, e := range logs.FilterMessage("a batch waited for the next stage of its window").All() {
				d, _ := e.ContextMap()["waited"].(time.Duration)
				waits = append(waits, d)
			}
			if n := len(logs.FilterMessageSnippet("in vain").All()); n != 0 {
				t.Errorf("%d waits for a stage ran out", n)
			}
			rc := testenv.RedisClient(t, srv)
			f, err := NewFilter(cfg, rc)
			if err != nil {
				t.Fatal(err)
			}
			st, err := f.Stats(t.Context(), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			var stages int
			var over, testOnly int64
			for _, s := range st {
				stages = max(stages, s.Stages)
				over += s.Overfilled
				testOnly += s.TestOnly
			}
			if over != 0 || testOnly != 0 {
				t.Errorf("%d overfilled and %d test-only: want none below the cap", over, testOnly)
			}
			if made < 2 {
				t.Errorf("%g stages made at %.0fx the plan, want 2 or more", made, load)
			}
			var longest, total time.Duration
			for _, d := range waits {
				longest, total = max(longest, d), total+d
			}
			t.Logf("%d events, %d distinct IDs, planned %d per window (%.1fx), read in %v by two replicas deciding %v events: lost %d, duplicates passed %d; "+
				"%d stages (%g made), %d overfilled, %d test-only; %g calls refused for a stage, %d waits, longest %v, %v in all",
				len(recs), len(tr.Valid), c.expected, load, took.Round(time.Millisecond), decided, rep.Lost, rep.DuplicatesPass,
				stages, made, over, testOnly, refused, len(waits), longest, total)
		})
	}
}

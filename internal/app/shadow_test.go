package app

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/config"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// shadowInput is n click events keyed by their ID (so the copies of an
// ID share a partition and the first copy is the first produced), about
// a fifth of them repeated one to three times later on, a few malformed
// ones, and a few stamped three hours back (beyond the lag bound).
func shadowInput(n int, seed uint64) (recs []*kgo.Record, valid, malformed, late int) {
	rng := rand.New(rand.NewPCG(seed, 21))
	ms := time.Now().UnixMilli()
	var pending []*kgo.Record
	for i := range n {
		id := fmt.Sprintf("c-%d", i)
		r := &kgo.Record{Key: []byte(id), Value: fmt.Appendf(nil, `{"id":%q,"ts":%d,"page":"/p/%d"}`, id, ms, i%13)}
		switch {
		case i%97 == 5:
			r.Value = fmt.Appendf(nil, `{"id":%q,"ts":"a while ago"}`, id)
			malformed++
		case i%89 == 7:
			r.Value = fmt.Appendf(nil, `{"id":%q,"ts":%d}`, id, ms-3*time.Hour.Milliseconds())
			late++
		default:
			valid++
			if rng.IntN(5) == 0 {
				for range 1 + rng.IntN(3) {
					pending = append(pending, &kgo.Record{Key: r.Key, Value: r.Value})
					valid++
				}
			}
		}
		recs = append(recs, r)
		// Copies come out of pending in a random order, a few at a time.
		for len(pending) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(pending))
			recs = append(recs, pending[j])
			pending = append(pending[:j], pending[j+1:]...)
		}
	}
	return append(recs, pending...), valid, malformed, late
}

// Shadow mode forwards every valid event and marks exactly the duplicates
// drop mode drops: the same input through a pipeline in each mode,
// compared source by source and ID by ID. The decisions, and the verdict
// counts per partition, are the same; events beyond the lag bound, which
// drop dead-letters here (DEDUPE_LATE_POLICY=dead-letter), shadow
// forwards undeduplicated. Then the shadow pipeline is switched to drop:
// it keeps its filters, and the copies of what it saw in shadow are
// dropped.
func TestShadowMarksWhatDropDrops(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 4, "out-drop": 4, "out-shadow": 4, "dlq-drop": 1, "dlq-shadow": 1})
	srv := testenv.Redis(t)
	recs, valid, malformed, late := shadowInput(3000, 1)
	// Pipeline p-NAME writes out-NAME and dlq-NAME.
	modeConfig := func(name, mode string) config.Config {
		cfg := replicas.Config("p-"+name, k.Addrs(), srv.Addr)
		cfg.OutputTopic, cfg.DLQTopic = "out-"+name, "dlq-"+name
		cfg.TimeField, cfg.LatePolicy, cfg.Mode = "ts", config.LateDeadLetter, mode
		return cfg
	}
	drop := replicas.Start(t, modeConfig("drop", config.ModeDrop), runWorker, nil)
	shadow := replicas.Start(t, modeConfig("shadow", config.ModeShadow), runWorker, nil)
	k.Produce("in", recs...)

	n := float64(len(recs))
	delivered := func(r *replicas.Replica, forwarded, dead float64) func() bool {
		return func() bool {
			m := r.Metrics()
			return m.Value("dedupe_events_in_total") == n && m.Value("dedupe_events_forwarded_total") == forwarded &&
				m.Value("dedupe_events_dead_lettered_total") == dead
		}
	}
	// Shadow: every valid event forwarded, late ones too; only the
	// malformed dead-lettered.
	testenv.Eventually(t, 90*time.Second, "the shadow pipeline delivers every valid event", delivered(shadow, float64(valid+late), float64(malformed)))
	dm := drop.Metrics()
	testenv.Eventually(t, 90*time.Second, "the drop pipeline delivers", func() bool {
		dm = drop.Metrics()
		return dm.Value("dedupe_events_in_total") == n && dm.Value("dedupe_events_forwarded_total")+dm.Value("dedupe_verdicts_total", "verdict", "duplicate") == float64(valid) &&
			dm.Value("dedupe_events_dead_lettered_total") == float64(malformed+late)
	})
	sm := shadow.Metrics()
	for _, v := range []string{"first_seen", "duplicate", "late", "replayed_first_seen", "replayed_duplicate", "replay_unknown"} {
		if d, s := dm.Value("dedupe_verdicts_total", "verdict", v), sm.Value("dedupe_verdicts_total", "verdict", v); d != s {
			t.Errorf("verdict %s: drop %g, shadow %g", v, d, s)
		}
	}
	if got := dm.Value("dedupe_events_dead_lettered_total", "reason", "late"); got != float64(late) {
		t.Errorf("drop dead-lettered %g late events, want %d", got, late)
	}

	// Source by source.
	src := func(r *kgo.Record) string { return clickstream.Header(r, event.SourceHeader) }
	dropOut := map[string]string{} // source -> ID
	for _, r := range k.Read("out-drop") {
		dropOut[src(r)] = clickstream.Header(r, event.IDHeader)
	}
	shadowOut := k.Read("out-shadow")
	marked := map[event.Verdict]int{}
	perPartition := map[string][2]int{}
	firstOf := map[string]string{} // ID -> the source shadow marked first
	undeduplicated := 0
	for _, r := range shadowOut {
		s, id := src(r), clickstream.Header(r, event.IDHeader)
		if u := clickstream.Header(r, event.UndeduplicatedHeader); u != "" {
			if u != "late" || clickstream.Header(r, event.VerdictHeader) != "" {
				t.Errorf("%s: undeduplicated %q with verdict %q; want late without a verdict", s, u, clickstream.Header(r, event.VerdictHeader))
			}
			undeduplicated++
			continue
		}
		v, ok := event.ParseVerdict([]byte(clickstream.Header(r, event.VerdictHeader)))
		if !ok {
			t.Errorf("%s: no or a bad %s header %q", s, event.VerdictHeader, clickstream.Header(r, event.VerdictHeader))
			continue
		}
		marked[v]++
		ps, _ := event.ParseSource([]byte(s))
		c := perPartition[strconv.Itoa(int(ps.Partition))]
		c[v]++
		perPartition[strconv.Itoa(int(ps.Partition))] = c
		_, forwardedByDrop := dropOut[s]
		if (v == event.First) != forwardedByDrop {
			t.Errorf("%s (ID %s): shadow marked it %s, drop forwarded it: %v", s, id, v, forwardedByDrop)
		}
		if v == event.First {
			if prev, twice := firstOf[id]; twice {
				t.Errorf("ID %s marked first at %s and at %s", id, prev, s)
			}
			firstOf[id] = s
		}
	}
	// ID by ID: drop forwarded each ID once, from the source shadow marked
	// first.
	for s, id := range dropOut {
		if firstOf[id] != s {
			t.Errorf("ID %s: drop forwarded %s, shadow marked %q first", id, s, firstOf[id])
		}
	}
	if len(firstOf) != len(dropOut) {
		t.Errorf("%d IDs marked first in shadow, %d forwarded by drop", len(firstOf), len(dropOut))
	}
	if marked[event.First]+marked[event.Duplicate] != valid || undeduplicated != late {
		t.Errorf("shadow forwarded %d first, %d duplicate, %d late; want %d valid and %d late", marked[event.First], marked[event.Duplicate],
			undeduplicated, valid, late)
	}
	if marked[event.Duplicate] == 0 || marked[event.Duplicate] != valid-len(dropOut) {
		t.Errorf("%d marked duplicate, drop dropped %d", marked[event.Duplicate], valid-len(dropOut))
	}
	// The verdicts per partition, as the headers say, in both modes.
	if len(perPartition) != 4 {
		t.Errorf("verdicts in %d partitions, want 4", len(perPartition))
	}
	for p, c := range perPartition {
		for _, v := range event.Verdicts() {
			for name, m := range map[string]testenv.Metrics{"drop": dm, "shadow": sm} {
				if got := m.Value("dedupe_partition_verdicts_total", "topic", "in", "partition", p, "verdict", v.String()); got != float64(c[v]) {
					t.Errorf("%s: partition %s, %s: %g, want %d", name, p, v, got, c[v])
				}
			}
		}
	}
	t.Logf("%d events: %d valid, %d malformed, %d late; shadow marked %d first and %d duplicate (duplicate rate %.1f%%), drop forwarded %d",
		len(recs), valid, malformed, late, marked[event.First], marked[event.Duplicate],
		100*float64(marked[event.Duplicate])/float64(valid), len(dropOut))

	// The shadow pipeline switched to drop: same pipeline, same group.
	if err := shadow.Stop(); err != nil {
		t.Fatalf("stopping shadow: %v", err)
	}
	switched := replicas.Start(t, modeConfig("shadow", config.ModeDrop), runWorker, nil)
	var again []*kgo.Record
	for id := range firstOf {
		again = append(again, &kgo.Record{Key: []byte(id), Value: fmt.Appendf(nil, `{"id":%q,"ts":%d}`, id, time.Now().UnixMilli())})
	}
	const fresh = 50
	for i := range fresh {
		id := fmt.Sprintf("new-%d", i)
		again = append(again, &kgo.Record{Key: []byte(id), Value: fmt.Appendf(nil, `{"id":%q,"ts":%d}`, id, time.Now().UnixMilli())})
	}
	k.Produce("in", again...)
	testenv.Eventually(t, 90*time.Second, "the switched pipeline decides the copies", func() bool {
		m := switched.Metrics()
		return m.Value("dedupe_events_in_total") == float64(len(again)) &&
			m.Value("dedupe_events_forwarded_total")+m.Value("dedupe_verdicts_total", "verdict", "duplicate") == float64(len(again))
	})
	m := switched.Metrics()
	if fw, dup := m.Value("dedupe_events_forwarded_total"), m.Value("dedupe_verdicts_total", "verdict", "duplicate"); fw != fresh || dup != float64(len(firstOf)) {
		t.Errorf("after the switch: %g forwarded, %g dropped; want the %d new ones forwarded and the %d seen in shadow dropped", fw, dup, fresh, len(firstOf))
	}
	before := map[string]bool{}
	for _, r := range shadowOut {
		before[src(r)] = true
	}
	after := 0
	for _, r := range k.Read("out-shadow") {
		if before[src(r)] {
			continue
		}
		after++
		if v := clickstream.Header(r, event.VerdictHeader); v != "" {
			t.Errorf("%s: forwarded in drop mode with %s %q", src(r), event.VerdictHeader, v)
		}
	}
	if after != fresh {
		t.Errorf("%d records forwarded after the switch, want %d", after, fresh)
	}
}

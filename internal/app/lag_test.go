package app

import (
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"dedupe-worker/config"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// lagInput is click events with event times from 'from' on, 100 ms apart,
// and three kinds of duplicate: an exact copy next in the log (same key,
// same partition); an exact copy 4 minutes of events later under another
// key (most likely another partition); and a copy stamped 4 minutes later,
// placed where its event time falls. In a 10-minute rolling window all
// are duplicates. pos[i] is when record i would be produced live: the
// event time of the newest event before it.
func lagInput(n int, from time.Time) (recs []*kgo.Record, pos []time.Time, tr clickstream.Truth) {
	tr = clickstream.Truth{Valid: map[string]bool{}}
	const step = 100 * time.Millisecond
	later := 4 * time.Minute
	delayed := map[int][]*kgo.Record{}
	add := func(at time.Time, rs ...*kgo.Record) {
		for _, r := range rs {
			recs = append(recs, r)
			pos = append(pos, at)
		}
	}
	value := func(id string, at time.Time) []byte {
		return fmt.Appendf(nil, `{"id":%q,"ts":%d}`, id, at.UnixMilli())
	}
	for i := 0; i < n; i++ {
		at := from.Add(time.Duration(i) * step)
		add(at, delayed[i]...)
		id := fmt.Sprintf("click-%d", i)
		v := value(id, at)
		add(at, &kgo.Record{Key: []byte(fmt.Sprint(i % 37)), Value: v})
		tr.Valid[id] = true
		switch i % 20 {
		case 0:
			add(at, &kgo.Record{Key: []byte(fmt.Sprint(i % 37)), Value: v})
		case 7:
			j := i + int(later/step)
			delayed[j] = append(delayed[j], &kgo.Record{Key: []byte(fmt.Sprint(i%37 + 100)), Value: v})
		case 13:
			j := i + int(later/step)
			delayed[j] = append(delayed[j], &kgo.Record{Key: []byte(fmt.Sprint(i%37 + 200)), Value: value(id, at.Add(later))})
		}
	}
	for _, j := range slices.Sorted(maps.Keys(delayed)) {
		if j >= n {
			add(from.Add(time.Duration(j)*step), delayed[j]...)
		}
	}
	tr.Total = len(recs)
	return recs, pos, tr
}

// fresh is the number of offsets the replicas decided for the first time
// (replays are counted apart), forwardable how many of those and of the
// replays are to be forwarded (or dead-lettered as late), and forwarded
// how many were.
func fresh(rs ...*replicas.Replica) (decided, forwardable, forwarded float64) {
	for _, r := range rs {
		m := r.Metrics()
		for _, v := range []string{"first_seen", "duplicate", "late", "future"} {
			decided += m.Value("dedupe_verdicts_total", "verdict", v)
		}
		for _, v := range []string{"first_seen", "late", "future", "replayed_first_seen", "replay_unknown"} {
			forwardable += m.Value("dedupe_verdicts_total", "verdict", v)
		}
		// Late and future events dead-lettered under the policy count as
		// delivered.
		forwarded += m.Value("dedupe_events_forwarded_total") + m.Value("dedupe_events_dead_lettered_total", "reason", "late") +
			m.Value("dedupe_events_dead_lettered_total", "reason", "future")
	}
	return decided, forwardable, forwarded
}

// settle waits until the replicas decided n offsets afresh and delivered
// everything they decided.
func settle(t *testing.T, n int, rs ...*replicas.Replica) {
	t.Helper()
	testenv.Eventually(t, 90*time.Second, fmt.Sprintf("%d offsets decided and delivered", n), func() bool {
		d, f, fw := fresh(rs...)
		if d > float64(n) {
			t.Fatalf("%g offsets decided afresh, more than the %d produced:\n%s", d, n, rs[0].Metrics().Show("dedupe_verdicts"))
		}
		return d == float64(n) && f == fw
	})
}

// idsOf is the set of dedupe-id values of records.
func idsOf(recs []*kgo.Record) map[string]bool {
	ids := map[string]bool{}
	for _, r := range recs {
		ids[clickstream.Header(r, event.IDHeader)] = true
	}
	return ids
}

// A backlog read 45 to 55 minutes after its event times, by two replicas
// with the default lag bound, is deduplicated as the same input read live:
// no duplicate passes, nothing is lost, no event is late, and the
// forwarded IDs are the same. A third reading of the same offsets (a new
// group on the same pipeline, as after offsets were lost) forwards
// nothing: every offset was delivered before.
func TestBacklogIsDeduplicatedAsLive(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 4, "out-live": 4, "out-backlog": 4, "out-replay": 4, "dlq": 1})
	srv := testenv.Redis(t)
	// The backlog is read with the clock of the test's start, so that the
	// events are 45 to 55 minutes old however long the test takes.
	now := testenv.Now()
	atStart := runAt(func() time.Time { return now })
	from := now.Add(-55 * time.Minute)
	recs, pos, tr := lagInput(6000, from)

	cfgFor := func(pipeline, out string) config.Config {
		c := replicas.Config(pipeline, k.Addrs(), srv.Addr)
		c.TimeField, c.OutputTopic = "ts", out
		return c
	}
	// Live: the input is produced 30 s of event time at a time, each part
	// decided before the next, with the clock a second past the part's
	// newest event: every event is decided within 30 s of its event time.
	var clock atomic.Int64
	live := replicas.Start(t, cfgFor("live", "out-live"), runAt(func() time.Time { return time.Unix(0, clock.Load()) }), nil)
	for lo := 0; lo < len(recs); {
		hi := lo
		for hi < len(recs) && pos[hi].Sub(pos[lo]) < 30*time.Second {
			hi++
		}
		clock.Store(pos[hi-1].Add(time.Second).UnixNano())
		k.Produce("in", recs[lo:hi]...)
		settle(t, hi, live)
		lo = hi
	}

	// Backlog: the same offsets in another pipeline, read by two replicas
	// 45 to 55 minutes after the event times. The test configuration's lag
	// bound is the default, 1h.
	a := replicas.Start(t, cfgFor("backlog", "out-backlog"), atStart, nil)
	b := replicas.Start(t, cfgFor("backlog", "out-backlog"), atStart, nil)
	settle(t, len(recs), a, b)
	outLive, outBacklog := k.Read("out-live"), k.Read("out-backlog")
	for name, out := range map[string][]*kgo.Record{"live": outLive, "backlog": outBacklog} {
		rep := clickstream.Check(tr, out, nil)
		if rep.Lost != 0 || rep.DuplicatesPass != 0 || rep.Unknown != 0 || rep.Conflicts != 0 {
			t.Errorf("%s: %v", name, rep)
		}
	}
	if l, bl := idsOf(outLive), idsOf(outBacklog); !maps.Equal(l, bl) || len(l) != len(tr.Valid) {
		t.Errorf("live forwarded %d IDs, the backlog %d; the sets differ or miss some of %d", len(l), len(bl), len(tr.Valid))
	}
	for _, r := range []*replicas.Replica{a, b} {
		if m := r.Metrics(); m.Value("dedupe_verdicts_total", "verdict", "late") != 0 || !m.Has("dedupe_event_lag_seconds") {
			t.Errorf("late verdicts or no lag histogram:\n%s", m.Show("dedupe_verdicts_total"))
		}
	}
	if d := a.Metrics().Value("dedupe_verdicts_total", "verdict", "duplicate") + b.Metrics().Value("dedupe_verdicts_total", "verdict", "duplicate"); d != float64(len(recs)-len(tr.Valid)) {
		t.Errorf("%g duplicates caught, want %d", d, len(recs)-len(tr.Valid))
	}

	// Replay: every offset again, in a new group of the backlog pipeline.
	// Every one was delivered before: each is skipped, nothing forwarded.
	rcfg := cfgFor("backlog", "out-replay")
	rcfg.GroupID = "dedupe-backlog-replay"
	r := replicas.Start(t, rcfg, atStart, nil)
	testenv.Eventually(t, 90*time.Second, "every offset replayed", func() bool {
		m := r.Metrics()
		return m.Value("dedupe_verdicts_total", "verdict", "replayed_delivered") == float64(len(recs)) &&
			m.Value("dedupe_replays_total", "outcome", "skipped") == float64(len(recs))
	})
	if m := r.Metrics(); m.Value("dedupe_events_forwarded_total") != 0 || m.Value("dedupe_replays_total", "outcome", "forwarded") != 0 {
		t.Errorf("the replay of delivered offsets forwarded some:\n%s", m.Show("dedupe_replays_total")+m.Show("dedupe_events_forwarded_total"))
	}
	if out := k.Read("out-replay"); len(out) != 0 {
		t.Errorf("the replay of delivered offsets wrote %d records", len(out))
	}
}

// clicks are events with IDs prefix-0.. and event times from 'from' on,
// step apart, each under its own key.
func clicks(prefix string, n int, from time.Time, step time.Duration) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: fmt.Appendf(nil, "%s-%d", prefix, i),
			Value: fmt.Appendf(nil, `{"id":"%s-%d","ts":%d}`, prefix, i, from.Add(time.Duration(i)*step).UnixMilli())}
	}
	return recs
}

// copies are recs again, under other keys.
func copies(recs []*kgo.Record) []*kgo.Record {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		out[i] = &kgo.Record{Key: append([]byte("copy-"), r.Key...), Value: r.Value}
	}
	return out
}

// playOutage decides n events stamped at, live, with the clock a few
// seconds past them; then every replica stops, the clock moves on 45
// minutes, and copies of those events arrive (as producers that retried
// during the outage send them) with n new events and n events stamped two
// hours ahead. It returns the replica that reads after the outage, once it
// has decided all of that. Redis expires keys by its own clock, so at is
// chosen so that the keys written live are not past their deadline by the
// real clock.
func playOutage(t *testing.T, k *testenv.Kafka, redisAddr string, n int, at time.Time, tune func(*config.Config)) *replicas.Replica {
	t.Helper()
	now := at.Add(45 * time.Minute)
	var clock atomic.Int64
	clock.Store(at.Add(5 * time.Second).UnixNano())
	run := runAt(func() time.Time { return time.Unix(0, clock.Load()) })
	cfg := func() config.Config {
		c := replicas.Config("outage", k.Addrs(), redisAddr)
		c.TimeField = "ts"
		tune(&c)
		return c
	}
	first := clicks("first", n, at, time.Millisecond)
	k.Produce("in", first...)
	before := replicas.Start(t, cfg(), run, nil)
	settle(t, n, before)
	if got := before.Metrics().Value("dedupe_verdicts_total", "verdict", "first_seen"); got != float64(n) {
		t.Fatalf("live: %g first seen, want %d", got, n)
	}
	if err := before.Stop(); err != nil {
		t.Fatal(err)
	}

	clock.Store(now.UnixNano())
	k.Produce("in", copies(first)...)
	k.Produce("in", clicks("new", n, now.Add(-time.Second), time.Millisecond)...)
	k.Produce("in", clicks("ahead", n, now.Add(2*time.Hour), time.Millisecond)...)
	after := replicas.Start(t, cfg(), run, nil)
	settle(t, 3*n, after)
	return after
}

// After an outage shorter than the bound, the copies of events decided
// before it are caught.
func TestOutageWithinTheBound(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
	const n = 500
	r := playOutage(t, k, testenv.Redis(t).Addr, n, testenv.Now().Add(-45*time.Minute), func(*config.Config) {})
	m := r.Metrics()
	for verdict, want := range map[string]float64{"duplicate": n, "first_seen": n, "late": 0, "future": n} {
		if got := m.Value("dedupe_verdicts_total", "verdict", verdict); got != want {
			t.Errorf("after the outage, %s: %g, want %g", verdict, got, want)
		}
	}
	out := k.Read("out")
	ids := idsOf(out)
	for _, p := range []string{"first", "new", "ahead"} {
		for i := range n {
			if !ids[fmt.Sprintf("%s-%d", p, i)] {
				t.Fatalf("%s-%d was never forwarded", p, i)
			}
		}
	}
	if len(out) != 3*n {
		t.Errorf("%d records forwarded, want %d: each ID once", len(out), 3*n)
	}
}

// Beyond the bound (an outage longer than a 10-minute bound), the
// copies are late by the clock, moved 45 minutes ahead of the real one: forwarded with the header that says so, or
// dead-lettered with reason late; events two hours ahead likewise, as
// future. Each is counted, none is lost.
func TestBeyondTheBound(t *testing.T) {
	const n = 300
	for _, policy := range []string{config.LateForward, config.LateDeadLetter} {
		t.Run(policy, func(t *testing.T) {
			k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
			r := playOutage(t, k, testenv.Redis(t).Addr, n, testenv.Now(), func(c *config.Config) {
				c.MaxLag, c.LatePolicy = 10*time.Minute, policy
			})
			m := r.Metrics()
			for verdict, want := range map[string]float64{"late": n, "future": n, "first_seen": n, "duplicate": 0} {
				if got := m.Value("dedupe_verdicts_total", "verdict", verdict); got != want {
					t.Errorf("%s: %g, want %g", verdict, got, want)
				}
			}
			out, dead := k.Read("out"), k.Read("dlq")
			marked := map[string]string{} // ID -> dedupe-undeduplicated
			for _, rec := range out {
				if h := clickstream.Header(rec, event.UndeduplicatedHeader); h != "" {
					marked[clickstream.Header(rec, event.IDHeader)] = h
				}
			}
			reasons := map[string]int{}
			for _, rec := range dead {
				reasons[clickstream.Header(rec, event.ReasonHeader)]++
			}
			if policy == config.LateForward {
				// Every copy and every event ahead forwarded and marked; the
				// first copies of the first events too (before the outage).
				if len(out) != 4*n || len(dead) != 0 {
					t.Fatalf("%d forwarded, %d dead letters; want %d and 0", len(out), len(dead), 4*n)
				}
				for i := range n {
					if marked[fmt.Sprintf("first-%d", i)] != "late" || marked[fmt.Sprintf("ahead-%d", i)] != "future" {
						t.Fatalf("first-%d marked %q, ahead-%d marked %q; want late and future",
							i, marked[fmt.Sprintf("first-%d", i)], i, marked[fmt.Sprintf("ahead-%d", i)])
					}
					if _, ok := marked[fmt.Sprintf("new-%d", i)]; ok {
						t.Fatalf("new-%d is marked, but was deduplicated", i)
					}
				}
			} else {
				if len(out) != 2*n || len(marked) != 0 || reasons["late"] != n || reasons["future"] != n || len(dead) != 2*n {
					t.Fatalf("%d forwarded (%d marked), dead letters by reason %v; want %d, none marked, %d late and %d future",
						len(out), len(marked), reasons, 2*n, n, n)
				}
				for reason, want := range map[string]float64{"late": n, "future": n} {
					if got := m.Value("dedupe_events_dead_lettered_total", "reason", reason); got != want {
						t.Errorf("dead-lettered %s: %g, want %g", reason, got, want)
					}
				}
			}
			if !m.Has("dedupe_max_lag_seconds") || m.Value("dedupe_max_lag_seconds") != 600 {
				t.Errorf("dedupe_max_lag_seconds: %g, want 600", m.Value("dedupe_max_lag_seconds"))
			}
		})
	}
}

// A daily fixed window, read 10 minutes behind across UTC midnight: the
// events of the end of the day before are decided after their window
// ended, and still deduplicated. The clock is set 10 minutes past the
// coming midnight, ahead of the real one, as Redis's expiries require.
func TestDailyWindowAcrossMidnight(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
	midnight := testenv.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)
	cfg := replicas.Config("daily", k.Addrs(), testenv.Redis(t).Addr)
	cfg.TimeField, cfg.Window, cfg.WindowMode = "ts", 24*time.Hour, "fixed"
	clock := midnight.Add(10 * time.Minute)
	// Fifteen minutes of events, ten before midnight, each sent twice: the
	// copy a few hundred records later, under another key.
	recs := clicks("c", 900, midnight.Add(-10*time.Minute), time.Second)
	input := append(append([]*kgo.Record{}, recs[:450]...), copies(recs[:450])...)
	input = append(append(input, recs[450:]...), copies(recs[450:])...)
	k.Produce("in", input...)
	r := replicas.Start(t, cfg, runAt(func() time.Time { return clock }), nil)
	settle(t, len(input), r)
	m := r.Metrics()
	for verdict, want := range map[string]float64{"first_seen": 900, "duplicate": 900, "late": 0} {
		if got := m.Value("dedupe_verdicts_total", "verdict", verdict); got != want {
			t.Errorf("%s: %g, want %g", verdict, got, want)
		}
	}
	if out := k.Read("out"); len(out) != 900 || len(idsOf(out)) != 900 {
		t.Errorf("%d forwarded, %d distinct IDs; want 900 of each", len(out), len(idsOf(out)))
	}
}

// A new group told to start at the latest offset forwards what arrives
// after its first replica started, and none of the history.
func TestStartAtLatest(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
	now := testenv.Now()
	k.Produce("in", clicks("old", 200, now.Add(-time.Minute), time.Millisecond)...)
	cfg := replicas.Config("latest", k.Addrs(), testenv.Redis(t).Addr)
	cfg.TimeField, cfg.StartOffset = "ts", "latest"
	r := replicas.Start(t, cfg, runWorker, nil)
	cl, err := kgo.NewClient(k.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// The start is committed before the replica joins: wait for it, so
	// that the new events come after it.
	testenv.Eventually(t, 30*time.Second, "the start offsets committed", func() bool {
		c, err := clickstream.Committed(t.Context(), cl, cfg.GroupID, "in")
		return err == nil && len(c) == 2 && c[0]+c[1] == 200
	})
	k.Produce("in", clicks("new", 100, now, time.Millisecond)...)
	settle(t, 100, r)
	out := k.Read("out")
	ids := idsOf(out)
	if len(out) != 100 || len(ids) != 100 || !ids["new-0"] || !ids["new-99"] {
		t.Errorf("%d forwarded (%d IDs); want the 100 new ones only", len(out), len(ids))
	}
}

// runAt is Run with the clock now in place of the real one, for the
// decisions that depend on the present (late events, the start offset
// given as a duration, the event-time lag): to play an outage. Keep now
// near the real clock, which Redis expires keys by.
func runAt(now func() time.Time) replicas.RunFunc {
	return replicas.Runs(func(cfg config.Config, log *zap.Logger) (*Worker, error) { return newAt(cfg, log, now) })
}

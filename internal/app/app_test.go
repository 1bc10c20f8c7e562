package app

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// runWorker runs a worker as the dedupe-worker command does: New, then
// Worker.Run.
var runWorker = replicas.Runs(New)

// The whole worker from its configuration: it becomes ready, forwards,
// exports metrics, turns unready while Redis is stalled and ready again
// after, and stops within its bound when cancelled.
func TestRunLifecycle(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 2})
	srv := testenv.Redis(t)
	cfg := replicas.Config("life", k.Addrs(), srv.Addr)
	cfg.RedisTimeout = 300 * time.Millisecond
	r := replicas.Start(t, cfg, runWorker, nil)
	produce := func(from, to int) {
		var recs []*kgo.Record
		for i := from; i < to; i++ {
			recs = append(recs, &kgo.Record{Value: []byte(fmt.Sprintf(`{"id":"e%d"}`, i%((to-from)/2+from)))})
		}
		k.Produce("in", append(recs, &kgo.Record{Value: []byte(`garbage`)})...)
	}
	const limit = 30 * time.Second
	eventsIn := func(n float64) func() bool {
		return func() bool { return r.Metrics().Value("dedupe_events_in_total") == n }
	}

	produce(0, 200)
	testenv.Eventually(t, limit, "readiness", r.Ready)
	if c := r.Status("/healthz"); c != 200 {
		t.Fatalf("healthz %d", c)
	}
	testenv.Eventually(t, limit, "201 events counted", eventsIn(201))
	m := r.Metrics()
	if got := m.Value("dedupe_verdicts_total", "pipeline", "life", "verdict", "first_seen"); got != 100 {
		t.Errorf("first seen: %g, want 100", got)
	}
	if got := m.Value("dedupe_verdicts_total", "pipeline", "life", "verdict", "duplicate"); got != 100 {
		t.Errorf("duplicates: %g, want 100", got)
	}
	if got := m.Value("dedupe_events_dead_lettered_total", "pipeline", "life", "reason", "not_json"); got != 1 {
		t.Errorf("dead letters: %g, want 1", got)
	}
	for _, name := range []string{"dedupe_consumer_lag", "dedupe_fetch_to_produce_seconds", "dedupe_redis_call_seconds",
		"dedupe_batch_size", "dedupe_filter_fill_ratio", "dedupe_filter_false_positive_rate"} {
		if !m.Has(name) {
			t.Errorf("no metric %s", name)
		}
	}
	for _, name := range []string{"dedupe_fetch_to_produce_seconds", "dedupe_redis_call_seconds", "dedupe_batch_size"} {
		if m.Value(name) == 0 {
			t.Errorf("%s observed nothing", name)
		}
	}

	// Redis stalls: the next batch cannot be decided, readiness drops, and
	// comes back when Redis does.
	srv.Pause()
	produce(200, 260)
	testenv.Eventually(t, limit, "unready while Redis is stalled", func() bool { return r.Status("/readyz") == 503 })
	srv.Resume()
	testenv.Eventually(t, limit, "ready again", r.Ready)
	testenv.Eventually(t, limit, "all 262 events counted", eventsIn(262))

	// Kafka refuses the worker's produce requests to the output topic for
	// three seconds: the worker retries, is not ready meanwhile, and
	// forwards everything after.
	var until atomic.Int64
	var injected atomic.Int64
	k.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		if len(pr.Topics) > 0 && pr.Topics[0].Topic == "out" && time.Now().UnixNano() < until.Load() {
			injected.Add(1)
			return nil, errors.New("injected produce failure"), true
		}
		return nil, nil, false
	})
	until.Store(time.Now().Add(3 * time.Second).UnixNano())
	produce(262, 322)
	testenv.Eventually(t, limit, "unready while Kafka refuses produces", func() bool { return r.Status("/readyz") == 503 })
	testenv.Eventually(t, limit, "ready after Kafka recovers", r.Ready)
	testenv.Eventually(t, limit, "all 323 events counted", eventsIn(323))
	if injected.Load() == 0 {
		t.Error("no produce request was refused: the fault did not happen")
	}
	// Everything decided "forward" (first seen, or a replay of a first-seen
	// decision after the stalled call above) has been produced.
	testenv.Eventually(t, limit, "every event decided forward produced", func() bool {
		m := r.Metrics()
		want := m.Value("dedupe_verdicts_total", "pipeline", "life", "verdict", "first_seen") +
			m.Value("dedupe_verdicts_total", "pipeline", "life", "verdict", "replayed_first_seen")
		return want > 0 && m.Value("dedupe_events_forwarded_total") == want
	})
	t.Logf("%d produce requests refused", injected.Load())

	start := time.Now()
	if err := r.Stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("stopped in %v", time.Since(start))
}

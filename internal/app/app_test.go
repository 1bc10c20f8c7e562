package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"dedupe-worker/config"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testenv"
)

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The whole worker from its configuration: it becomes ready, forwards,
// exports metrics, turns unready while Redis is stalled and ready again
// after, and stops within its bound when cancelled.
func TestRunLifecycle(t *testing.T) {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "in", "out", "dlq"), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	srv := testenv.Redis(t)
	cfg := config.Config{
		Pipeline: "life", KafkaBrokers: broker.ListenAddrs(), InputTopic: "in", OutputTopic: "out", DLQTopic: "dlq",
		GroupID: "dedupe-life", RedisAddrs: []string{srv.Addr}, IDField: "id", Window: 10 * time.Minute, WindowMode: "rolling",
		WindowGrace: time.Minute, ExpectedPerWindow: 100_000, FalsePositiveRate: 1e-6, Shards: 1, BatchSize: 100,
		BatchLinger: 20 * time.Millisecond, HTTPAddr: redisproc.FreeAddr(), LogLevel: "warn", RedisTimeout: 300 * time.Millisecond,
		KafkaTimeout: 5 * time.Second, KafkaSessionTimeout: 2 * time.Second, ShutdownTimeout: 10 * time.Second,
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel))) }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(from, to int) {
		var recs []*kgo.Record
		for i := from; i < to; i++ {
			recs = append(recs, &kgo.Record{Value: []byte(fmt.Sprintf(`{"id":"e%d"}`, i%((to-from)/2+from)))})
		}
		recs = append(recs, &kgo.Record{Value: []byte(`garbage`)})
		if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://" + cfg.HTTPAddr
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	metric := func(name string) string {
		_, body := get(base + "/metrics")
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, name) {
				return line
			}
		}
		return ""
	}

	produce(0, 200)
	waitFor("readiness", func() bool { c, _ := get(base + "/readyz"); return c == 200 })
	if c, _ := get(base + "/healthz"); c != 200 {
		t.Fatalf("healthz %d", c)
	}
	waitFor("201 events counted", func() bool { return strings.HasSuffix(metric("dedupe_events_in_total"), " 201") })
	if got := metric(`dedupe_verdicts_total{pipeline="life",verdict="first_seen"}`); !strings.HasSuffix(got, " 100") {
		t.Errorf("first seen: %q", got)
	}
	if got := metric(`dedupe_events_dead_lettered_total{pipeline="life",reason="not_json"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("dead letters: %q", got)
	}
	for _, name := range []string{"dedupe_consumer_lag{", "dedupe_fetch_to_produce_seconds_count", "dedupe_redis_call_seconds_count",
		"dedupe_batch_size_count", "dedupe_filter_fill_ratio{", "dedupe_filter_false_positive_rate{"} {
		if metric(name) == "" {
			t.Errorf("no metric %s", name)
		}
	}

	// Redis stalls: the next batch cannot be decided, readiness drops, and
	// comes back when Redis does.
	srv.Pause()
	produce(200, 260)
	waitFor("unready while Redis is stalled", func() bool { c, _ := get(base + "/readyz"); return c == 503 })
	srv.Resume()
	waitFor("ready again", func() bool { c, _ := get(base + "/readyz"); return c == 200 })
	waitFor("all 262 events counted", func() bool { return strings.HasSuffix(metric("dedupe_events_in_total"), " 262") })

	// Kafka refuses the worker's produce requests to the output topic for
	// three seconds: the worker retries, is not ready meanwhile, and
	// forwards everything after.
	var until atomic.Int64
	var injected atomic.Int64
	broker.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		broker.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		if len(pr.Topics) > 0 && pr.Topics[0].Topic == "out" && time.Now().UnixNano() < until.Load() {
			injected.Add(1)
			return nil, errors.New("injected produce failure"), true
		}
		return nil, nil, false
	})
	until.Store(time.Now().Add(3 * time.Second).UnixNano())
	produce(262, 322)
	waitFor("unready while Kafka refuses produces", func() bool { c, _ := get(base + "/readyz"); return c == 503 })
	waitFor("ready after Kafka recovers", func() bool { c, _ := get(base + "/readyz"); return c == 200 })
	waitFor("all 323 events counted", func() bool { return strings.HasSuffix(metric("dedupe_events_in_total"), " 323") })
	// Everything decided "forward" (first seen, or a replay of a first-seen
	// decision after the stalled call above) has been produced.
	value := func(line string) int {
		f := strings.Fields(line)
		if len(f) < 2 {
			return 0
		}
		n, _ := strconv.Atoi(f[1])
		return n
	}
	waitFor("every event decided forward produced", func() bool {
		want := value(metric(`dedupe_verdicts_total{pipeline="life",verdict="first_seen"}`)) +
			value(metric(`dedupe_verdicts_total{pipeline="life",verdict="replayed_first_seen"}`))
		return want > 0 && value(metric("dedupe_events_forwarded_total")) == want
	})
	t.Logf("%d produce requests refused", injected.Load())

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(cfg.ShutdownTimeout + 10*time.Second):
		t.Fatal("Run did not return within its shutdown bound")
	}
	t.Logf("stopped in %v", time.Since(start))
}

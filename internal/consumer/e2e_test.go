package consumer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/redisproc/redistest"
	"dedupe-worker/internal/sink"
)

const (
	inTopic  = "clicks"
	outTopic = "clicks-out"
	dlqTopic = "clicks-dlq"
)

func newBroker(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, inTopic, outTopic), kfake.SeedTopics(1, dlqTopic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// truth is what the input holds.
type truth struct {
	valid     map[string]bool // distinct valid click IDs
	malformed int
	total     int
}

// produceClicks writes n click events: dupShare of them repeat an earlier
// click (same ID and time), badShare are malformed in assorted ways.
func produceClicks(t *testing.T, brokers []string, n int, dupShare, badShare float64) truth {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(inTopic), kgo.ProducerBatchMaxBytes(2<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	tr := truth{valid: map[string]bool{}, total: n}
	now := time.Now().UnixMilli()
	var ids []string
	bad := []string{`not json`, `{"click_id":null,"ts":%d}`, `{"click_id":"","ts":%d}`, `{"ts":%d}`,
		`{"click_id":"x-%d","ts":"yesterday"}`, `{"click_id":{"a":1},"ts":%d}`, strings.Repeat("[", 300) + `%d`, "\xff\xfe%d",
		"{\"click_id\":\"bad-\xff\xfe\",\"ts\":%d}", `{"click_id":true,"ts":%d}`, `{"click_id":"y","ts":%d`}
	// Valid but unusual: a number ID, a duplicated key (the first counts),
	// an escaped ID, a 600 kB payload. Each is repeated once later.
	odd := []struct{ id, value string }{
		{"4242", `{"click_id":4242,"ts":%d}`},
		{"first", `{"click_id":"first","click_id":"second","ts":%d}`},
		{`q"uote\`, `{"click_id":"q\"uote\\","ts":%d}`},
		{"big", `{"click_id":"big","ts":%d,"pad":"` + strings.Repeat("x", 600<<10) + `"}`},
	}
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		var v string
		switch r := rng.Float64(); {
		case r < badShare:
			v = fmt.Sprintf(bad[tr.malformed%len(bad)], now)
			tr.malformed++
		case r < badShare+dupShare && len(ids) > 0:
			v = ids[rng.IntN(len(ids))]
		default:
			id := fmt.Sprintf("click-%d", i)
			v = fmt.Sprintf(`{"click_id":%q,"ts":%d,"page":"/p/%d","user":"u%d"}`, id, now, i%97, i%1013)
			ids = append(ids, v)
			tr.valid[id] = true
		}
		recs = append(recs, &kgo.Record{Key: []byte(strconv.Itoa(i % 64)), Value: []byte(v)})
		if i == n/3 || i == 2*n/3 {
			for _, o := range odd {
				recs = append(recs, &kgo.Record{Key: []byte(o.id), Value: fmt.Appendf(nil, o.value, now)})
				tr.valid[o.id] = true
				tr.total++
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return tr
}

// readAll reads every record of topic.
func readAll(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r); n++ })
		if n == 0 {
			return out
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func distinctSources(rs []*kgo.Record) int {
	seen := map[string]bool{}
	for _, r := range rs {
		seen[header(r, sink.SourceHeader)] = true
	}
	return len(seen)
}

type replica struct {
	w      *Worker
	cancel context.CancelFunc
	done   chan error
}

func startReplica(t *testing.T, brokers []string, redisAddr string, name string) *replica {
	t.Helper()
	log := zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel)).Named(name)
	rc := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rc.Close() })
	plan, err := bloom.NewPlan(100_000, 1e-6, bloom.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := bloom.New(rc, bloom.Config{Pipeline: "e2e", Plan: plan, Windows: bloom.Windows{Length: 10 * time.Minute, Mode: bloom.Rolling}})
	if err != nil {
		t.Fatal(err)
	}
	ex, _ := NewExtractor("click_id", "ts")
	out := sink.New(sink.Config{Brokers: brokers, Topic: outTopic, Logger: log})
	dlq := sink.New(sink.Config{Brokers: brokers, Topic: dlqTopic, Logger: log})
	t.Cleanup(func() { out.Close(); dlq.Close() })
	w, err := New(Config{Brokers: brokers, Topic: inTopic, GroupID: "dedupe-e2e", BatchSize: 500, BatchLinger: 50 * time.Millisecond,
		SessionTimeout: 2 * time.Second, ShutdownTimeout: 10 * time.Second, Extractor: ex, Logger: log}, f, out, dlq)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	return r
}

func (r *replica) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("replica stopped with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("replica did not stop within 20s")
	}
}

// Two replicas share the work of one group; the output holds each
// distinct valid click once (by dedupe-source), the dead-letter topic
// every malformed record with a reason, and each input partition's order.
func TestTwoReplicasEndToEnd(t *testing.T) {
	broker := newBroker(t)
	brokers := broker.ListenAddrs()
	srv := redistest.Server(t)
	tr := produceClicks(t, brokers, 20_000, 0.07, 0.01)

	a := startReplica(t, brokers, srv.Addr, "a")
	b := startReplica(t, brokers, srv.Addr, "b")
	// Stop one replica while it is busy: it must finish its batch and leave
	// the group cleanly, and the other takes over its partitions.
	for distinctSources(readAll(t, brokers, outTopic)) < len(tr.valid)/4 {
		time.Sleep(20 * time.Millisecond)
	}
	a.stop(t)
	// Wait until every input record has been decided: as many distinct
	// sources in the output and dead-letter topics as the input holds
	// (fewer if something is lost; the checks below then say what).
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		if distinctSources(readAll(t, brokers, outTopic)) >= len(tr.valid) &&
			distinctSources(readAll(t, brokers, dlqTopic)) >= tr.malformed {
			break
		}
	}
	var wg sync.WaitGroup
	for _, r := range []*replica{b} {
		wg.Add(1)
		go func() { defer wg.Done(); r.stop(t) }()
	}
	wg.Wait()

	out := readAll(t, brokers, outTopic)
	sources := map[string]string{} // dedupe-source -> click id
	lastOffset := map[string]int64{}
	for _, r := range out {
		src, id := header(r, sink.SourceHeader), header(r, IDHeader)
		if prev, ok := sources[src]; ok {
			if prev != id {
				t.Fatalf("source %s forwarded as %s and %s", src, prev, id)
			}
			continue // a replay: an exact copy, allowed after a rebalance
		}
		sources[src] = id
		// Order: first copies of one input partition's offsets rise within
		// an output partition.
		parts := strings.Split(src, "/")
		off, _ := strconv.ParseInt(parts[2], 10, 64)
		key := fmt.Sprintf("%d<-%s", r.Partition, parts[1])
		if off < lastOffset[key] {
			t.Errorf("output partition %d has input offset %s/%d after %d", r.Partition, parts[1], off, lastOffset[key])
		}
		lastOffset[key] = off
	}
	perID := map[string]int{}
	for _, id := range sources {
		perID[id]++
	}
	lost, extra := 0, 0
	for id := range tr.valid {
		switch perID[id] {
		case 0:
			lost++
		case 1:
		default:
			extra++
		}
	}
	for id := range perID {
		if !tr.valid[id] {
			t.Errorf("forwarded %q, which is not a valid input ID", id)
		}
	}
	if lost > 0 || extra > 0 {
		t.Errorf("%d distinct IDs: %d lost, %d forwarded from more than one source", len(tr.valid), lost, extra)
	}

	dead := readAll(t, brokers, dlqTopic)
	deadSources := map[string]bool{}
	for _, r := range dead {
		if header(r, ErrorHeader) == "" {
			t.Errorf("dead letter %q without a reason", r.Value)
		}
		deadSources[header(r, sink.SourceHeader)] = true
	}
	if len(deadSources) != tr.malformed {
		t.Errorf("%d distinct dead letters, %d malformed records produced", len(deadSources), tr.malformed)
	}
	t.Logf("input %d, distinct valid %d, malformed %d; output %d records (%d sources), dead letters %d",
		tr.total, len(tr.valid), tr.malformed, len(out), len(sources), len(dead))
}

package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/clicktest"
	"dedupe-worker/internal/sink"
	"dedupe-worker/internal/testenv"
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
	srv := testenv.Redis(t)
	recs, tr := clicktest.Generate(20_000, 0.07, 0.01, 1)
	if err := clicktest.Produce(context.Background(), brokers, inTopic, recs); err != nil {
		t.Fatal(err)
	}
	read := func(topic string) []*kgo.Record {
		rs, err := clicktest.ReadAll(brokers, topic)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}

	a := startReplica(t, brokers, srv.Addr, "a")
	b := startReplica(t, brokers, srv.Addr, "b")
	// Stop one replica while it is busy: it must finish its batch and leave
	// the group cleanly, and the other takes over its partitions.
	for clicktest.DistinctSources(read(outTopic)) < len(tr.Valid)/4 {
		time.Sleep(20 * time.Millisecond)
	}
	a.stop(t)
	// Wait until every input record has been decided: as many distinct
	// sources in the output and dead-letter topics as the input holds
	// (fewer if something is lost; the checks below then say what).
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		if clicktest.DistinctSources(read(outTopic)) >= len(tr.Valid) && clicktest.DistinctSources(read(dlqTopic)) >= tr.Malformed {
			break
		}
	}
	b.stop(t)

	rep := clicktest.Check(tr, read(outTopic), read(dlqTopic))
	if !rep.OK() {
		t.Error(rep)
	}
	t.Logf("input %d: %v", tr.Total, rep)
}

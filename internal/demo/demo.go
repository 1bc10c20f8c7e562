// Package demo runs the whole pipeline on one machine (the demo command):
// a Kafka-protocol broker, redis-server, two worker replicas, a click
// generator with a known ground truth, and a verifier that reports what
// became of every event.
package demo

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/redisproc"
)

// Topics and group of the demo pipeline.
const (
	InputTopic  = "clicks"
	OutputTopic = "clicks-deduped"
	DLQTopic    = "clicks-dlq"
	Group       = "dedupe-demo"
	Replicas    = 2
	// IDHeader holds the click ID with -id-from header; TimeHeader the
	// event time (Unix milliseconds) with key, header and value.
	IDHeader   = "click-id"
	TimeHeader = "event-time"
)

// ErrNoRedis is returned when redis-server is not on the PATH.
var ErrNoRedis = errors.New("redis-server is not on the PATH: install the Debian/Ubuntu package redis-server (apt-get install redis-server), or on macOS run brew install redis")

// ErrInvalidOptions wraps the errors of options out of range.
var ErrInvalidOptions = errors.New("invalid option")

// Run runs the demo: a Kafka-protocol broker in this process, a
// redis-server child process, two worker replicas (each built by app.New,
// one consumer group), a generator with a known ground truth, and the
// verifier. It returns an error when the run could not be completed; what
// the verifier found is in the Result.
func Run(ctx context.Context, o Options) (*Result, error) {
	o.setDefaults()
	res, err := newResult(o)
	if err != nil {
		return nil, err
	}
	logs := &logBuffer{}
	if o.Verbose {
		logs.echo = o.Progress
	}
	defer func() { res.Log, res.LogLines = logs.snapshot() }()
	srv, err := startServers(ctx, res.Partitions)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	cfgs, err := replicaConfigs(o, srv.brokers, srv.redisAddr)
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, cfgs[0])
	if err != nil {
		return nil, err
	}
	defer st.rc.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(srv.brokers...), kgo.DefaultProduceTopic(InputTopic))
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	reps, err := startReplicas(ctx, cfgs, newLogger(logs))
	if err != nil {
		return nil, err
	}
	defer func() { res.WorkerErrors = append(res.WorkerErrors, reps.stop()...) }()
	if err := waitForGroup(ctx, cl, reps.early); err != nil {
		return res, err
	}
	tr, final, err := feed(ctx, o, cl, res, reps)
	if err != nil {
		return res, err
	}
	decided, err := readDecisions(ctx, st, o, tr, res)
	if err != nil {
		return res, err
	}
	res.WorkerErrors = append(res.WorkerErrors, reps.stop()...)
	out, dead, err := readTopics(ctx, srv.brokers)
	if err != nil {
		return res, err
	}
	judge(res, tr, out, dead, decided, final)
	return res, nil
}

// newResult checks o and that redis-server can be run, and starts the
// result with the filter's plan, the input's partitions and the ID source.
func newResult(o Options) (*Result, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if _, err := redisproc.ServerProgram(); errors.Is(err, redisproc.ErrNotInstalled) {
		return nil, ErrNoRedis
	} else if err != nil {
		return nil, err
	}
	plan, err := bloom.NewPlan(o.Expected, o.P, bloom.PlanOptions{MinShards: 1, MaxGrowth: o.MaxGrowth})
	if err != nil {
		return nil, err
	}
	res := &Result{Options: o, Plan: plan, Partitions: partitionsFor(o.N)}
	if res.IDSource, err = workerConfig(o, nil, "", "").IDSource(); err != nil {
		return nil, err
	}
	return res, nil
}

// feed produces the click events, showing the replicas' progress from
// their own /metrics, and waits until the group has committed every
// offset produced. It returns the ground truth and the replicas' last
// counters, and sets res.Elapsed.
func feed(ctx context.Context, o Options, cl *kgo.Client, res *Result, reps *replicas) (*truth, snapshot, error) {
	var produced atomic.Int64
	mon := startMonitor(ctx, o, reps.metricsURLs(), &produced)
	start := time.Now()
	tr := newTruth(o.N)
	ends, err := produce(ctx, o, cl, tr, &produced)
	if err == nil {
		err = waitCommitted(ctx, cl, res.Partitions, ends, reps.early)
	}
	if err != nil {
		mon.stop("")
		return nil, snapshot{}, err
	}
	res.Elapsed = time.Since(start)
	final := mon.stop(fmt.Sprintf("done in %v", res.Elapsed.Round(time.Millisecond)))
	return tr, final, nil
}

// produce writes o.N click events to the input, 5,000 at a time, and
// remembers in tr where each went. It returns the end offset of each
// partition.
func produce(ctx context.Context, o Options, cl *kgo.Client, tr *truth, produced *atomic.Int64) (map[int32]int64, error) {
	ends := map[int32]int64{}
	stream := clickstream.NewStream(o.Dup, o.Bad, o.Seed, func() time.Time { return time.Now().Add(-o.Behind) })
	for sent := 0; sent < o.N; {
		k := min(5000, o.N-sent)
		evs := make([]clickstream.Event, k)
		recs := make([]*kgo.Record, k)
		for j := range evs {
			recs[j], evs[j] = o.record(stream.Next())
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := cl.ProduceSync(pctx, recs...).FirstErr()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("producing the click events: %w", err)
		}
		for j, r := range recs {
			tr.add(evs[j], r.Partition, r.Offset)
			ends[r.Partition] = max(ends[r.Partition], r.Offset+1)
		}
		sent += k
		produced.Store(int64(sent))
	}
	return ends, nil
}

// readDecisions reads what Redis holds before anything is stopped: the
// memory and the filter's statistics into res, and the decision recorded
// for each input event, in the order of tr.inputs.
func readDecisions(ctx context.Context, st *store, o Options, tr *truth, res *Result) ([]bloom.Recorded, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := redisFacts(rctx, st.rc, st.filter, o, tr, res, st.memBefore); err != nil {
		return nil, err
	}
	elems, idx := tr.elements(InputTopic)
	rec, err := st.filter.Recorded(rctx, elems)
	if err != nil {
		return nil, fmt.Errorf("reading the decision records: %w", err)
	}
	decided := make([]bloom.Recorded, len(tr.inputs))
	for k, i := range idx {
		decided[i] = rec[k]
	}
	return decided, nil
}

// readTopics reads the output and the dead letters, once the replicas
// have stopped.
func readTopics(ctx context.Context, brokers []string) (out, dead []*kgo.Record, err error) {
	kctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if out, err = clickstream.ReadToEnd(kctx, brokers, OutputTopic); err != nil {
		return nil, nil, err
	}
	if dead, err = clickstream.ReadToEnd(kctx, brokers, DLQTopic); err != nil {
		return nil, nil, err
	}
	return out, dead, nil
}

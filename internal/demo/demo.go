// Package demo runs the whole pipeline on one machine (the demo command):
// a Kafka-protocol broker, redis-server, two worker replicas, a click
// generator with a known ground truth, and a verifier that reports what
// became of every event.
package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
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

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr() (string, error) {
	port, err := redisproc.FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// logBuffer keeps the first 256 kB of the workers' log and counts its
// lines.
type logBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines int
	echo  io.Writer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines += bytes.Count(p, []byte{'\n'})
	if l.buf.Len() < 256<<10 {
		l.buf.Write(p)
	}
	if l.echo != nil {
		l.echo.Write(p)
	}
	return len(p), nil
}

func (l *logBuffer) snapshot() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String(), l.lines
}

// Run runs the demo: a Kafka-protocol broker in this process, a
// redis-server child process, two worker replicas (app.Run, one consumer
// group), a generator with a known ground truth, and the verifier. It
// returns an error when the run could not be completed; what the verifier
// found is in the Result.
func Run(ctx context.Context, o Options) (*Result, error) {
	o.setDefaults()
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
	logs := &logBuffer{}
	if o.Verbose {
		logs.echo = o.Progress
	}
	defer func() { res.Log, res.LogLines = logs.snapshot() }()

	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	redisAddr, stopRedis, err := startRedis(sctx)
	cancel()
	if err != nil {
		return nil, err
	}
	defer stopRedis()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(res.Partitions, InputTopic, OutputTopic),
		kfake.SeedTopics(1, DLQTopic), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("starting the Kafka-protocol broker: %w", err)
	}
	defer broker.Close()
	brokers := broker.ListenAddrs()

	cfgs := make([]config.Config, Replicas)
	for i := range cfgs {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		cfgs[i] = workerConfig(o, brokers, redisAddr, addr)
		if err := cfgs[i].Validate(); err != nil {
			return nil, err
		}
	}
	rc, err := app.NewRedis(cfgs[0])
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	filter, err := app.NewFilter(cfgs[0], rc)
	if err != nil {
		return nil, err
	}
	if err := filter.CheckServer(ctx); err != nil {
		return nil, err
	}
	memBefore, err := usedMemory(ctx, rc)
	if err != nil {
		return nil, err
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(InputTopic))
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	// The replicas.
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	logger := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(logs), zap.WarnLevel))
	wctx, cancelWorkers := context.WithCancel(ctx)
	defer cancelWorkers()
	dones := make([]chan error, Replicas)
	for i := range cfgs {
		dones[i] = make(chan error, 1)
		go func() { dones[i] <- app.Run(wctx, cfgs[i], logger.With(zap.Int("replica", i+1))) }()
	}
	stopped := false
	stopWorkers := func() {
		if stopped {
			return
		}
		stopped = true
		cancelWorkers()
		for i, d := range dones {
			select {
			case err := <-d:
				if err != nil {
					res.WorkerErrors = append(res.WorkerErrors, fmt.Errorf("replica %d: %w", i+1, err))
				}
			case <-time.After(cfgs[i].ShutdownTimeout + 10*time.Second):
				res.WorkerErrors = append(res.WorkerErrors, fmt.Errorf("replica %d did not stop within %v", i+1, cfgs[i].ShutdownTimeout+10*time.Second))
			}
		}
	}
	defer stopWorkers()
	early := func() error {
		for i, d := range dones {
			select {
			case err := <-d:
				dones[i] <- err // for stopWorkers
				return fmt.Errorf("replica %d stopped early: %v", i+1, err)
			default:
			}
		}
		return nil
	}
	if err := waitForGroup(ctx, cl, early); err != nil {
		return res, err
	}

	// Progress, from the replicas' own /metrics.
	urls := make([]string, Replicas)
	for i, c := range cfgs {
		urls[i] = "http://" + c.HTTPAddr + "/metrics"
	}
	var produced atomic.Int64
	mon := startMonitor(ctx, o, urls, &produced)

	// Produce, remembering where each event went.
	start := time.Now()
	tr := newTruth(o.N)
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
			mon.stop("")
			return res, fmt.Errorf("producing the click events: %w", err)
		}
		for j, r := range recs {
			tr.add(evs[j], r.Partition, r.Offset)
			ends[r.Partition] = max(ends[r.Partition], r.Offset+1)
		}
		sent += k
		produced.Store(int64(sent))
	}

	// Wait until the group has committed every offset produced.
	if err := waitCommitted(ctx, cl, res.Partitions, ends, early); err != nil {
		mon.stop("")
		return res, err
	}
	res.Elapsed = time.Since(start)
	final := mon.stop(fmt.Sprintf("done in %v", res.Elapsed.Round(time.Millisecond)))

	// What Redis holds, before anything is stopped.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := redisFacts(rctx, rc, filter, o, tr, res, memBefore); err != nil {
		return res, err
	}
	elems, idx := tr.elements(InputTopic)
	rec, err := filter.Recorded(rctx, elems)
	if err != nil {
		return res, fmt.Errorf("reading the decision records: %w", err)
	}
	decided := make([]bloom.Recorded, len(tr.inputs))
	for k, i := range idx {
		decided[i] = rec[k]
	}
	stopWorkers()

	kctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := clickstream.ReadToEnd(kctx, brokers, OutputTopic)
	if err != nil {
		return res, err
	}
	dead, err := clickstream.ReadToEnd(kctx, brokers, DLQTopic)
	if err != nil {
		return res, err
	}

	judge(res, tr, out, dead, decided, final)
	return res, nil
}

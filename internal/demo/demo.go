// Package demo runs the whole pipeline on one machine (the demo command),
// and holds the load generator and the downstream counter that a
// docker-compose setup runs beside real workers (generate and count).
package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/consumer"
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

// Options configure a demo run.
type Options struct {
	N        int           // events to produce
	Dup, Bad float64       // shares of repeated and malformed events
	Window   time.Duration // deduplication window
	// Behind stamps the events this long before the clock, as a backlog
	// read after an outage; MaxLag is the workers' lag bound (default 1h).
	Behind, MaxLag time.Duration
	// MaxGrowth is how far a window may grow past Expected (default 64).
	MaxGrowth float64
	P         float64 // target false-positive rate
	// Expected is the filter's capacity: distinct IDs per window. 0 sizes
	// it for the distinct IDs the run is expected to have, so the filter
	// ends the run at its planned load and rate.
	Expected int64
	Seed     uint64
	// IDFrom is where the workers read the ID (DEDUPE_ID_FROM): json (the
	// default: the click_id field, the time in ts), key, header or value.
	// With the last three the event time is in the header TimeHeader, the
	// ID in the key or the header IDHeader, and a malformed event is one
	// without them (for value: with an empty value).
	IDFrom string
	// Mode is the workers' DEDUPE_MODE: drop (the default) or shadow.
	Mode string
	// Progress receives the live progress line (nil: none) and, with
	// Verbose, the workers' log.
	Progress io.Writer
	// Terminal rewrites the progress line in place instead of adding one
	// every two seconds.
	Terminal bool
	Verbose  bool
}

func (o *Options) setDefaults() {
	d := config.Defaults()
	if o.Expected == 0 {
		o.Expected = max(1, int64(math.Ceil(float64(o.N)*(1-o.Dup-o.Bad))))
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Window == 0 {
		o.Window = d.Window
	}
	if o.P == 0 {
		o.P = d.FalsePositiveRate
	}
	if o.MaxLag == 0 {
		o.MaxLag = d.MaxLag
	}
	if o.MaxGrowth == 0 {
		o.MaxGrowth = d.MaxGrowth
	}
	if o.IDFrom == "" {
		o.IDFrom = d.IDFrom
	}
	if o.Mode == "" {
		o.Mode = d.Mode
	}
}

// validate checks the options of the demo itself; those it hands to the
// workers are checked by config.Validate, as any worker's are, and named
// by their flags (flagOf).
func (o Options) validate() error {
	switch {
	case o.N < 1 || o.N > 10_000_000:
		return fmt.Errorf("-n %d: want 1 to 10000000 events", o.N)
	case !(o.Dup >= 0 && o.Dup < 1), !(o.Bad >= 0 && o.Bad < 1), o.Dup+o.Bad >= 1:
		return fmt.Errorf("-dup %g, -bad %g: want shares from 0 to below 1, together below 1", o.Dup, o.Bad)
	case o.Behind < 0 || o.Behind > 744*time.Hour:
		return fmt.Errorf("-behind %v: want 0 to 744h", o.Behind)
	}
	err := workerConfig(o, []string{"127.0.0.1:9092"}, "127.0.0.1:6379", ":0").Validate()
	if ve := (*config.VarError)(nil); errors.As(err, &ve) && flagOf[ve.Var] != "" {
		return fmt.Errorf("%s: %s", flagOf[ve.Var], ve.Msg)
	}
	return err
}

// flagOf names the demo flag that sets each worker variable.
var flagOf = map[string]string{"WINDOW": "-window", "MAX_LAG": "-max-lag", "FALSE_POSITIVE_RATE": "-p",
	"EXPECTED_PER_WINDOW": "-expected", "MAX_GROWTH": "-max-growth", "ID_FROM": "-id-from", "MODE": "-mode"}

// partitionsFor is the input's partition count: 8, or more so that no
// partition holds more events than the decision records the verifier
// reads reach back (65,536 offsets), with room for an uneven spread.
func partitionsFor(n int) int32 {
	return int32(max(8, (n+49_999)/50_000))
}

// Result is what a demo run found.
type Result struct {
	Options    Options
	Plan       bloom.Plan
	Partitions int32
	Elapsed    time.Duration // from the first event produced to the last committed

	Events, Valid, Distinct, Malformed int
	// ForwardedSources are the output records distinct by dedupe-source;
	// OutRecords all of them; Replays the difference.
	ForwardedSources, OutRecords, Replays int
	// Dropped are the valid events not forwarded: repeats of an ID, and
	// the first copies taken for repeats (false positives).
	Dropped      int
	DeadLettered int            // dead letters distinct by dedupe-source
	DeadReasons  map[string]int // by reason
	// Lost are distinct valid IDs never forwarded although a copy was
	// decided first seen; Unclassified those whose decisions cannot be
	// read. Both must be 0.
	Lost, Unclassified int
	// FalsePositives are distinct valid IDs never forwarded because every
	// copy was decided a duplicate: the first test was a false positive.
	FalsePositives int
	// FalsePositivesByCounters is the same from the workers' counters:
	// duplicate verdicts less the repeats in the input.
	FalsePositivesByCounters  int
	ExpectedFP, ExpectedFPVar float64
	// RecordedFirst and RecordedDup are the decisions the Redis decision
	// records hold for the valid events; RecordsAgree that the first-seen
	// ones match the output.
	RecordedFirst, RecordedDup int
	RecordsAgree               bool
	Check                      clickstream.Report

	// FilterKeyBytes is MEMORY USAGE summed over the filter keys of the
	// buckets the run's IDs fell in (FilterKeys of them: every stage in
	// use and those before it).
	FilterKeyBytes int64
	FilterKeys     int
	// PlannedKeyBytes is what the plan gives for those keys.
	PlannedKeyBytes int64
	// UsedMemoryGrowth is INFO memory used_memory at the end less before
	// the workers started.
	UsedMemoryGrowth int64
	// Fill, EstElements and EstFPR are the filter's own statistics for the
	// newest bucket holding IDs (bloom.Filter.Stats).
	Fill, EstElements, EstFPR float64
	// Stages the newest window grew into; Overfilled and TestOnly from its
	// growth records.
	Stages               int
	Overfilled, TestOnly int64
	// StagesMade are the stages the replicas made; Refused the
	// test-and-set calls refused for a stage not made yet; Waits the
	// batches that waited for one, WaitTotal how long in all, and
	// LongestWait the upper bound of the histogram bucket of the longest
	// (the replicas' dedupe_filter_growth_wait_seconds).
	StagesMade, Refused, Waits int
	WaitTotal, LongestWait     time.Duration

	// IDSource says where the workers read the IDs; Shadow is what the
	// verifier found of the marks in shadow mode.
	IDSource config.IDSource
	Shadow   ShadowCheck

	PerReplica   []float64 // events decided by each replica
	Verdicts     map[string]float64
	LogLines     int
	WorkerErrors []error
	Log          string // the workers' warnings and errors
}

// OK reports whether the verifier found nothing lost or mangled.
func (r *Result) OK() bool { return len(r.problems()) == 0 }

// EventsPerSecond is the run's throughput.
func (r *Result) EventsPerSecond() float64 { return float64(r.Events) / r.Elapsed.Seconds() }

// workerConfig is one replica's configuration, as DEDUPE_* variables would
// give it.
func workerConfig(o Options, brokers []string, redisAddr, httpAddr string) config.Config {
	c := config.Defaults()
	c.Pipeline, c.KafkaBrokers, c.InputTopic, c.OutputTopic, c.DLQTopic = "demo", brokers, InputTopic, OutputTopic, DLQTopic
	c.GroupID, c.RedisAddrs = Group, []string{redisAddr}
	c.IDFrom, c.Mode = o.IDFrom, o.Mode
	switch o.IDFrom {
	case "json":
		c.IDField, c.TimeField = "click_id", "ts"
	case "header":
		c.IDHeader, c.TimeHeader = IDHeader, TimeHeader
	default:
		c.TimeHeader = TimeHeader
	}
	c.Window, c.MaxLag, c.MaxGrowth, c.ExpectedPerWindow, c.FalsePositiveRate = o.Window, o.MaxLag, o.MaxGrowth, o.Expected, o.P
	c.HTTPAddr, c.LogLevel = httpAddr, "warn"
	// A replica stopped by the demo hands its partitions over sooner.
	c.KafkaSessionTimeout, c.ShutdownTimeout = 3*time.Second, 10*time.Second
	return c
}

// record is the input record of click event e for the run's ID source,
// and e as the ground truth knows it: its ID is the one the workers make,
// and a malformed event's value the one its dead letter carries.
func (o Options) record(e clickstream.Event) (*kgo.Record, clickstream.Event) {
	if o.IDFrom == "json" {
		return &kgo.Record{Key: e.Key, Value: e.Value}, e
	}
	r := &kgo.Record{Key: e.Key, Value: e.Value,
		Headers: []kgo.RecordHeader{{Key: TimeHeader, Value: strconv.AppendInt(nil, e.Time.UnixMilli(), 10)}}}
	valid := e.ID != ""
	switch o.IDFrom {
	case "key":
		// A malformed event has no key.
		r.Key = nil
		if valid {
			r.Key = []byte(e.ID)
		}
	case "header":
		if valid {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: IDHeader, Value: []byte(e.ID)})
		}
	case "value":
		// A malformed event has an empty value; any other value is valid,
		// and its ID is its hash.
		if valid {
			e.ID = string(consumer.AppendValueID(nil, e.Value))
		} else {
			r.Value, e.Value = nil, nil
		}
	}
	return r, e
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
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

	// The verdict. In shadow mode every valid event is forwarded, and the
	// ones marked first are what drop mode would have forwarded: they are
	// checked as drop mode's output is.
	res.Events, res.Valid, res.Distinct, res.Malformed = tr.Total, tr.valid, len(tr.ids), tr.Truth.Malformed
	if o.Mode == config.ModeShadow {
		res.Shadow = checkShadow(tr, out, decided)
		out = res.Shadow.first
	}
	res.Check = clickstream.Check(tr.Truth, out, dead)
	res.OutRecords, res.Replays = res.Check.OutRecords, res.Check.Replays
	res.ForwardedSources = res.OutRecords - res.Replays
	res.Dropped = res.Valid - res.ForwardedSources
	res.DeadReasons = deadReasons(dead)
	for _, n := range res.DeadReasons {
		res.DeadLettered += n
	}
	f := classify(tr, out, decided)
	res.Lost, res.Unclassified, res.FalsePositives = f.lost, f.unclassified, f.falsePositives
	res.RecordedFirst, res.RecordedDup = f.recordedFirst, f.recordedDup
	res.RecordsAgree = f.recordedNone == 0 && f.recordedFirst == res.ForwardedSources
	perBucket := map[int64]int{}
	w := bloom.Windows{Length: o.Window, Mode: bloom.Rolling}
	for _, ms := range tr.idTime {
		perBucket[w.Bucket(time.UnixMilli(ms))]++
	}
	res.ExpectedFP, res.ExpectedFPVar = expectedFalsePositives(plan, true, perBucket)
	res.Verdicts = final.total.verdicts
	res.FalsePositivesByCounters = int(final.total.verdicts["duplicate"]) - (res.Valid - res.Distinct)
	for _, c := range final.each {
		res.PerReplica = append(res.PerReplica, c.decided())
	}
	g := final.total
	res.StagesMade, res.Refused, res.Waits = int(g.stagesMade), int(g.refused), int(g.waits)
	res.WaitTotal, res.LongestWait = time.Duration(g.waitSeconds*float64(time.Second)), g.longestWait()
	return res, nil
}

// waitForGroup waits until both replicas are members of the group and it
// is stable, so that they share the partitions from the first event.
func waitForGroup(ctx context.Context, cl *kgo.Client, early func() error) error {
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for {
		if err := early(); err != nil {
			return err
		}
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		state, members, err := groupState(gctx, cl, Group)
		cancel()
		if err == nil && state == "Stable" && members == Replicas {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("state %s, %d members", state, members)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the replicas did not form group %s within 60s: %s", Group, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitCommitted waits until the group's committed offsets reach ends,
// failing after a minute without progress.
func waitCommitted(ctx context.Context, cl *kgo.Client, partitions int32, ends map[int32]int64, early func() error) error {
	var want int64
	for _, e := range ends {
		want += e
	}
	var best int64 = -1
	lastMove := time.Now()
	for {
		if err := early(); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := clickstream.Committed(cctx, cl, Group, InputTopic, partitions)
		cancel()
		if err == nil {
			var sum int64
			done := true
			for p, e := range ends {
				sum += min(got[p], e)
				if got[p] < e {
					done = false
				}
			}
			if done {
				return nil
			}
			if sum > best {
				best, lastMove = sum, time.Now()
			}
		}
		if time.Since(lastMove) > time.Minute {
			return fmt.Errorf("the replicas committed nothing for a minute: %d of %d offsets committed (last error: %v)", max(best, 0), want, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// redisFacts fills in the memory and the filter statistics.
func redisFacts(ctx context.Context, rc redis.UniversalClient, f *bloom.Filter, o Options, tr *truth, res *Result, memBefore int64) error {
	memAfter, err := usedMemory(ctx, rc)
	if err != nil {
		return err
	}
	res.UsedMemoryGrowth = memAfter - memBefore
	w := bloom.Windows{Length: o.Window, Mode: bloom.Rolling}
	buckets := map[int64]bool{}
	var newest int64
	for _, ms := range tr.idTime {
		b := w.Bucket(time.UnixMilli(ms))
		buckets[b] = true
		newest = max(newest, b)
	}
	shards := f.Plan().Shards
	for b := range buckets {
		// The stages each shard inserts into and those before it: the
		// keys holding the run's IDs (a stage made ahead holds none).
		st, err := f.Stats(ctx, w.Start(b))
		if err != nil {
			return err
		}
		for _, x := range st[:min(shards, len(st))] {
			for stage := range max(x.Stages, 1) {
				n, err := rc.MemoryUsage(ctx, f.StageKey(x.Shard, b, stage)).Result()
				if errors.Is(err, redis.Nil) {
					continue // expired already: a window shorter than the run
				}
				if err != nil {
					return fmt.Errorf("MEMORY USAGE: %w", err)
				}
				res.FilterKeyBytes += n
				res.FilterKeys++
				res.PlannedKeyBytes += int64(f.Plan().Stages[stage].Memory) / int64(shards)
			}
		}
	}
	// The newest bucket's shards come first.
	st, err := f.Stats(ctx, w.Start(newest))
	if err != nil {
		return err
	}
	var set, all uint64
	for _, x := range st[:min(shards, len(st))] {
		res.Stages = max(res.Stages, x.Stages)
		res.Overfilled += x.Overfilled
		res.TestOnly += x.TestOnly
		set += x.BitsSet
		all += x.Bits
		res.EstElements += x.Elements
		res.EstFPR += x.FPR / float64(shards)
	}
	if all > 0 {
		res.Fill = float64(set) / float64(all)
	}
	return nil
}

func usedMemory(ctx context.Context, rc redis.UniversalClient) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return redisproc.UsedMemory(ctx, rc)
}

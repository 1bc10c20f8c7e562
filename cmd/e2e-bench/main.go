// Command e2e-bench measures the dedupe worker end to end against a bare
// kafka-go consume-then-produce copy with the same batch settings, on the
// same Kafka-protocol broker, in one run:
//
//	go run ./cmd/e2e-bench              # 1 million click events
//	go run ./cmd/e2e-bench -n 200000    # a quicker run
//
// The broker, the copy and the worker each run as a child process of this
// command, so the CPU time of each is its own (getrusage of the child);
// Redis CPU is read from INFO.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/sink"
)

type options struct {
	role       string
	n          int
	dup        float64
	batch      int
	linger     time.Duration
	partitions int
	brokers    string
	redis      string
	port       int
	cpuprofile string
	// idFrom and idField choose the worker's ID (DEDUPE_ID_FROM,
	// DEDUPE_ID_FIELD); mode is its DEDUPE_MODE.
	idFrom, idField, mode string
}

const (
	inTopic   = "clicks"
	copyTopic = "copy-out"
	outTopic  = "dedupe-out"
	dlqTopic  = "dedupe-dlq"
)

func main() {
	var o options
	flag.StringVar(&o.role, "role", "", "internal: broker, copy or worker")
	flag.IntVar(&o.n, "n", 1_000_000, "click events")
	flag.Float64Var(&o.dup, "dup", 0.07, "share of events that repeat an earlier one")
	flag.IntVar(&o.batch, "batch", 1000, "messages per batch")
	flag.DurationVar(&o.linger, "linger", 100*time.Millisecond, "batch linger")
	flag.IntVar(&o.partitions, "partitions", 8, "partitions of every topic")
	flag.StringVar(&o.brokers, "brokers", "", "internal")
	flag.StringVar(&o.redis, "redis", "", "internal")
	flag.IntVar(&o.port, "port", 0, "internal")
	flag.StringVar(&o.idFrom, "id-from", "json", "where the worker reads the ID: json (the fields of -id-field, the time in ts) or value (a hash of the value, the time from the timestamp)")
	flag.StringVar(&o.idField, "id-field", "click_id", "with -id-from json: the ID field, or several separated by commas (user,click_id)")
	flag.StringVar(&o.mode, "mode", "drop", "the worker's mode: drop, or shadow (every event forwarded, duplicates marked)")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write CPU profiles of the copy and the worker to this path + .copy and .worker, and allocation profiles + .copy.allocs and .worker.allocs")
	flag.Parse()
	if o.cpuprofile != "" && (o.role == "worker" || o.role == "copy") {
		f, err := os.Create(o.cpuprofile + "." + o.role)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
		defer func() { // allocations over the whole run, for -sample_index=alloc_space
			if f, err := os.Create(o.cpuprofile + "." + o.role + ".allocs"); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	var err error
	switch o.role {
	case "":
		err = orchestrate(o)
	case "broker":
		err = broker(o)
	case "copy":
		err = report(bareCopy(o))
	case "worker":
		err = report(worker(o))
	default:
		err = fmt.Errorf("unknown role %q", o.role)
	}
	if err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "e2e-bench:", err)
		os.Exit(1)
	}
}

// result is what a child reports on its last line of output.
type result struct {
	Events    int     `json:"events"`
	Forwarded int     `json:"forwarded"`
	Seconds   float64 `json:"seconds"` // first fetch to last acknowledgement
	P50       float64 `json:"p50"`
	P99       float64 `json:"p99"`
	CPU       float64 `json:"cpu"` // filled in by the parent
	RedisCPU  float64 `json:"redis_cpu"`
}

func report(r result, err error) error {
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

func broker(o options) error {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(o.port),
		kfake.SeedTopics(int32(o.partitions), inTopic, copyTopic, outTopic, dlqTopic))
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("ready")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}

func orchestrate(o options) error {
	if _, _, err := idSource(o); err != nil {
		return err
	}
	ctx := context.Background()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	port, err := redisproc.FreePort()
	if err != nil {
		return err
	}
	bro := exec.Command(self, "-role", "broker", "-port", strconv.Itoa(port), "-partitions", strconv.Itoa(o.partitions))
	bro.Stderr = os.Stderr
	out, _ := bro.StdoutPipe()
	if err := bro.Start(); err != nil {
		return err
	}
	defer func() { bro.Process.Signal(syscall.SIGTERM); bro.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("broker did not start: %q", line)
	}
	brokers := "127.0.0.1:" + strconv.Itoa(port)

	srv, err := redisproc.StartTemp(ctx)
	if err != nil {
		return err
	}
	defer srv.Stop()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()

	size, err := produce(ctx, brokers, o)
	if err != nil {
		return err
	}
	fmt.Printf("%d click events of %.0f bytes on average, %.0f%% duplicates, %d partitions, batches of %d, linger %v; the worker's IDs from %s, mode %s\n",
		o.n, size, o.dup*100, o.partitions, o.batch, o.linger, idDesc(o), o.mode)

	var rows []result
	for _, role := range []string{"copy", "worker"} {
		cpu0 := redisCPU(ctx, rc)
		r, err := child(self, role, brokers, srv.Addr, o)
		if err != nil {
			return fmt.Errorf("%s: %w", role, err)
		}
		r.RedisCPU = redisCPU(ctx, rc) - cpu0
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "%s done\n", role)
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tevents\tforwarded\tevents/s\tCPU us/event\tvs copy\tRedis CPU us/event\tp50 fetch->produce\tp99\t")
	for i, r := range rows {
		name := []string{"bare kafka-go copy", "dedupe worker"}[i]
		cpu := r.CPU / float64(r.Events) * 1e6
		base := rows[0].CPU / float64(rows[0].Events) * 1e6
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.2fx\t%.2f\t%.1fms\t%.1fms\t\n", name, r.Events, r.Forwarded,
			float64(r.Events)/r.Seconds, cpu, cpu/base, r.RedisCPU/float64(r.Events)*1e6, r.P50*1e3, r.P99*1e3)
	}
	return tw.Flush()
}

func child(self, role, brokers, redisAddr string, o options) (result, error) {
	cmd := exec.Command(self, "-role", role, "-brokers", brokers, "-redis", redisAddr, "-n", strconv.Itoa(o.n),
		"-batch", strconv.Itoa(o.batch), "-linger", o.linger.String(), "-dup", fmt.Sprint(o.dup), "-cpuprofile", o.cpuprofile,
		"-id-from", o.idFrom, "-id-field", o.idField, "-mode", o.mode)
	cmd.Stderr = os.Stderr
	outb, err := cmd.Output()
	if err != nil {
		return result{}, err
	}
	var r result
	lines := strings.Split(strings.TrimSpace(string(outb)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return result{}, fmt.Errorf("reading the report %q: %w", lines[len(lines)-1], err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	r.CPU = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	return r, nil
}

func redisCPU(ctx context.Context, c *redis.Client) float64 {
	s, _ := redisproc.CPUSeconds(ctx, c)
	return s
}

// produce writes o.n click events of about 150 bytes; a share o.dup repeat
// an earlier event exactly.
func produce(ctx context.Context, brokers string, o options) (float64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(inTopic), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(7, 7))
	now := time.Now().UnixMilli()
	var values [][]byte
	var bytes int
	for done := 0; done < o.n; {
		k := min(10_000, o.n-done)
		recs := make([]*kgo.Record, 0, k)
		for i := 0; i < k; i++ {
			var v []byte
			if len(values) > 0 && rng.Float64() < o.dup {
				v = values[rng.IntN(len(values))]
			} else {
				j := done + i
				v = fmt.Appendf(nil, `{"click_id":"c-%012d-%08x","ts":%d,"user":"u-%07d","page":"/products/%05d","ref":"campaign-%03d","ua":"Mozilla/5.0"}`,
					j, rng.Uint32(), now, rng.IntN(1e6), rng.IntN(1e5), rng.IntN(1000))
				values = append(values, v)
			}
			bytes += len(v)
			recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "u%d", rng.IntN(1e5)), Value: v})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return 0, err
		}
		done += k
	}
	return float64(bytes) / float64(o.n), nil
}

func readerConfig(o options, group string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers: []string{o.brokers}, GroupID: group, Topic: inTopic, MinBytes: 1, MaxBytes: 16 << 20,
		MaxWait: 500 * time.Millisecond, StartOffset: kafka.FirstOffset, QueueCapacity: o.batch,
		SessionTimeout: 10 * time.Second, HeartbeatInterval: 2 * time.Second,
	}
}

// bareCopy consumes o.n messages and produces each unchanged, with the
// worker's batch, producer and commit settings and nothing else.
func bareCopy(o options) (result, error) {
	ctx := context.Background()
	r := kafka.NewReader(readerConfig(o, "bare-copy"))
	w := sink.New(sink.Config{Brokers: []string{o.brokers}, Topic: copyTopic, BatchSize: o.batch})
	defer w.Close()
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "latency", Buckets: consumer.LatencyBuckets})
	var first time.Time
	var res result
	for res.Events < o.n {
		var batch []kafka.Message
		var fetched []time.Time
		fctx, cancel := ctx, context.CancelFunc(func() {})
		for len(batch) < o.batch && res.Events+len(batch) < o.n {
			m, err := r.FetchMessage(fctx)
			if errors.Is(err, context.DeadlineExceeded) {
				break
			} else if err != nil {
				cancel()
				return res, err
			}
			now := time.Now()
			if len(batch) == 0 {
				fctx, cancel = context.WithDeadline(ctx, now.Add(o.linger))
			}
			if first.IsZero() {
				first = now
			}
			batch = append(batch, m)
			fetched = append(fetched, now)
		}
		cancel()
		out := make([]kafka.Message, len(batch))
		for i, m := range batch {
			out[i] = kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers, Time: m.Time}
		}
		if err := w.Write(ctx, out); err != nil {
			return res, err
		}
		acked := time.Now()
		for _, f := range fetched {
			hist.Observe(acked.Sub(f).Seconds())
		}
		if err := r.CommitMessages(ctx, batch...); err != nil {
			return res, err
		}
		res.Events += len(batch)
		res.Forwarded += len(out)
		res.Seconds = acked.Sub(first).Seconds()
	}
	r.Close()
	res.P50, res.P99 = quantiles(hist)
	return res, nil
}

// worker runs the dedupe worker until it has read o.n messages.
func worker(o options) (result, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: o.redis, ContextTimeoutEnabled: true})
	defer rc.Close()
	plan, err := bloom.NewPlan(int64(float64(o.n)*(1-o.dup))+1, 1e-6, bloom.PlanOptions{})
	if err != nil {
		return result{}, err
	}
	// The product's lag bound: without one, a run that crosses the end of
	// a 10-minute window gets late verdicts, forwarded untested.
	f, err := bloom.New(rc, bloom.Config{Pipeline: "bench", Plan: plan,
		Window: bloom.Window{Length: 10 * time.Minute, Mode: bloom.Rolling, MaxLag: config.Defaults().MaxLag}})
	if err != nil {
		return result{}, err
	}
	if err := f.Preallocate(ctx, time.Now()); err != nil {
		return result{}, err
	}
	reg := prometheus.NewRegistry()
	m := consumer.NewMetrics(reg, "bench")
	src, timeField, err := idSource(o)
	if err != nil {
		return result{}, err
	}
	ex, err := consumer.NewExtractor(src, timeField, "")
	if err != nil {
		return result{}, err
	}
	out := sink.New(sink.Config{Brokers: []string{o.brokers}, Topic: outTopic, BatchSize: o.batch})
	dlq := sink.New(sink.Config{Brokers: []string{o.brokers}, Topic: dlqTopic, BatchSize: o.batch})
	defer out.Close()
	defer dlq.Close()
	w, err := consumer.New(consumer.Config{Brokers: []string{o.brokers}, Topic: inTopic, GroupID: "dedupe-bench",
		BatchSize: o.batch, BatchLinger: o.linger, Extractor: ex, Metrics: m, Logger: zap.NewNop(), Shadow: o.mode == config.ModeShadow}, f, out, dlq)
	if err != nil {
		return result{}, err
	}
	var first, last time.Time
	go func() {
		for ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
			in := m.EventsIn()
			if in > 0 && first.IsZero() {
				first = time.Now()
			}
			if in >= float64(o.n) {
				last = time.Now()
				cancel()
			}
		}
	}()
	if err := w.Run(ctx); err != nil {
		return result{}, err
	}
	res := result{Events: int(counter(reg, "dedupe_events_in_total")), Forwarded: int(counter(reg, "dedupe_events_forwarded_total")),
		Seconds: last.Sub(first).Seconds()}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "dedupe_fetch_to_produce_seconds" {
			res.P50, res.P99 = quantilesOf(mf.GetMetric()[0].GetHistogram())
		}
	}
	return res, nil
}

// idSource is the worker's ID source and JSON time field for o.
func idSource(o options) (consumer.IDSource, string, error) {
	if o.mode != config.ModeDrop && o.mode != config.ModeShadow {
		return consumer.IDSource{}, "", fmt.Errorf("-mode %q: want drop or shadow", o.mode)
	}
	switch o.idFrom {
	case "json":
		src, err := config.ParseIDSource("json", o.idField, "")
		return src, "ts", err
	case "value":
		src, err := config.ParseIDSource("value", "", "")
		return src, "", err
	}
	return consumer.IDSource{}, "", fmt.Errorf("-id-from %q: want json or value (the events' keys are not their IDs)", o.idFrom)
}

func idDesc(o options) string {
	src, _, err := idSource(o)
	if err != nil {
		return err.Error()
	}
	return src.String()
}

func counter(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func quantiles(h prometheus.Histogram) (float64, float64) {
	var m dto.Metric
	h.Write(&m)
	return quantilesOf(m.GetHistogram())
}

// quantilesOf interpolates p50 and p99 inside the histogram's buckets, as
// Prometheus's histogram_quantile does.
func quantilesOf(h *dto.Histogram) (float64, float64) {
	q := func(p float64) float64 {
		rank := p * float64(h.GetSampleCount())
		var prevCount uint64
		prevBound := 0.0
		for _, b := range h.GetBucket() {
			if float64(b.GetCumulativeCount()) >= rank {
				in := float64(b.GetCumulativeCount() - prevCount)
				if in == 0 {
					return b.GetUpperBound()
				}
				return prevBound + (b.GetUpperBound()-prevBound)*(rank-float64(prevCount))/in
			}
			prevCount, prevBound = b.GetCumulativeCount(), b.GetUpperBound()
		}
		return math.Inf(1)
	}
	return q(0.5), q(0.99)
}

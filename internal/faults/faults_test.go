// Package faults runs the real dedupe-worker binary as separate processes
// against real redis-server processes and a Kafka-protocol broker over TCP,
// injects faults, and checks with the input's ground truth that nothing is
// lost. Run with -v to see the table.
package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/clicktest"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/syncbuf"
)

var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "faults")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "dedupe-worker")
	if out, err := exec.Command("go", "build", "-o", bin, "dedupe-worker/cmd/dedupe-worker").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if len(table) > 0 {
		fmt.Println(strings.Join(table, "\n"))
	}
	os.Exit(code)
}

var (
	tableMu sync.Mutex
	table   []string
)

func addRow(format string, a ...any) {
	tableMu.Lock()
	defer tableMu.Unlock()
	if len(table) == 0 {
		table = append(table, fmt.Sprintf("%-22s %8s %8s %6s %10s %8s %10s %9s %8s %s", "scenario", "events", "distinct", "lost", "dups pass", "replays", "DLQ miss", "faults", "peak MB", "recovery (max)"))
	}
	table = append(table, fmt.Sprintf(format, a...))
}

const (
	inTopic  = "clicks"
	outTopic = "clicks-out"
	dlqTopic = "clicks-dlq"
)

// rig is one run: a broker, a Redis (a standalone server, or the seed
// addresses of a Cluster), worker processes.
type rig struct {
	t       *testing.T
	broker  *kfake.Cluster
	brokers []string
	redis   *redisproc.Server // nil for a Cluster
	// redisAddrs and extraEnv go to every worker.
	redisAddrs []string
	extraEnv   []string
	// mutate, if set, changes the generated input before it is produced.
	mutate  func(recs []*kgo.Record, tr *clicktest.Truth) []*kgo.Record
	truth   clicktest.Truth
	pending []*kgo.Record // input not produced yet
	all     []*kgo.Record // the whole input
	mu      sync.Mutex
	workers map[int]*worker
	// recoveries are what recovered measured, in order.
	recoveries []time.Duration
}

type worker struct {
	cmd    *exec.Cmd
	http   string
	stderr *syncbuf.Buffer // safe to read while the process writes
	done   chan struct{}
}

func newRig(t *testing.T, redisArgs ...string) *rig { return newRigBrokers(t, 1, redisArgs...) }

func newRigBrokers(t *testing.T, brokers int, redisArgs ...string) *rig {
	t.Helper()
	srv, err := redisproc.StartTemp(context.Background(), redisArgs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	r := newKafkaRig(t, brokers, srv.Addr)
	r.redis = srv
	return r
}

// newKafkaRig starts the broker; the workers use the Redis at redisAddrs.
func newKafkaRig(t *testing.T, brokers int, redisAddrs ...string) *rig {
	t.Helper()
	broker, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.SeedTopics(6, inTopic, outTopic), kfake.SeedTopics(1, dlqTopic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	r := &rig{t: t, broker: broker, brokers: broker.ListenAddrs(), redisAddrs: redisAddrs, workers: map[int]*worker{}}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, w := range r.workers {
			w.cmd.Process.Kill()
			<-w.done
			if t.Failed() {
				t.Logf("worker %d's log (its last 4 kB):\n%s", i, tail(w.stderr.String(), 4096))
			}
		}
	})
	return r
}

// start runs worker i.
func (r *rig) start(i int) {
	w := &worker{http: redisproc.FreeAddr(), stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	w.cmd = exec.Command(bin)
	w.cmd.Env = append(os.Environ(),
		"DEDUPE_PIPELINE=faults", "DEDUPE_KAFKA_BROKERS="+strings.Join(r.brokers, ","), "DEDUPE_INPUT_TOPIC="+inTopic,
		"DEDUPE_OUTPUT_TOPIC="+outTopic, "DEDUPE_DLQ_TOPIC="+dlqTopic, "DEDUPE_REDIS_ADDRS="+strings.Join(r.redisAddrs, ","),
		"DEDUPE_ID_FIELD=click_id", "DEDUPE_TIME_FIELD=ts",
		// Expected false positives far below one: 200k IDs in a filter for 2M at 1e-9.
		"DEDUPE_EXPECTED_PER_WINDOW=2000000", "DEDUPE_FALSE_POSITIVE_RATE=1e-9",
		"DEDUPE_BATCH_SIZE=500", "DEDUPE_BATCH_LINGER=20ms", "DEDUPE_HTTP_ADDR="+w.http, "DEDUPE_LOG_LEVEL=warn",
		"DEDUPE_REDIS_TIMEOUT=1s", "DEDUPE_KAFKA_TIMEOUT=5s", "DEDUPE_KAFKA_SESSION_TIMEOUT=1s", "DEDUPE_SHUTDOWN_TIMEOUT=10s")
	w.cmd.Env = append(w.cmd.Env, r.extraEnv...)
	w.cmd.Stderr = w.stderr
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := w.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() { w.cmd.Wait(); close(w.done) }()
	r.mu.Lock()
	r.workers[i] = w
	r.mu.Unlock()
}

// kill ends worker i with SIGKILL.
func (r *rig) kill(i int) {
	r.mu.Lock()
	w := r.workers[i]
	delete(r.workers, i)
	r.mu.Unlock()
	w.cmd.Process.Kill()
	<-w.done
}

// stop ends worker i with SIGTERM; it must exit 0 within its bound.
func (r *rig) stop(i int) {
	r.mu.Lock()
	w := r.workers[i]
	delete(r.workers, i)
	r.mu.Unlock()
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
		if code := w.cmd.ProcessState.ExitCode(); code != 0 {
			r.t.Errorf("worker %d exited %d after SIGTERM: %s", i, code, w.stderr.String())
		}
	case <-time.After(20 * time.Second):
		r.t.Errorf("worker %d did not exit within 20s of SIGTERM", i)
	}
}

func (r *rig) ready(i int) bool {
	r.mu.Lock()
	w := r.workers[i]
	r.mu.Unlock()
	if w == nil {
		return false
	}
	c := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := c.Get("http://" + w.http + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// eventsIn reads dedupe_events_in_total of every live worker.
func (r *rig) eventsIn() map[int]float64 { return r.metric("dedupe_events_in_total") }

// metricLines are the lines of each live worker's /metrics that start
// with prefix.
func (r *rig) metricLines(prefix string) map[int][]string {
	r.mu.Lock()
	addrs := map[int]string{}
	for i, w := range r.workers {
		addrs[i] = w.http
	}
	r.mu.Unlock()
	out := map[int][]string{}
	c := http.Client{Timeout: 500 * time.Millisecond}
	for i, a := range addrs {
		resp, err := c.Get("http://" + a + "/metrics")
		if err != nil {
			continue
		}
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(b.String(), "\n") {
			if strings.HasPrefix(line, prefix) {
				out[i] = append(out[i], line)
			}
		}
	}
	return out
}

// metric sums, per live worker, the series whose lines start with prefix.
func (r *rig) metric(prefix string) map[int]float64 {
	out := map[int]float64{}
	for i, lines := range r.metricLines(prefix) {
		for _, line := range lines {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			out[i] += v
		}
	}
	return out
}

// recovered waits until some live worker has read more input than at the
// call, and returns how long that took: the time to recover from a fault.
// It returns 0 early when the input is used up (no progress is possible).
func (r *rig) recovered(limit time.Duration) time.Duration {
	d := r.recoveredWithin(limit)
	r.recoveries = append(r.recoveries, d.Round(time.Millisecond))
	return d
}

func (r *rig) recoveredWithin(limit time.Duration) time.Duration {
	start := time.Now()
	before := r.eventsIn()
	lastCheck := start
	for time.Since(start) < limit {
		time.Sleep(20 * time.Millisecond)
		for i, v := range r.eventsIn() {
			if v > before[i] {
				return time.Since(start)
			}
		}
		if time.Since(lastCheck) > 2*time.Second {
			lastCheck = time.Now()
			if r.exhausted() {
				return 0
			}
		}
	}
	r.t.Errorf("no progress within %v of a fault", limit)
	// What the workers report, and which inputs are not in the output yet.
	{
		for i, lines := range r.metricLines("dedupe_") {
			for _, line := range lines {
				if strings.HasPrefix(line, "dedupe_consumer_lag") || strings.HasPrefix(line, "dedupe_events_in_total") {
					r.t.Logf("worker %d: %s", i, line)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, _ := clicktest.ReadToEnd(ctx, r.brokers, outTopic)
		dead, _ := clicktest.ReadToEnd(ctx, r.brokers, dlqTopic)
		cancel()
		r.t.Logf("output %d distinct sources of %d valid IDs, DLQ %d of %d", clicktest.DistinctSources(out), len(r.truth.Valid), clicktest.DistinctSources(dead), r.truth.Malformed)
		got := map[string]bool{}
		for _, rec := range out {
			got[clicktest.Header(rec, clicktest.IDHeader)] = true
		}
		shown := 0
		for k, rec := range r.all {
			var v struct {
				ID string `json:"click_id"`
			}
			if json.Unmarshal(rec.Value, &v) == nil && v.ID != "" && r.truth.Valid[v.ID] && !got[v.ID] {
				if shown++; shown > 20 {
					break
				}
				produced := k < len(r.all)-len(r.pending)
				r.t.Logf("not in the output: %s (input partition %d offset %d, produced %v)", v.ID, rec.Partition, rec.Offset, produced)
			}
		}
	}
	r.mu.Lock()
	for i, w := range r.workers {
		l := w.stderr.String()
		r.t.Logf("worker %d's log (its first and last 4 kB):\n%s\n...\n%s", i, l[:min(len(l), 4<<10)], tail(l, 4<<10))
	}
	r.mu.Unlock()
	return limit
}

// exhausted reports whether the output and dead-letter topics already
// account for the whole input. It reads each topic up to its current end:
// a snapshot cut off by a time limit once read part of a loaded topic and
// took finished work for a stall.
func (r *rig) exhausted() bool {
	snap := func(topic string) int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rs, err := clicktest.ReadToEnd(ctx, r.brokers, topic)
		if err != nil {
			r.t.Fatal(err)
		}
		return clicktest.DistinctSources(rs)
	}
	return snap(outTopic) >= len(r.truth.Valid) && snap(dlqTopic) >= r.truth.Malformed
}

// waitReady waits until worker i is ready and returns how long it took.
func (r *rig) waitReady(i int, limit time.Duration) time.Duration {
	start := time.Now()
	for !r.ready(i) {
		if time.Since(start) > limit {
			r.t.Errorf("worker %d not ready after %v", i, limit)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

func (r *rig) read(topic string) []*kgo.Record {
	rs, err := clicktest.ReadAll(r.brokers, topic)
	if err != nil {
		r.t.Fatal(err)
	}
	return rs
}

// waitDecided waits until the output and dead-letter topics account for
// every input record, or limit passes.
func (r *rig) waitDecided(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && !r.exhausted() {
		time.Sleep(300 * time.Millisecond)
	}
}

// feed produces the next n records of the input (all that is left if n
// is larger).
func (r *rig) feed(n int) {
	n = min(n, len(r.pending))
	if err := clicktest.Produce(context.Background(), r.brokers, inTopic, r.pending[:n]); err != nil {
		r.t.Fatal(err)
	}
	r.pending = r.pending[n:]
}

// everything, as run's upfront, produces the whole input before the
// replicas start. (Recovery is measured as new input read, or the input
// used up; with part of the input held back, a fault that outlasts the
// backlog looked like a stall.)
const everything = -1

// run makes 200,000 events and produces upfront of them, starts replicas,
// runs fault while they work (fault may feed more input), produces the
// rest, waits for the end, and checks and reports.
func run(t *testing.T, name string, r *rig, replicas, upfront int, fault func(r *rig) (faults int, recovery time.Duration)) {
	recs, tr := clicktest.Generate(200_000, 0.07, 0.01, uint64(len(name)))
	if r.mutate != nil {
		recs = r.mutate(recs, &tr)
	}
	r.truth, r.pending, r.all = tr, recs, recs
	if upfront == everything {
		upfront = len(recs)
	}
	r.feed(upfront)
	for i := 0; i < replicas; i++ {
		r.start(i)
	}
	start := time.Now()
	faults, recovery := fault(r)
	r.feed(len(r.pending))
	r.waitDecided(120 * time.Second)
	r.mu.Lock()
	live := make([]int, 0, len(r.workers))
	for i := range r.workers {
		live = append(live, i)
	}
	r.mu.Unlock()
	var peak int64
	for _, i := range live {
		peak = max(peak, r.peakRSS(i))
		r.stop(i)
	}
	rep := clicktest.Check(tr, r.read(outTopic), r.read(dlqTopic))
	addRow("%-22s %8d %8d %6d %10d %8d %10d %9d %8d %v (run %v)", name, tr.Total, rep.Distinct, rep.Lost, rep.DuplicatesPass,
		rep.Replays, rep.DeadMissing, faults, peak>>20, recovery.Round(time.Millisecond), time.Since(start).Round(time.Second))
	if peak > maxRSS {
		t.Errorf("%s: a worker's peak resident memory was %d MiB, above the bound of %d MiB", name, peak>>20, maxRSS>>20)
	}
	t.Logf("%s: time to recover after each fault: %v", name, r.recoveries)
	if !rep.OK() {
		t.Errorf("%s: %v", name, rep)
	}
	t.Logf("%s: %v", name, rep)
}

// maxRSS bounds each worker's peak resident memory in every scenario. With
// batches of 500 the worker holds at most three batches, the reader's
// queue of 500 messages and a fetch buffer per partition; the hostile
// scenario's megabyte messages must not push it past this.
const maxRSS = 256 << 20

// peakRSS is worker i's peak resident memory so far (VmHWM), 0 if unknown.
func (r *rig) peakRSS(i int) int64 {
	r.mu.Lock()
	w := r.workers[i]
	r.mu.Unlock()
	if w == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb << 10
		}
	}
	return 0
}

// Hostile input is mixed into the stream of two replicas: random bytes,
// megabyte payloads nested a million levels deep, cut short or valid and
// sent twice, IDs of odd kinds. Each lands in the dead-letter topic with a
// reason or is deduplicated, no worker crashes (both exit 0 on SIGTERM at
// the end), and peak memory stays under maxRSS.
func TestHostileInput(t *testing.T) {
	r := newRig(t)
	r.mutate = func(recs []*kgo.Record, tr *clicktest.Truth) []*kgo.Record { return clicktest.Hostile(recs, tr, 11) }
	run(t, "hostile input", r, 2, everything, func(r *rig) (int, time.Duration) {
		return 0, r.recovered(30 * time.Second)
	})
}

// Replicas are killed with SIGKILL twelve times and restarted. The kills
// take turns among three moments:
//   - any moment while input flows;
//   - with the replica's test-and-set in flight: Redis is stopped while the
//     replicas are busy, a replica is killed, and Redis then runs the call
//     it finds in the dead client's socket, so decisions are recorded whose
//     events were never produced (the crash between Redis and Kafka);
//   - between producing and committing: the group coordinator holds back
//     offset commits, and the replica whose commit arrives first is killed,
//     with its output acknowledged and its offsets not committed.
func TestWorkerCrashes(t *testing.T) {
	r := newRig(t)
	// Input arrives in chunks: one lands just before each kill, so batches
	// are in flight when a replica dies, and one right after each restart,
	// so the time until the group reads again can be measured.
	chunk := 200_000 / 25
	run(t, "worker kill -9 x12", r, 3, chunk, func(r *rig) (int, time.Duration) {
		rng := rand.New(rand.NewPCG(3, 4))
		var worst time.Duration
		var moments [3]int
		for k := 0; k < 12; k++ {
			r.feed(chunk)
			time.Sleep(time.Duration(20+rng.IntN(180)) * time.Millisecond)
			var i int
			switch k % 3 {
			case 0:
				i = rng.IntN(3)
				r.kill(i)
				moments[0]++
			case 1:
				i = rng.IntN(3)
				r.redis.Pause()
				time.Sleep(300 * time.Millisecond)
				r.kill(i)
				r.redis.Resume()
				moments[1]++
			case 2:
				var ok bool
				if i, ok = r.killAtCommit(10 * time.Second); !ok {
					continue
				}
				moments[2]++
			}
			time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
			r.start(i)
			r.waitReady(i, 30*time.Second)
			r.feed(chunk)
			worst = max(worst, r.recovered(30*time.Second))
		}
		t.Logf("kills: %d at random, %d with a Redis call in flight, %d between produce and commit", moments[0], moments[1], moments[2])
		if moments[2] < 4 {
			t.Errorf("only %d of 4 kills between produce and commit happened", moments[2])
		}
		return moments[0] + moments[1] + moments[2], worst
	})
}

// killAtCommit holds back every offset commit until one arrives, kills
// the replica that sent it, and lets commits through again. It returns
// the replica's index, or false if no commit came within limit.
func (r *rig) killAtCommit(limit time.Duration) (int, bool) {
	var hold atomic.Bool
	hold.Store(true)
	first := make(chan string, 1)
	r.broker.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if !hold.Load() {
			return nil, nil, false // and the control function is dropped
		}
		r.broker.KeepControl()
		select {
		case first <- req.(*kmsg.OffsetCommitRequest).MemberID:
		default:
		}
		return nil, errors.New("commit held back by the test"), true
	})
	defer hold.Store(false)
	select {
	case member := <-first:
		// A member ID starts with the client ID, which ends with the pid.
		r.mu.Lock()
		found := -1
		for i, w := range r.workers {
			if strings.Contains(member, fmt.Sprintf(".%d-", w.cmd.Process.Pid)) {
				found = i
			}
		}
		r.mu.Unlock()
		if found < 0 {
			r.t.Errorf("no replica has the member ID %q", member)
			return 0, false
		}
		r.kill(found)
		return found, true
	case <-time.After(limit):
		r.t.Errorf("no offset commit within %v", limit)
		return 0, false
	}
}

// Redis stops answering for 10 s (SIGSTOP): the workers wait, are not
// ready meanwhile, and carry on after SIGCONT.
func TestRedisStall(t *testing.T) {
	r := newRig(t)
	run(t, "redis SIGSTOP 10s", r, 2, everything, func(r *rig) (int, time.Duration) {
		time.Sleep(800 * time.Millisecond)
		r.redis.Pause()
		time.Sleep(3 * time.Second)
		for i := 0; i < 2; i++ {
			if r.ready(i) {
				t.Errorf("worker %d ready while Redis is stopped", i)
			}
		}
		time.Sleep(7 * time.Second)
		r.redis.Resume()
		recovery := r.recovered(30 * time.Second)
		for i := 0; i < 2; i++ {
			r.waitReady(i, 30*time.Second)
		}
		return 1, recovery
	})
}

// Redis is killed and restarted from its append-only file (fsync always):
// filters and decision records survive, and the workers carry on.
func TestRedisRestartWithAOF(t *testing.T) {
	r := newRig(t, "--appendonly", "yes", "--appendfsync", "always")
	run(t, "redis kill -9, AOF", r, 2, everything, func(r *rig) (int, time.Duration) {
		time.Sleep(1 * time.Second)
		r.redis.Kill()
		time.Sleep(2 * time.Second)
		if err := r.redis.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
		return 1, r.recovered(30 * time.Second)
	})
}

// Scale 1 -> 3 -> 1 while working: two replicas join, then leave, one
// gracefully and one killed.
func TestRebalances(t *testing.T) {
	r := newRig(t)
	run(t, "scale 1->3->1", r, 1, everything, func(r *rig) (int, time.Duration) {
		time.Sleep(500 * time.Millisecond)
		r.start(1)
		r.start(2)
		r.waitReady(1, 30*time.Second)
		r.waitReady(2, 30*time.Second)
		worst := r.recovered(30 * time.Second)
		time.Sleep(1 * time.Second)
		r.stop(1)
		r.kill(2)
		return 4, max(worst, r.recovered(30*time.Second))
	})
}

// Kafka misbehaves, each fault for 3 s: fetches of the input answered
// with an error code; fetch connections dropped; produces to the output
// answered REQUEST_TIMED_OUT after the broker wrote them (so the retries
// write copies: replays); produce connections dropped; then every
// partition's leader moves to another broker.
func TestKafkaFaults(t *testing.T) {
	r := newRigBrokers(t, 3)
	// Input arrives in chunks, one before each fault, so that every fault
	// finds work in flight.
	chunk := 200_000 / 6
	run(t, "kafka errors, leaders", r, 2, chunk, func(r *rig) (int, time.Duration) {
		const d = 3 * time.Second
		fault := func(f kfake.Fault) time.Duration {
			r.feed(chunk)
			f.Count = -1
			h := r.broker.Fault(f)
			time.Sleep(d)
			h.Remove()
			if h.Hits() == 0 {
				t.Errorf("no %s request was faulted: the fault did not happen", f.Keys[0].Name())
			}
			t.Logf("%s on %s answered %s: %d requests", f.Keys[0].Name(), f.Topic, f.Err.Message, h.Hits())
			return r.recovered(30 * time.Second)
		}
		drop := func(key kmsg.Key) time.Duration {
			r.feed(chunk)
			until := time.Now().Add(d)
			var dropped atomic.Int64
			r.broker.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
				if time.Now().Before(until) {
					r.broker.KeepControl()
					dropped.Add(1)
					return nil, errors.New("injected failure"), true // kfake closes the connection
				}
				return nil, nil, false
			})
			time.Sleep(d)
			if dropped.Load() == 0 {
				t.Errorf("no %s connection was dropped: the fault did not happen", key.Name())
			}
			t.Logf("%s: %d connections dropped", key.Name(), dropped.Load())
			return r.recovered(30 * time.Second)
		}
		time.Sleep(500 * time.Millisecond)
		worst := fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: inTopic, Err: kerr.UnknownServerError})
		worst = max(worst, drop(kmsg.Fetch))
		worst = max(worst, fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: outTopic, Err: kerr.RequestTimedOut}))
		worst = max(worst, drop(kmsg.Produce))
		r.feed(chunk)
		for _, topic := range []string{inTopic, outTopic} {
			for p := int32(0); p < 6; p++ {
				leader := r.broker.LeaderFor(topic, p)
				if err := r.broker.MoveTopicPartition(topic, p, (leader+1)%3); err != nil {
					t.Errorf("moving %s/%d: %v", topic, p, err)
				}
			}
		}
		worst = max(worst, r.recovered(30*time.Second))
		return 5, worst
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

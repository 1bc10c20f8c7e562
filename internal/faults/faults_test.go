// Package faults runs the real dedupe-worker binary as separate processes
// against real redis-server processes and a Kafka-protocol broker over TCP,
// injects faults, and checks with the input's ground truth that nothing is
// lost. Run with -v to see the table.
package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/syncbuf"
	"dedupe-worker/internal/testenv"
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
		table = append(table, fmt.Sprintf("%-22s %8s %8s %6s %10s %8s %10s %9s %10s %8s %s", "scenario", "events", "distinct", "lost", "dups pass", "replays",
			"DLQ miss", "faults", "recoveries", "peak MB", "recovery (max)"))
	}
	table = append(table, fmt.Sprintf(format, a...))
}

const (
	inTopic  = "clicks"
	outTopic = "clicks-out"
	dlqTopic = "clicks-dlq"
	// dupsTopic is DEDUPE_DUPLICATES_TOPIC where a scenario sets it
	// (rig.keepDuplicates).
	dupsTopic = "clicks-dups"
	// group is the workers' consumer group (DEDUPE_PIPELINE=faults).
	group = "dedupe-faults"
	// events is how many click events each scenario generates (Generate
	// adds a few unusual ones, and the hostile scenario its records).
	events = 200_000
)

// rig is one run: a broker, a Redis (a standalone server, or the seed
// addresses of a Cluster), worker processes.
type rig struct {
	t     *testing.T
	k     *testenv.Kafka
	admin *kgo.Client       // reads offsets for the test
	redis *redisproc.Server // nil for a Cluster
	// redisAddrs and extraEnv go to every worker.
	redisAddrs []string
	extraEnv   []string
	// failOpen runs the workers with DEDUPE_FAIL_OPEN_AFTER=failOpenAfter;
	// run then lets a copy pass where one of its ID's records went
	// unchecked, and no other.
	failOpen bool
	// keepDuplicates sends the copies dropped to dupsTopic, and run checks
	// that it holds exactly those.
	keepDuplicates bool
	// replaysUnbounded: the scenario writes copies the worker cannot tell
	// apart (produce retries), so run does not bound the replays.
	replaysUnbounded bool
	// events is the size of the input, if not the package's events.
	events int
	// steady: the scenario has no fault, so no recovery to measure.
	steady bool
	// mutate, if set, changes the generated input before it is produced.
	mutate  func(recs []*kgo.Record, tr *clickstream.Truth) []*kgo.Record
	truth   clickstream.Truth
	pending []*kgo.Record // input not produced yet
	all     []*kgo.Record // the whole input
	mu      sync.Mutex
	workers map[int]*worker
	// recoveries are the recoveries measured, in order; tries counts the
	// faults after which one was to be measured.
	recoveries []time.Duration
	tries      int
	// lastRead is when usedUp last read the output topics.
	lastRead time.Time
	// killedAt is when kill ended each process, by process ID.
	killedAt map[int]time.Time
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
	srv := testenv.Redis(t, redisArgs...)
	r := newKafkaRig(t, brokers, srv.Addr)
	r.redis = srv
	return r
}

// newKafkaRig starts the broker; the workers use the Redis at redisAddrs.
func newKafkaRig(t *testing.T, brokers int, redisAddrs ...string) *rig {
	t.Helper()
	k := testenv.StartKafka(t, testenv.Topics{inTopic: 6, outTopic: 6, dlqTopic: 1, dupsTopic: 6}, kfake.NumBrokers(brokers))
	admin, err := kgo.NewClient(k.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	r := &rig{t: t, k: k, admin: admin, redisAddrs: redisAddrs, workers: map[int]*worker{}, killedAt: map[int]time.Time{}}
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
		"DEDUPE_PIPELINE=faults", "DEDUPE_FILTER="+testenv.Filter(), "DEDUPE_KAFKA_BROKERS="+strings.Join(r.k.Addrs(), ","), "DEDUPE_INPUT_TOPIC="+inTopic,
		"DEDUPE_OUTPUT_TOPIC="+outTopic, "DEDUPE_DLQ_TOPIC="+dlqTopic, "DEDUPE_REDIS_ADDRS="+strings.Join(r.redisAddrs, ","),
		"DEDUPE_ID_FIELD=click_id", "DEDUPE_TIME_FIELD=ts",
		// Expected false positives far below one: 200k IDs in a filter for 2M at 1e-9.
		"DEDUPE_EXPECTED_PER_WINDOW=2000000", "DEDUPE_FALSE_POSITIVE_RATE=1e-9",
		"DEDUPE_BATCH_SIZE=500", "DEDUPE_BATCH_LINGER=20ms", "DEDUPE_HTTP_ADDR="+w.http, "DEDUPE_LOG_LEVEL=warn",
		"DEDUPE_REDIS_TIMEOUT=1s", "DEDUPE_KAFKA_TIMEOUT=5s", "DEDUPE_KAFKA_SESSION_TIMEOUT=1s", "DEDUPE_SHUTDOWN_TIMEOUT=10s",
		// As short as the session: a replica that died holds the next
		// owner's first batch of its partitions that long.
		"DEDUPE_HANDOFF_WAIT=1s")
	w.cmd.Env = append(w.cmd.Env, r.extraEnv...)
	if r.keepDuplicates {
		w.cmd.Env = append(w.cmd.Env, "DEDUPE_DUPLICATES_TOPIC="+dupsTopic)
	}
	if r.failOpen {
		w.cmd.Env = append(w.cmd.Env, "DEDUPE_FAIL_OPEN_AFTER="+failOpenAfter.String())
	}
	w.cmd.Stderr = w.stderr
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := w.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() { w.cmd.Wait(); close(w.done) }()
	r.mu.Lock()
	r.workers[i] = w
	delete(r.killedAt, w.cmd.Process.Pid) // a process ID used again
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
	r.mu.Lock()
	r.killedAt[w.cmd.Process.Pid] = time.Now()
	r.mu.Unlock()
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

// waitReady waits until worker i is ready.
func (r *rig) waitReady(i int) {
	r.t.Helper()
	testenv.Eventually(r.t, 30*time.Second, fmt.Sprintf("worker %d to be ready", i), func() bool { return r.ready(i) })
}

// hold lets time pass for the fault in progress: d is how long the fault
// lasts, or, before a kill, how far its moment moves at random. It waits
// for nothing; what the tests wait for, they observe.
func hold(d time.Duration) { time.Sleep(d) }

// metrics scrapes every live worker's /metrics; a worker that does not
// answer is left out.
func (r *rig) metrics() map[int]testenv.Metrics {
	r.mu.Lock()
	addrs := map[int]string{}
	for i, w := range r.workers {
		addrs[i] = w.http
	}
	r.mu.Unlock()
	out := map[int]testenv.Metrics{}
	for i, a := range addrs {
		if m, err := testenv.Scrape(context.Background(), "http://"+a+"/metrics"); err == nil {
			out[i] = m
		}
	}
	return out
}

// metricTotal is the sum of a metric over the live workers that answer.
func (r *rig) metricTotal(name string) float64 {
	total := 0.0
	for _, m := range r.metrics() {
		total += m.Value(name)
	}
	return total
}

// stderr is what worker i has logged so far.
func (r *rig) stderr(i int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.workers[i].stderr.String()
}

// eventsIn is dedupe_events_in_total of every live worker that answers.
func (r *rig) eventsIn() map[int]float64 {
	out := map[int]float64{}
	for i, m := range r.metrics() {
		out[i] = m.Value("dedupe_events_in_total")
	}
	return out
}

// outputEnds is the end offset of each partition of the output topic.
func (r *rig) outputEnds() map[int32]int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(r.admin).ListEndOffsets(ctx, outTopic)
	if err != nil {
		r.t.Fatalf("end offsets of %s: %v", outTopic, err)
	}
	out := map[int32]int64{}
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			out[o.Partition] = o.Offset
		}
	})
	return out
}

// readTotal is dedupe_events_in_total summed over the live workers.
func (r *rig) readTotal() float64 {
	var sum float64
	for _, v := range r.eventsIn() {
		sum += v
	}
	return sum
}

// waitRead waits until the live workers have read n input records in all,
// so that a fault started then meets work in flight.
func (r *rig) waitRead(n float64) {
	r.t.Helper()
	testenv.Eventually(r.t, 30*time.Second, fmt.Sprintf("the workers to read %.0f input records", n), func() bool { return r.readTotal() >= n })
}

// readMore reports whether some live worker has read more input than
// before holds for it.
func (r *rig) readMore(before map[int]float64) bool {
	for i, v := range r.eventsIn() {
		if v > before[i] {
			return true
		}
	}
	return false
}

// recovered waits until some live worker has read more input than at the
// call, and returns how long that took: the time to recover from a fault.
// Every scenario leaves input for after its fault, so that there is
// something to read. If the workers have decided all the input produced
// so far without reading more, no recovery was measured, and the test
// fails; so it does if nothing is read within limit.
func (r *rig) recovered(limit time.Duration) time.Duration {
	r.t.Helper()
	return r.recoveredAfter(func() {}, limit)
}

// recoveredAfter is recovered for input that feed produces: what the
// workers have read is noted first, so that reading what feed produced
// counts as progress however quickly it happens.
func (r *rig) recoveredAfter(feed func(), limit time.Duration) time.Duration {
	r.t.Helper()
	r.tries++
	start := time.Now()
	before := r.eventsIn()
	feed()
	var progressed, usedUp bool
	checked := start
	testenv.Until(limit, func() bool {
		progressed = r.readMore(before)
		// Whether the input is used up takes a few requests to the broker:
		// it is asked once a second.
		if !progressed && time.Since(checked) >= time.Second {
			checked = time.Now()
			usedUp = r.usedUp()
			// The last of it may have been read between the two looks.
			progressed = r.readMore(before)
		}
		return progressed || usedUp
	})
	d := time.Since(start)
	switch {
	case progressed:
		r.recoveries = append(r.recoveries, d.Round(time.Millisecond))
		return d
	case usedUp:
		r.t.Errorf("the input was used up %v after a fault, before any worker read again: no recovery was measured (the scenario must leave input for after its fault)",
			d.Round(time.Millisecond))
		return 0
	}
	r.t.Errorf("no progress within %v of a fault", limit)
	// What the workers report, and which inputs are not in the output yet.
	for i, m := range r.metrics() {
		r.t.Logf("worker %d:\n%s\n%s", i, m.Show("dedupe_events_in_total"), m.Show("dedupe_consumer_lag"))
	}
	if n, err := r.uncommitted(); err == nil {
		r.t.Logf("%d input records produced and not committed", n)
	}
	out, dead := r.k.Read(outTopic), r.k.Read(dlqTopic)
	r.t.Logf("output %d distinct sources of %d valid IDs, DLQ %d of %d", clickstream.DistinctSources(out), len(r.truth.Valid), clickstream.DistinctSources(dead), r.truth.Malformed)
	got := map[string]bool{}
	for _, rec := range out {
		got[clickstream.Header(rec, clickstream.IDHeader)] = true
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
	r.mu.Lock()
	for i, w := range r.workers {
		l := w.stderr.String()
		r.t.Logf("worker %d's log (its first and last 4 kB):\n%s\n...\n%s", i, l[:min(len(l), 4<<10)], tail(l, 4<<10))
	}
	r.mu.Unlock()
	return limit
}

// uncommitted is how many input records the workers' group has not
// committed: per partition, the end offset less the committed one. A
// worker commits a batch once its output and dead letters are
// acknowledged, so 0 means that all the input produced is decided.
func (r *rig) uncommitted() (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ends, err := clickstream.EndOffsets(ctx, r.admin, inTopic)
	if err != nil {
		return 0, err
	}
	committed, err := clickstream.Committed(ctx, r.admin, group, inTopic)
	if err != nil {
		return 0, err
	}
	var left int64
	for p, end := range ends {
		left += end - max(committed[p], 0)
	}
	return left, nil
}

// groupMembers is the workers' group as the coordinator describes it:
// its state and members.
func (r *rig) groupMembers() (state string, members []kmsg.DescribeGroupsResponseGroupMember, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, r.admin)
	if err != nil {
		return "", nil, fmt.Errorf("describing group %s: %w", group, err)
	}
	if len(resp.Groups) != 1 {
		return "", nil, fmt.Errorf("describing group %s: %d groups in the answer", group, len(resp.Groups))
	}
	g := resp.Groups[0]
	if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
		return "", nil, fmt.Errorf("describing group %s: %w", group, err)
	}
	return g.State, g.Members, nil
}

// pidOf is the process ID of the worker that a member of the group is:
// the Kafka client ID of a worker ends with it.
func pidOf(m kmsg.DescribeGroupsResponseGroupMember) int {
	pid, _ := strconv.Atoi(m.ClientID[strings.LastIndexByte(m.ClientID, '.')+1:])
	return pid
}

// groupState is the group's state and the process ID of each member, in
// order.
func (r *rig) groupState() (state string, pids []int, err error) {
	state, members, err := r.groupMembers()
	for _, m := range members {
		pids = append(pids, pidOf(m))
	}
	slices.Sort(pids)
	return state, pids, err
}

// expireKilled does for the workers' group what a Kafka coordinator does
// and the test broker does not always do: once the group is stable, it
// removes each member of a killed worker whose session timeout has passed
// since the kill (with a LeaveGroup naming it). kfake starts a member's
// session timer only when a response to it has been written. A worker
// killed while its first JoinGroup waited is still counted as joined, so
// the rebalance completes once the others rejoin; its answer cannot reach
// it (or, as kfake picks at random, goes into the dead connection's
// buffer), and the member can stay in the stable group, with partitions
// that no one reads, until another rebalance. Kafka starts the session at
// the join and would have expired it. While the group rebalances, and for
// the joins that live workers gave up, the broker is left to itself: that
// is where its rebalance timer and the workers' timings meet. The
// returned function stops it (it may be called again) and says how many
// members it removed.
func (r *rig) expireKilled(session time.Duration) (stop func() int) {
	done, ended := make(chan struct{}), make(chan struct{})
	var removed int
	var once sync.Once
	go func() {
		defer close(ended)
		sent := map[string]bool{}
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			state, members, err := r.groupMembers()
			if err != nil || state != "Stable" {
				continue
			}
			for _, m := range members {
				r.mu.Lock()
				at, killed := r.killedAt[pidOf(m)]
				r.mu.Unlock()
				if !killed || time.Since(at) < session || sent[m.MemberID] {
					continue
				}
				sent[m.MemberID] = true
				if r.leave(m.MemberID) == nil {
					removed++
				}
			}
		}
	}()
	return func() int {
		once.Do(func() { close(done) })
		<-ended
		return removed
	}
}

// leave removes member from the workers' group.
func (r *rig) leave(member string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID = member
	req.Members = append(req.Members, lm)
	resp, err := req.RequestWith(ctx, r.admin)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err == nil && len(resp.Members) == 1 {
		err = kerr.ErrorForCode(resp.Members[0].ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("removing member %s from group %s: %w", member, group, err)
	}
	return nil
}

// livePids are the process IDs of the workers running now, in order.
func (r *rig) livePids() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	pids := make([]int, 0, len(r.workers))
	for _, w := range r.workers {
		pids = append(pids, w.cmd.Process.Pid)
	}
	slices.Sort(pids)
	return pids
}

// noteRecovery records a recovery that a scenario measured its own way.
func (r *rig) noteRecovery(d time.Duration) {
	r.tries++
	r.recoveries = append(r.recoveries, d.Round(time.Millisecond))
}

// usedUp reports whether the workers have decided all the input produced
// so far: their group has committed all of it. A commit refused after its
// batch was delivered can leave a partition's offset behind for good,
// though; so once the whole input is produced, the output and dead-letter
// topics are read as well, at most every 2 s (reading them is not cheap).
func (r *rig) usedUp() bool {
	if n, err := r.uncommitted(); err == nil && n == 0 {
		return true
	}
	if len(r.pending) > 0 || time.Since(r.lastRead) < 2*time.Second {
		return false
	}
	r.lastRead = time.Now()
	return r.exhausted()
}

// exhausted reports whether the output and dead-letter topics already
// account for the whole input. It reads each topic up to its current end:
// a snapshot cut off by a time limit once read part of a loaded topic and
// took finished work for a stall.
func (r *rig) exhausted() bool {
	return clickstream.DistinctSources(r.k.Read(outTopic)) >= len(r.truth.Valid) && clickstream.DistinctSources(r.k.Read(dlqTopic)) >= r.truth.Malformed
}

// waitDecided waits until the workers have decided the whole input, or
// limit passes (the check that follows then says what is missing).
func (r *rig) waitDecided(limit time.Duration) { testenv.Until(limit, r.usedUp) }

// feed produces the next n records of the input (all that is left if n
// is larger).
func (r *rig) feed(n int) {
	r.t.Helper()
	n = min(n, len(r.pending))
	r.k.Produce(inTopic, r.pending[:n]...)
	r.pending = r.pending[n:]
}

// everything, as run's upfront, produces the whole input before the
// replicas start: for a run whose only "fault" is its input.
const everything = -1

// run makes the input (events click events) and produces upfront records
// of it, starts replicas, runs fault while they work, produces the rest,
// waits for the end, and checks and reports. The fault feeds what it
// holds back: a scenario keeps input back for its faults, produced while
// or just before each lasts, so that the workers have input left when it
// ends and their recovery can be measured.
func run(t *testing.T, name string, r *rig, replicas, upfront int, fault func(r *rig) (faults int, recovery time.Duration)) {
	n := events
	if r.events > 0 {
		n = r.events
	}
	recs, tr := clickstream.Generate(n, 0.07, 0.01, uint64(len(name)))
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
	logs := map[int]*syncbuf.Buffer{}
	for i, w := range r.workers {
		live = append(live, i)
		logs[i] = w.stderr
	}
	r.mu.Unlock()
	// The group's generations: the most any worker counted (one that was
	// there from the start counts them all, if none restarted).
	var generations float64
	for _, m := range r.metrics() {
		generations = max(generations, m.Value("dedupe_rebalances_total"))
	}
	var peak int64
	for _, i := range live {
		peak = max(peak, r.peakRSS(i))
		r.stop(i)
	}
	out, dead := r.k.Read(outTopic), r.k.Read(dlqTopic)
	rep := clickstream.Check(tr, out, dead)
	deadReplays := len(dead) - clickstream.DistinctSources(dead)
	if r.failOpen {
		u := uncheckedPasses(out)
		t.Logf("%s: %d records forwarded unchecked; %d IDs passed more than once, of which %d had no unchecked record; %d sources written twice, %d of them checked",
			name, u.unchecked, rep.DuplicatesPass, u.unexplained, rep.Replays, u.checkedReplays)
		if u.unchecked == 0 {
			t.Errorf("%s: no record was forwarded unchecked: the worker did not fail open", name)
		}
		// A partition that moved (the second worker's join is a move) with
		// batches its previous owner delivered and had not committed is
		// read again by its new owner, which cannot ask the filter whether
		// they were delivered while Redis is down: it writes them again,
		// unchecked, after later offsets. At most the three batches the
		// previous owner had in hand per move; nothing else is written
		// twice.
		moves := max(int(generations)-1, 0)
		if rep.Replays > 0 && rep.Replays == u.uncheckedReplays && rep.Replays <= moves*3*inFlight {
			t.Logf("%s: %d unchecked records written again (replays of a partition that moved, %d moves), %d order breaks with them; some of them, by source: %s",
				name, rep.Replays, moves, rep.OrderBreaks, strings.Join(u.written, "; "))
			rep.OrderBreaks = 0
		} else if rep.Replays > 0 {
			t.Errorf("%s: %d records written again, %d of them unchecked, with %d partition moves (at most %d events may be written again): some of them, by source: %s",
				name, rep.Replays, u.uncheckedReplays, moves, moves*3*inFlight, strings.Join(u.written, "; "))
			for i, l := range logs {
				var kept []string
				for _, line := range strings.Split(l.String(), "\n") {
					if !strings.Contains(line, "failed; retrying") {
						kept = append(kept, line)
					}
				}
				t.Logf("%s: worker %d's log but for the retries:\n%s", name, i, tail(strings.Join(kept, "\n"), 6<<10))
			}
			rep.OrderBreaks = 0
		}
		rep.DuplicatesPass, rep.Replays = u.unexplained, u.checkedReplays
	}
	dupReplays := 0
	if r.keepDuplicates {
		dupReplays = checkDuplicates(t, name, tr, out, r.k.Read(dupsTopic))
	}
	addRow("%-22s %8d %8d %6d %10d %8d %10d %9d %10s %8d %v (run %v)", name, tr.Total, rep.Distinct, rep.Lost, rep.DuplicatesPass,
		rep.Replays, rep.DeadMissing, faults, fmt.Sprintf("%d/%d", len(r.recoveries), r.tries), peak>>20, recovery.Round(time.Millisecond),
		time.Since(start).Round(time.Second))
	if peak > maxRSS {
		t.Errorf("%s: a worker's peak resident memory was %d MiB, above the bound of %d MiB", name, peak>>20, maxRSS>>20)
	}
	if len(r.recoveries) == 0 && !r.steady {
		t.Errorf("%s: no recovery was measured", name)
	}
	t.Logf("%s: time to recover after each fault (%d measured of %d): %v", name, len(r.recoveries), r.tries, r.recoveries)
	if !rep.OK() {
		t.Errorf("%s: %v", name, rep)
	}
	// Only a batch acknowledged and not yet marked delivered when its
	// replica died is written again: one per fault at most, and none where
	// replicas only start and stop.
	// A replay is an event written again: forwarded, dead-lettered or
	// kept as a copy.
	if n, bound := rep.Replays+deadReplays+dupReplays, faults*inFlight; !r.replaysUnbounded && n > bound {
		t.Errorf("%s: %d replays (%d forwarded, %d dead-lettered, %d copies kept), more than the %d batches of %d one per fault can make",
			name, n, rep.Replays, deadReplays, dupReplays, faults, inFlight)
	}
	t.Logf("%s: %v", name, rep)
}

// uncheckedCount is what uncheckedPasses finds.
type uncheckedCount struct {
	unchecked   int // records forwarded unchecked
	unexplained int // IDs forwarded from several sources, none unchecked
	// Records beyond one per source: of sources with an unchecked record,
	// and of sources without.
	uncheckedReplays, checkedReplays int
	// written is, for a few sources written more than once, each of their
	// records: its verdict and its place in the output.
	written []string
}

// uncheckedPasses counts the output records forwarded unchecked, the IDs
// forwarded from more than one source none of whose records is (a copy
// that passed with nothing to explain it), and the sources written more
// than once, by whether one of their records went unchecked.
func uncheckedPasses(out []*kgo.Record) uncheckedCount {
	var c uncheckedCount
	sources := map[string]map[string]bool{}
	explained, bySource, uncheckedSource := map[string]bool{}, map[string]int{}, map[string]bool{}
	for _, rec := range out {
		id, src := clickstream.Header(rec, event.IDHeader), clickstream.Header(rec, event.SourceHeader)
		if sources[id] == nil {
			sources[id] = map[string]bool{}
		}
		sources[id][src] = true
		bySource[src]++
		if clickstream.Header(rec, event.VerdictHeader) == event.Unchecked {
			c.unchecked++
			explained[id], uncheckedSource[src] = true, true
		}
	}
	for id, srcs := range sources {
		if len(srcs) > 1 && !explained[id] {
			c.unexplained++
		}
	}
	places := map[string][]string{}
	for _, rec := range out {
		if src := clickstream.Header(rec, event.SourceHeader); bySource[src] > 1 && (len(places) < 3 || places[src] != nil) {
			places[src] = append(places[src], fmt.Sprintf("%s at %d/%d", clickstream.Header(rec, event.VerdictHeader), rec.Partition, rec.Offset))
		}
	}
	for src, p := range places {
		c.written = append(c.written, fmt.Sprintf("%s: %s", src, strings.Join(p, ", ")))
	}
	for src, n := range bySource {
		if uncheckedSource[src] {
			c.uncheckedReplays += n - 1
		} else {
			c.checkedReplays += n - 1
		}
	}
	return c
}

// failOpenAfter is DEDUPE_FAIL_OPEN_AFTER where a scenario sets it.
const failOpenAfter = 5 * time.Second

// checkDuplicates checks that the duplicates topic holds exactly the
// copies dropped: every valid event that is not its ID's first, once by
// source (a replay of a copy may write it again), none of them forwarded,
// each of an ID that was. It returns the records beyond one per source.
func checkDuplicates(t *testing.T, name string, tr clickstream.Truth, out, dups []*kgo.Record) int {
	t.Helper()
	forwardedIDs, forwardedSources := map[string]bool{}, map[string]bool{}
	for _, rec := range out {
		forwardedIDs[clickstream.Header(rec, event.IDHeader)] = true
		forwardedSources[clickstream.Header(rec, event.SourceHeader)] = true
	}
	sources := map[string]bool{}
	for _, rec := range dups {
		src := clickstream.Header(rec, event.SourceHeader)
		sources[src] = true
		switch {
		case forwardedSources[src]:
			t.Errorf("%s: %s is both forwarded and in the duplicates topic", name, src)
		case !forwardedIDs[clickstream.Header(rec, event.IDHeader)]:
			t.Errorf("%s: the copy %s has an ID never forwarded", name, src)
		case clickstream.Header(rec, event.VerdictHeader) != "duplicate":
			t.Errorf("%s: the copy %s has no dedupe-verdict: duplicate", name, src)
		}
	}
	if want := tr.Total - tr.Malformed - len(tr.Valid); len(sources) != want {
		t.Errorf("%s: the duplicates topic holds %d copies (%d records); the input has %d", name, len(sources), len(dups), want)
	}
	t.Logf("%s: duplicates topic: %d records, %d copies", name, len(dups), len(sources))
	return len(dups) - len(sources)
}

// inFlight is the most events a worker can have forwarded and not marked
// delivered when it dies: one batch (DEDUPE_BATCH_SIZE).
const inFlight = 500

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
	r.mutate = func(recs []*kgo.Record, tr *clickstream.Truth) []*kgo.Record {
		return clickstream.Hostile(recs, tr, 11)
	}
	run(t, "hostile input", r, 2, everything, func(r *rig) (int, time.Duration) {
		// No fault: the time until the replicas, just started, read.
		return 0, r.recovered(30 * time.Second)
	})
}

// Replicas are killed with SIGKILL twelve times and restarted. The kills
// take turns among three moments:
//   - any moment while input flows;
//   - with the replica's test-and-set in flight: Redis is stopped while the
//     replicas have input, a replica whose call waits in Redis's socket is
//     killed, and Redis then runs the call it finds in the dead client's
//     socket, so decisions are recorded whose events were never produced
//     (the crash between Redis and Kafka);
//   - between producing and committing: the group coordinator holds back
//     offset commits, and the replica whose commit arrives first is killed,
//     with its output acknowledged and its offsets not committed.
func TestWorkerCrashes(t *testing.T) {
	r := newRig(t)
	// Input arrives in chunks: one as each kill is prepared, so batches are
	// in flight when a replica dies, and one while the replica is down, so
	// that input is left when it is back (its partitions are read by no one
	// until the group rebalances) and the time until the group reads again
	// can be measured.
	chunk := events / 25
	run(t, "worker kill -9 x12", r, 3, chunk, func(r *rig) (int, time.Duration) {
		rng := rand.New(rand.NewPCG(3, 4))
		var worst time.Duration
		var moments [3]int
		for k := 0; k < 12; k++ {
			var i int
			switch k % 3 {
			case 0:
				// Once the workers read the new chunk, at a moment moved by
				// 20-200 ms.
				n := r.readTotal()
				r.feed(chunk)
				r.waitRead(n + 1)
				hold(time.Duration(20+rng.IntN(180)) * time.Millisecond)
				i = rng.IntN(3)
				r.kill(i)
				moments[0]++
			case 1:
				// Redis is stopped before the chunk arrives, so the calls that
				// decide it wait in Redis's sockets; the first replica seen
				// with one there is killed.
				r.redis.Pause()
				r.feed(chunk)
				from := rng.IntN(3)
				i = -1
				testenv.Until(10*time.Second, func() bool {
					for j := range 3 {
						if r.callWaiting((from + j) % 3) {
							i = (from + j) % 3
							return true
						}
					}
					return false
				})
				if i < 0 {
					r.redis.Resume()
					t.Fatal("no replica's test-and-set waited in the socket of the stopped Redis within 10s")
				}
				r.kill(i)
				r.redis.Resume()
				moments[1]++
			case 2:
				var ok bool
				if i, ok = r.killAtCommit(10*time.Second, chunk); !ok {
					continue
				}
				moments[2]++
			}
			// The replica stays down for 50-250 ms (or as long as half the
			// next chunk takes to produce, if longer). The other half comes
			// once it is back: the survivors may have read all of the first
			// half by then.
			down := time.Now()
			r.feed(chunk / 2)
			hold(time.Duration(50+rng.IntN(200))*time.Millisecond - time.Since(down))
			r.start(i)
			r.waitReady(i)
			worst = max(worst, r.recoveredAfter(func() { r.feed(chunk - chunk/2) }, 30*time.Second))
		}
		t.Logf("kills: %d at random, %d with a Redis call in flight, %d between produce and commit", moments[0], moments[1], moments[2])
		if moments[2] < 4 {
			t.Errorf("only %d of 4 kills between produce and commit happened", moments[2])
		}
		return moments[0] + moments[1] + moments[2], worst
	})
}

// callWaiting reports whether worker i has a call waiting in a socket of
// the (stopped) standalone Redis: bytes it sent that Redis has not read.
// Linux lists both ends of every loopback connection in /proc/net/tcp,
// each with its receive queue and socket inode; /proc/<pid>/fd names the
// worker's sockets by inode.
func (r *rig) callWaiting(i int) bool {
	r.mu.Lock()
	w := r.workers[i]
	r.mu.Unlock()
	if w == nil {
		return false
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", w.cmd.Process.Pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return false
	}
	mine := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if inode, ok := strings.CutPrefix(l, "socket:["); err == nil && ok {
			mine[strings.TrimSuffix(inode, "]")] = true
		}
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return false
	}
	_, p, _ := net.SplitHostPort(r.redis.Addr)
	port, _ := strconv.Atoi(p)
	redisPort := fmt.Sprintf("%04X", port)
	portOf := func(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }
	// The worker's ends of its connections to Redis, and the ends on
	// Redis's side with bytes to read, each by the other end's port.
	mineTo, queuedFrom := map[string]bool{}, map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[0] == "sl" {
			continue
		}
		local, remote := portOf(f[1]), portOf(f[2])
		switch {
		case remote == redisPort && mine[f[9]]:
			mineTo[local] = true
		case local == redisPort:
			_, rx, _ := strings.Cut(f[4], ":") // tx_queue:rx_queue
			if n, _ := strconv.ParseUint(rx, 16, 64); n > 0 {
				queuedFrom[remote] = true
			}
		}
	}
	for p := range mineTo {
		if queuedFrom[p] {
			return true
		}
	}
	return false
}

// killAtCommit holds back every offset commit, feeds n records of input
// so that commits come, kills the replica whose commit arrives first, and
// lets commits through again. It returns the replica's index, or false if
// no commit came within limit.
func (r *rig) killAtCommit(limit time.Duration, n int) (int, bool) {
	var holding atomic.Bool
	holding.Store(true)
	first := make(chan string, 1)
	r.k.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if !holding.Load() {
			r.k.DropControl() // an unhandled request leaves the control function in place otherwise
			return nil, nil, false
		}
		r.k.KeepControl()
		select {
		case first <- req.(*kmsg.OffsetCommitRequest).MemberID:
		default:
		}
		return nil, errors.New("commit held back by the test"), true
	})
	defer holding.Store(false)
	r.feed(n)
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
	// The last tenth of the input arrives during the stall: none of it can
	// be decided before Redis is back.
	chunk := events / 10
	run(t, "redis SIGSTOP 10s", r, 2, events-chunk, func(r *rig) (int, time.Duration) {
		const stall = 10 * time.Second
		r.waitRead(10_000)
		r.redis.Pause()
		stopped := time.Now()
		r.feed(len(r.pending))
		unready := func() bool { return !r.ready(0) && !r.ready(1) }
		testenv.Eventually(t, 5*time.Second, "both workers to be unready while Redis is stopped", unready)
		// The rest of the stall: both stay unready throughout.
		testenv.Throughout(t, stall-time.Since(stopped), "both workers unready while Redis is stopped", unready)
		r.redis.Resume()
		recovery := r.recovered(30 * time.Second)
		for i := 0; i < 2; i++ {
			r.waitReady(i)
		}
		return 1, recovery
	})
}

// Redis is stopped (SIGSTOP) for 30 s while input arrives. Waiting (the
// default), both workers are unready throughout and decide everything
// once Redis is back. Failing open (DEDUPE_FAIL_OPEN_AFTER=5s), they
// forward the input unchecked after 5 s, marked, each worker saying so
// once; nothing is lost, a copy passes only where one of its ID's records
// went unchecked, and once Redis is back nothing more goes unchecked.
func TestRedisDown(t *testing.T) {
	for _, open := range []bool{false, true} {
		name := "redis down 30s, wait"
		if open {
			name = "redis down 30s, open"
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			r.failOpen = open
			chunk := events / 10
			run(t, name, r, 2, events-3*chunk, func(r *rig) (int, time.Duration) {
				const down = 30 * time.Second
				r.waitRead(10_000)
				r.redis.Pause()
				stopped := time.Now()
				r.feed(chunk)
				unready := func() bool { return !r.ready(0) && !r.ready(1) }
				testenv.Eventually(t, 5*time.Second, "both workers to be unready while Redis is stopped", unready)
				if open {
					testenv.Eventually(t, down-time.Since(stopped), "events forwarded unchecked while Redis is stopped",
						func() bool { return r.metricTotal("dedupe_unchecked_total") > 0 })
				}
				testenv.Throughout(t, down-time.Since(stopped), "both workers unready while Redis is stopped", unready)
				r.redis.Resume()
				recovery := r.recoveredAfter(func() { r.feed(chunk) }, 30*time.Second)
				for i := 0; i < 2; i++ {
					r.waitReady(i)
				}
				// Back to checking: what arrives now is decided.
				before := r.metricTotal("dedupe_unchecked_total")
				if open != (before > 0) {
					t.Errorf("%s: %g events forwarded unchecked during the outage", name, before)
				}
				r.feed(len(r.pending))
				r.waitDecided(60 * time.Second)
				if after := r.metricTotal("dedupe_unchecked_total"); after != before {
					t.Errorf("%s: %g more events forwarded unchecked after Redis was back", name, after-before)
				}
				// What could write a record twice: a commit refused (a
				// partition moved) or a produce retried.
				for _, m := range r.metrics() {
					t.Logf("%s: errors by step: commit %g, produce %g, test_and_set %g, mark_delivered %g; rebalances %g", name,
						m.Value("dedupe_errors_total", "step", "commit"), m.Value("dedupe_errors_total", "step", "produce"),
						m.Value("dedupe_errors_total", "step", "test_and_set"), m.Value("dedupe_errors_total", "step", "mark_delivered"),
						m.Value("dedupe_rebalances_total"))
				}
				for i := 0; i < 2; i++ {
					log := r.stderr(i)
					for _, line := range []string{"forwarding valid events unchecked", "checking resumed"} {
						if n := strings.Count(log, line); open && n != 1 || !open && n != 0 {
							t.Errorf("%s: worker %d logged %q %d times", name, i, line, n)
						}
					}
				}
				return 1, recovery
			})
		})
	}
}

// Redis is killed and restarted from its append-only file (fsync always):
// filters and decision records survive, and the workers carry on.
func TestRedisRestartWithAOF(t *testing.T) {
	r := newRig(t, "--appendonly", "yes", "--appendfsync", "always")
	// The last tenth of the input arrives while Redis is down.
	chunk := events / 10
	run(t, "redis kill -9, AOF", r, 2, events-chunk, func(r *rig) (int, time.Duration) {
		const down = 2 * time.Second
		r.waitRead(10_000)
		r.redis.Kill()
		killed := time.Now()
		r.feed(len(r.pending))
		hold(down - time.Since(killed))
		if err := r.redis.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
		return 1, r.recovered(30 * time.Second)
	})
}

// Scale 1 -> 3 -> 1 while working: two replicas join, then leave
// gracefully. Partitions move four times with batches in flight, and no
// event is forwarded twice (run bounds replays by the faults: a graceful
// change is not one).
func TestRebalances(t *testing.T) {
	r := newRig(t)
	// A tenth of the input arrives during each change of the group.
	chunk := events / 10
	run(t, "scale 1->3->1", r, 1, events-2*chunk, func(r *rig) (int, time.Duration) {
		r.waitRead(10_000)
		before := r.eventsIn()
		r.start(1)
		r.start(2)
		r.feed(chunk)
		r.waitReady(1)
		r.waitReady(2)
		worst := r.recovered(30 * time.Second)
		// The two leave once all three share the work.
		testenv.Eventually(t, 30*time.Second, "each of the three workers to read input", func() bool {
			now := r.eventsIn()
			return now[0] > before[0] && now[1] > 0 && now[2] > 0
		})
		r.stop(1)
		r.stop(2)
		r.feed(len(r.pending))
		worst = max(worst, r.recovered(30*time.Second))
		// Worker 0 joined, saw the two join and saw them leave: three
		// generations at least (kfake may join the two in one).
		rebalances := func() float64 { return r.metrics()[0].Value("dedupe_rebalances_total") }
		testenv.Eventually(t, 10*time.Second, "worker 0 to count 3 rebalances or more", func() bool { return rebalances() >= 3 })
		t.Logf("scale 1->3->1: worker 0 counted %g rebalances", rebalances())
		return 0, worst
	})
}

// A rollout while events flow: each of three replicas is stopped with
// SIGTERM and started again, one after the other, twice; each new replica
// is ready before the next is stopped. No event is forwarded twice, and
// the duplicates topic holds exactly the copies dropped.
func TestRollout(t *testing.T) {
	r := newRig(t)
	r.keepDuplicates = true
	chunk := events / 8
	run(t, "rollout x2, 3 replicas", r, 3, chunk, func(r *rig) (int, time.Duration) {
		var worst time.Duration
		for round := 0; round < 2; round++ {
			for i := 0; i < 3; i++ {
				n := r.readTotal()
				r.feed(chunk / 2)
				r.waitRead(n + 1)
				r.stop(i)
				r.feed(chunk / 4)
				r.start(i)
				r.waitReady(i)
				// The other two may have read all there was meanwhile: the
				// recovery is measured on input of its own.
				worst = max(worst, r.recoveredAfter(func() { r.feed(chunk / 4) }, 30*time.Second))
			}
		}
		return 0, worst
	})
}

// Two replicas start on a backlog, the second while the first works: the
// partitions the first gives up hold batches it decided and delivered but
// did not commit. None is forwarded twice.
func TestStartOnBacklog(t *testing.T) {
	r := newRig(t)
	run(t, "start on a backlog", r, 1, everything, func(r *rig) (int, time.Duration) {
		r.waitRead(20_000)
		r.start(1)
		r.waitReady(1)
		return 0, r.recovered(30 * time.Second)
	})
}

// Live traffic at a steady 1,500 events/s into three replicas, with no
// restart and no fault: they keep up, and nothing is written twice.
// DEDUPE_TEST_STEADY_FOR sets how long the traffic lasts (60 s unless set).
func TestSteadyTraffic(t *testing.T) {
	const rate = 1500 // events per second
	last := 60 * time.Second
	if v := os.Getenv("DEDUPE_TEST_STEADY_FOR"); v != "" {
		var err error
		if last, err = time.ParseDuration(v); err != nil || last < time.Second {
			t.Fatalf("DEDUPE_TEST_STEADY_FOR=%q: want a duration of 1s or more", v)
		}
	}
	r := newRig(t)
	r.events, r.steady = int(last.Seconds()*rate), true
	name := fmt.Sprintf("steady %d/s for %v", rate, last)
	run(t, name, r, 3, 0, func(r *rig) (int, time.Duration) {
		for i := 0; i < 3; i++ {
			r.waitReady(i)
		}
		// What is due by now is produced every tick, so that a slow
		// produce does not lower the rate.
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		start, fed := time.Now(), 0
		for len(r.pending) > 0 {
			<-tick.C
			due := min(int(time.Since(start).Seconds()*rate), fed+len(r.pending)) - fed
			r.feed(due)
			fed += due
		}
		produced := time.Now()
		t.Logf("%s: %d events produced in %v", name, fed, produced.Sub(start).Round(time.Millisecond))
		r.waitDecided(60 * time.Second)
		t.Logf("%s: the last decided within %v of the last produced", name, time.Since(produced).Round(time.Millisecond))
		// The three joined once each (kfake may need a generation or two
		// more while they start); more would be replicas dropped under load.
		for i, m := range r.metrics() {
			t.Logf("%s: worker %d counted %g rebalances, %g replays skipped, %g forwarded", name, i, m.Value("dedupe_rebalances_total"),
				m.Value("dedupe_replays_total", "outcome", "skipped"), m.Value("dedupe_replays_total", "outcome", "forwarded"))
		}
		return 0, 0
	})
}

// Kafka misbehaves, each fault for 3 s: fetches of the input answered
// with an error code; fetch connections dropped; produces to the output
// answered REQUEST_TIMED_OUT after the broker wrote them (so the retries
// write copies: replays); produce connections dropped; then every output
// partition's leader moves to another broker (the output's stall is
// logged), then every input partition's.
func TestKafkaFaults(t *testing.T) {
	r := newRigBrokers(t, 3)
	// Input arrives in chunks, one for each fault: produced while a fetch
	// fault lasts, which keeps it from the workers until the fault ends;
	// and for the others just before, the fault starting once the workers
	// read it, so that it meets batches in flight. A worker decides at most
	// two batches it cannot deliver, so a produce fault leaves most of its
	// chunk for after it (and the test's own produces would fail while
	// produce connections are dropped).
	chunk := events / 8
	// Output produces answered REQUEST_TIMED_OUT after the broker wrote
	// them are written again: copies no worker can tell apart (kafka-go
	// has no idempotent producer).
	r.replaysUnbounded = true
	run(t, "kafka errors, leaders", r, 2, chunk, func(r *rig) (int, time.Duration) {
		const d = 3 * time.Second
		// busy feeds a chunk and waits until the workers read from it.
		busy := func() {
			n := r.readTotal()
			r.feed(chunk)
			r.waitRead(n + 1)
		}
		// end lets the fault that began at began last d, stops it (stop
		// says how many requests it hit), checks it happened, and
		// measures the recovery.
		end := func(what string, began time.Time, stop func() int) time.Duration {
			hold(d - time.Since(began))
			n := stop()
			if n == 0 {
				t.Errorf("%s: no request was hit: the fault did not happen", what)
			}
			t.Logf("%s: %d requests", what, n)
			return r.recovered(30 * time.Second)
		}
		// refuse answers the requests f selects with f.Err until stopped.
		refuse := func(f kfake.Fault) (string, time.Time, func() int) {
			f.Count = -1
			h := r.k.Fault(f)
			return fmt.Sprintf("%s on %s answered %s", f.Keys[0].Name(), f.Topic, f.Err.Message), time.Now(), func() int { h.Remove(); return h.Hits() }
		}
		// drop closes the connection of every key request until stopped.
		drop := func(key kmsg.Key) (string, time.Time, func() int) {
			var on atomic.Bool
			var dropped atomic.Int64
			on.Store(true)
			r.k.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
				if !on.Load() {
					r.k.DropControl()
					return nil, nil, false
				}
				r.k.KeepControl()
				dropped.Add(1)
				return nil, errors.New("injected failure"), true // kfake closes the connection
			})
			return key.Name() + " connections dropped", time.Now(), func() int { on.Store(false); return int(dropped.Load()) }
		}

		r.waitRead(10_000)
		what, began, stop := refuse(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: inTopic, Err: kerr.UnknownServerError})
		r.feed(chunk)
		worst := end(what, began, stop)

		what, began, stop = drop(kmsg.Fetch)
		r.feed(chunk)
		worst = max(worst, end(what, began, stop))

		busy()
		worst = max(worst, end(refuse(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: outTopic, Err: kerr.RequestTimedOut})))

		busy()
		worst = max(worst, end(drop(kmsg.Produce)))

		// The output's leaders move first, while the workers write, and a
		// chunk of input for every partition follows: the stall is the time
		// until every output partition has grown again. The writers read
		// the metadata on the first NOT_LEADER_OR_FOLLOWER answer, not on
		// their transport's timer (up to 6 s later).
		busy()
		ends := r.outputEnds()
		moved := time.Now()
		for p := int32(0); p < 6; p++ {
			if err := r.k.MoveTopicPartition(outTopic, p, (r.k.LeaderFor(outTopic, p)+1)%3); err != nil {
				t.Errorf("moving %s/%d: %v", outTopic, p, err)
			}
		}
		r.feed(chunk)
		testenv.Eventually(t, 30*time.Second, "every output partition to grow after its leader moved", func() bool {
			now := r.outputEnds()
			for p, end := range ends {
				if now[p] <= end {
					return false
				}
			}
			return len(ends) == 6
		})
		t.Logf("output leaders moved: every output partition grew again %v after", time.Since(moved).Round(time.Millisecond))
		// Then the input's, while the workers read.
		busy()
		for p := int32(0); p < 6; p++ {
			if err := r.k.MoveTopicPartition(inTopic, p, (r.k.LeaderFor(inTopic, p)+1)%3); err != nil {
				t.Errorf("moving %s/%d: %v", inTopic, p, err)
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

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/syncbuf"
	"dedupe-worker/internal/testenv"
)

func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dedupe-worker")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func baseEnv(brokers, redisAddr, httpAddr string) []string {
	return append(os.Environ(), workerVars(brokers, redisAddr, httpAddr)...)
}

// workerVars are the DEDUPE_* variables of the tests' worker.
func workerVars(brokers, redisAddr, httpAddr string) []string {
	return []string{"DEDUPE_PIPELINE=bin", "DEDUPE_KAFKA_BROKERS=" + brokers, "DEDUPE_INPUT_TOPIC=in", "DEDUPE_OUTPUT_TOPIC=out",
		"DEDUPE_DLQ_TOPIC=dlq", "DEDUPE_REDIS_ADDRS=" + redisAddr, "DEDUPE_ID_FIELD=id", "DEDUPE_EXPECTED_PER_WINDOW=100000",
		"DEDUPE_HTTP_ADDR=" + httpAddr, "DEDUPE_SHUTDOWN_TIMEOUT=10s", "DEDUPE_LOG_LEVEL=warn", "DEDUPE_FILTER=" + testenv.Filter()}
}

// startBinary runs bin with env, its stderr collected (readable while it
// runs); it is killed when the test ends if still running.
func startBinary(t *testing.T, bin string, env []string) (*exec.Cmd, *syncbuf.Buffer) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = env
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, stderr
}

// terminate sends SIGTERM to cmd and returns how long the exit took and
// what Wait returned; it fails the test if there is none within limit.
func terminate(t *testing.T, cmd *exec.Cmd, stderr *syncbuf.Buffer, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(limit):
		t.Fatalf("no exit %v after SIGTERM; stderr:\n%s", limit, stderr.String())
		return 0, nil
	}
}

// The real binary: it starts, becomes ready, and on SIGTERM finishes and
// exits 0 within its shutdown bound.
func TestBinarySIGTERM(t *testing.T) {
	bin := build(t)
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 2})
	srv := testenv.Redis(t)
	httpAddr := redisproc.FreeAddr()

	cmd, stderr := startBinary(t, bin, baseEnv(strings.Join(k.Addrs(), ","), srv.Addr, httpAddr))

	var recs []*kgo.Record
	for i := 0; i < 500; i++ {
		recs = append(recs, &kgo.Record{Value: []byte(fmt.Sprintf(`{"id":"x%d"}`, i%300))})
	}
	k.Produce("in", recs...)
	// Ready, and all 500 events decided: SIGTERM then meets a worker that
	// has done work, not one still starting.
	var m testenv.Metrics
	if !testenv.Until(30*time.Second, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		m, _ = testenv.Scrape(context.Background(), "http://"+httpAddr+"/metrics")
		return resp.StatusCode == 200 && m.Value("dedupe_verdicts_total") == 500
	}) {
		t.Fatalf("not ready with 500 events decided after 30s:\n%s\nstderr:\n%s", m.Show("dedupe_verdicts"), stderr.String())
	}
	took, err := terminate(t, cmd, stderr, 20*time.Second)
	if err != nil {
		t.Fatalf("exit: %v; stderr:\n%s", err, stderr.String())
	}
	t.Logf("exited 0, %v after SIGTERM", took.Round(time.Millisecond))
}

// A bad variable stops the start with exit code 2 and one line naming it,
// without showing a password.
func TestBinaryBadConfig(t *testing.T) {
	bin := build(t)
	const pw = "binary-pw-4f1e"
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"DEDUPE_WINDOW", []string{"DEDUPE_WINDOW=soon"}},
		{"DEDUPE_KAFKA_SASL_MECHANISM", []string{"DEDUPE_KAFKA_SASL_MECHANISM=GSSAPI", "DEDUPE_KAFKA_SASL_USERNAME=u", "DEDUPE_KAFKA_SASL_PASSWORD=" + pw}},
		{"DEDUPE_KAFKA_SASL_USERNAME", []string{"DEDUPE_KAFKA_SASL_MECHANISM=SCRAM-SHA-512", "DEDUPE_KAFKA_SASL_PASSWORD=" + pw}},
		{"DEDUPE_REDIS_TLS_CA_FILE", []string{"DEDUPE_REDIS_TLS_CA_FILE=" + filepath.Join(t.TempDir(), "none.pem"), "DEDUPE_REDIS_PASSWORD=" + pw}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Env = append(baseEnv("127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:0"), tc.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2", err)
			}
			msg := strings.TrimSpace(stderr.String())
			if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, tc.name) {
				t.Fatalf("stderr %q: want one line naming %s", msg, tc.name)
			}
			if strings.Contains(msg, pw) {
				t.Fatalf("stderr shows the password: %q", msg)
			}
		})
	}
}

func TestPlanCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"plan", "-n", "7000000", "-p", "1e-6", "-max-growth", "1"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "3x5") || !strings.Contains(out.String(), "7.3e-07") || strings.Contains(out.String(), "growth") {
		t.Fatalf("plan output without growth:\n%s", out.String())
	}
	// With growth, a row per load; the planner takes the shards the last
	// stage needs, so the window reaches 64x.
	out.Reset()
	if code := run([]string{"plan", "-n", "7000000", "-p", "1e-6", "-max-growth", "64", "-shards", "1"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"\n1x ", "\n4x ", "\n16x ", "\n64x ", "(64x)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan output with growth has no %q:\n%s", want, out.String())
		}
	}
	// The lag bound's windows are counted: 10-minute rolling windows and
	// a 1h bound keep 3 + 6 windows of 28 MiB, a 6h bound 3 + 36.
	// A daily fixed window's next day is made shortly before midnight, so
	// a day with a 1h bound keeps 2 windows at most, not 3.
	for _, tc := range []struct{ window, mode, lag, want string }{
		{"10m", "rolling", "1h", "at most 9 windows of keys live at once"},
		{"10m", "rolling", "6h", "at most 39 windows of keys live at once"},
		{"24h", "fixed", "1h", "at most 2 windows of keys live at once"},
	} {
		out.Reset()
		if code := run([]string{"plan", "-n", "7000000", "-p", "1e-6", "-window", tc.window, "-mode", tc.mode, "-max-lag", tc.lag}, &out, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("max lag %s: want %q in\n%s", tc.lag, tc.want, out.String())
		}
	}
}

// plan says where the IDs come from and what the mode does when those
// variables are set, and refuses them out of range.
func TestPlanNamesIDSource(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		code int
		want string
	}{
		{[]string{"DEDUPE_ID_FIELD=tenant_id,meta.click_id", "DEDUPE_MODE=shadow"}, 0,
			"IDs: composite of JSON fields tenant_id, meta.click_id; mode shadow: every valid event is forwarded"},
		{[]string{"DEDUPE_ID_FROM=value"}, 0, "IDs: a 128-bit hash of the value; mode drop"},
		{[]string{"DEDUPE_ID_FROM=header"}, 2, "DEDUPE_ID_HEADER"},
		{[]string{"DEDUPE_ID_FROM=key", "DEDUPE_MODE=observe"}, 2, "DEDUPE_MODE"},
	} {
		t.Run(strings.Join(tc.env, " "), func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := run([]string{"plan", "-n", "1000000"}, &out, &errb)
			if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s%s", code, tc.code, tc.want, out.String(), errb.String())
			}
		})
	}
}

func TestUsageNamesSubcommands(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"help"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, sub := range []string{"run", "plan", "stats"} {
		if !strings.Contains(out.String(), "\n  "+sub+" ") {
			t.Errorf("usage does not name %s:\n%s", sub, out.String())
		}
	}
	// The demo and the traffic tools are commands of their own.
	for _, sub := range []string{"demo", "generate", "count"} {
		out.Reset()
		errb.Reset()
		if code := run([]string{sub}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage: dedupe-worker") {
			t.Errorf("%s: exit %d, stderr %q; want 2 and the usage", sub, code, errb.String())
		}
	}
}

// SIGTERM while nothing can finish: Kafka refuses every produce to the
// output topic and Redis is stopped. The worker gives up the batches in
// hand (uncommitted, so they are read again), and exits 1 within its
// documented bound, DEDUPE_SHUTDOWN_TIMEOUT plus 5 s.
func TestBinarySIGTERMWhenNothingCanFinish(t *testing.T) {
	bin := build(t)
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 2})
	srv := testenv.Redis(t)
	httpAddr := redisproc.FreeAddr()
	cmd, stderr := startBinary(t, bin, append(baseEnv(strings.Join(k.Addrs(), ","), srv.Addr, httpAddr),
		"DEDUPE_SHUTDOWN_TIMEOUT=3s", "DEDUPE_REDIS_TIMEOUT=500ms", "DEDUPE_KAFKA_TIMEOUT=1s", "DEDUPE_BATCH_SIZE=50"))
	events := func(from, to int) {
		var recs []*kgo.Record
		for i := from; i < to; i++ {
			recs = append(recs, &kgo.Record{Value: []byte(fmt.Sprintf(`{"id":"s%d"}`, i))})
		}
		k.Produce("in", recs...)
	}
	metrics := func() testenv.Metrics {
		m, _ := testenv.Scrape(context.Background(), "http://"+httpAddr+"/metrics")
		return m
	}
	events(0, 100)
	testenv.Eventually(t, 30*time.Second, "100 events forwarded", func() bool { return metrics().Value("dedupe_events_forwarded_total") == 100 })

	// Kafka refuses the output, then Redis stops: one batch waits to be
	// produced, the next to be decided.
	k.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		if pr := req.(*kmsg.ProduceRequest); len(pr.Topics) > 0 && pr.Topics[0].Topic == "out" {
			return nil, errors.New("injected produce refusal"), true
		}
		return nil, nil, false
	})
	events(100, 150)
	testenv.Eventually(t, 30*time.Second, "produces refused", func() bool { return metrics().Value("dedupe_errors_total", "step", consumer.StepProduce) > 0 })
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume() })
	events(150, 200)
	testenv.Eventually(t, 30*time.Second, "test-and-set failing", func() bool { return metrics().Value("dedupe_errors_total", "step", consumer.StepDecide) > 0 })

	bound := 3*time.Second + consumer.ReaderCloseTimeout + app.CloseTimeout
	took, err := terminate(t, cmd, stderr, bound+20*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("exit %v, want 1 (batches in hand not finished); stderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "finishing the batches in hand") {
		t.Errorf("stderr does not say which batches were given up:\n%s", stderr.String())
	}
	// The bound plus a second for the process to be reaped.
	if took > bound+time.Second {
		t.Errorf("exited %v after SIGTERM, beyond the bound of %v", took, bound)
	}
	t.Logf("exited 1, %v after SIGTERM (bound %v)", took.Round(time.Millisecond), bound)
}

// The binary against a Redis at volatile-lru: exit code 1 and one line,
// logged with "exiting", naming the server, the policy and the setting.
func TestBinaryRefusesEvictingPolicy(t *testing.T) {
	bin := build(t)
	k := testenv.StartKafka(t, testenv.Topics{"in": 1, "out": 1, "dlq": 1})
	srv := testenv.Redis(t, "--maxmemory-policy", "volatile-lru")
	cmd, stderr := startBinary(t, bin, baseEnv(strings.Join(k.Addrs(), ","), srv.Addr, redisproc.FreeAddr()))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("still running after 60s; stderr:\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1; stderr:\n%s", err, stderr.String())
	}
	msg := strings.TrimSpace(stderr.String())
	if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "exiting") || !strings.Contains(msg, srv.Addr+" has maxmemory-policy volatile-lru") ||
		!strings.Contains(msg, "set maxmemory-policy noeviction") {
		t.Fatalf("stderr %q: want one line naming the server, the policy and the setting", msg)
	}
}

// plan compares the kinds for the same n, p and window: each kind's
// memory, its Redis work and its measured Redis CPU per ID (naming the
// server it was measured on), and with -rate the cores and masters each
// needs; it says which it recommends. The figures are the benchmarks'
// (kinds.go), each measured, none left at zero.
func TestPlanComparesKinds(t *testing.T) {
	for _, m := range measured {
		if m.us <= 0 || m.setnx <= 0 || m.server == "" {
			t.Errorf("measured figure %+v: no measurement", m)
		}
	}
	var out, errb bytes.Buffer
	const rate = 200_000
	if code := run([]string{"plan", "-n", "7000000", "-p", "1e-9", "-rate", strconv.Itoa(rate)}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	text := out.String()
	_, table, ok := strings.Cut(text, "the kinds compared")
	if !ok {
		t.Fatalf("no comparison of the kinds:\n%s", text)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(table, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && (f[0] == "bloom" || f[0] == "fingerprint") {
			rows[f[0]] = f
		}
	}
	for _, kind := range []bloom.Kind{bloom.KindBloom, bloom.KindFingerprint} {
		f := rows[kind.String()]
		if f == nil {
			t.Fatalf("no row for %s:\n%s", kind, table)
		}
		us, _, _, server := measuredCPU(kind, 1e-9)
		line := strings.Join(f, " ")
		if !strings.Contains(line, fmt.Sprintf("%.1f us", us)) || !strings.Contains(line, server) {
			t.Errorf("%s: want %.1f us measured on %s in %q", kind, us, server, line)
		}
		// The last two columns: cores at the rate, and masters at half a
		// core each.
		cores, err := strconv.ParseFloat(f[len(f)-2], 64)
		if err != nil || math.Abs(cores-rate*us*1e-6) > 0.01 {
			t.Errorf("%s: %q cores at %d/s, want %.2f", kind, f[len(f)-2], rate, rate*us*1e-6)
		}
		if want := strconv.Itoa(max(1, int(math.Ceil(rate*us*1e-6/loadPerMaster)))); f[len(f)-1] != want {
			t.Errorf("%s: %s masters, want %s", kind, f[len(f)-1], want)
		}
	}
	if !strings.Contains(table, "recommended: fingerprint") {
		t.Errorf("at 1e-9 the fingerprint table takes less memory and less Redis CPU; want it recommended:\n%s", table)
	}
	// -filter fingerprint plans tables, and refuses a Bloom layout.
	out.Reset()
	if code := run([]string{"plan", "-n", "7000000", "-p", "1e-9", "-filter", "fingerprint", "-max-growth", "1"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "fp4x") {
		t.Errorf("-filter fingerprint: exit %d, want a table of 4-byte fingerprints (fp4x...):\n%s%s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run([]string{"plan", "-n", "7000000", "-filter", "fingerprint", "-layout", "4x4"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "-layout") {
		t.Errorf("-filter fingerprint -layout 4x4: exit %d, %q; want 2 and a line naming -layout", code, errb.String())
	}
}

// plan refuses a DEDUPE_ variable that names no setting, as the worker
// does: a misspelt one would leave its flag at the default unnoticed.
func TestPlanRefusesUnknownVariable(t *testing.T) {
	t.Setenv("DEDUPE_WINDOWZ", "24h")
	var out, errb bytes.Buffer
	if code := run([]string{"plan", "-n", "7000000"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "did you mean DEDUPE_WINDOW?") {
		t.Errorf("plan with DEDUPE_WINDOWZ set: exit %d, %q; want 2 and a line naming DEDUPE_WINDOW", code, errb.String())
	}
}

// plan reads its variables as the worker does: a value the worker refuses
// stops it with one line naming the variable, instead of a plan made with
// the default or with the value; a flag out of range is named as the flag.
func TestPlanRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		env, args []string
		want      string
	}{
		{[]string{"DEDUPE_WINDOW=1500ms"}, nil, "DEDUPE_WINDOW: "},
		{[]string{"DEDUPE_WINDOW=soon"}, []string{"-n", "1000"}, "DEDUPE_WINDOW: "},
		{[]string{"DEDUPE_SHARDS=0"}, []string{"-n", "1000"}, "DEDUPE_SHARDS: "},
		{[]string{"DEDUPE_REDIS_TIMEOUT=1ms"}, nil, "DEDUPE_REDIS_TIMEOUT: "},
		{[]string{"DEDUPE_START_OFFSET=yesterday"}, nil, "DEDUPE_START_OFFSET: "},
		{nil, []string{"-window", "1500ms"}, "-window: "},
		{nil, []string{"-mode", "sliding"}, "-mode: "},
		{nil, []string{"-n", "0"}, "-n: "},
	} {
		t.Run(strings.Join(append(tc.env, tc.args...), " "), func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := run(append([]string{"plan"}, tc.args...), &out, &errb)
			if code != 2 || out.Len() != 0 || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, and one line naming %q", code, out.String(), errb.String(), tc.want)
			}
		})
	}
}

// The worker refuses to start on a DEDUPE_ variable that names no
// setting, with one line naming it and the nearest setting, before it
// connects to anything.
func TestRunRefusesUnknownVariable(t *testing.T) {
	for k, v := range map[string]string{"DEDUPE_PIPELINE": "p", "DEDUPE_KAFKA_BROKERS": "127.0.0.1:1", "DEDUPE_INPUT_TOPIC": "in",
		"DEDUPE_OUTPUT_TOPIC": "out", "DEDUPE_DLQ_TOPIC": "dlq", "DEDUPE_REDIS_ADDRS": "127.0.0.1:1", "DEDUPE_WINDOWZ": "24h"} {
		t.Setenv(k, v)
	}
	var out, errb bytes.Buffer
	code := run([]string{"run"}, &out, &errb)
	if code != 2 || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), "DEDUPE_WINDOWZ is not a setting; did you mean DEDUPE_WINDOW?") {
		t.Errorf("run with DEDUPE_WINDOWZ set: exit %d, %q; want 2 and one line naming DEDUPE_WINDOW", code, errb.String())
	}
}

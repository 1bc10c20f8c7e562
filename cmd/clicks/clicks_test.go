package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/app"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/syncbuf"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

var clickID = regexp.MustCompile(`"click_id":"(click-[0-9a-f]+-[0-9]+)"`)

// generate started before Kafka is up keeps trying, then produces exactly
// the stream its flags ask for.
func TestGenerateWaitsForKafka(t *testing.T) {
	port, err := redisproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	t.Setenv("DEDUPE_KAFKA_BROKERS", addr)
	t.Setenv("DEDUPE_INPUT_TOPIC", "in")
	t.Setenv("DEDUPE_REDIS_ADDRS", "") // not needed
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	start := time.Now()
	go func() {
		done <- RunGenerate(ctx, []string{"-n", "400", "-rate", "2000", "-dup", "0.1", "-bad", "0.05", "-seed", "5"}, &stdout, &stderr)
	}()
	// It has tried and failed at least once, and goes on trying.
	testenv.Eventually(t, 20*time.Second, "generate to report that it cannot produce yet", func() bool {
		select {
		case code := <-done:
			t.Fatalf("generate returned %d before Kafka was up; stderr:\n%s", code, stderr.String())
		default:
		}
		return strings.Contains(stderr.String(), "cannot produce to in on "+addr+" yet, retrying")
	})
	testenv.StartKafka(t, testenv.Topics{"in": 2}, kfake.Ports(port))
	if code := <-done; code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	t.Logf("done %v after start; stdout %q; stderr %q", time.Since(start).Round(time.Millisecond), stdout.String(), stderr.String())
	recs, err := clickstream.ReadToEnd(ctx, []string{addr}, "in")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 400 {
		t.Fatalf("%d records in the topic, want 400", len(recs))
	}
	var got []string
	for _, r := range recs {
		if m := clickID.FindSubmatch(r.Value); m != nil {
			got = append(got, string(m[1]))
		}
	}
	slices.Sort(got)
	want, _ := clickstream.StreamIDs(400, 0.1, 0.05, 5)
	if !slices.Equal(got, want) {
		t.Fatalf("%d valid events produced, the stream has %d (or they differ)", len(got), len(want))
	}
	if !strings.Contains(stdout.String(), "produced 400 events") {
		t.Fatalf("stdout %q", stdout.String())
	}
}

// generate -> a worker -> count, over TCP: the counter's totals are the
// distinct valid clicks the generator made.
func TestGenerateCount(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 4, "out": 4, "dlq": 1})
	brokers := k.Addrs()
	srv := testenv.Redis(t)
	cfg := replicas.Config("clicks", brokers, srv.Addr)
	cfg.IDField, cfg.TimeField, cfg.FalsePositiveRate = "click_id", "ts", 1e-9
	worker := replicas.Start(t, cfg, replicas.Runs(app.New), nil)
	defer func() {
		if err := worker.Stop(); err != nil {
			t.Errorf("worker: %v", err)
		}
	}()

	t.Setenv("DEDUPE_KAFKA_BROKERS", strings.Join(brokers, ","))
	t.Setenv("DEDUPE_INPUT_TOPIC", "in")
	t.Setenv("DEDUPE_OUTPUT_TOPIC", "out")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var gout, gerr bytes.Buffer
	if code := RunGenerate(ctx, []string{"-n", "3000", "-rate", "20000", "-seed", "11"}, &gout, &gerr); code != 0 {
		t.Fatalf("generate: exit %d: %s", code, gerr.String())
	}
	_, distinct := clickstream.StreamIDs(3000, 0.07, 0.01, 11)

	cctx, stopCount := context.WithCancel(ctx)
	defer stopCount()
	var cout, cerr syncbuf.Buffer
	countDone := make(chan int, 1)
	go func() { countDone <- RunCount(cctx, []string{"-every", "100ms"}, &cout, &cerr) }()
	totals := regexp.MustCompile(`count: records (\d+), distinct sources (\d+), replays (\d+), distinct dedupe-id (\d+)`)
	last := func() []int {
		lines := strings.Split(strings.TrimSpace(cout.String()), "\n")
		m := totals.FindStringSubmatch(lines[len(lines)-1])
		if m == nil {
			return nil
		}
		out := make([]int, 4)
		for i := range out {
			out[i], _ = strconv.Atoi(m[i+1])
		}
		return out
	}
	if !testenv.Until(30*time.Second, func() bool { v := last(); return v != nil && v[1] >= distinct }) {
		t.Fatalf("count never reached %d distinct sources; stdout:\n%s\nstderr:\n%s", distinct, cout.String(), cerr.String())
	}
	stopCount()
	if code := <-countDone; code != 0 {
		t.Fatalf("count: exit %d: %s", code, cerr.String())
	}
	final := cout.String()
	if !strings.HasSuffix(strings.TrimSpace(final), "(final)") {
		t.Fatalf("no final line:\n%s", final)
	}
	v := last()
	if v == nil || v[1] != distinct || v[3] != distinct || v[0] != v[1]+v[2] {
		t.Fatalf("final totals %v: want %d distinct sources and IDs, records = sources + replays\n%s", v, distinct, final)
	}
	t.Logf("generate: %s; count, last lines: %s", strings.TrimSpace(gout.String()), lastLines(final, 2))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// count counts each dedupe-source once and the rest as replays.
func TestCountReplays(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"out": 3})
	rec := func(src, id string) *kgo.Record {
		r := &kgo.Record{Value: []byte("{}")}
		if src != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: clickstream.SourceHeader, Value: []byte(src)})
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: clickstream.IDHeader, Value: []byte(id)})
		return r
	}
	var recs []*kgo.Record
	for i := range 10_000 {
		recs = append(recs, rec(fmt.Sprintf("clicks/%d/%d", i%4, i/4), fmt.Sprintf("id-%d", i%9000)))
	}
	// Replays of sources near block edges, one odd source twice, one
	// record without a source.
	recs = append(recs, rec("clicks/0/0", "id-0"), rec("clicks/3/2499", "id-9999"), rec("clicks/1/1023", "id-4093"),
		rec("no-slashes", "x"), rec("no-slashes", "x"), rec("", "y"))
	k.Produce("out", recs...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out syncbuf.Buffer
	cctx, stop := context.WithCancel(ctx)
	type result struct {
		t   Totals
		err error
	}
	done := make(chan result, 1)
	go func() {
		tot, err := Count(cctx, CountOptions{Brokers: k.Addrs(), Topic: "out", Every: 100 * time.Millisecond, Out: &out})
		done <- result{tot, err}
	}()
	if !testenv.Until(20*time.Second, func() bool { return strings.Contains(out.String(), "records 10006,") }) {
		t.Fatalf("never read all records:\n%s", out.String())
	}
	stop()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := Totals{Records: 10_006, Sources: 10_002, Replays: 4, IDs: 9_003, NoSource: 1}
	if r.t != want {
		t.Fatalf("totals %+v, want %+v", r.t, want)
	}
}

func TestGenerateCountNeedOnlyKafka(t *testing.T) {
	for _, tc := range []struct {
		cmd  func(context.Context, []string, io.Writer, io.Writer) int
		env  []string
		want string
	}{
		{RunGenerate, []string{"DEDUPE_INPUT_TOPIC", "in"}, "DEDUPE_KAFKA_BROKERS"},
		{RunGenerate, []string{"DEDUPE_KAFKA_BROKERS", "127.0.0.1:1"}, "DEDUPE_INPUT_TOPIC"},
		{RunCount, []string{"DEDUPE_KAFKA_BROKERS", "127.0.0.1:1"}, "DEDUPE_OUTPUT_TOPIC"},
	} {
		for _, v := range []string{"DEDUPE_KAFKA_BROKERS", "DEDUPE_INPUT_TOPIC", "DEDUPE_OUTPUT_TOPIC"} {
			t.Setenv(v, "")
		}
		t.Setenv(tc.env[0], tc.env[1])
		var out, errb bytes.Buffer
		if code := tc.cmd(context.Background(), nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("exit %d, stderr %q: want 2 naming %s", code, errb.String(), tc.want)
		}
	}
}

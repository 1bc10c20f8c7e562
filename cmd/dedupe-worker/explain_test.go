package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/testenv"
)

// explain, with the worker's own variables, tells a seen ID from a new
// one and gives each offset its recorded verdict.
func TestExplainCommand(t *testing.T) {
	f := explainFilter(t)
	now := testenv.Now()
	src := func(off int64) bloom.Source { return bloom.Source{Topic: "in", Partition: 3, Offset: off} }
	d, err := f.Decide(t.Context(), []bloom.Element{{ID: []byte("click-1"), Time: now, Source: src(0)}, {ID: []byte("click-1"), Time: now, Source: src(1)}}, nil)
	if v := d.Verdicts; err != nil || v[0] != bloom.FirstSeen || v[1] != bloom.Duplicate {
		t.Fatalf("verdicts %v, %v", v, err)
	}
	// Offset 0 delivered, offset 1 not yet.
	if err := f.Delivered(t.Context(), d, []bloom.Source{src(0)}); err != nil {
		t.Fatal(err)
	}

	explain := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(append([]string{"explain"}, args...), &out, &errb); code != 0 {
			t.Fatalf("explain %v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	at := strconv.FormatInt(now.Unix(), 10)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-id", "click-1", "-time", at}, []string{"a copy decided now: duplicate, dropped", " true\n", "shard 0"}},
		{[]string{"-id", "click-2", "-time", now.Format(time.RFC3339)}, []string{"a copy decided now: first seen, forwarded", " false\n"}},
		{[]string{"-id", "click-1", "-time", now.Add(-3 * time.Hour).Format(time.RFC3339)}, []string{"late (past its deadline)"}},
		{[]string{"-source", "in/3/0"}, []string{"recorded verdict: forwarded", "decided up to offset 1", "delivered up to offset 0"}},
		{[]string{"-source", "in/3/1"}, []string{"recorded verdict: dropped as a duplicate"}},
		{[]string{"-source", "in/3/7"}, []string{"no verdict: offset 7 is past the highest decided (1)"}},
		{[]string{"-source", "in/4/0"}, []string{"does not exist"}},
	} {
		out := explain(tc.args...)
		t.Logf("explain %s\n%s", strings.Join(tc.args, " "), out)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("explain %v: no %q in\n%s", tc.args, w, out)
			}
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"explain", "-id", "x"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "-time") {
		t.Errorf("explain -id alone: exit %d, %q", code, errb.String())
	}
}

// explain makes the ID as the worker does from what an operator sees:
// the fields of a composite, a binary key in hexadecimal, the value of an
// event whose ID is its hash; and says what shadow mode does with a
// duplicate.
func TestExplainIDSources(t *testing.T) {
	f := explainFilter(t)
	now := testenv.Now()
	value := []byte{0x00, 0x00, 0x00, 0x01, 0x2c, 0x02, 0xff}
	key := []byte{0x00, 0x00, 0x00, 0x01, 0x2c, 'k'}
	ids := [][]byte{consumer.AppendCompositeID(nil, []byte("a"), []byte("bc")), consumer.AppendValueID(nil, value), key}
	var elems []bloom.Element
	for i, id := range ids {
		elems = append(elems, bloom.Element{ID: id, Time: now, Source: bloom.Source{Topic: "in", Partition: 0, Offset: int64(2 * i)}},
			bloom.Element{ID: id, Time: now, Source: bloom.Source{Topic: "in", Partition: 0, Offset: int64(2*i + 1)}})
	}
	if _, err := f.TestAndSet(t.Context(), elems); err != nil {
		t.Fatal(err)
	}
	valueFile := filepath.Join(t.TempDir(), "value.bin")
	if err := os.WriteFile(valueFile, value, 0o644); err != nil {
		t.Fatal(err)
	}
	at := strconv.FormatInt(now.Unix(), 10)
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		want []string
	}{
		{[]string{"DEDUPE_ID_FIELD=tenant,click_id"}, []string{"-part", "a", "-part", "bc", "-time", at},
			0, []string{`the worker makes the ID "1:a,2:bc,"`, "duplicate, dropped"}},
		{[]string{"DEDUPE_ID_FIELD=tenant,click_id"}, []string{"-part", "ab", "-part", "c", "-time", at},
			0, []string{`"2:ab,1:c,"`, "first seen, forwarded"}},
		{[]string{"DEDUPE_ID_FIELD=tenant,click_id"}, []string{"-part", "a", "-time", at}, 2, []string{"one per field"}},
		{[]string{"DEDUPE_ID_FIELD=", "DEDUPE_ID_FROM=value"}, []string{"-value", valueFile, "-time", at},
			0, []string{string(ids[1]), "duplicate, dropped"}},
		{[]string{"DEDUPE_ID_FIELD=", "DEDUPE_ID_FROM=value", "DEDUPE_MODE=shadow"}, []string{"-id", string(ids[1]), "-time", at, "-source", "in/0/3"},
			0, []string{"forwarded with dedupe-verdict: duplicate", "recorded verdict: a duplicate, forwarded with dedupe-verdict: duplicate"}},
		{[]string{"DEDUPE_ID_FIELD=", "DEDUPE_ID_FROM=key"}, []string{"-id-hex", "000000012c6b", "-time", at}, 0, []string{"duplicate, dropped"}},
		{[]string{"DEDUPE_ID_FIELD=", "DEDUPE_ID_FROM=key"}, []string{"-value", valueFile, "-time", at}, 2, []string{"DEDUPE_ID_FROM=value"}},
		{nil, []string{"-part", "a", "-time", at}, 2, []string{"composite"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := run(append([]string{"explain"}, tc.args...), &out, &errb)
			t.Logf("exit %d\n%s%s", code, out.String(), errb.String())
			if code != tc.code {
				t.Fatalf("exit %d, want %d", code, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String()+errb.String(), w) {
					t.Errorf("no %q in the output", w)
				}
			}
		})
	}
}

// explainFilter sets the worker's variables for a Redis of the test's own
// (as explain reads them) and returns the pipeline's filter on it.
func explainFilter(t *testing.T) *bloom.Filter {
	t.Helper()
	srv := testenv.Redis(t)
	for _, kv := range workerVars("127.0.0.1:9", srv.Addr, ":0") {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := app.NewRedis(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	f, err := app.NewFilter(cfg, rc)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// stats shows each window of the configured pipeline from Redis, and says
// which are missing though due to live: here the current window made and
// the previous one not (lost, or no worker ran then).
func TestStatsCommandShowsMissingWindows(t *testing.T) {
	f := explainFilter(t)
	w := f.Window()
	var out, errb bytes.Buffer
	var b int64
	// Again if a window began while the command ran.
	for b = w.Bucket(time.Now()); ; b = w.Bucket(time.Now()) {
		if err := f.Preallocate(t.Context(), w.Start(b)); err != nil {
			t.Fatal(err)
		}
		out.Reset()
		if code := run([]string{"stats"}, &out, &errb); code != 0 {
			t.Fatalf("stats: exit %d: %s", code, errb.String())
		}
		if w.Bucket(time.Now()) == b {
			break
		}
	}
	t.Logf("stats:\n%s", out.String())
	lines := strings.Split(out.String(), "\n")
	for _, c := range []struct {
		bucket int64
		state  string
	}{{b, "live"}, {b - 1, "MISSING"}} {
		start := w.Start(c.bucket).Format(time.RFC3339)
		found := false
		for _, l := range lines {
			if strings.HasPrefix(l, start+" ") {
				found = true
				if fs := strings.Fields(l); len(fs) < 4 || fs[3] != c.state {
					t.Errorf("the row of the window of %s: %q, want state %s", start, l, c.state)
				}
			}
		}
		if !found {
			t.Errorf("no row for the window of %s", start)
		}
	}
	if !strings.Contains(out.String(), "1 window keys MISSING") {
		t.Errorf("no line counting the missing windows")
	}
}

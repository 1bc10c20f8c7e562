package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/testenv"
)

// explain, with the worker's own variables, tells a seen ID from a new
// one and gives each offset its recorded verdict.
func TestExplainCommand(t *testing.T) {
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
	defer rc.Close()
	f, err := app.NewFilter(cfg, rc)
	if err != nil {
		t.Fatal(err)
	}
	now := testenv.Now()
	src := func(off int64) bloom.Source { return bloom.Source{Topic: "in", Partition: 3, Offset: off} }
	v, err := f.TestAndSet(t.Context(), []bloom.Element{{ID: []byte("click-1"), Time: now, Source: src(0)}, {ID: []byte("click-1"), Time: now, Source: src(1)}})
	if err != nil || v[0] != bloom.FirstSeen || v[1] != bloom.Duplicate {
		t.Fatalf("verdicts %v, %v", v, err)
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
		{[]string{"-source", "in/3/0"}, []string{"recorded verdict: forwarded", "decided up to offset 1"}},
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

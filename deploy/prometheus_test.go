package deploy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/app"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/syncbuf"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// PrometheusDirVar names a directory holding prometheus and promtool
// (scripts/fetch-prometheus prints one); without it they are looked up on
// PATH. With RequirePrometheusVar set, as scripts/test sets it, their
// absence fails the tests instead of skipping them.
const (
	PrometheusDirVar     = "DEDUPE_TEST_PROMETHEUS_DIR"
	RequirePrometheusVar = "DEDUPE_TEST_REQUIRE_PROMETHEUS"
)

// prometheusTool is the path of prometheus or promtool.
func prometheusTool(t *testing.T, name string) string {
	t.Helper()
	p := name
	if dir := os.Getenv(PrometheusDirVar); dir != "" {
		p = filepath.Join(dir, name)
	}
	path, err := exec.LookPath(p)
	if err != nil {
		if os.Getenv(RequirePrometheusVar) != "" {
			t.Fatalf("%s: %v (%s names its directory; scripts/fetch-prometheus fetches it)", name, err, PrometheusDirVar)
		}
		t.Skipf("%s not found (%v): set %s (scripts/test does, with scripts/fetch-prometheus)", name, err, PrometheusDirVar)
	}
	return path
}

// The alerting rules are valid and pass their unit tests.
func TestPrometheusRules(t *testing.T) {
	promtool := prometheusTool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = repoPath("deploy", "prometheus")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s said no SUCCESS:\n%s", strings.Join(args, " "), out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// promQuery is the answer of /api/v1/query.
type promQuery struct {
	Status    string `json:"status"`
	Error     string `json:"error"`
	ErrorType string `json:"errorType"`
	Data      struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	} `json:"data"`
}

// A real Prometheus scrapes two replicas at work and loads the alerting
// rules: every dashboard query returns data and none errors, and every
// rule is evaluated without error.
func TestDashboardQueriesOnPrometheus(t *testing.T) {
	prom := prometheusTool(t, "prometheus")
	k := testenv.StartKafka(t, testenv.Topics{"in": 4, "out": 4, "dlq": 1})
	srv := testenv.Redis(t)
	const pipeline = "prom"
	var targets []string
	for range 2 {
		cfg := replicas.Config(pipeline, k.Addrs(), srv.Addr)
		r := replicas.Start(t, cfg, replicas.Runs(app.New), nil)
		defer r.Stop()
		targets = append(targets, r.Config.HTTPAddr)
	}
	var recs []*kgo.Record
	for i := range 400 {
		recs = append(recs, &kgo.Record{Value: fmt.Appendf(nil, `{"id":"e%d"}`, i%300)})
	}
	recs = append(recs, &kgo.Record{Value: []byte(`{"id": oops`)})
	k.Produce("in", recs...)

	dir := t.TempDir()
	rules, err := filepath.Abs(repoPath("deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: dedupe-worker
    static_configs:
      - targets: [%q, %q]
`, rules, targets[0], targets[1])
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := redisproc.FreeAddr()
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	var log syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus logged:\n%s", log.String())
		}
	}()
	base := "http://" + addr
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string, v any) error {
		resp, err := client.Get(base + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if v == nil {
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", path, resp.Status)
			}
			return nil
		}
		return json.Unmarshal(body, v)
	}
	testenv.Eventually(t, 30*time.Second, "Prometheus ready", func() bool { return get("/-/ready", nil) == nil })

	var queries []string
	for _, p := range allPanels(loadDashboard(t).Panels) {
		for _, tg := range p.Targets {
			q := strings.NewReplacer("$pipeline", pipeline, "$__rate_interval", "1m").Replace(tg.Expr)
			if strings.Contains(q, "$") {
				t.Fatalf("panel %d %q: a variable this test does not fill: %s", p.ID, p.Title, tg.Expr)
			}
			queries = append(queries, q)
		}
	}
	if len(queries) < 30 {
		t.Fatalf("%d dashboard queries; the dashboard has more", len(queries))
	}
	// Until every query has data: the filter gauges appear with the first
	// maintenance pass, the lag once a batch is delivered.
	var empty []string
	ok := testenv.Until(60*time.Second, func() bool {
		empty = empty[:0]
		for _, q := range queries {
			var r promQuery
			if err := get("/api/v1/query?query="+url.QueryEscape(q), &r); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			if r.Status != "success" {
				t.Fatalf("%s: %s: %s", q, r.ErrorType, r.Error)
			}
			if len(r.Data.Result) == 0 {
				empty = append(empty, q)
			}
		}
		return len(empty) == 0
	})
	if !ok {
		t.Fatalf("after a minute, %d of %d dashboard queries still return no data:\n%s", len(empty), len(queries), strings.Join(empty, "\n"))
	}
	t.Logf("%d dashboard queries, each with data, none failing", len(queries))

	// The rules are loaded and evaluated without error.
	var rr struct {
		Status string `json:"status"`
		Data   struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	testenv.Eventually(t, 10*time.Second, "every rule evaluated", func() bool {
		if err := get("/api/v1/rules", &rr); err != nil || len(rr.Data.Groups) == 0 {
			return false
		}
		for _, g := range rr.Data.Groups {
			for _, r := range g.Rules {
				if r.Health != "ok" {
					return false
				}
			}
		}
		return true
	})
	var names []string
	for _, g := range rr.Data.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Name)
			if r.LastError != "" {
				t.Errorf("rule %s: %s", r.Name, r.LastError)
			}
		}
	}
	for _, want := range []string{"DedupeLagNearBound", "DedupeEventsBeyondLagBound", "DedupeFalsePositiveRateAboveTarget",
		"DedupeWindowGrowing", "DedupeWindowCapped", "DedupeReplicasNotReady", "DedupeErrors",
		"DedupeRedisEvictedKeys", "DedupeRedisEvictionPolicyUnsafe"} {
		if !slices.Contains(names, want) {
			t.Errorf("rule %s not loaded (got %v)", want, names)
		}
	}
}

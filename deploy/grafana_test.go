package deploy

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
)

const dashboardFile = "deploy/grafana/dedupe-worker.json"

// externalMetrics are series the dashboard may read that this code does
// not export: none, so that a Prometheus scraping only the worker answers
// every query (TestDashboardQueriesOnPrometheus).
var externalMetrics = map[string]bool{}

// targetLabels are added by Prometheus to every scraped series.
var targetLabels = []string{"job", "instance"}

// family is one registered metric family.
type family struct {
	name   string
	kind   string // counter, gauge, histogram, summary
	labels []string
}

// series are the names of the series a family exports, with their labels.
func (f family) series() map[string][]string {
	base := append(append([]string{}, f.labels...), targetLabels...)
	switch f.kind {
	case "histogram":
		return map[string][]string{f.name + "_bucket": append(slices.Clone(base), "le"), f.name + "_sum": base, f.name + "_count": base}
	case "summary":
		return map[string][]string{f.name: append(slices.Clone(base), "quantile"), f.name + "_sum": base, f.name + "_count": base}
	}
	return map[string][]string{f.name: base}
}

// capture records what is registered, and registers it with a real
// registry too (so a duplicate or inconsistent metric panics as in the
// worker).
type capture struct {
	reg        *prometheus.Registry
	collectors []prometheus.Collector
}

func (c *capture) Register(x prometheus.Collector) error {
	c.collectors = append(c.collectors, x)
	return c.reg.Register(x)
}

func (c *capture) MustRegister(xs ...prometheus.Collector) {
	for _, x := range xs {
		if err := c.Register(x); err != nil {
			panic(err)
		}
	}
}

func (c *capture) Unregister(x prometheus.Collector) bool { return c.reg.Unregister(x) }

var descPattern = regexp.MustCompile(`^Desc\{fqName: "([a-zA-Z_:][a-zA-Z0-9_:]*)", help: .*, constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)

// families are the families register registers, read from the
// collectors themselves: names and labels from their descriptions, kinds
// from their Go types.
func families(t *testing.T, what string, register func(prometheus.Registerer)) []family {
	t.Helper()
	c := &capture{reg: prometheus.NewRegistry()}
	register(c)
	if len(c.collectors) == 0 {
		t.Fatalf("%s registered nothing", what)
	}
	var fams []family
	// unlabelled are the families of the collectors without labels, which
	// Gather shows before anything is observed.
	unlabelled := map[string]bool{}
	for _, col := range c.collectors {
		var kind string
		vec := false
		switch col.(type) {
		case prometheus.Histogram:
			kind = "histogram"
		case *prometheus.HistogramVec:
			kind, vec = "histogram", true
		case prometheus.Summary:
			kind = "summary"
		case *prometheus.SummaryVec:
			kind, vec = "summary", true
		case prometheus.Gauge: // before Counter: a Gauge has Inc and Add too
			kind = "gauge"
		case *prometheus.GaugeVec:
			kind, vec = "gauge", true
		case prometheus.Counter:
			kind = "counter"
		case *prometheus.CounterVec:
			kind, vec = "counter", true
		case prometheus.GaugeFunc: // last: every metric has its methods
			kind = "gauge"
		default:
			t.Fatalf("%s registered a %T: teach this test its series", what, col)
		}
		ch := make(chan *prometheus.Desc, 16)
		col.Describe(ch)
		close(ch)
		described := 0
		for d := range ch {
			described++
			m := descPattern.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the description %s", d.String())
			}
			f := family{name: m[1], kind: kind}
			for _, lp := range strings.Split(m[2], ",") {
				if name, _, ok := strings.Cut(lp, "="); ok {
					f.labels = append(f.labels, name)
				}
			}
			for _, l := range strings.Split(m[3], ",") {
				if l != "" {
					f.labels = append(f.labels, l)
				}
			}
			fams = append(fams, f)
			if !vec {
				unlabelled[f.name] = true
			}
		}
		if described == 0 {
			t.Fatalf("%s: a %T describes no metric", what, col)
		}
	}
	// Cross-check the reading of descriptions against what a Gather shows
	// of the families that have a series without being observed: every
	// collector without labels must be among them.
	mfs, err := c.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		i := slices.IndexFunc(fams, func(f family) bool { return f.name == mf.GetName() })
		if i < 0 || fams[i].kind != strings.ToLower(mf.GetType().String()) {
			t.Fatalf("Gather shows %s (%s), not read from the descriptions as such", mf.GetName(), mf.GetType())
		}
		delete(unlabelled, mf.GetName())
	}
	if len(unlabelled) > 0 {
		t.Fatalf("%s: Gather does not show %v, which have no labels and so a series from the start", what, sortedKeys(unlabelled))
	}
	return fams
}

// runtimeFamilies are the Go and process collectors' families, if
// internal/app registers those collectors.
func runtimeFamilies(t *testing.T) []family {
	t.Helper()
	src := string(readRepoFile(t, "internal", "app", "app.go"))
	reg := prometheus.NewRegistry()
	if strings.Contains(src, "collectors.NewGoCollector(") {
		reg.MustRegister(collectors.NewGoCollector())
	}
	if strings.Contains(src, "collectors.NewProcessCollector(") {
		reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var fams []family
	for _, mf := range mfs {
		f := family{name: mf.GetName(), kind: strings.ToLower(mf.GetType().String())}
		if mf.GetType() == dto.MetricType_UNTYPED || mf.GetType() == dto.MetricType_GAUGE_HISTOGRAM {
			f.kind = "gauge"
		}
		if len(mf.GetMetric()) > 0 {
			for _, lp := range mf.GetMetric()[0].GetLabel() {
				f.labels = append(f.labels, lp.GetName())
			}
		}
		fams = append(fams, f)
	}
	return fams
}

// registeredSeries is every series name the worker exports, with its
// labels.
func registeredSeries(t *testing.T) map[string][]string {
	t.Helper()
	cons := families(t, "consumer.NewMetrics", func(r prometheus.Registerer) { consumer.NewMetrics(r, "p") })
	appFams := families(t, "bloom.NewGauges", func(r prometheus.Registerer) { bloom.NewGauges(r, "p") })
	appFams = append(appFams, families(t, "app.RegisterStatus", func(r prometheus.Registerer) {
		app.RegisterStatus(r, "p", 1e-6, func() bool { return true })
	})...)

	out := map[string][]string{}
	for _, f := range slices.Concat(cons, appFams, runtimeFamilies(t)) {
		for name, labels := range f.series() {
			if _, dup := out[name]; dup {
				t.Fatalf("series %s exported twice", name)
			}
			out[name] = labels
		}
	}
	return out
}

// promqlWords are PromQL's functions, aggregations and keywords: every
// other identifier outside braces, brackets and strings names a metric.
var promqlWords = map[string]bool{}

// promqlGrouping take a parenthesised list of label names.
var promqlGrouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

func init() {
	for _, w := range strings.Fields(`sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
		bool and or unless offset atan2
		abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week days_in_month delta deriv exp floor
		histogram_quantile histogram_count histogram_sum histogram_fraction holt_winters hour idelta increase irate label_join label_replace ln log2 log10
		minute month predict_linear rate resets round scalar sgn sort sort_desc sqrt time timestamp vector year
		avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time stdvar_over_time last_over_time present_over_time`) {
		promqlWords[w] = true
	}
	for w := range promqlGrouping {
		promqlWords[w] = true
	}
}

// selector is one vector selector of an expression: a metric name and the
// label names its matchers use.
type selector struct {
	metric string
	labels []string
}

// parsePromQL finds the vector selectors of expr and the label names its
// by/without/on/ignoring/group_* lists use. It is a tokenizer, not a
// parser: enough to tell metric names from functions and labels.
func parsePromQL(expr string) (sels []selector, grouping []string, err error) {
	isStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || c >= '0' && c <= '9' }
	skipSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n') {
			i++
		}
		return i
	}
	// closing returns the index after the bracket that closes the one at
	// i, skipping quoted strings.
	closing := func(i int, open, close byte) (int, error) {
		depth := 0
		for j := i; j < len(expr); j++ {
			switch c := expr[j]; {
			case c == '"' || c == '\'' || c == '`':
				k := j + 1
				for k < len(expr) && expr[k] != c {
					if expr[k] == '\\' && c != '`' {
						k++
					}
					k++
				}
				if k >= len(expr) {
					return 0, fmt.Errorf("unterminated string at %d", j)
				}
				j = k
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unbalanced %c at %d", open, i)
	}
	matcherLabels := func(body string) []string {
		var ls []string
		for _, m := range regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"`).FindAllStringSubmatch(body, -1) {
			ls = append(ls, m[1])
		}
		return ls
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || strings.IndexByte("()+-*/%^,<>=!", c) >= 0:
			i++
		case c == '"' || c == '\'' || c == '`':
			return nil, nil, fmt.Errorf("string at %d outside a selector", i)
		case c == '[':
			j, err := closing(i, '[', ']')
			if err != nil {
				return nil, nil, err
			}
			i = j
		case c == '{':
			// A selector without a metric name: {__name__=...}.
			return nil, nil, fmt.Errorf("selector without a metric name at %d", i)
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.' || (expr[i] == '-' || expr[i] == '+') && (expr[i-1] == 'e' || expr[i-1] == 'E')) {
				i++
			}
		case c == '$':
			return nil, nil, fmt.Errorf("a Grafana variable at %d outside a selector or range", i)
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			word := expr[i:j]
			next := skipSpace(j)
			switch {
			case promqlGrouping[word]:
				if next < len(expr) && expr[next] == '(' {
					k, err := closing(next, '(', ')')
					if err != nil {
						return nil, nil, err
					}
					for _, l := range strings.Split(expr[next+1:k-1], ",") {
						if l = strings.TrimSpace(l); l != "" {
							grouping = append(grouping, l)
						}
					}
					j = k
				} else if !strings.HasPrefix(word, "group_") {
					return nil, nil, fmt.Errorf("%s without a label list", word)
				}
			case promqlWords[word]:
				if next < len(expr) && expr[next] == '(' || word == "bool" || word == "and" || word == "or" || word == "unless" || word == "offset" {
					break
				}
				// An aggregation followed by its grouping: sum by (x) (...)
				if k := skipSpace(next); k < len(expr) && isStart(expr[k]) {
					break
				}
				return nil, nil, fmt.Errorf("%s is not followed by an argument list", word)
			case next < len(expr) && expr[next] == '(':
				return nil, nil, fmt.Errorf("unknown function %s", word)
			default:
				s := selector{metric: word}
				if next < len(expr) && expr[next] == '{' {
					k, err := closing(next, '{', '}')
					if err != nil {
						return nil, nil, err
					}
					s.labels = matcherLabels(expr[next+1 : k-1])
					j = k
				}
				sels = append(sels, s)
			}
			i = j
		default:
			return nil, nil, fmt.Errorf("unexpected %q at %d", c, i)
		}
	}
	return sels, grouping, nil
}

func TestPromQLTokenizer(t *testing.T) {
	sels, grouping, err := parsePromQL(`histogram_quantile(0.99, sum by (le) (rate(dedupe_batch_seconds_bucket{pipeline="$pipeline", x!~"a}b"}[$__rate_interval]))) / 1e-3
		* on (job, instance) group_left () count by (job, instance) (up) > bool 0.5`)
	if err != nil {
		t.Fatal(err)
	}
	want := []selector{{"dedupe_batch_seconds_bucket", []string{"pipeline", "x"}}, {"up", nil}}
	if fmt.Sprint(sels) != fmt.Sprint(want) || fmt.Sprint(grouping) != "[le job instance job instance]" {
		t.Errorf("got %v and %v", sels, grouping)
	}
	for _, bad := range []string{`rat(x[5m])`, `sum(x{a="b"`, `x{a="b}`, `"s"`, `$pipeline`} {
		if _, _, err := parsePromQL(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []map[string]any `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Datasource  *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // in collapsed rows
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data := readRepoFile(t, dashboardFile)
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// checkExpr reports the problems of one PromQL expression: names no
// code registers, labels a series does not have, a dedupe_* selector not
// narrowed to $pipeline, and histogram_quantile not over _bucket by le.
func checkExpr(expr string, series map[string][]string) []string {
	sels, grouping, err := parsePromQL(expr)
	if err != nil {
		return []string{err.Error()}
	}
	if len(sels) == 0 {
		// Nothing below would look at it: an empty or constant query.
		return []string{"no metric selector"}
	}
	var probs []string
	labelsHere := map[string]bool{}
	for _, s := range sels {
		ls, ok := series[s.metric]
		switch {
		case externalMetrics[s.metric]:
			continue
		case !ok:
			probs = append(probs, fmt.Sprintf("%s is not a metric the worker registers", s.metric))
			continue
		}
		for _, l := range ls {
			labelsHere[l] = true
		}
		for _, l := range s.labels {
			if !slices.Contains(ls, l) {
				probs = append(probs, fmt.Sprintf("%s has no label %s", s.metric, l))
			}
		}
		if strings.HasPrefix(s.metric, "dedupe_") && !regexp.MustCompile(`\b`+s.metric+`\{[^}]*pipeline="\$pipeline"`).MatchString(expr) {
			probs = append(probs, fmt.Sprintf(`%s is not narrowed to pipeline="$pipeline"`, s.metric))
		}
	}
	for _, l := range grouping {
		if !labelsHere[l] && len(labelsHere) > 0 {
			probs = append(probs, fmt.Sprintf("grouping label %s is on none of the series", l))
		}
	}
	if strings.Contains(expr, "histogram_quantile(") {
		ok := strings.Contains(expr, "by (le)") && slices.ContainsFunc(sels, func(s selector) bool { return strings.HasSuffix(s.metric, "_bucket") })
		if !ok {
			probs = append(probs, "histogram_quantile wants a sum by (le) of a _bucket series")
		}
	}
	return probs
}

func TestGrafanaDashboard(t *testing.T) {
	series := registeredSeries(t)
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard without uid or title")
	}

	// The pipeline variable, from a worker metric's pipeline label.
	var pipelineVar map[string]any
	for _, v := range d.Templating.List {
		if v["name"] == "pipeline" {
			pipelineVar = v
		}
	}
	if pipelineVar == nil {
		t.Fatal("no templated pipeline variable")
	}
	q, _ := pipelineVar["definition"].(string)
	m := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*), pipeline\)$`).FindStringSubmatch(q)
	if m == nil || !slices.Contains(series[m[1]], "pipeline") {
		t.Errorf("pipeline variable query %q: want label_values(<a worker metric>, pipeline)", q)
	}
	if vq, _ := pipelineVar["query"].(map[string]any); vq == nil || vq["query"] != q {
		t.Errorf("pipeline variable: query and definition differ")
	}

	used := map[string]bool{}
	ids := map[int]bool{}
	queries := 0
	for _, p := range allPanels(d.Panels) {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource is not the ${datasource} variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			for _, prob := range checkExpr(tg.Expr, series) {
				t.Errorf("panel %q, query %s: %s\n  %s", p.Title, tg.RefID, prob, tg.Expr)
			}
			sels, _, _ := parsePromQL(tg.Expr)
			for _, s := range sels {
				used[s.metric] = true
			}
		}
	}

	if queries == 0 {
		t.Fatalf("%s: no panel queries found (panels %d)", dashboardFile, len(d.Panels))
	}

	// Every family the worker itself exports has a panel.
	own := 0
	for name := range series {
		if !strings.HasPrefix(name, "dedupe_") {
			continue
		}
		own++
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if !used[name] && !used[base+"_bucket"] && !used[base+"_count"] && !used[base] {
			t.Errorf("no panel shows %s", name)
		}
	}
	if own == 0 {
		t.Errorf("no dedupe_* series among the %d registered: none was checked for a panel", len(series))
	}
}

// A renamed metric or label must fail the check.
func TestDashboardCheckFailsOnRename(t *testing.T) {
	series := registeredSeries(t)
	good := `histogram_quantile(0.5, sum by (le) (rate(dedupe_batch_seconds_bucket{pipeline="$pipeline"}[$__rate_interval])))`
	if probs := checkExpr(good, series); len(probs) > 0 {
		t.Fatalf("a good query: %v", probs)
	}
	for _, bad := range []string{
		strings.Replace(good, "dedupe_batch_seconds_bucket", "dedupe_batch_duration_seconds_bucket", 1),
		strings.Replace(good, `pipeline="$pipeline"`, `pipe="$pipeline"`, 1),
		strings.Replace(good, `{pipeline="$pipeline"}`, ``, 1),
		strings.Replace(good, "by (le)", "by (partition)", 1),
		`max by (partition) (dedupe_consumer_lag{pipeline="$pipeline", topic="x"})`,
		`sum(rate(dedupe_events_total{pipeline="$pipeline"}[5m]))`,
		``,          // an empty query
		`vector(1)`, // no metric at all
	} {
		if probs := checkExpr(bad, series); len(probs) == 0 {
			t.Errorf("accepted: %s", bad)
		}
	}
}

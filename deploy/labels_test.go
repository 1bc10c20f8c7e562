package deploy

import (
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/event"
)

// checkedLabels are the labels whose every value the worker exports from
// the start (at 0), so the whole set is known: a rule or a panel that
// names another value watches a series that never comes.
var checkedLabels = map[string]bool{"step": true, "reason": true, "verdict": true}

// exportedValues are, by series and label, the values of checkedLabels the
// worker exports: the series it makes at 0, and the per-partition
// verdicts (made at a partition's first decision) from the event format (package event).
func exportedValues(t *testing.T) map[string]map[string]map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	consumer.NewMetrics(reg, "p")
	bloom.NewGauges(reg, "p")
	app.RegisterStatus(reg, "p", 1e-6, func() bool { return true })
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]map[string]bool{}
	add := func(series, label, value string) {
		if out[series] == nil {
			out[series] = map[string]map[string]bool{}
		}
		if out[series][label] == nil {
			out[series][label] = map[string]bool{}
		}
		out[series][label][value] = true
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if checkedLabels[lp.GetName()] {
					add(mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
	for _, v := range event.Verdicts() {
		add("dedupe_partition_verdicts_total", "verdict", v.String())
	}
	return out
}

var (
	seriesSelector = regexp.MustCompile(`(dedupe_[a-z_]+)\{([^}]*)\}`)
	exactMatcher   = regexp.MustCompile(`([a-z_]+)\s*=\s*"([^"]*)"`)
)

// The alerting rules, their unit tests and the dashboard name only label
// values the worker exports: a step, reason or verdict renamed in the code
// and not in them fails here.
func TestLabelValuesAreTheWorkers(t *testing.T) {
	exported := exportedValues(t)
	if len(exported["dedupe_errors_total"]["step"]) != len(consumer.Steps()) ||
		len(exported["dedupe_events_dead_lettered_total"]["reason"]) != len(event.Reasons()) {
		t.Fatalf("the worker exports %v; want every step and reason at 0", exported)
	}
	checked := 0
	for _, file := range [][]string{{"deploy", "prometheus", "alerts.yml"}, {"deploy", "prometheus", "alerts_test.yml"}, {"deploy", "grafana", "dedupe-worker.json"}} {
		text := strings.ReplaceAll(string(readRepoFile(t, file...)), `\"`, `"`)
		for _, sel := range seriesSelector.FindAllStringSubmatch(text, -1) {
			series := sel[1]
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if _, ok := exported[series]; !ok {
					series = strings.TrimSuffix(series, suffix)
				}
			}
			for _, m := range exactMatcher.FindAllStringSubmatch(sel[2], -1) {
				label, value := m[1], m[2]
				if !checkedLabels[label] || strings.Contains(value, "$") {
					continue
				}
				checked++
				if !exported[series][label][value] {
					t.Errorf("%s: %s{%s=%q}: the worker exports %s values %v", strings.Join(file, "/"), sel[1], label, value, label,
						sortedKeys(exported[series][label]))
				}
			}
		}
	}
	// The rule tests name steps and verdicts, the dashboard a verdict.
	if checked < 5 {
		t.Fatalf("checked %d label values; the files name more", checked)
	}
}

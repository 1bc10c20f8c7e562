package testenv

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"dedupe-worker/internal/promtext"

	dto "github.com/prometheus/client_model/go"
)

// Metrics are the metric families one scrape returned, by name.
type Metrics map[string]*dto.MetricFamily

// Scrape reads url (a /metrics endpoint) with the Prometheus text parser
// (promtext.Scrape: a 2 s deadline).
func Scrape(ctx context.Context, url string) (Metrics, error) {
	return promtext.Scrape(ctx, url)
}

// Has reports whether the scrape holds a series of family name whose
// labels include labels (name, value pairs).
func (m Metrics) Has(name string, labels ...string) bool {
	return len(m.series(name, labels)) > 0
}

// Value sums the series of family name whose labels include labels (name,
// value pairs): the values of counters, gauges and untyped series, the
// sample counts of histograms and summaries. It is 0 when there is none.
func (m Metrics) Value(name string, labels ...string) float64 {
	var sum float64
	for _, s := range m.series(name, labels) {
		sum += value(s)
	}
	return sum
}

// value is a series' value: a counter's, gauge's or untyped series' value,
// a histogram's or summary's sample count.
func value(s *dto.Metric) float64 {
	switch {
	case s.Counter != nil:
		return s.Counter.GetValue()
	case s.Gauge != nil:
		return s.Gauge.GetValue()
	case s.Untyped != nil:
		return s.Untyped.GetValue()
	case s.Histogram != nil:
		return float64(s.Histogram.GetSampleCount())
	case s.Summary != nil:
		return float64(s.Summary.GetSampleCount())
	}
	return 0
}

// Show prints the series of the families whose names start with prefix,
// one per line, for a failure message.
func (m Metrics) Show(prefix string) string {
	var lines []string
	for name := range m {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, s := range m[name].Metric {
			var ls []string
			for _, l := range s.Label {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			lines = append(lines, fmt.Sprintf("%s{%s} %g", name, strings.Join(ls, ","), value(s)))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func (m Metrics) series(name string, labels []string) []*dto.Metric {
	if len(labels)%2 != 0 {
		panic("testenv: labels must come in name, value pairs")
	}
	f := m[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
next:
	for _, s := range f.Metric {
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, l := range s.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

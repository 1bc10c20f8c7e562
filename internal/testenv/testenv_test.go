package testenv

import (
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Until polls until the condition holds, and gives up at its limit.
func TestUntil(t *testing.T) {
	var n atomic.Int32
	if !Until(5*time.Second, func() bool { return n.Add(1) == 3 }) {
		t.Fatal("Until gave up on a condition that held at the third poll")
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("polled %d times, want 3", got)
	}
	start := time.Now()
	if Until(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("Until reported a condition that never held")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before its limit", d)
	}
}

// Scrape reads counters by label, histograms as their sample counts, and
// nothing as 0.
func TestScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_events_total"}, []string{"pipeline", "verdict"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "t_seconds"})
	reg.MustRegister(c, h)
	c.WithLabelValues("p", "first_seen").Add(7)
	c.WithLabelValues("p", "duplicate").Add(2)
	c.WithLabelValues("q", "duplicate").Add(1)
	h.Observe(0.1)
	h.Observe(0.2)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	m, err := Scrape(t.Context(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"t_events_total", nil, 10},
		{"t_events_total", []string{"pipeline", "p"}, 9},
		{"t_events_total", []string{"pipeline", "p", "verdict", "duplicate"}, 2},
		{"t_events_total", []string{"pipeline", "r"}, 0},
		{"t_seconds", nil, 2},
		{"t_absent", nil, 0},
	} {
		if got := m.Value(tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %g, want %g", tc.name, tc.labels, got, tc.want)
		}
	}
	if m.Has("t_events_total", "verdict", "late") || !m.Has("t_events_total", "verdict", "duplicate") {
		t.Error("Has does not match labels")
	}
}

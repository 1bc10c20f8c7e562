package promtext

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "# TYPE dedupe_events_total counter\ndedupe_events_total{verdict=\"first_seen\"} 7\ndedupe_events_total{verdict=\"duplicate\"} 3\n")
	}))
	defer srv.Close()

	fams, err := Scrape(context.Background(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, m := range fams["dedupe_events_total"].GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	if len(fams["dedupe_events_total"].GetMetric()) != 2 || sum != 10 {
		t.Fatalf("dedupe_events_total: %v, want two series summing to 10", fams["dedupe_events_total"])
	}

	_, err = Scrape(context.Background(), srv.URL+"/nothing")
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("a 404 gave %v, want an error naming it", err)
	}
}

package demo

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// counters are what one scrape of a worker's /metrics says.
type counters struct {
	in, forwarded float64
	verdicts      map[string]float64 // by verdict label
	dead          map[string]float64 // by reason label
}

func (c counters) decided() float64 {
	var n float64
	for _, v := range c.verdicts {
		n += v
	}
	return n
}

func (c counters) deadLettered() float64 {
	var n float64
	for _, v := range c.dead {
		n += v
	}
	return n
}

// add sums o into c.
func (c *counters) add(o counters) {
	c.in += o.in
	c.forwarded += o.forwarded
	if c.verdicts == nil {
		c.verdicts, c.dead = map[string]float64{}, map[string]float64{}
	}
	for k, v := range o.verdicts {
		c.verdicts[k] += v
	}
	for k, v := range o.dead {
		c.dead[k] += v
	}
}

var scrapeClient = &http.Client{Timeout: 2 * time.Second}

// scrape reads the dedupe counters from the Prometheus text at url, with
// Prometheus's own parser.
func scrape(ctx context.Context, url string) (counters, error) {
	c := counters{verdicts: map[string]float64{}, dead: map[string]float64{}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return c, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("%s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return c, fmt.Errorf("%s: %w", url, err)
	}
	// Each counter, summed over its series, or by one label.
	sum := func(name string) float64 {
		var n float64
		for _, m := range fams[name].GetMetric() {
			n += m.GetCounter().GetValue()
		}
		return n
	}
	by := func(name, label string, into map[string]float64) {
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					into[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	c.in, c.forwarded = sum("dedupe_events_in_total"), sum("dedupe_events_forwarded_total")
	by("dedupe_verdicts_total", "verdict", c.verdicts)
	by("dedupe_events_dead_lettered_total", "reason", c.dead)
	return c, nil
}

package demo

import (
	"context"
	"math"
	"slices"
	"time"

	"dedupe-worker/internal/promtext"
)

// counters are what one scrape of a worker's /metrics says.
type counters struct {
	in, forwarded float64
	verdicts      map[string]float64 // by verdict label
	dead          map[string]float64 // by reason label
	// Growth: stages made, calls refused for a stage, and the batches'
	// waits for one (count, seconds in all, cumulative counts by upper
	// bound).
	stagesMade, refused, waits, waitSeconds float64
	waitBuckets                             map[float64]float64
}

// longestWait is the upper bound of the histogram bucket that holds the
// longest wait: the smallest bound every wait is within (0 without waits).
func (c counters) longestWait() time.Duration {
	if c.waits == 0 {
		return 0
	}
	var bounds []float64
	for ub := range c.waitBuckets {
		bounds = append(bounds, ub)
	}
	slices.Sort(bounds)
	for _, ub := range bounds {
		if c.waitBuckets[ub] >= c.waits {
			return time.Duration(ub * float64(time.Second))
		}
	}
	return time.Duration(math.MaxInt64)
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
	c.stagesMade += o.stagesMade
	c.refused += o.refused
	c.waits += o.waits
	c.waitSeconds += o.waitSeconds
	if c.verdicts == nil {
		c.verdicts, c.dead = map[string]float64{}, map[string]float64{}
	}
	if c.waitBuckets == nil {
		c.waitBuckets = map[float64]float64{}
	}
	for ub, n := range o.waitBuckets {
		c.waitBuckets[ub] += n
	}
	for k, v := range o.verdicts {
		c.verdicts[k] += v
	}
	for k, v := range o.dead {
		c.dead[k] += v
	}
}

// scrape reads the dedupe counters from the Prometheus text at url, with
// Prometheus's own parser.
func scrape(ctx context.Context, url string) (counters, error) {
	c := counters{verdicts: map[string]float64{}, dead: map[string]float64{}, waitBuckets: map[float64]float64{}}
	fams, err := promtext.Scrape(ctx, url)
	if err != nil {
		return c, err
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
	c.stagesMade, c.refused = sum("dedupe_filter_stages_made_total"), sum("dedupe_filter_growth_refused_total")
	for _, m := range fams["dedupe_filter_growth_wait_seconds"].GetMetric() {
		h := m.GetHistogram()
		c.waits += float64(h.GetSampleCount())
		c.waitSeconds += h.GetSampleSum()
		for _, b := range h.GetBucket() {
			c.waitBuckets[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
	}
	return c, nil
}

package bloom

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Gauges are the filter statistics the worker exports.
type Gauges struct {
	fill, fpr, elements, ttl     *prometheus.GaugeVec
	stages, overfilled, testOnly *prometheus.GaugeVec
	maxLag                       prometheus.Gauge
	grown                        prometheus.Counter
}

// NewGauges registers the filter statistics the worker exports per
// window and shard (fill, estimated false-positive rate, estimated
// elements, TTL, stages, overfilled, test-only), the stages made and the
// lag bound.
func NewGauges(reg prometheus.Registerer, pipeline string) *Gauges {
	l := prometheus.Labels{"pipeline": pipeline}
	labels := []string{"window", "shard"}
	g := &Gauges{
		fill: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_fill_ratio",
			Help: "Set bits over all bits, per window (current, previous) and shard.", ConstLabels: l}, labels),
		fpr: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_false_positive_rate",
			Help: "Estimated false-positive rate at the current fill.", ConstLabels: l}, labels),
		elements: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_estimated_elements",
			Help: "Elements estimated from the set bits.", ConstLabels: l}, labels),
		ttl: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_ttl_seconds",
			Help: "Time the window's key has left.", ConstLabels: l}, labels),
	}
	g.stages = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_stages",
		Help: "Stages the window has grown into (1: its planned size).", ConstLabels: l}, labels)
	g.overfilled = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_overfilled",
		Help: "Elements inserted past a full stage because the next was not made in time: the rate is above target.", ConstLabels: l}, labels)
	g.testOnly = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_filter_test_only",
		Help: "New elements only tested, not inserted, because the window reached DEDUPE_MAX_GROWTH: their copies pass.", ConstLabels: l}, labels)
	g.grown = prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupe_filter_stages_made_total",
		Help: "Stages this replica made ahead for windows that grow.", ConstLabels: l})
	g.maxLag = prometheus.NewGauge(prometheus.GaugeOpts{Name: "dedupe_max_lag_seconds",
		Help: "The lag bound, DEDUPE_MAX_LAG: events decided later than this after their event time may not be deduplicated.", ConstLabels: l})
	reg.MustRegister(g.fill, g.fpr, g.elements, g.ttl, g.maxLag, g.stages, g.overfilled, g.testOnly, g.grown)
	return g
}

// growEvery is how often the maintenance looks for windows to grow, and
// slowEvery how often it preallocates and reads the gauges.
const (
	growEvery = 5 * time.Second
	slowEvery = 30 * time.Second
)

// Maintain keeps the filter's windows ready and its gauges current until
// ctx ends: it makes stages for windows that grow (at once when a call asks
// for one, every growEvery otherwise), and every slowEvery preallocates
// the current and the next window and reads the statistics of the current
// and the previous one into g. It logs what it makes and what goes wrong,
// and warns once per window and shard that overfills or only tests.
func (f *Filter) Maintain(ctx context.Context, g *Gauges, log *zap.Logger) {
	g.maxLag.Set(f.cfg.Windows.MaxLag.Seconds())
	window := f.cfg.Windows.Length
	tick := time.NewTicker(growEvery)
	defer tick.Stop()
	warned := map[[2]int64]string{} // buckets and shards already warned about
	var lastSlow, growFailed time.Time
	for {
		// After a failure, requests from the script wait for the tick.
		if now := time.Now(); now.Sub(growFailed) >= growEvery {
			made, err := f.Grow(ctx, f.Now())
			for _, m := range made {
				g.grown.Inc()
				log.Info("window grew: next stage made", zap.Time("window", f.Windows().Start(m.Bucket)), zap.Int("shard", m.Shard),
					zap.Int("stage", m.Stage), zap.Uint64("bytes", m.Bytes))
			}
			if err != nil && ctx.Err() == nil {
				growFailed = now
				log.Warn("growing windows", zap.Error(err))
			}
		}
		if now := time.Now(); now.Sub(lastSlow) >= slowEvery {
			lastSlow = now
			f.maintainSlow(ctx, f.Now(), window, g, warned, log)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-f.GrowthWanted():
		}
	}
}

func (f *Filter) maintainSlow(ctx context.Context, now time.Time, window time.Duration, g *Gauges, warned map[[2]int64]string, log *zap.Logger) {
	if err := f.Preallocate(ctx, now); err != nil && ctx.Err() == nil {
		log.Warn("preallocating the current window", zap.Error(err))
	}
	if err := f.Preallocate(ctx, now.Add(window)); err != nil && ctx.Err() == nil {
		log.Warn("preallocating the next window", zap.Error(err))
	}
	st, err := f.Stats(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("reading filter stats", zap.Error(err))
		}
		return
	}
	cur := f.Plan().Shards
	for i, s := range st {
		win := "current"
		if i >= cur {
			win = "previous"
		}
		shard := strconv.Itoa(s.Shard)
		g.fill.WithLabelValues(win, shard).Set(s.Fill)
		g.fpr.WithLabelValues(win, shard).Set(s.FPR)
		g.elements.WithLabelValues(win, shard).Set(s.Elements)
		g.ttl.WithLabelValues(win, shard).Set(s.TTL.Seconds())
		g.stages.WithLabelValues(win, shard).Set(float64(s.Stages))
		g.overfilled.WithLabelValues(win, shard).Set(float64(s.Overfilled))
		g.testOnly.WithLabelValues(win, shard).Set(float64(s.TestOnly))
		k := [2]int64{s.Bucket, int64(s.Shard)}
		switch stage := f.Plan().Stages[min(s.Stages, len(f.Plan().Stages))-1]; {
		case s.TestOnly > 0 && warned[k] != "test-only":
			warned[k] = "test-only"
			log.Warn("window only tests new IDs: it reached DEDUPE_MAX_GROWTH, or its next stage could not be made; their copies pass",
				zap.Time("window", s.Start), zap.Int("shard", s.Shard), zap.Int64("test_only", s.TestOnly), zap.Float64("estimated_elements", s.Elements))
		case s.Overfilled > stage.CapacityPerShard/100 && warned[k] == "":
			// A few batches overfill each stage while the next is made;
			// more means it is late.
			warned[k] = "overfilled"
			log.Warn("window overfilled: its next stage was not made in time, the false-positive rate is above target",
				zap.Time("window", s.Start), zap.Int("shard", s.Shard), zap.Int64("overfilled", s.Overfilled))
		}
	}
	// Windows long expired are forgotten.
	for k := range warned {
		if k[0] < f.Windows().Bucket(now.Add(-f.Windows().Retention())) {
			delete(warned, k)
		}
	}
}

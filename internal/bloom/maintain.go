package bloom

import (
	"context"
	"strconv"
	"sync"
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
	// A batch's wait for a stage it needs, and the script calls refused
	// for one.
	growthWait prometheus.Histogram
	refused    prometheus.Counter
	// Per master (label server): evicted keys and whether the policy is
	// noeviction; policy changes to one that evicts; failed maintenance
	// calls by step.
	evicted, policySafe *prometheus.GaugeVec
	unsafePolicy        prometheus.Counter
	failed              *prometheus.CounterVec
	// Windows made, by who made them; windows found lost, per server.
	windowsMade, keysLost *prometheus.CounterVec
}

// The steps of dedupe_filter_maintenance_errors_total.
const (
	stepPreallocate = "preallocate"
	stepGrow        = "grow"
	stepStats       = "stats"
	stepServerInfo  = "server_info"
	stepLost        = "lost_keys"
)

// NewGauges registers the filter statistics the worker exports per
// window and shard (fill, estimated false-positive rate, estimated
// elements, TTL, stages, overfilled, test-only), the stages made, the
// waits of batches for a stage and the calls refused for one, the lag
// bound, per Redis master the evicted keys and whether its eviction policy
// is safe, the policy changes found, and the maintenance's failed calls.
func NewGauges(reg prometheus.Registerer, pipeline string) *Gauges {
	l := prometheus.Labels{"pipeline": pipeline}
	perShard := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l}, []string{"window", "shard"})
	}
	perServer := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l}, []string{"server"})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l})
	}
	g := &Gauges{
		fill:     perShard("dedupe_filter_fill_ratio", "Set bits over all bits, per window (current, previous) and shard."),
		fpr:      perShard("dedupe_filter_false_positive_rate", "Estimated false-positive rate at the current fill."),
		elements: perShard("dedupe_filter_estimated_elements", "Elements estimated from the set bits."),
		ttl:      perShard("dedupe_filter_ttl_seconds", "Time the window's key has left."),
		stages:   perShard("dedupe_filter_stages", "Stages the window has grown into (1: its planned size)."),
		overfilled: perShard("dedupe_filter_overfilled",
			"Elements inserted past a full stage, by versions that did not wait for the next stage: the rate is above target."),
		testOnly: perShard("dedupe_filter_test_only",
			"New elements only tested, not inserted, because the window reached its growth cap (PlanOptions.MaxGrowth): their copies pass."),
		grown: counter("dedupe_filter_stages_made_total", "Stages this replica made for windows that grow."),
		growthWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dedupe_filter_growth_wait_seconds",
			Help:    "Time a test-and-set waited for the next stage of a growing window, which its batch needed and was not made yet.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}, ConstLabels: l}),
		refused: counter("dedupe_filter_growth_refused_total",
			"Test-and-set calls refused, nothing decided, because a stage they needed was not made yet; each is made or awaited and the call made again."),
		maxLag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dedupe_max_lag_seconds",
			Help: "The lag bound (Window.MaxLag): events decided later than this after their event time may not be deduplicated.", ConstLabels: l}),
		evicted: perServer("dedupe_redis_evicted_keys",
			"Keys the Redis master has evicted since it started (evicted_keys of INFO stats), read every maintenance pass: any increase may be filters or decision records lost."),
		policySafe: perServer("dedupe_redis_eviction_policy_safe",
			"1 while the Redis master's maxmemory-policy is noeviction, 0 while it is one that evicts the worker's keys (the replica is then not ready)."),
		unsafePolicy: counter("dedupe_redis_eviction_policy_unsafe_total",
			"Times the maintenance found a Redis master's maxmemory-policy changed to one that evicts."),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dedupe_filter_maintenance_errors_total",
			Help: "Failed maintenance calls, by step (preallocate, grow, stats, server_info, lost_keys); each is tried again at the next pass.", ConstLabels: l}, []string{"step"}),
		windowsMade: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dedupe_filter_windows_made_total",
			Help: "Windows (one shard's first stage of a bucket) this replica made, by who made it: the maintenance ahead of the bucket, or a batch that needed it (a backlog, an event ahead of the clock, or preallocation behind).", ConstLabels: l}, []string{"by"}),
		keysLost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dedupe_filter_keys_lost_total",
			Help: "Windows this replica saw made whose keys were gone before they were due to expire, per Redis server: a restart without persistence, a flush, a failover to a replica that had not caught up. Their copies pass until they expire.", ConstLabels: l}, []string{"server"}),
	}
	for _, step := range []string{stepPreallocate, stepGrow, stepStats, stepServerInfo, stepLost} {
		g.failed.WithLabelValues(step) // at 0 from the start
	}
	for _, by := range []maker{byMaintenance, byBatch} {
		g.windowsMade.WithLabelValues(by.String())
	}
	reg.MustRegister(g.fill, g.fpr, g.elements, g.ttl, g.maxLag, g.stages, g.overfilled, g.testOnly, g.grown, g.growthWait, g.refused,
		g.evicted, g.policySafe, g.unsafePolicy, g.failed, g.windowsMade, g.keysLost)
	return g
}

// growEvery is how often the maintenance looks for windows to grow, and
// slowEvery how often it checks the masters' eviction policies,
// preallocates and reads the gauges.
const (
	growEvery = 5 * time.Second
	slowEvery = 30 * time.Second
)

// Maintain keeps the filter's windows ready, its servers watched and its
// gauges current until ctx ends, in two loops that do not wait for each
// other. One makes stages for windows that grow: at once when a call asks
// for one ahead of need, and every growEvery it looks for any that are due.
// The other, every slowEvery, reads each master's eviction policy and
// evicted keys (see Healthy), makes the current window and, PreallocateLead
// before it starts, the next (Preallocate), looks for windows whose keys
// were lost (see lost.go), and reads the statistics of the current and the
// previous window into g; so a growth that takes minutes on a slow server
// does not hold up the next window. A failed call is logged, counted by
// step and tried again at the next pass; nothing ends the loops but ctx. It
// warns once per window and shard that overfills or only tests, and logs
// an error once when a master's policy turns to one that evicts and once
// more when it is back to noeviction. Its figures and messages go to
// Config.Gauges and Config.Logger, as the filter's own do.
func (f *Filter) Maintain(ctx context.Context) {
	f.maintain(ctx, f.cfg.Gauges, f.cfg.Logger, growEvery, slowEvery)
}

// maintain is Maintain with its intervals, and its gauges and logger.
func (f *Filter) maintain(ctx context.Context, g *Gauges, log *zap.Logger, growEvery, slowEvery time.Duration) {
	g.maxLag.Set(f.cfg.Window.MaxLag.Seconds())
	f.obs.Store(&reporter{g: g, log: log})
	var wg sync.WaitGroup
	wg.Go(func() { f.growLoop(ctx, g, log, growEvery) })
	f.slowLoop(ctx, g, log, slowEvery)
	wg.Wait()
}

// growLoop makes the stages of windows that grow: a tick looks at every
// window; a request makes what the calls asked for. After a failure,
// requests wait for the tick. The stages made are counted and logged as
// they are made.
func (f *Filter) growLoop(ctx context.Context, g *Gauges, log *zap.Logger, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var failed time.Time
	scan := true
	for {
		if now := time.Now(); now.Sub(failed) >= every {
			var err error
			if scan {
				_, err = f.Grow(ctx, f.Now())
			} else {
				_, err = f.makeWanted(ctx)
			}
			if err != nil && ctx.Err() == nil {
				failed = now
				g.failed.WithLabelValues(stepGrow).Inc()
				log.Warn("growing windows; trying again at the next pass", zap.Error(err))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			scan = true
		case <-f.GrowthWanted():
			scan = false
		}
	}
}

// slowLoop runs the slow pass at once and then every every.
func (f *Filter) slowLoop(ctx context.Context, g *Gauges, log *zap.Logger, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	warned := map[[2]int64]string{} // buckets and shards already warned about
	ev := &evictionWatch{unsafe: map[string]string{}}
	for {
		f.watchEviction(ctx, g, ev, log)
		f.maintainSlow(ctx, f.Now(), g, warned, log)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// evictionWatch is what the maintenance found of the masters' eviction
// policies.
type evictionWatch struct {
	// unsafe holds the masters whose policy evicts, with the policy.
	unsafe map[string]string
	// servers are the masters with series in the gauges.
	servers map[string]bool
}

// watchEviction reads every master's eviction policy and evicted keys into
// g and sets the filter's health: unhealthy while any master's policy is
// not noeviction. A master whose INFO fails, or does not name its policy,
// keeps the answer it last gave; a master no longer listed (after a
// failover) loses its series and its say.
func (f *Filter) watchEviction(ctx context.Context, g *Gauges, w *evictionWatch, log *zap.Logger) {
	evs, err := f.Evictions(ctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		g.failed.WithLabelValues(stepServerInfo).Inc()
		log.Warn("reading the Redis masters' eviction policies; trying again at the next pass", zap.Error(err))
	}
	seen := map[string]bool{}
	for _, e := range evs {
		seen[e.Server] = true
		if e.Err != nil {
			g.failed.WithLabelValues(stepServerInfo).Inc()
			log.Warn("reading a Redis master's eviction policy; trying again at the next pass", zap.String("server", e.Server), zap.Error(e.Err))
		}
		if e.Evicted >= 0 {
			g.evicted.WithLabelValues(e.Server).Set(float64(e.Evicted))
		}
		g.keysLost.WithLabelValues(e.Server) // at 0 until a loss, so increase() sees the first
		if e.Policy == "" {
			continue
		}
		was, wasUnsafe := w.unsafe[e.Server]
		switch {
		case !e.Safe():
			g.policySafe.WithLabelValues(e.Server).Set(0)
			if was != e.Policy {
				w.unsafe[e.Server] = e.Policy
				g.unsafePolicy.Inc()
				log.Error("Redis eviction policy changed to one that evicts: not ready until it is back to noeviction", zap.String("server", e.Server),
					zap.String("policy", e.Policy), zap.Error(policyError(e.Server, e.Policy)))
			}
		default:
			g.policySafe.WithLabelValues(e.Server).Set(1)
			if wasUnsafe {
				delete(w.unsafe, e.Server)
				log.Info("Redis eviction policy is noeviction again", zap.String("server", e.Server), zap.String("was", was))
			}
		}
	}
	if err == nil {
		for s := range w.servers {
			if seen[s] {
				continue
			}
			g.evicted.DeleteLabelValues(s)
			g.policySafe.DeleteLabelValues(s)
			if p, ok := w.unsafe[s]; ok {
				delete(w.unsafe, s)
				log.Info("Redis server with an evicting policy is no longer a master", zap.String("server", s), zap.String("policy", p))
			}
		}
		w.servers = seen
	}
	f.evicting.Store(len(w.unsafe) > 0)
}

func (f *Filter) maintainSlow(ctx context.Context, now time.Time, g *Gauges, warned map[[2]int64]string, log *zap.Logger) {
	if err := f.Preallocate(ctx, now); err != nil && ctx.Err() == nil {
		g.failed.WithLabelValues(stepPreallocate).Inc()
		log.Warn("preallocating the current window; trying again at the next pass", zap.Error(err))
	}
	// The next bucket, once it starts within the lead.
	if ahead := now.Add(f.PreallocateLead()); f.cfg.Window.Bucket(ahead) != f.cfg.Window.Bucket(now) {
		if err := f.Preallocate(ctx, ahead); err != nil && ctx.Err() == nil {
			g.failed.WithLabelValues(stepPreallocate).Inc()
			log.Warn("preallocating the next window; trying again at the next pass", zap.Error(err))
		}
	}
	if err := f.watchLost(ctx); err != nil && ctx.Err() == nil {
		g.failed.WithLabelValues(stepLost).Inc()
		log.Warn("looking for lost filter keys; trying again at the next pass", zap.Error(err))
	}
	st, err := f.Stats(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			g.failed.WithLabelValues(stepStats).Inc()
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
			log.Warn("window only tests new IDs: it reached its growth cap (PlanOptions.MaxGrowth); their copies pass",
				zap.Time("window", s.Start), zap.Int("shard", s.Shard), zap.Int64("test_only", s.TestOnly), zap.Float64("estimated_elements", s.Elements))
		case s.Overfilled > stage.CapacityPerShard/100 && warned[k] == "":
			// Only replicas of a version before back-pressure overfill.
			warned[k] = "overfilled"
			log.Warn("window overfilled by a replica of an older version: the false-positive rate is above target",
				zap.Time("window", s.Start), zap.Int("shard", s.Shard), zap.Int64("overfilled", s.Overfilled))
		}
	}
	// Windows long expired are forgotten.
	for k := range warned {
		if k[0] < f.Window().Bucket(now.Add(-f.Window().Retention())) {
			delete(warned, k)
		}
	}
}

package consumer

import (
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/event"
)

// Metrics are the worker's Prometheus metrics, labelled with the pipeline.
type Metrics struct {
	eventsIn     prometheus.Counter
	forwarded    prometheus.Counter
	verdicts     *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	errors       *prometheus.CounterVec
	// replays count input decided before: skipped (delivered before, only
	// committed) or forwarded again (decided, never delivered).
	replays *prometheus.CounterVec
	// unchecked counts events forwarded without a test-and-set (fail-open).
	unchecked prometheus.Counter
	// rebalances counts kafka-go's Stats().Rebalances (watchReader).
	rebalances   prometheus.Counter
	batchSize    prometheus.Histogram
	batchSeconds prometheus.Histogram
	redisSeconds prometheus.Histogram
	// fetchToProduce is per message: from its fetch to the acknowledgement
	// of the output (and dead letters) of its batch.
	fetchToProduce prometheus.Histogram
	lag            *prometheus.GaugeVec
	// eventLag is per event: the clock at its decision less its event time.
	eventLag prometheus.Histogram
	// partitionVerdicts count first and duplicate verdicts per input topic
	// and partition; partitions holds their counters, made when a
	// partition is first decided.
	partitionVerdicts *prometheus.CounterVec
	mu                sync.Mutex
	partitions        map[topicPartition]*[2]prometheus.Counter
}

type topicPartition struct {
	topic     string
	partition int32
}

// The steps of dedupe_errors_total, as its step label says them: the
// calls the worker retries, and the one that stopped it (StageError.Step).
const (
	StepStart      = "set_start_offsets"
	StepFetch      = "fetch"
	StepDecide     = "test_and_set"
	StepProduce    = "produce"
	StepDuplicates = "duplicates"
	StepDeadLetter = "dead_letter"
	StepMark       = "mark_delivered"
	StepCommit     = "commit"
)

// The outcomes of dedupe_replays_total.
const (
	ReplaySkipped   = "skipped"
	ReplayForwarded = "forwarded"
)

// steps are the steps in the order of an event's way, each with the
// phrase logs and errors say it in.
var steps = [...]struct{ label, phrase string }{
	{StepStart, "setting the start offsets"},
	{StepFetch, "fetching"},
	{StepDecide, "test-and-set"},
	{StepProduce, "producing"},
	{StepDuplicates, "writing the copies dropped"},
	{StepDeadLetter, "dead-lettering"},
	{StepMark, "marking delivered"},
	{StepCommit, "committing"},
}

// Steps are the step labels, in order: loops over them (the series made at
// 0, tests) use this.
func Steps() []string {
	labels := make([]string, len(steps))
	for i, s := range steps {
		labels[i] = s.label
	}
	return labels
}

// stepPhrase is how logs and errors say step: the label itself for one
// not in steps.
func stepPhrase(step string) string {
	for _, s := range steps {
		if s.label == step {
			return s.phrase
		}
	}
	return step
}

// verdictLabels are the labels of the filter's verdicts: the help of
// dedupe_verdicts_total and its series made at 0. Package bloom has no
// list of them yet, so this counts on FirstSeen and Future being its first
// and last; it is the one place in the worker that does.
func verdictLabels() []string {
	var labels []string
	for _, v := range bloom.Verdicts() {
		labels = append(labels, v.String())
	}
	return labels
}

// EventLagBuckets span a second to a week, dense around the lag bounds
// operators choose (minutes to hours).
var EventLagBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200, 10800,
	14400, 21600, 43200, 86400, 172800, 345600, 604800}

// LatencyBuckets are fine enough (25% apart) to read p50 and p99 from.
var LatencyBuckets = prometheus.ExponentialBuckets(0.0005, 1.25, 40)

// NewMetrics registers the metrics with reg (none if nil).
func NewMetrics(reg prometheus.Registerer, pipeline string) *Metrics {
	l := prometheus.Labels{"pipeline": pipeline}
	m := &Metrics{
		eventsIn: prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupe_events_in_total", Help: "Input messages read.", ConstLabels: l}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupe_events_forwarded_total",
			Help: "Messages written to the output topic.", ConstLabels: l}),
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dedupe_verdicts_total",
			Help: "Decisions by verdict: " + strings.Join(verdictLabels(), ", ") + ".", ConstLabels: l}, []string{"verdict"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dedupe_events_dead_lettered_total",
			Help: "Messages sent to the dead-letter topic, by reason.", ConstLabels: l}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dedupe_errors_total",
			Help: "Failed calls, by step: those retried, and the one that stopped the worker.", ConstLabels: l}, []string{"step"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dedupe_replays_total",
			Help:        "Input read again after it was decided (a rebalance, a restart): skipped, delivered before and only committed; or forwarded, decided and never delivered (or older than the decision records).",
			ConstLabels: l}, []string{"outcome"}),
		unchecked: prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupe_unchecked_total",
			Help: "Events forwarded without their test-and-set, with dedupe-verdict: unchecked, while the filter failed (DEDUPE_FAIL_OPEN_AFTER).", ConstLabels: l}),
		rebalances: prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupe_rebalances_total",
			Help: "Consumer-group generations this replica joined (its first join and every rebalance), and reads of a partition restarted because its leader moved: each may read input again.", ConstLabels: l}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dedupe_batch_size",
			Help: "Messages per batch.", ConstLabels: l, Buckets: prometheus.ExponentialBuckets(1, 2, 15)}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dedupe_batch_seconds",
			Help: "Time from the first message of a batch fetched to its last output acknowledged.", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}),
		redisSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dedupe_redis_call_seconds",
			Help: "Time of one test-and-set, all shards.", ConstLabels: l, Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15)}),
	}
	m.fetchToProduce = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dedupe_fetch_to_produce_seconds",
		Help: "Per message, from its fetch to the acknowledgement of its batch's output.", ConstLabels: l, Buckets: LatencyBuckets})
	m.lag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dedupe_consumer_lag",
		Help: "Messages behind the partition's high watermark after the last batch this replica processed.", ConstLabels: l}, []string{"partition"})
	m.eventLag = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dedupe_event_lag_seconds",
		Help: "Per event, the clock at its decision less its event time (0 for event times ahead of the clock).", ConstLabels: l,
		Buckets: EventLagBuckets})
	m.partitionVerdicts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dedupe_partition_verdicts_total",
		Help:        "Decisions per input topic and partition: first (forwarded in drop mode) or duplicate (dropped in drop mode, marked in shadow mode); events beyond the lag bound are not counted.",
		ConstLabels: l}, []string{"topic", "partition", "verdict"})
	m.partitions = map[topicPartition]*[2]prometheus.Counter{}
	// Every label value the worker can use exists from the start, at 0, so
	// that a rate over it is 0 rather than no data, and an alert on it
	// fires on the first event rather than the second.
	for _, v := range verdictLabels() {
		m.verdicts.WithLabelValues(v)
	}
	for _, r := range event.Reasons() {
		m.deadLettered.WithLabelValues(r.String())
	}
	for _, s := range Steps() {
		m.errors.WithLabelValues(s)
	}
	m.replays.WithLabelValues(ReplaySkipped)
	m.replays.WithLabelValues(ReplayForwarded)
	if reg != nil {
		reg.MustRegister(m.eventsIn, m.forwarded, m.verdicts, m.deadLettered, m.errors, m.replays, m.unchecked, m.rebalances, m.batchSize, m.batchSeconds, m.redisSeconds,
			m.fetchToProduce, m.lag, m.eventLag, m.partitionVerdicts)
	}
	return m
}

// addPartitionVerdicts adds n, counts by event.Verdict, to the verdicts of
// one input partition. Both of its series exist from its first decision
// on, so a rate of duplicates is 0 rather than no data. The series are
// bounded by the partitions of the input topic.
func (m *Metrics) addPartitionVerdicts(topic string, partition int32, n [2]int) {
	k := topicPartition{topic, partition}
	m.mu.Lock()
	c, ok := m.partitions[k]
	if !ok {
		c = &[2]prometheus.Counter{}
		p := strconv.Itoa(int(partition))
		for _, v := range event.Verdicts() {
			c[v] = m.partitionVerdicts.WithLabelValues(topic, p, v.String())
		}
		m.partitions[k] = c
	}
	m.mu.Unlock()
	for v, x := range n {
		if x > 0 {
			c[v].Add(float64(x))
		}
	}
}

package demo

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/consumer"
)

// Result is what a demo run found.
type Result struct {
	Options    Options
	Plan       bloom.Plan
	Partitions int32
	Elapsed    time.Duration // from the first event produced to the last committed

	Events, Valid, Distinct, Malformed int
	// ForwardedSources are the output records distinct by dedupe-source;
	// OutRecords all of them; Replays the difference.
	ForwardedSources, OutRecords, Replays int
	// Dropped are the valid events not forwarded: repeats of an ID, and
	// the first copies taken for repeats (false positives).
	Dropped      int
	DeadLettered int            // dead letters distinct by dedupe-source
	DeadReasons  map[string]int // by reason
	// Lost are distinct valid IDs never forwarded although a copy was
	// decided first seen; Unclassified those whose decisions cannot be
	// read. Both must be 0.
	Lost, Unclassified int
	// FalsePositives are distinct valid IDs never forwarded because every
	// copy was decided a duplicate: the first test was a false positive.
	FalsePositives int
	// FalsePositivesByCounters is the same from the workers' counters:
	// duplicate verdicts less the repeats in the input.
	FalsePositivesByCounters  int
	ExpectedFP, ExpectedFPVar float64
	// RecordedFirst and RecordedDup are the decisions the Redis decision
	// records hold for the valid events; RecordsAgree that the first-seen
	// ones match the output.
	RecordedFirst, RecordedDup int
	RecordsAgree               bool
	Check                      clickstream.Report

	// FilterKeyBytes is MEMORY USAGE summed over the filter keys of the
	// buckets the run's IDs fell in (FilterKeys of them: every stage in
	// use and those before it).
	FilterKeyBytes int64
	FilterKeys     int
	// PlannedKeyBytes is what the plan gives for those keys.
	PlannedKeyBytes int64
	// UsedMemoryGrowth is INFO memory used_memory at the end less before
	// the workers started.
	UsedMemoryGrowth int64
	// Fill, EstElements and EstFPR are the filter's own statistics for the
	// newest bucket holding IDs (bloom.Filter.Stats).
	Fill, EstElements, EstFPR float64
	// Stages the newest window grew into; Overfilled and TestOnly from its
	// growth records.
	Stages               int
	Overfilled, TestOnly int64
	// StagesMade are the stages the replicas made; Refused the
	// test-and-set calls refused for a stage not made yet; Waits the
	// batches that waited for one, WaitTotal how long in all, and
	// LongestWait the upper bound of the histogram bucket of the longest
	// (the replicas' dedupe_filter_growth_wait_seconds).
	StagesMade, Refused, Waits int
	WaitTotal, LongestWait     time.Duration

	// IDSource says where the workers read the IDs; Shadow is what the
	// verifier found of the marks in shadow mode.
	IDSource consumer.IDSource
	Shadow   ShadowCheck

	PerReplica   []float64 // events decided by each replica
	Verdicts     map[string]float64
	LogLines     int
	WorkerErrors []error
	Log          string // the workers' warnings and errors
}

// OK reports whether the verifier found nothing lost or mangled.
func (r *Result) OK() bool { return len(r.problems()) == 0 }

// EventsPerSecond is the run's throughput.
func (r *Result) EventsPerSecond() float64 { return float64(r.Events) / r.Elapsed.Seconds() }

// Print writes the report: what the run was, a table of what became of
// the events, of the filter and of the replicas, and the verdict.
func (r *Result) Print(w io.Writer) {
	r.printHeader(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, a...)) }
	r.eventRows(row)
	r.filterRows(row)
	r.replicaRows(row)
	tw.Flush()

	bad := r.problems()
	if len(bad) == 0 {
		fmt.Fprintln(w, "\nresult: OK, nothing lost")
		return
	}
	fmt.Fprintf(w, "\nresult: FAILED: %s\n", strings.Join(bad, "; "))
}

// rowFunc adds a row to the report's table: its name and its text.
type rowFunc func(k, format string, a ...any)

// printHeader says what the run was: the events, the replicas, the
// filter and, when not the defaults, the ID source and the mode.
func (r *Result) printHeader(w io.Writer) {
	o, pl := r.Options, r.Plan
	fmt.Fprintf(w, "dedupe-worker demo: %s click events (%s%% repeats, %s%% malformed) through %d worker replicas in one group, %d input partitions\n",
		group3(int64(r.Events)), percent(o.Dup), percent(o.Bad), Replicas, r.Partitions)
	fmt.Fprintf(w, "filter: %s distinct IDs per %v rolling window at p = %g; %d words x %d bits per ID, %d shard(s), %s bits (%.1f per ID at capacity), achieved p %.2g at capacity\n",
		group3(pl.Elements), o.Window, pl.TargetFPR, pl.Layout.Words, pl.Layout.BitsPerWord, pl.Shards, group3(int64(pl.Bits())), pl.BitsPerElement(), pl.AchievedFPR)
	fmt.Fprintf(w, "event times %v behind the clock; lag bound %v\n", o.Behind, o.MaxLag)
	if o.IDFrom != "json" || o.Mode != config.ModeDrop {
		fmt.Fprintf(w, "IDs from %s; mode %s\n", r.IDSource, o.Mode)
	}
	fmt.Fprintln(w)
}

// eventRows are the rows of what became of the events: forwarded (and
// marked, in shadow mode), dropped, dead-lettered, lost.
func (r *Result) eventRows(row rowFunc) {
	o := r.Options
	row("events in", "%s", group3(int64(r.Events)))
	row("distinct valid IDs", "%s (in %s valid events)", group3(int64(r.Distinct)), group3(int64(r.Valid)))
	forwarded := "forwarded"
	if o.Mode == config.ModeShadow {
		forwarded = "forwarded, marked first"
	}
	row(forwarded, "%s distinct by dedupe-source; %s records, %s of them replays", group3(int64(r.ForwardedSources)),
		group3(int64(r.OutRecords)), group3(int64(r.Replays)))
	if o.Mode == config.ModeShadow {
		sc := r.Shadow
		row("shadow mode", "%s of %s valid events forwarded: %s marked first, %s marked duplicate (a duplicate rate of %.2f%%), %s undeduplicated (beyond the lag bound)",
			group3(int64(sc.Forwarded)), group3(int64(r.Valid)), group3(int64(sc.MarkedFirst)), group3(int64(sc.MarkedDuplicate)),
			100*float64(sc.MarkedDuplicate)/float64(max(r.Valid, 1)), group3(int64(sc.Undeduplicated)))
		row("marks", "%s unmarked, %s marked otherwise than the decision records say, %s valid events not forwarded",
			group3(int64(sc.Unmarked)), group3(int64(sc.Disagree)), group3(int64(sc.Missing)))
	}
	dropped := "duplicates dropped"
	if o.Mode == config.ModeShadow {
		dropped = "duplicates marked"
	}
	row(dropped, "%s: %s repeats of an ID already seen, %s first copies taken for repeats (false positives)",
		group3(int64(r.Dropped)), group3(int64(r.Valid-r.Distinct)), group3(int64(r.FalsePositives)))
	row("dead-lettered", "%s of %s malformed (%s)", group3(int64(r.DeadLettered)), group3(int64(r.Malformed)), reasons(r.DeadReasons))
	lost := group3(int64(r.Lost))
	if r.Unclassified > 0 {
		lost += fmt.Sprintf(", and %s never forwarded whose decisions cannot be read", group3(int64(r.Unclassified)))
	}
	row("lost", "%s", lost)
}

// filterRows are the rows of the filter's work: false positives against
// the expected, duplicates passed, throughput, memory, the filter's own
// statistics and its growth.
func (r *Result) filterRows(row rowFunc) {
	o := r.Options
	row("false positives observed", "%s, expected %s (sd %s) from the filter's rate at its fill over %s first-seen tests; the workers' counters say %s",
		group3(int64(r.FalsePositives)), approx(r.ExpectedFP), approx(math.Sqrt(r.ExpectedFPVar)), group3(int64(r.Distinct)), group3(int64(r.FalsePositivesByCounters)))
	row("duplicates passed", "%s IDs forwarded from more than one source (late: %s)", group3(int64(r.Check.DuplicatesPass)),
		group3(int64(r.Verdicts["late"])))
	row("throughput", "%s events/s: %v from the first event produced to the last offset committed (broker, generator and both replicas share this process)",
		group3(int64(r.EventsPerSecond())), r.Elapsed.Round(time.Millisecond))
	perID := func(b int64) float64 { return float64(b) / float64(max(r.Distinct, 1)) }
	row("Redis bytes per distinct ID", "%.2f by MEMORY USAGE of the %d filter key(s) holding the run's IDs (%s bytes); %.2f by the growth of INFO used_memory (%s bytes: also the next window's key, made ahead of time, any stage made ahead of need, and the decision records)",
		perID(r.FilterKeyBytes), r.FilterKeys, group3(r.FilterKeyBytes), perID(r.UsedMemoryGrowth), group3(r.UsedMemoryGrowth))
	if math.IsInf(r.EstElements, 1) || r.Fill >= 1 {
		row("filter statistics", "fill %.4f: every bit is set, so every new ID is taken for a repeat", r.Fill)
	} else {
		row("filter statistics", "fill %.4f, estimated %s IDs, estimated p %.2g now (bloom stats)", r.Fill, group3(int64(r.EstElements)), r.EstFPR)
	}
	row("filter stages", "%d of %d (growth up to %gx the expected IDs); %s inserted past a full stage, %s only tested past the cap",
		r.Stages, len(r.Plan.Stages), o.MaxGrowth, group3(r.Overfilled), group3(r.TestOnly))
	if r.Plan.Growth() {
		waits := "no batch waited for one"
		if r.Waits > 0 {
			waits = fmt.Sprintf("%s batches waited for one not made yet (%s calls refused), %v in all, the longest at most %v",
				group3(int64(r.Waits)), group3(int64(r.Refused)), r.WaitTotal.Round(time.Millisecond/10), r.LongestWait)
		}
		row("stages made", "%s by the replicas; %s", group3(int64(r.StagesMade)), waits)
	}
}

// replicaRows are the rows of the replicas: what each decided, their log,
// and the decisions they recorded in Redis against the output.
func (r *Result) replicaRows(row rowFunc) {
	var each []string
	for _, d := range r.PerReplica {
		each = append(each, group3(int64(d)))
	}
	row("replicas", "decided %s events", strings.Join(each, " and "))
	agree := "they match the output"
	if !r.RecordsAgree {
		agree = "they do NOT match the output: the per-ID split of false positives and losses is not to be trusted"
	}
	if r.LogLines > 0 {
		row("worker log", "%s lines at warn level or above (-v shows them as they come)", group3(int64(r.LogLines)))
	}
	row("decisions in Redis", "%s first seen, %s duplicate for the valid events; %s", group3(int64(r.RecordedFirst)), group3(int64(r.RecordedDup)), agree)
}

func reasons(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %s", k, group3(int64(m[k])))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// approx writes x with sense for its size.
func approx(x float64) string {
	switch {
	case x >= 100:
		return group3(int64(math.Round(x)))
	case x >= 0.1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strconv.FormatFloat(x, 'g', 2, 64)
}

// percent writes a share as a percentage without float noise.
func percent(share float64) string {
	return strconv.FormatFloat(math.Round(share*1e8)/1e6, 'f', -1, 64)
}

// problems lists what the verifier found wrong; none means OK.
func (r *Result) problems() []string {
	var bad []string
	c := r.Check
	for _, x := range []struct {
		n    int
		what string
	}{
		{r.Lost, "lost"}, {r.Unclassified, "never forwarded, decisions unreadable"}, {c.DeadMissing, "malformed not dead-lettered"},
		{c.Unknown, "forwarded IDs not in the input"}, {c.Conflicts, "sources forwarded with two IDs"},
		{c.NoReason, "dead letters without a reason"}, {c.WrongDead, "valid events dead-lettered"},
		{c.OrderBreaks, "order breaks"}, {len(r.WorkerErrors), "replica errors"},
	} {
		if x.n > 0 {
			bad = append(bad, fmt.Sprintf("%s %s", group3(int64(x.n)), x.what))
		}
	}
	if !r.RecordsAgree {
		bad = append(bad, "decision records disagree with the output")
	}
	if sc := r.Shadow; r.Options.Mode == config.ModeShadow {
		for _, x := range []struct {
			n    int
			what string
		}{{sc.Missing, "valid events not forwarded in shadow mode"}, {sc.Unmarked, "forwarded without dedupe-verdict"},
			{sc.Disagree, "marked otherwise than recorded"}} {
			if x.n > 0 {
				bad = append(bad, fmt.Sprintf("%s %s", group3(int64(x.n)), x.what))
			}
		}
	}
	for _, err := range r.WorkerErrors {
		bad = append(bad, err.Error())
	}
	return bad
}

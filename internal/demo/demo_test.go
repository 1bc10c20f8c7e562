package demo

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/event"
)

func runDemo(t *testing.T, o Options) *Result {
	t.Helper()
	var progress bytes.Buffer
	o.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	res, err := Run(ctx, o)
	if err != nil {
		if res != nil {
			t.Logf("workers' log:\n%s", res.Log)
		}
		t.Fatal(err)
	}
	var report bytes.Buffer
	res.Print(&report)
	t.Logf("in %v:\n%s\nprogress:\n%s", time.Since(start).Round(time.Millisecond), report.String(), progress.String())
	if !strings.Contains(progress.String(), "done in") {
		t.Errorf("no final progress line")
	}
	return res
}

// checkAgainstTruth asserts the report's numbers against the ground truth
// recomputed here.
func checkAgainstTruth(t *testing.T, res *Result) {
	t.Helper()
	o := res.Options
	ids, distinct := clickstream.StreamIDs(o.N, o.Dup, o.Bad, o.Seed)
	valid, malformed := len(ids), o.N-len(ids)
	if res.Events != o.N || res.Valid != valid || res.Distinct != distinct || res.Malformed != malformed {
		t.Errorf("events %d, valid %d, distinct %d, malformed %d; the generator made %d, %d, %d, %d",
			res.Events, res.Valid, res.Distinct, res.Malformed, o.N, valid, distinct, malformed)
	}
	if res.Lost != 0 || res.Unclassified != 0 {
		t.Errorf("lost %d, unclassified %d", res.Lost, res.Unclassified)
	}
	if res.ForwardedSources != res.Distinct-res.FalsePositives {
		t.Errorf("forwarded %d distinct sources, want distinct %d - false positives %d", res.ForwardedSources, res.Distinct, res.FalsePositives)
	}
	if res.Dropped != res.Valid-res.Distinct+res.FalsePositives {
		t.Errorf("dropped %d, want repeats %d + false positives %d", res.Dropped, res.Valid-res.Distinct, res.FalsePositives)
	}
	if res.DeadLettered != malformed {
		t.Errorf("dead-lettered %d, want the %d malformed", res.DeadLettered, malformed)
	}
	if res.FalsePositives != res.FalsePositivesByCounters {
		t.Errorf("false positives: %d per ID, %d by the workers' counters", res.FalsePositives, res.FalsePositivesByCounters)
	}
	if !res.RecordsAgree || res.RecordedFirst+res.RecordedDup != valid {
		t.Errorf("decision records: %d first, %d duplicate, agree %v; %d valid events", res.RecordedFirst, res.RecordedDup, res.RecordsAgree, valid)
	}
	if len(res.PerReplica) != Replicas || res.PerReplica[0] == 0 || res.PerReplica[1] == 0 {
		t.Errorf("events decided per replica %v: want both replicas working", res.PerReplica)
	}
	if !within(res.FalsePositives, res.ExpectedFP, res.ExpectedFPVar) {
		t.Errorf("false positives %d, expected %.1f (variance %.1f)", res.FalsePositives, res.ExpectedFP, res.ExpectedFPVar)
	}
	if !res.OK() {
		t.Errorf("not OK: %+v", res.Check)
	}
	var report bytes.Buffer
	res.Print(&report)
	for _, re := range []string{`(?m)^lost\s+0$`, `(?m)^result: OK, nothing lost$`,
		`(?m)^dead-lettered\s+` + group3(int64(malformed)) + ` of `,
		`(?m)^false positives observed\s+` + group3(int64(res.FalsePositives)) + `, expected `} {
		if !regexp.MustCompile(re).MatchString(report.String()) {
			t.Errorf("report does not match %s", re)
		}
	}
}

// By default the filter is planned for the distinct IDs the run is
// expected to have.
func TestDemoDefaultCapacity(t *testing.T) {
	o := Options{N: 20_000, Dup: 0.07, Bad: 0.01}
	o.setDefaults()
	if o.Expected != 18_400 {
		t.Errorf("default capacity %d, want 18,400", o.Expected)
	}
}

// The demo at a small size: every number of the report agrees with the
// ground truth, and the filter at its planned load shows its planned rate
// (expected false positives far below one). The run has 18,430 distinct
// IDs, a few more than the 18,400 it is expected to have: the filter is
// planned for 18,500, so that its window does not grow.
func TestDemo(t *testing.T) {
	res := runDemo(t, Options{N: 20_000, Dup: 0.07, Bad: 0.01, Window: 10 * time.Minute, P: 1e-6, Expected: 18_500, Seed: 7})
	checkAgainstTruth(t, res)
	if res.ExpectedFP > 0.1 || res.FalsePositives > 2 {
		t.Errorf("false positives %d, expected %.3g: a filter at its planned load should have almost none", res.FalsePositives, res.ExpectedFP)
	}
	if res.Stages != 1 {
		t.Fatalf("the window grew into %d stages: the memory checks below are for one", res.Stages)
	}
	// Redis holds for each window about what the plan says (a run that
	// crosses a window boundary has two windows' keys). MEMORY USAGE adds
	// the key's own overhead, and below 16 kB jemalloc's size classes are
	// coarser than the planner's 16-byte rounding assumes (a 15 kB shard
	// takes 16 kB), so only an upper bound of 30% more is checked.
	// Without a window's keys both bounds below hold for nothing (0 of 0
	// bytes, and NaN bytes per ID).
	if res.Plan.Shards < 1 || res.FilterKeys < res.Plan.Shards || res.FilterKeyBytes <= 0 {
		t.Fatalf("%d filter keys of %d bytes for %d shards: want at least one window's keys", res.FilterKeys, res.FilterKeyBytes, res.Plan.Shards)
	}
	windows := float64(res.FilterKeys) / float64(res.Plan.Shards)
	if got, want := float64(res.FilterKeyBytes), float64(res.PlannedKeyBytes); got < want || got > 1.3*want || want != windows*float64(res.Plan.Memory) {
		t.Errorf("filter keys use %.0f bytes, the plan %.0f for %.0f windows", got, want, windows)
	}
	if bpi := float64(res.FilterKeyBytes) / windows / float64(res.Distinct); bpi < 3 || bpi > 6 {
		t.Errorf("%.2f filter bytes per distinct ID per window, want about 4.5 at p = 1e-6", bpi)
	}
}

// The demo with the ID in the key, in a header and as the hash of the
// value (the event time in a header): the same report agrees with the
// ground truth, and the malformed events (no key, no header, an empty
// value) are dead-lettered for the source's reason.
func TestDemoIDSources(t *testing.T) {
	for from, reason := range map[string]string{"key": "no_key", "header": "no_header", "value": "empty_value"} {
		t.Run(from, func(t *testing.T) {
			res := runDemo(t, Options{N: 6_000, Dup: 0.1, Bad: 0.02, Seed: 11, IDFrom: from})
			checkAgainstTruth(t, res)
			if len(res.DeadReasons) != 1 || res.DeadReasons[reason] != res.Malformed {
				t.Errorf("dead letters by reason %v: want all %d for %s", res.DeadReasons, res.Malformed, reason)
			}
			var report bytes.Buffer
			res.Print(&report)
			if want := "IDs from " + res.IDSource.String() + "; mode drop"; !strings.Contains(report.String(), want) {
				t.Errorf("the report does not say %q", want)
			}
		})
	}
}

// In shadow mode the demo forwards every valid event, marks exactly the
// duplicates (as the decision records in Redis say), and the events
// marked first pass the checks drop mode's output passes.
func TestDemoShadow(t *testing.T) {
	res := runDemo(t, Options{N: 10_000, Dup: 0.1, Bad: 0.01, Seed: 12, Mode: "shadow"})
	checkAgainstTruth(t, res)
	sc := res.Shadow
	if sc.Forwarded != res.Valid || sc.Missing != 0 || sc.Unmarked != 0 || sc.Disagree != 0 {
		t.Errorf("%+v: want all %d valid events forwarded and marked as recorded", sc, res.Valid)
	}
	if sc.MarkedDuplicate != res.Dropped || sc.MarkedDuplicate < res.Valid-res.Distinct || sc.MarkedFirst != res.ForwardedSources {
		t.Errorf("%d marked duplicate, %d marked first; want %d (the repeats and false positives) and %d", sc.MarkedDuplicate, sc.MarkedFirst,
			res.Dropped, res.ForwardedSources)
	}
	var report bytes.Buffer
	res.Print(&report)
	if !regexp.MustCompile(`(?m)^shadow mode\s+` + group3(int64(res.Valid)) + ` of ` + group3(int64(res.Valid)) + ` valid events forwarded`).MatchString(report.String()) {
		t.Error("the report does not say every valid event was forwarded")
	}
}

// A filter ten times too small that may not grow: false positives are
// many, all of them are told apart from losses, and their count is what
// the filter's rate at its fill predicts.
func TestDemoTinyFilter(t *testing.T) {
	res := runDemo(t, Options{N: 20_000, Dup: 0.07, Bad: 0.01, Window: 10 * time.Minute, P: 0.01, Expected: 2000, MaxGrowth: 1, Seed: 8})
	checkAgainstTruth(t, res)
	if res.FalsePositives < 1000 {
		t.Errorf("only %d false positives from a filter sized for 2000 IDs holding %d", res.FalsePositives, res.Distinct)
	}
	t.Logf("false positives %d, expected %.1f, sd %.1f", res.FalsePositives, res.ExpectedFP, math.Sqrt(res.ExpectedFPVar))
}

func TestDemoWithoutRedis(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	var out, errb bytes.Buffer
	if code := RunDemo(context.Background(), []string{"-n", "100"}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	msg := errb.String()
	if strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "redis-server") || !strings.Contains(msg, "brew install redis") {
		t.Fatalf("stderr %q: want one line naming the package to install", msg)
	}
	if out.Len() != 0 {
		t.Fatalf("stdout %q", out.String())
	}
}

func TestDemoBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-dup", "0.7", "-bad", "0.4"}, {"-window", "1500ms"}, {"-p", "1"}, {"-n", "0"}, {"extra"},
		{"-id-from", "body"}, {"-mode", "observe"}} {
		var out, errb bytes.Buffer
		if code := RunDemo(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
}

// The verifier tells a loss from a false positive: an ID never forwarded
// is a false positive only if every copy was decided a duplicate.
func TestClassify(t *testing.T) {
	tr := newTruth(0)
	ev := func(id string) clickstream.Event { return clickstream.Event{ID: id, Time: time.Now()} }
	// Partition 0: a@0 (forwarded), b@1, a@2, c@3; partition 1: b@0, d@1, e@5.
	tr.add(ev("a"), 0, 0)
	tr.add(ev("b"), 0, 1)
	tr.add(ev("a"), 0, 2)
	tr.add(ev("c"), 0, 3)
	tr.add(ev("b"), 1, 0)
	tr.add(ev("d"), 1, 1)
	tr.add(ev("e"), 1, 5)
	out := []*kgo.Record{{Headers: []kgo.RecordHeader{{Key: clickstream.IDHeader, Value: []byte("a")}, {Key: clickstream.SourceHeader, Value: []byte("clicks/0/0")}}}}
	// What the decision records say of each input, in order: a forwarded;
	// b dropped, a dropped, c forwarded (never produced: lost); b dropped;
	// d and e never decided.
	decided := []bloom.Recorded{bloom.RecordedForward, bloom.RecordedDrop, bloom.RecordedDrop, bloom.RecordedForward,
		bloom.RecordedDrop, bloom.NotDecided, bloom.Forgotten}
	f := classify(tr, out, decided)
	// a forwarded; b: every copy duplicate, a false positive; c: decided
	// first seen, never forwarded, lost; d and e never decided.
	if f.forwardedIDs != 1 || f.falsePositives != 1 || f.lost != 1 || f.unclassified != 2 {
		t.Fatalf("%+v: want 1 forwarded, 1 false positive, 1 lost, 2 unclassified", f)
	}
	if f.recordedFirst != 2 || f.recordedDup != 3 || f.recordedNone != 2 {
		t.Fatalf("%+v: want 2 first, 3 duplicate, 2 undecided", f)
	}
}

// The expected count agrees with a direct sum, and a rolling window adds
// the previous bucket's rate.
func TestExpectedFalsePositives(t *testing.T) {
	plan, err := bloom.NewPlan(1000, 0.01, bloom.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var direct float64
	for i := 0; i < 5000; i++ {
		if i > 0 {
			direct += bloom.BlockedFPR(float64(plan.Bits())/float64(i), plan.Layout)
		}
	}
	mean, _ := expectedFalsePositives(plan, true, map[int64]int{10: 5000})
	if mean < 0.98*direct || mean > 1.02*direct {
		t.Fatalf("expected %.1f, direct sum %.1f", mean, direct)
	}
	two, _ := expectedFalsePositives(plan, true, map[int64]int{10: 5000, 11: 5000})
	fixed, _ := expectedFalsePositives(plan, false, map[int64]int{10: 5000, 11: 5000})
	if !(two > fixed && fixed > 1.9*mean && fixed < 2.1*mean) {
		t.Fatalf("rolling %.1f, fixed %.1f, one bucket %.1f", two, fixed, mean)
	}
}

func TestGroup3(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", -1234567: "-1,234,567", 200000: "200,000"} {
		if got := group3(n); got != want {
			t.Errorf("group3(%d) = %q, want %q", n, got, want)
		}
	}
}

// The shadow check counts an event marked otherwise than recorded, one
// not marked and one not forwarded.
func TestCheckShadow(t *testing.T) {
	tr := newTruth(0)
	ev := func(id string) clickstream.Event { return clickstream.Event{ID: id, Time: time.Now()} }
	tr.add(ev("a"), 0, 0)
	tr.add(ev("a"), 0, 1)
	tr.add(ev("b"), 0, 2)
	tr.add(ev("c"), 0, 3)
	tr.add(ev("d"), 0, 4)
	tr.add(clickstream.Event{Value: []byte("bad")}, 0, 5)
	rec := func(off int, id, verdict string) *kgo.Record {
		h := []kgo.RecordHeader{{Key: clickstream.IDHeader, Value: []byte(id)}, {Key: clickstream.SourceHeader, Value: fmt.Appendf(nil, "clicks/0/%d", off)}}
		if verdict != "" {
			h = append(h, kgo.RecordHeader{Key: event.VerdictHeader, Value: []byte(verdict)})
		}
		return &kgo.Record{Headers: h}
	}
	// a@0 first, a@1 duplicate (a replay of it too), b@2 marked duplicate
	// though recorded forward, c@3 unmarked, d@4 never forwarded.
	out := []*kgo.Record{rec(0, "a", "first"), rec(1, "a", "duplicate"), rec(1, "a", "duplicate"), rec(2, "b", "duplicate"), rec(3, "c", "")}
	decided := []bloom.Recorded{bloom.RecordedForward, bloom.RecordedDrop, bloom.RecordedForward, bloom.RecordedForward, bloom.RecordedForward, bloom.NotDecided}
	c := checkShadow(tr, out, decided)
	if c.Forwarded != 4 || c.MarkedFirst != 1 || c.MarkedDuplicate != 2 || c.Unmarked != 1 || c.Disagree != 1 || c.Missing != 1 || len(c.first) != 2 {
		t.Fatalf("%+v (%d first): want 4 forwarded, 1 first, 2 duplicate, 1 unmarked, 1 disagreeing, 1 missing, 2 checked as first", c, len(c.first))
	}
}

// within reports whether observed is within a generous statistical bound
// of a count with this mean and variance: six standard deviations, plus 5%
// of the mean for the approximations of the model, plus 3.
func within(observed int, mean, variance float64) bool {
	return math.Abs(float64(observed)-mean) <= 6*math.Sqrt(variance)+0.05*mean+3
}

package demo

import (
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/event"
)

// input is one produced event as the ground truth knows it.
type input struct {
	partition int32
	offset    int64
	id        int32 // index into truth.ids; -1 when malformed
}

// truth is what the demo produced.
type truth struct {
	clickstream.Truth
	ids     []string // distinct valid IDs, in order of first appearance
	idIndex map[string]int32
	idTime  []int64 // event time (Unix ms) of each ID; its copies carry it too
	inputs  []input
	valid   int // valid events: first copies and repeats
}

func newTruth(n int) *truth {
	return &truth{Truth: clickstream.Truth{Valid: map[string]bool{}}, idIndex: map[string]int32{}, inputs: make([]input, 0, n)}
}

// add records e, produced at partition p and offset off.
func (t *truth) add(e clickstream.Event, p int32, off int64) {
	t.Add(e)
	in := input{partition: p, offset: off, id: -1}
	if e.ID != "" {
		t.valid++
		i, ok := t.idIndex[e.ID]
		if !ok {
			i = int32(len(t.ids))
			t.idIndex[e.ID] = i
			t.ids = append(t.ids, e.ID)
			t.idTime = append(t.idTime, e.Time.UnixMilli())
		}
		in.id = i
	}
	t.inputs = append(t.inputs, in)
}

// elements are the valid inputs as the filter saw them, and idx their
// index in t.inputs.
func (t *truth) elements(topic string) (elems []bloom.Element, idx []int) {
	for i, in := range t.inputs {
		if in.id < 0 {
			continue
		}
		elems = append(elems, bloom.Element{ID: []byte(t.ids[in.id]),
			Source: bloom.Source{Topic: topic, Partition: in.partition, Offset: in.offset}})
		idx = append(idx, i)
	}
	return elems, idx
}

// perBucket counts the distinct valid IDs by the bucket of a rolling
// window of this length that their event time falls in.
func (t *truth) perBucket(window time.Duration) map[int64]int {
	w := bloom.Window{Length: window, Mode: bloom.Rolling}
	n := map[int64]int{}
	for _, ms := range t.idTime {
		n[w.Bucket(time.UnixMilli(ms))]++
	}
	return n
}

// judge fills in res what the verifier found: the output and dead letters
// read back (out, dead) against the truth and the decision records
// (decided[i] for tr.inputs[i]), and the replicas' last counters (final).
func judge(res *Result, tr *truth, out, dead []*kgo.Record, decided []bloom.Recorded, final snapshot) {
	// In shadow mode every valid event is forwarded, and the ones marked
	// first are what drop mode would have forwarded: they are checked as
	// drop mode's output is.
	res.Events, res.Valid, res.Distinct, res.Malformed = tr.Total, tr.valid, len(tr.ids), tr.Truth.Malformed
	if res.Options.Mode == config.ModeShadow {
		res.Shadow = checkShadow(tr, out, decided)
		out = res.Shadow.first
	}
	res.Check = clickstream.Check(tr.Truth, out, dead)
	res.OutRecords, res.Replays = res.Check.OutRecords, res.Check.Replays
	res.ForwardedSources = res.OutRecords - res.Replays
	res.Dropped = res.Valid - res.ForwardedSources
	res.DeadReasons = deadReasons(dead)
	for _, n := range res.DeadReasons {
		res.DeadLettered += n
	}
	f := classify(tr, out, decided)
	res.Lost, res.Unclassified, res.FalsePositives = f.lost, f.unclassified, f.falsePositives
	res.RecordedFirst, res.RecordedDup = f.recordedFirst, f.recordedDup
	res.RecordsAgree = f.recordedNone == 0 && f.recordedFirst == res.ForwardedSources
	res.ExpectedFP, res.ExpectedFPVar = expectedFalsePositives(res.Plan, true, tr.perBucket(res.Options.Window))
	res.Verdicts = final.total.verdicts
	res.FalsePositivesByCounters = int(final.total.verdicts["duplicate"]) - (res.Valid - res.Distinct)
	for _, c := range final.each {
		res.PerReplica = append(res.PerReplica, c.decided())
	}
	g := final.total
	res.StagesMade, res.Refused, res.Waits = int(g.stagesMade), int(g.refused), int(g.waits)
	res.WaitTotal, res.LongestWait = time.Duration(g.waitSeconds*float64(time.Second)), g.longestWait()
}

// fates is what became of the valid IDs.
type fates struct {
	forwardedIDs   int // distinct valid IDs forwarded at least once
	falsePositives int // never forwarded; every copy was decided duplicate
	lost           int // never forwarded though a copy was decided first seen
	unclassified   int // never forwarded; a copy's decision cannot be read
	// recordedFirst and recordedDup count the decisions the records hold
	// for the valid events.
	recordedFirst, recordedDup, recordedNone int
}

// classify splits the valid IDs never forwarded into false positives and
// losses by the decisions recorded for their copies; decided[i] is what
// the decision records say of tr.inputs[i].
func classify(tr *truth, out []*kgo.Record, decided []bloom.Recorded) fates {
	var f fates
	forwarded := make([]bool, len(tr.ids))
	for _, r := range out {
		if i, ok := tr.idIndex[clickstream.Header(r, clickstream.IDHeader)]; ok && !forwarded[i] {
			forwarded[i] = true
			f.forwardedIDs++
		}
	}
	// Per ID never forwarded: whether any copy was decided first seen, and
	// whether any copy's decision is unreadable.
	const anyFirst, anyUnknown = 1, 2
	flags := make([]uint8, len(tr.ids))
	for i, in := range tr.inputs {
		if in.id < 0 {
			continue
		}
		d := decided[i]
		switch d {
		case bloom.RecordedForward:
			f.recordedFirst++
		case bloom.RecordedDrop:
			f.recordedDup++
		default:
			f.recordedNone++
		}
		if forwarded[in.id] {
			continue
		}
		switch d {
		case bloom.RecordedForward:
			flags[in.id] |= anyFirst
		case bloom.NotDecided, bloom.Forgotten:
			flags[in.id] |= anyUnknown
		}
	}
	for i := range tr.ids {
		switch {
		case forwarded[i]:
		case flags[i]&anyFirst != 0:
			f.lost++
		case flags[i]&anyUnknown != 0:
			f.unclassified++
		default:
			f.falsePositives++
		}
	}
	return f
}

// deadReasons counts dead letters (distinct by dedupe-source) by the
// reason in their dedupe-error header, named as the worker's metric
// labels name them.
func deadReasons(dead []*kgo.Record) map[string]int {
	seen := map[string]bool{}
	out := map[string]int{}
	for _, r := range dead {
		src := clickstream.Header(r, clickstream.SourceHeader)
		if seen[src] {
			continue
		}
		seen[src] = true
		out[clickstream.Header(r, clickstream.ReasonHeader)]++
	}
	return out
}

// expectedFalsePositives is the mean and variance of the number of false
// positives among the first tests of perBucket[b] distinct IDs per window
// bucket b. The test of the i-th new ID of a bucket finds a filter of
// plan.Bits() bits holding i IDs, so it is a false positive with
// probability fpr(i) = BlockedFPR(bits/i); an ID that is a false positive
// has all its bits set already, so setting them changes nothing and the
// filter is what i insertions make either way. In rolling mode a test also
// reads the previous bucket, full by then: 1 - (1 - fpr(prev))(1 - fpr(i)).
func expectedFalsePositives(plan bloom.Plan, rolling bool, perBucket map[int64]int) (mean, variance float64) {
	fpr := plan.FPRHolding
	buckets := make([]int64, 0, len(perBucket))
	for b := range perBucket {
		buckets = append(buckets, b)
	}
	slices.Sort(buckets)
	for _, b := range buckets {
		d := float64(perBucket[b])
		var prev float64
		if n, ok := perBucket[b-1]; ok && rolling {
			prev = fpr(float64(n))
		}
		steps := min(perBucket[b], 2000)
		w := d / float64(steps)
		for s := 0; s < steps; s++ {
			i := (float64(s) + 0.5) * w
			p := 1 - (1-prev)*(1-fpr(i))
			mean += p * w
			variance += p * (1 - p) * w
		}
	}
	return mean, variance
}

// ShadowCheck is what the verifier found of a shadow-mode run's output,
// which holds every valid event, each marked with what drop mode would
// have done.
type ShadowCheck struct {
	// Forwarded are the valid events forwarded, distinct by dedupe-source;
	// MarkedFirst and MarkedDuplicate split them by their dedupe-verdict,
	// and Undeduplicated are those beyond the lag bound (forwarded with
	// dedupe-undeduplicated, as drop mode forwards them by default).
	Forwarded, MarkedFirst, MarkedDuplicate, Undeduplicated int
	// Missing are valid events never forwarded; Unmarked those forwarded
	// without a dedupe-verdict (or with one not known); Disagree those
	// marked otherwise than the decision records in Redis say. All must
	// be 0.
	Missing, Unmarked, Disagree int
	// first are the output records marked first: what drop mode would
	// have forwarded.
	first []*kgo.Record
}

// checkShadow reads the marks of a shadow-mode output against the inputs
// and the decision records (decided[i] for tr.inputs[i]).
func checkShadow(tr *truth, out []*kgo.Record, decided []bloom.Recorded) ShadowCheck {
	var c ShadowCheck
	at := make(map[[2]int64]int, len(tr.inputs))
	for i, in := range tr.inputs {
		at[[2]int64{int64(in.partition), in.offset}] = i
	}
	seen := make([]bool, len(tr.inputs))
	for _, r := range out {
		v, marked := event.ParseVerdict([]byte(clickstream.Header(r, event.VerdictHeader)))
		undeduplicated := clickstream.Header(r, event.UndeduplicatedHeader) != ""
		if !marked || v == event.First {
			// Unmarked ones are checked with what drop mode forwards, so
			// that whatever they are is counted there too.
			c.first = append(c.first, r)
		}
		src, ok := event.ParseSource([]byte(clickstream.Header(r, clickstream.SourceHeader)))
		i, known := at[[2]int64{int64(src.Partition), src.Offset}]
		if !ok || !known || seen[i] {
			continue // not an input (the check of the first ones counts it), or a replay
		}
		seen[i] = true
		if tr.inputs[i].id < 0 {
			continue // a malformed input forwarded: counted by that check too
		}
		c.Forwarded++
		switch {
		case undeduplicated && !marked:
			c.Undeduplicated++
		case !marked:
			c.Unmarked++
		case v == event.First:
			c.MarkedFirst++
			if decided[i] != bloom.RecordedForward {
				c.Disagree++
			}
		default:
			c.MarkedDuplicate++
			if decided[i] != bloom.RecordedDrop {
				c.Disagree++
			}
		}
	}
	for i, in := range tr.inputs {
		if in.id >= 0 && !seen[i] {
			c.Missing++
		}
	}
	return c
}

package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/bloom"
)

// partitions are the input partitions the IDs are spread over, in turn.
const partitions = 8

// runEngine runs the engine in mode: the window before filled first with
// -steady, then the measured window from empty.
func runEngine(ctx context.Context, c *redis.Client, o options, mode bloom.Mode) (result, error) {
	e, err := newEngineRun(c, o, mode)
	if err != nil {
		return result{}, err
	}
	if o.steady {
		if err := e.fillBefore(ctx); err != nil {
			return result{}, err
		}
	}
	// Memory is counted from before the measured window's keys are made:
	// the value sent to preallocate them sits in a client buffer for a
	// while.
	mem0 := usedMemory(ctx, c)
	if err := e.f.Preallocate(ctx, e.at); err != nil {
		return result{}, err
	}
	s := &stream{rng: rand.New(rand.NewPCG(o.seed, 2)), dup: o.dup}
	r := result{n: o.n}
	tr := newTruth(o.n)
	m := startMeter(ctx, c)
	m.mem0 = mem0
	if err := e.measure(ctx, s, tr); err != nil {
		return r, err
	}
	m.stop(ctx, &r)
	r.distinct = s.distinct
	tr.finish(&r, s.distinct)
	r.expectedFP = e.expectedFP(s.distinct)
	r.note = e.note(s.distinct)
	return r, nil
}

// engineRun is one run of the engine: its plan and filter, the time its
// IDs are stamped with, and the batch it fills.
type engineRun struct {
	o    options
	mode bloom.Mode
	kind bloom.Kind
	// expected are the distinct IDs the run should give: the plan's n
	// times -load.
	expected int64
	plan     bloom.Plan
	f        *bloom.Filter
	at       time.Time
	offsets  [partitions]int64
	elems    []bloom.Element
	idx      []uint64 // the distinct index of each ID in elems
}

// newEngineRun plans the filter as the flags say and makes it on c, with a
// clock stopped a tenth into the current window.
func newEngineRun(c *redis.Client, o options, mode bloom.Mode) (*engineRun, error) {
	e := &engineRun{o: o, mode: mode, expected: int64(math.Round(float64(o.n) * (1 - o.dup))),
		elems: make([]bloom.Element, o.batch), idx: make([]uint64, o.batch)}
	var err error
	if e.kind, err = bloom.ParseKind(o.filter); err != nil {
		return nil, err
	}
	opt := bloom.PlanOptions{MinShards: o.shards, MaxGrowth: o.growth, MemoryFactor: o.memoryFactor, Kind: e.kind}
	if o.layout != "" {
		if opt.Layout, err = bloom.ParseLayout(o.layout); err != nil {
			return nil, err
		}
	}
	if e.plan, err = bloom.NewPlan(int64(math.Ceil(float64(e.expected)/o.load)), o.p, opt); err != nil {
		return nil, err
	}
	// A tenth into the current window: far from its end, where a rolling
	// test reads the next bucket too, so that runs compare alike.
	now := time.Now().Truncate(o.window).Add(o.window / 10)
	lag := o.maxLag
	e.at = now
	if o.backlog {
		e.at, lag = now.Add(-24*time.Hour), 48*time.Hour
	}
	e.f, err = bloom.New(c, bloom.Config{Pipeline: "bench", Plan: e.plan, Window: bloom.Window{Length: o.window, Mode: mode, MaxLag: lag},
		Now: func() time.Time { return now }})
	return e, err
}

// fillBefore fills the window before the measured one with as many other
// IDs (a stream of another seed), decided now as a late part of it: made
// and filled, not measured.
func (e *engineRun) fillBefore(ctx context.Context) error {
	before := e.at.Add(-e.o.window)
	if err := e.f.Preallocate(ctx, before); err != nil {
		return err
	}
	other := &stream{rng: rand.New(rand.NewPCG(e.o.seed+1000, 3)), dup: e.o.dup}
	for done := 0; done < e.o.n; done += e.o.batch {
		for i := range e.elems {
			id, _ := other.next()
			e.elems[i] = e.element(append([]byte("before-"), id...), before, done+i)
		}
		if err := e.grow(ctx, before); err != nil {
			return err
		}
		if _, err := e.f.TestAndSet(ctx, e.elems); err != nil {
			return err
		}
	}
	return nil
}

// measure tests and sets the IDs of s, a batch at a time, and counts
// what the filter said of each in tr.
func (e *engineRun) measure(ctx context.Context, s *stream, tr *truth) error {
	o := e.o
	for done := 0; done < o.n; {
		k := min(o.batch, o.n-done)
		for i := 0; i < k; i++ {
			id, j := s.next()
			e.elems[i] = e.element(id, e.at, done+i)
			e.idx[i] = j
		}
		if err := e.grow(ctx, e.at); err != nil {
			return err
		}
		vs, err := e.f.TestAndSet(ctx, e.elems[:k])
		if err != nil {
			return err
		}
		for i, v := range vs {
			if v != bloom.FirstSeen && v != bloom.Duplicate {
				// Late or future: not deduplicated, so neither a false
				// positive nor a duplicate passed; the run measures nothing.
				return fmt.Errorf("%s: element %d of batch %d decided %v: the run outlasted its window and the lag bound; raise -max-lag",
					e.mode, i, done/o.batch, v)
			}
			tr.add(e.idx[i], v == bloom.FirstSeen)
		}
		done += k
	}
	return nil
}

// element is id stamped t as the run's i-th message: on partition i
// modulo partitions, at that partition's next offset.
func (e *engineRun) element(id []byte, t time.Time, i int) bloom.Element {
	p := int32(i % partitions)
	el := bloom.Element{ID: id, Time: t, Source: bloom.Source{Topic: "clicks", Partition: p, Offset: e.offsets[p]}}
	e.offsets[p]++
	return el
}

// grow makes the next stage of t's window when the filter asks for one,
// as the worker's maintenance does.
func (e *engineRun) grow(ctx context.Context, t time.Time) error {
	select {
	case <-e.f.GrowthWanted():
		_, err := e.f.Grow(ctx, t)
		return err
	default:
		return nil
	}
}

// expectedFP is the false positives the plan expects of distinct new IDs.
func (e *engineRun) expectedFP(distinct uint64) float64 {
	fp := expectedFalsePositives(distinct, e.plan.FPRHolding)
	if e.o.steady && e.mode == bloom.Rolling {
		// Each new ID is tested against the full window before too.
		fp += float64(distinct) * e.plan.FPRHolding(float64(distinct))
	}
	return fp
}

// note describes the filter the run used: its layout and size against a
// classic filter's, and its growth.
func (e *engineRun) note(distinct uint64) string {
	plan := e.plan
	layout := fmt.Sprintf("layout %d words x %d bits", plan.Layout.Words, plan.Layout.BitsPerWord)
	if e.kind == bloom.KindFingerprint {
		st := plan.Stages[0]
		layout = fmt.Sprintf("fingerprints of %d bytes in %d part(s) of %d slots", st.Bytes, st.Parts, st.PartSlots)
	}
	note := fmt.Sprintf("%s, %d shard(s) of %d bits (%.1f bits per distinct), achieved p %.2e; a classic filter needs %.1f bits, k = %d",
		layout, plan.Shards, plan.ShardBits, float64(plan.Bits())/float64(distinct), plan.AchievedFPR,
		float64(plan.Standard.Bits)/float64(e.expected), plan.Standard.Hashes)
	if plan.Growth() {
		g := e.f.GrowthStats()
		note += fmt.Sprintf("; planned n %d, growth up to %gx in %d stages: %d made, %d calls refused for a stage, %d waits (longest %v)",
			plan.Elements, e.o.growth, len(plan.Stages), g.Made, g.Refused, g.Waits, g.Longest.Round(time.Millisecond/10))
	}
	return note
}

// expectedFalsePositives sums the false-positive rate seen by each of the d
// distinct insertions, fpr(i) being the rate after i insertions.
func expectedFalsePositives(d uint64, fpr func(i float64) float64) float64 {
	const steps = 2000
	var sum float64
	for s := 0; s < steps; s++ {
		i := (float64(s) + 0.5) / steps * float64(d)
		sum += fpr(i) * float64(d) / steps
	}
	return sum
}

package consumer

// The hand-off: replays another replica decided and may still be
// delivering wait for their delivered marks (Config.HandoffWait).

import (
	"context"
	"time"

	"go.uber.org/zap"

	"dedupe-worker/internal/bloom"
)

// noteAsked records, per partition, the highest offset of elems and
// probes this worker asked the filter about (asked), and returns what it
// held before.
func (w *Worker) noteAsked(elems []bloom.Element, probes []bloom.Source) map[int32]int64 {
	before := map[int32]int64{}
	note := func(src *bloom.Source) {
		if _, ok := before[src.Partition]; !ok {
			high, seen := w.asked[src.Partition]
			if !seen {
				high = -1
			}
			before[src.Partition] = high
		}
		if high, seen := w.asked[src.Partition]; !seen || src.Offset > high {
			w.asked[src.Partition] = src.Offset
		}
	}
	for i := range elems {
		note(&elems[i].Source)
	}
	for i := range probes {
		note(&probes[i])
	}
	return before
}

// awaitHandoff waits for the replays to write of a batch that another
// replica decided (above askedBefore): that replica may be delivering
// them still, having had the partition until the last rebalance. They are
// the elements ReplayedFirstSeen (ReplayedDuplicate too in shadow mode or
// with Config.Duplicates) and the probes ProbeDecided (dead letters). It
// asks the filter again about those alone, after pauses from
// handoffPause doubling to handoffPauseMax, until each is marked delivered
// (its answer in d becomes ReplayedDelivered or ProbeDelivered: it is
// skipped), HandoffWait has passed, or stopping ends (a shutdown begins);
// the rest are written again, as a crashed replica's are. Asking again is
// safe: each is below its record's watermark and gets its recorded
// decision.
func (w *Worker) awaitHandoff(ctx, stopping context.Context, elems []bloom.Element, probes []bloom.Source, d bloom.Decision, askedBefore map[int32]int64) error {
	dupsWritten := w.cfg.Shadow || w.cfg.Duplicates != nil
	var waitEl, waitPr []int
	for k, v := range d.Verdicts {
		if (v == bloom.ReplayedFirstSeen || v == bloom.ReplayedDuplicate && dupsWritten) && elems[k].Source.Offset > askedBefore[elems[k].Source.Partition] {
			waitEl = append(waitEl, k)
		}
	}
	for k, a := range d.Probes {
		if a == bloom.ProbeDecided && probes[k].Offset > askedBefore[probes[k].Partition] {
			waitPr = append(waitPr, k)
		}
	}
	if len(waitEl)+len(waitPr) == 0 {
		return nil
	}
	deadline := time.Now().Add(w.cfg.HandoffWait)
	pause := handoffPause
	var againEl []bloom.Element
	var againPr []bloom.Source
	for len(waitEl)+len(waitPr) > 0 {
		t := time.NewTimer(min(pause, max(time.Until(deadline), 0)))
		select {
		case <-t.C:
		case <-stopping.Done():
			t.Stop()
			return nil
		}
		if !time.Now().Before(deadline) {
			w.log.Info("replays another replica decided were not marked delivered in time: writing them again",
				zap.Int("replays", len(waitEl)+len(waitPr)), zap.Duration("waited", w.cfg.HandoffWait))
			return nil
		}
		pause = min(2*pause, handoffPauseMax)
		againEl, againPr = againEl[:0], againPr[:0]
		for _, k := range waitEl {
			againEl = append(againEl, elems[k])
		}
		for _, k := range waitPr {
			againPr = append(againPr, probes[k])
		}
		var again bloom.Decision
		err := w.retry(ctx, &w.deciding, StepDecide, "", func(ctx context.Context) error {
			var err error
			again, err = w.filter.Decide(ctx, againEl, againPr)
			return err
		})
		if err != nil {
			return err
		}
		waitEl = settled(waitEl, again.Verdicts, d.Verdicts, bloom.ReplayedDelivered)
		waitPr = settled(waitPr, again.Probes, d.Probes, bloom.ProbeDelivered)
	}
	return nil
}

// settled sets answers[k] to delivered for each k of wait whose answer
// asked again (again, in wait's order) is delivered, and returns the rest
// of wait, in place.
func settled[T comparable](wait []int, again, answers []T, delivered T) []int {
	left := wait[:0]
	for i, k := range wait {
		if again[i] == delivered {
			answers[k] = delivered
		} else {
			left = append(left, k)
		}
	}
	return left
}

// The pauses of awaitHandoff: a replica delivers a batch in milliseconds
// when Kafka answers.
const (
	handoffPause    = 5 * time.Millisecond
	handoffPauseMax = 200 * time.Millisecond
)

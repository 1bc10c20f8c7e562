package bloom

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Preallocate makes the window of the bucket of t, by the plan recorded
// for it (this replica's own, recorded now, if none was): every shard's
// stage 0,
// whole, in one SET NX with its expiry each (makeStage), unless it exists.
// Growing a string of hundreds of megabytes stalls Redis, and the script
// never makes a key: made ahead of the bucket's first event, the window
// costs no batch a wait, and a key made in one piece takes no more memory
// than its size class. Each shard is bounded by its make time-out (the
// call time-out plus 100 ms per MiB), as PreallocateLead budgets, and every
// shard is tried: the failures are returned joined.
func (f *Filter) Preallocate(ctx context.Context, t time.Time) error {
	b := f.cfg.Window.Bucket(t)
	wp, err := f.planOf(ctx, b, true)
	if err != nil {
		return err
	}
	var errs []error
	for s := range wp.plan.Shards {
		if _, err := f.makeStage(ctx, stageRef{bucket: b, shard: s}, byMaintenance); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			errs = append(errs, fmt.Errorf("preallocating shard %d of %s: %w", s, f.cfg.Window.Start(b).Format(time.RFC3339), err))
		}
	}
	return errors.Join(errs...)
}

// preallocatePasses is how many maintenance passes a bucket's keys are
// made ahead of its start: two passes may fail and the third still makes
// them in time.
const preallocatePasses = 3

// PreallocateLead is how long before a bucket starts the maintenance makes
// its keys (Preallocate): preallocatePasses of its slow passes (slowEvery
// apart, plus growEvery for the pass's other calls) plus the time making
// every shard of the bucket may take, one after the other (the call
// time-out plus 100 ms per MiB each, as for a stage), and at most the
// window's length. Made
// earlier, the next bucket's memory is held for nothing: a daily window
// made a day ahead holds two windows all day.
func PreallocateLead(p Plan, w Window, callTimeout time.Duration) time.Duration {
	lead := preallocatePasses*(slowEvery+growEvery) + time.Duration(p.Shards)*stageMakeTimeout(callTimeout, p.Stages[0])
	return min(lead, w.Length)
}

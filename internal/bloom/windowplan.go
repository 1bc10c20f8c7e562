package bloom

// A window keeps the plan it was made with: the first replica that makes
// a bucket's window (its maintenance, ahead of the bucket, or a batch
// that needs it) records its plan beside it, and every replica tests and
// fills that window by the plan recorded, whatever its own configuration
// or version says. A change of plan (the expected IDs, the rate, the
// kind, a new version's planner) so takes effect with the next window,
// with its neighbours still read by their own plans: nothing passes, and
// nothing has to be pinned.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// windowPlan is the plan of a window, and what follows from it: the tag
// its keys carry, the key prefix of each shard, and its entry in the
// script's argPlans.
type windowPlan struct {
	plan     Plan
	tag      string
	prefixes []string
	arg      []byte
}

func newWindowPlan(cfg Config, plan Plan) *windowPlan {
	tag := layoutTag(cfg, plan)
	return &windowPlan{plan: plan, tag: tag, prefixes: shardPrefixes(cfg, plan, tag), arg: planArg(plan)}
}

// windowPlans holds the plans of the windows this replica has looked up,
// by bucket; a window's plan never changes.
type windowPlans struct {
	mu       sync.Mutex
	byBucket map[int64]*windowPlan
	// known is every distinct plan met, by tag: windows of one plan share
	// its windowPlan.
	known map[string]*windowPlan
	// absent holds when a bucket was last found without a record (a
	// neighbour no one made): looked up again after planRecheck.
	absent map[int64]time.Time
}

// planRecheck is how long a bucket found without a plan record is taken
// to have none before it is looked up again: a window is made (and its
// record written) a preallocation lead before it is read as a neighbour,
// so a second of a replica's own plan is read only where no window was
// made.
const planRecheck = time.Second

// planRecord is what a window's plan record holds.
type planRecord struct {
	Plan Plan `json:"plan"`
}

// PlanKey is the key of the record of bucket b's plan. It carries the
// window's length, since buckets of another length are other buckets.
func (f *Filter) planKey(b int64) string {
	return fmt.Sprintf("%s:{%s:plans}:%d:%d", f.cfg.KeyPrefix, f.cfg.Pipeline, f.cfg.Window.seconds(), b)
}

// planOf returns the plan of bucket b's window: the one recorded, or,
// when none is and make is set, this replica's own, recorded first (SET
// NX; another replica's, made at the same time, may win). A window whose
// keys have expired, or one not to be made (make unset: an event that is
// not tested), without a record, gets this replica's own plan and no
// record. A window with a record made before plans were recorded (keys of
// this replica's own plan, no record) gets its own plan recorded.
func (f *Filter) planOf(ctx context.Context, b int64, make bool) (*windowPlan, error) {
	f.windows.mu.Lock()
	wp, ok := f.windows.byBucket[b]
	checked, wasAbsent := f.windows.absent[b]
	f.windows.mu.Unlock()
	if ok {
		return wp, nil
	}
	exp := time.Unix(f.cfg.Window.ExpireAt(b), 0)
	if !exp.After(f.cfg.Now()) || (!make && wasAbsent && time.Since(checked) < planRecheck) {
		return f.own, nil
	}
	key := f.planKey(b)
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	raw, err := f.client.Get(cctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		if !make {
			f.windows.mu.Lock()
			f.windows.absent[b] = time.Now()
			f.windows.mu.Unlock()
			return f.own, nil
		}
		own, _ := json.Marshal(planRecord{Plan: f.own.plan})
		if err := f.client.SetArgs(cctx, key, own, redis.SetArgs{Mode: "NX", ExpireAt: exp}).Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("%w: recording the plan of %s: %w", ErrRedis, f.cfg.Window.Start(b).Format(time.RFC3339), err)
		}
		raw, err = f.client.Get(cctx, key).Bytes()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading the plan of %s: %w", ErrRedis, f.cfg.Window.Start(b).Format(time.RFC3339), err)
	}
	var rec planRecord
	if err := json.Unmarshal(raw, &rec); err != nil || !rec.Plan.valid() {
		return nil, fmt.Errorf("%w: the plan recorded for the window of %s (%s) is not one this version can use; a newer version made it, or the key was overwritten",
			ErrRedis, f.cfg.Window.Start(b).Format(time.RFC3339), key)
	}
	wp = f.known(rec.Plan)
	f.windows.mu.Lock()
	f.windows.byBucket[b] = wp
	// Windows long expired are forgotten.
	delete(f.windows.absent, b)
	for old := range f.windows.byBucket {
		if !time.Unix(f.cfg.Window.ExpireAt(old), 0).After(f.cfg.Now()) {
			delete(f.windows.byBucket, old)
		}
	}
	for old, at := range f.windows.absent {
		if time.Since(at) >= planRecheck {
			delete(f.windows.absent, old)
		}
	}
	f.windows.mu.Unlock()
	return wp, nil
}

// known returns the windowPlan of plan, the same for every window of it.
func (f *Filter) known(plan Plan) *windowPlan {
	wp := newWindowPlan(f.cfg, plan)
	f.windows.mu.Lock()
	defer f.windows.mu.Unlock()
	if k, ok := f.windows.known[wp.tag]; ok {
		return k
	}
	f.windows.known[wp.tag] = wp
	return wp
}

package bloom

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ErrGrowthMemory says a window cannot grow to its cap within Redis's
// maxmemory. The worker still runs: a batch that needs a stage that
// cannot be made waits for it and fails (ErrRedis, or ErrGrowthWait), so
// the worker retries it, not ready, until memory is freed.
var ErrGrowthMemory = errors.New("growth exceeds Redis maxmemory")

// CheckCapacity compares the memory the filter needs in steady state with
// the maxmemory of every master and fails when it does not fit. Servers
// that refuse INFO are skipped.
func (f *Filter) CheckCapacity(ctx context.Context) error {
	need := f.own.plan.Memory * uint64(f.LiveWindows())
	check := func(ctx context.Context, c *redis.Client) error {
		maxmem, _ := strconv.ParseUint(f.serverInfo(ctx, c, "memory")["maxmemory"], 10, 64)
		// On a Cluster each master holds its share of the shards.
		share := need
		if f.cluster {
			share = need / uint64(min(f.own.plan.Shards, 3)) // at best spread over three masters
		}
		if maxmem > 0 && share > maxmem {
			return fmt.Errorf("%w: the filter needs %d bytes (%d windows of %d) and Redis at %s has maxmemory %d; lower the expected elements per window, raise the false-positive rate or shorten the lag bound",
				ErrInvalidPlan, share, f.LiveWindows(), f.own.plan.Memory, c.Options().Addr, maxmem)
		}
		// One window grown through every stage, beside the others at
		// their planned size.
		if grown := f.own.plan.Capacity(); f.own.plan.Growth() && maxmem > 0 {
			all, _ := f.own.plan.GrownMemory(float64(grown) / float64(f.own.plan.Elements))
			extra := all - f.own.plan.Memory
			if f.cluster {
				extra /= uint64(min(f.own.plan.Shards, 3))
			}
			if share+extra > maxmem {
				return fmt.Errorf("%w: a window grown to its cap (%d IDs) needs %d bytes more and Redis at %s has maxmemory %d with %d planned: growth will stop short of the cap, when Redis refuses writes",
					ErrGrowthMemory, grown, extra, c.Options().Addr, maxmem, share)
			}
		}
		return nil
	}
	return f.forEachServer(ctx, check)
}

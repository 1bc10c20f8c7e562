package bloom

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors callers test with errors.Is.
var (
	// ErrInvalidConfig wraps every configuration error of New.
	ErrInvalidConfig = errors.New("invalid filter configuration")
	// ErrInvalidElement wraps errors about the elements passed in; nothing
	// was sent to Redis.
	ErrInvalidElement = errors.New("invalid element")
	// ErrRedis wraps failures of a Redis call. The batch may or may not have
	// been applied; calling again with the same elements is safe and returns
	// the decisions of the first application.
	ErrRedis = errors.New("redis call failed")
)

// Filter is a set of windowed Bloom filters in Redis, shared by every
// replica configured alike. It is safe for concurrent use.
type Filter struct {
	cfg     Config
	client  redis.UniversalClient
	cluster bool
	// own is this replica's plan (Config.Plan), which the windows it
	// makes are made with; windows are tested by the plan recorded with
	// them (windowplan.go), looked up once each.
	own     *windowPlan
	windows windowPlans
	// scriptCached[s] is set once the master serving shard s (of any
	// plan) has run the
	// script with MinReplicas (see runReplicated).
	scriptCached []atomic.Bool
	// growWanted is signalled when a call asked for stages ahead of need,
	// which it adds to pending (see GrowthWanted).
	growWanted chan struct{}
	pendingStages
	// stats count the stages made, the refused calls and the waits for
	// stages; obs is where they are also reported once Maintain runs.
	stats growthStats
	obs   atomic.Pointer[reporter]
	// evicting is set while the maintenance finds a master whose eviction
	// policy is not noeviction (see Healthy).
	evicting atomic.Bool
	// lost is what this replica saw of its windows, to notice their loss
	// (lost.go).
	lost lostWatch
	// waiting holds the start of each wait for a stage under way (see
	// Healthy).
	waiting waits
}

// New returns a Filter over client, a *redis.Client for one server or a
// *redis.ClusterClient for a Cluster; any other client is refused, since
// the filter must know which it is to place shards, to reach every master
// and to send WAIT on the script's connection. Give the client
// ContextTimeoutEnabled so deadlines reach the socket.
func New(client redis.UniversalClient, cfg Config) (*Filter, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	_, cluster := client.(*redis.ClusterClient)
	if _, single := client.(*redis.Client); !cluster && !single {
		return nil, fmt.Errorf("%w: want a *redis.Client or a *redis.ClusterClient, got %T", ErrInvalidConfig, client)
	}
	f := &Filter{
		cfg:     cfg,
		client:  client,
		cluster: cluster,
	}
	f.windows.byBucket, f.windows.known, f.windows.absent = map[int64]*windowPlan{}, map[string]*windowPlan{}, map[int64]time.Time{}
	f.own = f.known(cfg.Plan)
	f.scriptCached = make([]atomic.Bool, MaxShards)
	f.growWanted = make(chan struct{}, 1)
	f.pending = map[stageRef]struct{}{}
	f.obs.Store(&reporter{g: cfg.Gauges, log: cfg.Logger})
	cfg.Gauges.maxLag.Set(cfg.Window.MaxLag.Seconds())
	return f, nil
}

// Plan returns the filter's sizing: the plan of the windows this replica
// makes (a window made by another is tested by the plan made with it).
func (f *Filter) Plan() Plan { return f.own.plan }

// Now is the present by the filter's clock (Config.Now): what preallocation
// and stats are computed for.
func (f *Filter) Now() time.Time { return f.cfg.Now() }

// LiveWindows is how many buckets of keys exist at once at most
// (Window.Live with PreallocateLead, or Config.MaxFutureSkew when longer:
// a future event's window is made when it is first tested).
func (f *Filter) LiveWindows() int {
	return f.cfg.Window.Live(max(f.PreallocateLead(), f.cfg.MaxFutureSkew))
}

// MaxFutureSkew is how far ahead of the clock an event's bucket may start
// and the event still be tested (Config.MaxFutureSkew).
func (f *Filter) MaxFutureSkew() time.Duration { return f.cfg.MaxFutureSkew }

// PreallocateLead is how long before a bucket starts the maintenance makes
// its keys (the package function PreallocateLead for this filter).
func (f *Filter) PreallocateLead() time.Duration {
	return PreallocateLead(f.own.plan, f.cfg.Window, f.cfg.CallTimeout)
}

// Window returns how the filter maps event times to buckets.
func (f *Filter) Window() Window { return f.cfg.Window }

func (f *Filter) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.cfg.CallTimeout)
}

// Tag returns the layout tag that every key of the windows this replica
// makes carries.
func (f *Filter) Tag() string { return f.own.tag }

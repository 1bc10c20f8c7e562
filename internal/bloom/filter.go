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
	plan    Plan
	client  redis.UniversalClient
	cluster bool
	// tag names the layout in every key (layoutTag).
	tag string
	// prefixes start the keys of each shard (shardPrefixes), built once
	// here, not per batch.
	prefixes []string
	// scriptCached[s] is set once the master serving shard s has run the
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
	// plansArg is the script's argPlans (plansArg).
	plansArg []byte
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
		plan:    cfg.Plan,
		client:  client,
		cluster: cluster,
		tag:     layoutTag(cfg),
	}
	f.scriptCached = make([]atomic.Bool, cfg.Plan.Shards)
	f.growWanted = make(chan struct{}, 1)
	f.pending = map[stageRef]struct{}{}
	f.plansArg = plansArg(cfg.Plan)
	f.prefixes = shardPrefixes(cfg, f.tag)
	return f, nil
}

// Plan returns the filter's sizing.
func (f *Filter) Plan() Plan { return f.plan }

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
	return PreallocateLead(f.plan, f.cfg.Window, f.cfg.CallTimeout)
}

// Window returns how the filter maps event times to buckets.
func (f *Filter) Window() Window { return f.cfg.Window }

func (f *Filter) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.cfg.CallTimeout)
}

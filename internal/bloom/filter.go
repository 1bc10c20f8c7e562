package bloom

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync/atomic"
	"time"

	"dedupe-worker/config"

	"github.com/redis/go-redis/v9"
	"github.com/tinylib/msgp/msgp"
)

//go:embed testandset.lua
var testAndSetLua string

var testAndSetScript = redis.NewScript(testAndSetLua)

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

// Source is where an element was read: a Kafka topic, partition and offset.
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
}

func (s Source) String() string { return fmt.Sprintf("%s/%d/%d", s.Topic, s.Partition, s.Offset) }

// MaxOffset is the largest source offset accepted: Lua numbers are exact to
// 2^53, and offsets are kept with room to spare.
const MaxOffset = 1<<52 - 1

// Element is one event to deduplicate.
type Element struct {
	// ID identifies the event; copies of an event share it. Any bytes, not
	// empty.
	ID []byte
	// Time is the event time; it chooses the window bucket.
	Time time.Time
	// Source is unique per event read; replays of it get the same verdict.
	Source Source
}

// Verdict is the decision on one element.
type Verdict uint8

const (
	// FirstSeen: not seen before in the window; forward it.
	FirstSeen Verdict = iota + 1
	// Duplicate: seen before in the window; drop it.
	Duplicate
	// ReplayedFirstSeen: this source offset was decided FirstSeen before;
	// forward it again.
	ReplayedFirstSeen
	// ReplayedDuplicate: this source offset was decided Duplicate before.
	ReplayedDuplicate
	// ReplayUnknown: this source offset was decided before, further back
	// than the decision record reaches; forwarded, as losing it would be
	// worse than passing a copy.
	ReplayUnknown
	// Late: the event is processed at or after its Windows.Deadline, its
	// bucket's end plus MaxLag, by the caller's clock or the Redis
	// server's: its keys may be gone, so it is not deduplicated (no key is
	// written). A replay is judged by the clock at the replay: an offset
	// recorded forward (first seen, late or future) whose event is late
	// now is Late again, so a caller's policy for late events holds on
	// replays; the record keeps one bit per offset, forward or drop, so a
	// first-seen event replayed after its deadline is Late too.
	Late
	// Future: the event's bucket is after the bucket of the clock plus
	// Config.MaxFutureSkew; not deduplicated, no key written. A replay of
	// it is Future while it still is, and ReplayedFirstSeen after.
	Future
)

var verdictNames = [...]string{"invalid", "first_seen", "duplicate", "replayed_first_seen", "replayed_duplicate", "replay_unknown", "late", "future"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return verdictNames[0]
}

// Forward reports whether the element is to be passed on.
func (v Verdict) Forward() bool { return v != Duplicate && v != ReplayedDuplicate }

// Config configures a Filter.
type Config struct {
	// Pipeline namespaces the keys: letters, digits, '.', '_' and '-'.
	Pipeline string
	// KeyPrefix starts every key. Default: "dedupe".
	KeyPrefix string
	// Plan is the filter sizing, from NewPlan.
	Plan Plan
	// Windows chooses buckets from event times.
	Windows Windows
	// MaxFutureSkew: events further ahead of the clock are not filtered
	// (verdict Future). Default: one window length.
	MaxFutureSkew time.Duration
	// ReplayHorizon is how many offsets back per partition the decision
	// record reaches. It must exceed the offsets a consumer can have decided
	// but not committed. Changing it starts new filters. Default: 65536.
	ReplayHorizon int64
	// CallTimeout bounds each Redis call. Default: the pipeline's,
	// config.Defaults().RedisTimeout.
	CallTimeout time.Duration
	// MinReplicas: when above zero, a test-and-set call fails with
	// ErrTooFewReplicas (inside ErrRedis: retry it) unless its writes
	// reached this many replicas within half the time left of the call;
	// see "Replicas and failover" in the package doc for why, how and what
	// it costs. The client must be a *redis.Client or a
	// *redis.ClusterClient. Default: 0 (no WAIT).
	MinReplicas int
	// GrowthWait bounds how long a test-and-set waits for a stage its
	// batch needs and that is not made yet (see Growth in the package
	// doc); then it fails with ErrGrowthWait, having decided nothing. A
	// make it started itself just before the bound may run past it, by at
	// most that stage's make time-out (CallTimeout plus 100 ms per MiB).
	// Default: CallTimeout plus 100 ms per MiB of the largest stage's
	// shard, what making one may take.
	GrowthWait time.Duration
	// Now is the clock: every decision that depends on the present (Late,
	// Future, the records' expiry) reads it, and so does the maintenance
	// through Filter.Now. Tests inject one close to the real clock: Redis
	// applies expiries with its own. Default: time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if len(c.Plan.Stages) == 0 {
		c.Plan.Stages = []Stage{{Capacity: c.Plan.Elements, CapacityPerShard: perShardCount(c.Plan.Elements, max(c.Plan.Shards, 1)),
			FPR: c.Plan.AchievedFPR, ShardBits: c.Plan.ShardBits, Memory: c.Plan.Memory}}
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = "dedupe"
	}
	if c.MaxFutureSkew == 0 {
		c.MaxFutureSkew = c.Windows.Length
	}
	if c.ReplayHorizon == 0 {
		c.ReplayHorizon = 1 << 16
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = config.Defaults().RedisTimeout
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.GrowthWait == 0 {
		var largest uint64
		for _, st := range c.Plan.Stages {
			largest = max(largest, st.ShardBits/8)
		}
		c.GrowthWait = makeTimeout(c.CallTimeout, largest)
	}
}

func (c *Config) validate() error {
	if !config.NamePattern.MatchString(c.Pipeline) {
		return fmt.Errorf("pipeline name %q: want 1 to 100 letters, digits, '.', '_' or '-'", c.Pipeline)
	}
	if !config.NamePattern.MatchString(c.KeyPrefix) {
		return fmt.Errorf("key prefix %q: want 1 to 100 letters, digits, '.', '_' or '-'", c.KeyPrefix)
	}
	if c.Plan.Shards < 1 || c.Plan.ShardBits < WordBits || c.Plan.ShardBits%WordBits != 0 || c.Plan.ShardBits > MaxKeyBits ||
		c.Plan.Layout.Words < 1 || c.Plan.Layout.Words > MaxWords || c.Plan.Layout.BitsPerWord < 1 || c.Plan.Layout.BitsPerWord > WordBits {
		return fmt.Errorf("plan %+v is not one NewPlan makes", c.Plan)
	}
	if err := c.Windows.validate(); err != nil {
		return err
	}
	if c.MaxFutureSkew < 0 {
		return fmt.Errorf("max future skew is %v, want 0 or more", c.MaxFutureSkew)
	}
	if c.ReplayHorizon < 1024 || c.ReplayHorizon > 1<<30 || c.ReplayHorizon%64 != 0 {
		return fmt.Errorf("replay horizon is %d, want a multiple of 64 from 1024 to 2^30", c.ReplayHorizon)
	}
	if c.CallTimeout < time.Millisecond {
		return fmt.Errorf("call timeout is %v, want at least 1ms", c.CallTimeout)
	}
	if c.MinReplicas < 0 {
		return fmt.Errorf("min replicas is %d, want 0 or more", c.MinReplicas)
	}
	if c.GrowthWait < time.Millisecond {
		return fmt.Errorf("growth wait is %v, want at least 1ms", c.GrowthWait)
	}
	return nil
}

// Filter is a set of windowed Bloom filters in Redis, shared by every
// replica configured alike. It is safe for concurrent use.
type Filter struct {
	cfg     Config
	plan    Plan
	client  redis.UniversalClient
	cluster bool
	// tag names the layout in every key: a change of anything that moves
	// bits or decisions gives new keys instead of corrupting live ones.
	tag string
	// slots are the key prefixes of the shards, each with its hash tag:
	// every key starts with one, and they are built once here, not per
	// batch.
	slots []string
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
	// stageTab is the script's stage table: the stage count, each stage's
	// capacity per shard, the words per key and the lead (ms) of stages 1
	// and up.
	stageTab []byte
	// evicting is set while the maintenance finds a master whose eviction
	// policy is not noeviction (see Healthy).
	evicting atomic.Bool
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
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d/%d/%d/%d/%d", cfg.Plan.Layout.Words, cfg.Plan.Layout.BitsPerWord,
		cfg.Plan.ShardBits, cfg.Plan.Shards, cfg.Windows.seconds(), cfg.ReplayHorizon)
	// The stages' sizes and capacities place and count elements too; a
	// plan without growth keeps the tag it had before stages existed.
	for _, st := range cfg.Plan.Stages[1:] {
		fmt.Fprintf(h, "/%d:%d", st.ShardBits, st.CapacityPerShard)
	}
	f := &Filter{
		cfg:     cfg,
		plan:    cfg.Plan,
		client:  client,
		cluster: cluster,
		tag:     fmt.Sprintf("v1-%08x", h.Sum32()),
	}
	f.scriptCached = make([]atomic.Bool, cfg.Plan.Shards)
	f.growWanted = make(chan struct{}, 1)
	f.pending = map[stageRef]struct{}{}
	f.stageTab = msgp.AppendArrayHeader(nil, uint32(3*len(cfg.Plan.Stages)-1))
	f.stageTab = msgp.AppendInt(f.stageTab, len(cfg.Plan.Stages))
	for _, st := range cfg.Plan.Stages {
		f.stageTab = msgp.AppendInt64(f.stageTab, st.CapacityPerShard)
	}
	for _, st := range cfg.Plan.Stages[1:] {
		f.stageTab = msgp.AppendUint64(f.stageTab, st.ShardBits/WordBits)
	}
	for _, st := range cfg.Plan.Stages[1:] {
		f.stageTab = msgp.AppendInt64(f.stageTab, StageLead(st).Milliseconds())
	}
	f.slots = make([]string, cfg.Plan.Shards)
	for s := range f.slots {
		f.slots[s] = fmt.Sprintf("%s:{%s:%d}:%s", cfg.KeyPrefix, cfg.Pipeline, s, f.tag)
	}
	return f, nil
}

// Plan returns the filter's sizing.
func (f *Filter) Plan() Plan { return f.plan }

// Now is the present by the filter's clock (Config.Now): what preallocation
// and stats are computed for.
func (f *Filter) Now() time.Time { return f.cfg.Now() }

// Tag returns the layout tag that every key of this filter carries.
func (f *Filter) Tag() string { return f.tag }

// FilterKey is the key of one shard of bucket b.
func (f *Filter) FilterKey(shard int, b int64) string {
	return f.slots[shard] + ":f:" + strconv.FormatInt(b, 10)
}

// StageKey is the key of stage st of one shard of bucket b: FilterKey for
// stage 0.
func (f *Filter) StageKey(shard int, b int64, st int) string {
	if st == 0 {
		return f.FilterKey(shard, b)
	}
	return f.FilterKey(shard, b) + ":" + strconv.Itoa(st)
}

// GrowthKey is the key of one shard's growth record of bucket b: the
// stage inserts go to and the elements it holds (see the script).
func (f *Filter) GrowthKey(shard int, b int64) string { return f.FilterKey(shard, b) + ":g" }

// RecordKey is the key of the decision record of one shard and partition.
func (f *Filter) RecordKey(shard int, topic string, partition int32) string {
	return f.slots[shard] + ":r:" + topic + ":" + strconv.FormatInt(int64(partition), 10)
}

func (f *Filter) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.cfg.CallTimeout)
}

// Preallocate creates the keys of the bucket of t at full size with their
// TTL, unless they exist. Growing a string of hundreds of megabytes stalls
// Redis; doing it ahead of the bucket's first event keeps the stall off the
// hot path, and a key made in one piece takes no more memory than its size
// class. Each shard's key is sent as a zero-filled value.
func (f *Filter) Preallocate(ctx context.Context, t time.Time) error {
	b := f.cfg.Windows.Bucket(t)
	exp := time.Unix(f.cfg.Windows.ExpireAt(b), 0)
	if !exp.After(f.cfg.Now()) {
		return nil
	}
	var zeros []byte
	for s := 0; s < f.plan.Shards; s++ {
		key := f.FilterKey(s, b)
		cctx, cancel := f.callCtx(ctx)
		n, err := f.client.Exists(cctx, key).Result()
		cancel()
		if err != nil {
			return fmt.Errorf("%w: checking %s: %w", ErrRedis, key, err)
		}
		if n == 1 {
			continue
		}
		if zeros == nil {
			zeros = make([]byte, f.plan.ShardBits/8)
		}
		cctx, cancel = f.callCtx(ctx)
		err = f.client.SetArgs(cctx, key, zeros, redis.SetArgs{Mode: "NX", ExpireAt: exp}).Err()
		cancel()
		if err != nil && err != redis.Nil {
			return fmt.Errorf("%w: preallocating %s: %w", ErrRedis, key, err)
		}
	}
	return nil
}

// ErrGrowthMemory says a window cannot grow to its cap within Redis's
// maxmemory. The worker still runs: a batch that needs a stage that
// cannot be made waits for it and fails (ErrRedis, or ErrGrowthWait), so
// the worker retries it, not ready, until memory is freed.
var ErrGrowthMemory = errors.New("growth exceeds Redis maxmemory")

// LiveWindows is how many buckets of keys exist at once (Windows.Live).
func (f *Filter) LiveWindows() int { return f.cfg.Windows.Live() }

// CheckCapacity compares the memory the filter needs in steady state with
// the maxmemory of every master and fails when it does not fit. Servers
// that refuse INFO are skipped.
func (f *Filter) CheckCapacity(ctx context.Context) error {
	need := f.plan.Memory * uint64(f.LiveWindows())
	check := func(ctx context.Context, c *redis.Client) error {
		maxmem, _ := strconv.ParseUint(f.serverInfo(ctx, c, "memory")["maxmemory"], 10, 64)
		// On a Cluster each master holds its share of the shards.
		share := need
		if f.cluster {
			share = need / uint64(min(f.plan.Shards, 3)) // at best spread over three masters
		}
		if maxmem > 0 && share > maxmem {
			return fmt.Errorf("%w: the filter needs %d bytes (%d windows of %d) and Redis at %s has maxmemory %d; lower the expected elements per window, raise the false-positive rate or shorten the lag bound",
				ErrInvalidPlan, share, f.LiveWindows(), f.plan.Memory, c.Options().Addr, maxmem)
		}
		// One window grown through every stage, beside the others at
		// their planned size.
		if grown := f.plan.Capacity(); f.plan.Growth() && maxmem > 0 {
			all, _ := f.plan.GrownMemory(float64(grown) / float64(f.plan.Elements))
			extra := all - f.plan.Memory
			if f.cluster {
				extra /= uint64(min(f.plan.Shards, 3))
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

// Windows returns how the filter maps event times to buckets.
func (f *Filter) Windows() Windows { return f.cfg.Windows }

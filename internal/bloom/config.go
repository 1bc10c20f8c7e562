package bloom

import (
	"fmt"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Defaults of Config, each applied when its field is zero.
const (
	// DefaultKeyPrefix starts every key (Config.KeyPrefix).
	DefaultKeyPrefix = "dedupe"
	// DefaultReplayHorizon is how many offsets back per partition the
	// decision records reach (Config.ReplayHorizon).
	DefaultReplayHorizon = 1 << 16
	// DefaultCallTimeout bounds each Redis call (Config.CallTimeout).
	DefaultCallTimeout = 5 * time.Second
	// DefaultMaxClockSkew is how far apart the replicas' and the Redis
	// servers' clocks may be (Config.MaxClockSkew): NTP keeps hosts within
	// milliseconds; this leaves room for a host that lost its time source
	// for a while.
	DefaultMaxClockSkew = 5 * time.Second
)

// NamePattern is what a pipeline name and a key prefix may be: 1 to 100
// letters, digits, '.', '_' or '-'. Both become part of every key, and the
// pipeline name of metric labels.
var NamePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// Config configures a Filter.
type Config struct {
	// Pipeline namespaces the keys, as NamePattern allows. Required.
	Pipeline string
	// KeyPrefix starts every key, as NamePattern allows. Default:
	// DefaultKeyPrefix.
	KeyPrefix string
	// Plan is the filter sizing, from NewPlan.
	Plan Plan
	// Window chooses buckets from event times.
	Window Window
	// MaxFutureSkew: an event whose bucket starts after the clock plus
	// MaxFutureSkew is not filtered (verdict Future), nor does it make a
	// window. Default: the preallocation lead (PreallocateLead), so that
	// the only future window an event can be tested in is the next one,
	// which the maintenance makes in that lead anyway: memory stays as
	// planned whatever the clocks of the event sources. A longer skew
	// makes windows earlier, off the script like a stage (see Growth), and
	// keeps them alive longer; LiveWindows and CheckCapacity count them.
	MaxFutureSkew time.Duration
	// MaxClockSkew is how far apart the clocks of the replicas and of the
	// Redis servers may be with every guarantee kept (see "Clocks" in the
	// package doc). In Rolling mode it widens the time before a bucket's
	// end in which its elements are also tested against the next bucket,
	// which a replica whose clock is ahead may already have written.
	// At most the window's length. Default: DefaultMaxClockSkew, or the
	// window's length if shorter.
	MaxClockSkew time.Duration
	// ReplayHorizon is how many offsets back per partition the decision
	// record reaches. It must exceed the offsets a consumer can have decided
	// but not committed. Changing it starts new filters. A multiple of 64
	// from 1024 to 2^30. Default: DefaultReplayHorizon.
	ReplayHorizon int64
	// CallTimeout bounds each Redis call, from MinCallTimeout to
	// MaxCallTimeout. Default: DefaultCallTimeout.
	CallTimeout time.Duration
	// MinReplicas: when above zero, a test-and-set call fails with
	// ErrTooFewReplicas (inside ErrRedis: retry it) unless its writes
	// reached this many replicas within half the time left of the call;
	// see "Replicas and failover" in the package doc for why, how and what
	// it costs. The client must be a *redis.Client or a
	// *redis.ClusterClient. Up to MaxMinReplicas. Default: 0 (no WAIT).
	MinReplicas int
	// GrowthWait bounds how long a test-and-set waits for a stage its
	// batch needs and that is not made yet (see Growth in the package
	// doc); then it fails with ErrGrowthWait, having decided nothing. A
	// make it started itself just before the bound may run past it, by at
	// most that stage's make time-out (CallTimeout plus 100 ms per MiB,
	// for each of its keys on the shard in turn). Default: the make
	// time-out of the largest stage on a shard, what making one may take.
	GrowthWait time.Duration
	// Gauges receive the filter's figures (made with NewGauges), and Logger
	// its messages: the stages and windows a batch makes, the waits for
	// them, lost keys, and everything Maintain does. Default: figures kept
	// in gauges registered nowhere, messages dropped.
	Gauges *Gauges
	Logger *zap.Logger
	// Now is the clock: every decision that depends on the present (Late,
	// Future, the records' expiry) reads it, and so does the maintenance
	// through Filter.Now. Tests inject one close to the real clock: Redis
	// applies expiries with its own. Default: time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if len(c.Plan.Stages) == 0 {
		c.Plan.Stages = []Stage{{Capacity: c.Plan.Elements, CapacityPerShard: perShardCount(c.Plan.Elements, max(c.Plan.Shards, 1)),
			FPR: c.Plan.AchievedFPR, ShardBits: c.Plan.ShardBits, Parts: 1, PartBits: c.Plan.ShardBits, Memory: c.Plan.Memory}}
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.ReplayHorizon == 0 {
		c.ReplayHorizon = DefaultReplayHorizon
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.MaxFutureSkew == 0 {
		c.MaxFutureSkew = PreallocateLead(c.Plan, c.Window, c.CallTimeout)
	}
	if c.MaxClockSkew == 0 {
		c.MaxClockSkew = min(DefaultMaxClockSkew, c.Window.Length)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Gauges == nil {
		c.Gauges = NewGauges(prometheus.NewRegistry(), c.Pipeline)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.GrowthWait == 0 {
		for _, st := range c.Plan.Stages {
			c.GrowthWait = max(c.GrowthWait, stageMakeTimeout(c.CallTimeout, st))
		}
	}
}

func (c *Config) validate() error {
	if !NamePattern.MatchString(c.Pipeline) {
		return fmt.Errorf("pipeline name %q: want 1 to 100 letters, digits, '.', '_' or '-'", c.Pipeline)
	}
	if !NamePattern.MatchString(c.KeyPrefix) {
		return fmt.Errorf("key prefix %q: want 1 to 100 letters, digits, '.', '_' or '-'", c.KeyPrefix)
	}
	if !c.Plan.valid() {
		return fmt.Errorf("plan %+v is not one NewPlan makes", c.Plan)
	}
	if err := c.Window.validate(); err != nil {
		return err
	}
	if c.MaxFutureSkew < 0 {
		return fmt.Errorf("max future skew is %v, want 0 or more", c.MaxFutureSkew)
	}
	if c.MaxClockSkew < 0 || c.MaxClockSkew > c.Window.Length {
		return fmt.Errorf("max clock skew is %v, want 0 to the window's length %v", c.MaxClockSkew, c.Window.Length)
	}
	if c.ReplayHorizon < 1024 || c.ReplayHorizon > 1<<30 || c.ReplayHorizon%64 != 0 {
		return fmt.Errorf("replay horizon is %d, want a multiple of 64 from 1024 to 2^30", c.ReplayHorizon)
	}
	if err := CheckCallTimeout(c.CallTimeout); err != nil {
		return err
	}
	if err := CheckMinReplicas(c.MinReplicas); err != nil {
		return err
	}
	if c.GrowthWait < time.Millisecond {
		return fmt.Errorf("growth wait is %v, want at least 1ms", c.GrowthWait)
	}
	return nil
}

package bloom

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrEvictionPolicy is returned by CheckServer for a server whose
// maxmemory-policy is not noeviction; callers test it with errors.Is.
var ErrEvictionPolicy = errors.New("redis eviction policy is not noeviction")

// errServerTooOld is returned by CheckServer for a server older than
// Redis 7.0. Nothing can be done about it but a newer server, so no caller
// tells it apart.
var errServerTooOld = errors.New("redis server too old")

// SafePolicy is the only maxmemory-policy the filter accepts. Every key
// it writes (filters, decision records, growth records) has a TTL, so any
// policy that evicts, volatile-* and allkeys-* alike, and whatever policy
// newer servers add, evicts exactly its keys first.
const SafePolicy = "noeviction"

// CheckServer refuses a server (every master of a Cluster) older than
// Redis 7.0, or with a maxmemory-policy other than noeviction:
//   - the script sets expiries with EXPIREAT NX and GT, which older servers
//     refuse, and every batch would fail;
//   - under a policy that evicts, Redis evicts the filter's keys first:
//     an evicted filter lets duplicates pass, and a replayed first-seen
//     event whose decision record was evicted can meet its own filter bits
//     and be dropped (ErrEvictionPolicy).
//
// Each error is one line naming the server and what to change. Valkey
// reports the Redis version it is compatible with. INFO is read, not
// CONFIG, which managed services often disable. A server that refuses
// INFO, or does not report a field, is let be for that field, and so is
// every server once ctx is cancelled.
func (f *Filter) CheckServer(ctx context.Context) error {
	check := func(ctx context.Context, c *redis.Client) error {
		if v := f.serverInfo(ctx, c, "server")["redis_version"]; tooOld(v) {
			return fmt.Errorf("%w: Redis at %s is %s; the filter needs Redis 7.0 or later (EXPIREAT NX and GT)", errServerTooOld, c.Options().Addr, v)
		}
		if p := f.serverInfo(ctx, c, "memory")["maxmemory_policy"]; p != "" && p != SafePolicy {
			return policyError(c.Options().Addr, p)
		}
		return nil
	}
	return f.forEachServer(ctx, check)
}

// policyError is ErrEvictionPolicy for the server at addr with policy p,
// in one line that says what to change and why.
func policyError(addr, p string) error {
	return fmt.Errorf("%w: Redis at %s has maxmemory-policy %s; set maxmemory-policy %s: every key the worker writes has a TTL, "+
		"so Redis evicts its filters and decision records first: duplicates pass and replayed events can be lost", ErrEvictionPolicy, addr, p, SafePolicy)
}

// forEachServer calls check for the server, or for every master of a
// Cluster, concurrently.
func (f *Filter) forEachServer(ctx context.Context, check func(context.Context, *redis.Client) error) error {
	switch c := f.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, check)
	default: // New accepts nothing else
		return check(ctx, f.client.(*redis.Client))
	}
}

// tooOld reports whether Redis version v (major.minor.patch) is below 7.0.
func tooOld(v string) bool {
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n < 7
}

// serverInfo is one section of c's INFO reply, field by field; empty when
// the server refuses INFO, which the checks then let be.
func (f *Filter) serverInfo(ctx context.Context, c *redis.Client, section string) map[string]string {
	fields, _ := f.info(ctx, c, section)
	return fields
}

// info is one section of c's INFO reply, field by field, or the error of
// the call, which is bounded by the call timeout.
func (f *Filter) info(ctx context.Context, c *redis.Client, section string) (map[string]string, error) {
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	info, err := c.InfoMap(cctx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("%w: INFO %s of %s: %w", ErrRedis, section, c.Options().Addr, err)
	}
	for _, fields := range info { // the one section asked for
		return fields, nil
	}
	return map[string]string{}, nil
}

// Eviction is what one master's INFO says about eviction.
type Eviction struct {
	// Server is the master's address.
	Server string
	// Policy is its maxmemory-policy; empty when INFO did not say.
	Policy string
	// Evicted is its evicted_keys: keys evicted since it started. -1 when
	// INFO did not say.
	Evicted int64
	// Err is the error of reading INFO; the fields above are then what
	// could be read.
	Err error
}

// Safe reports whether the policy is known and evicts nothing.
func (e Eviction) Safe() bool { return e.Policy == SafePolicy }

// Evictions reads the eviction policy and the evicted keys of the server,
// or of every master of a Cluster, concurrently, in no particular order.
// A master whose INFO fails has its error in Err; the error returned is
// for the servers that could not be listed at all (a Cluster's slot map
// unreadable), or ctx's once it ends. Each call is bounded by the call
// timeout.
func (f *Filter) Evictions(ctx context.Context) ([]Eviction, error) {
	var mu sync.Mutex
	var out []Eviction
	err := f.forEachServer(ctx, func(ctx context.Context, c *redis.Client) error {
		e := Eviction{Server: c.Options().Addr, Evicted: -1}
		mem, err := f.info(ctx, c, "memory")
		e.Policy = mem["maxmemory_policy"]
		if err == nil {
			var stats map[string]string
			stats, err = f.info(ctx, c, "stats")
			if n, perr := strconv.ParseInt(stats["evicted_keys"], 10, 64); perr == nil {
				e.Evicted = n
			}
		}
		e.Err = err
		mu.Lock()
		out = append(out, e)
		mu.Unlock()
		return nil
	})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return out, fmt.Errorf("%w: listing the masters: %w", ErrRedis, err)
	}
	return out, nil
}

// Healthy reports whether the filter can decide: false while a
// test-and-set has waited longer than Config.CallTimeout for a stage it
// needs (see Growth in the package doc), and while the servers' eviction
// policies were unsafe when last read: from the moment the maintenance
// (Maintain) finds a master whose maxmemory-policy is not noeviction until
// every master it finds is at noeviction again. CheckServer refuses such a
// server at start; this is for a policy changed while the worker runs. A
// master whose INFO cannot be read keeps the answer it last gave. Safe for
// concurrent use; it makes no call.
func (f *Filter) Healthy() bool {
	return !f.evicting.Load() && f.waiting.longest() <= f.cfg.CallTimeout
}

package bloom

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// evictingPolicies are the maxmemory-policy values of Redis 7.0 that
// evict: all of them but noeviction.
var evictingPolicies = []string{"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl", "allkeys-lru", "allkeys-lfu", "allkeys-random"}

// CheckServer refuses every policy that evicts, in a line that names the
// server, the policy and the setting to change, and accepts noeviction.
func TestCheckServerEvictionPolicy(t *testing.T) {
	srv := testenv.Redis(t)
	c := testenv.RedisClient(t, srv)
	clock := testenv.Now()
	f := newClockFilter(t, c, &clock, Window{Length: 10 * time.Minute})
	for _, p := range evictingPolicies {
		configSet(t, c, "maxmemory-policy", p)
		err := f.CheckServer(t.Context())
		if !errors.Is(err, ErrEvictionPolicy) {
			t.Errorf("%s: %v, want ErrEvictionPolicy", p, err)
			continue
		}
		for _, want := range []string{srv.Addr, "maxmemory-policy " + p + ";", "maxmemory-policy noeviction", "TTL"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", p, err, want)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %q is more than one line", p, err)
		}
	}
	configSet(t, c, "maxmemory-policy", "noeviction")
	if err := f.CheckServer(t.Context()); err != nil {
		t.Fatalf("noeviction: %v", err)
	}
	evs, err := f.Evictions(t.Context())
	if err != nil || len(evs) != 1 || evs[0].Server != srv.Addr || !evs[0].Safe() || evs[0].Evicted != 0 || evs[0].Err != nil {
		t.Fatalf("Evictions: %+v, %v; want %s at noeviction, nothing evicted", evs, err, srv.Addr)
	}
}

// On a Cluster every master is checked: one master of three with a policy
// that evicts stops the start, and the error names that master.
func TestCheckServerClusterFindsOneMaster(t *testing.T) {
	cl := sharedCluster(t)
	cc := testenv.ClusterClient(t, cl)
	clock := testenv.Now()
	f := newClockFilter(t, cc, &clock, Window{Length: 10 * time.Minute}, func(c *Config) { c.Pipeline = "policy-cluster" })
	if err := f.CheckServer(t.Context()); err != nil {
		t.Fatalf("every master at noeviction: %v", err)
	}
	master, _, err := cl.Shard(t.Context(), f.own.filterKey(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	mc := redis.NewClient(master.ClientOptions())
	t.Cleanup(func() { mc.Close() })
	configSet(t, mc, "maxmemory-policy", "allkeys-lru")
	t.Cleanup(func() { configSet(t, mc, "maxmemory-policy", "noeviction") })

	err = f.CheckServer(t.Context())
	if !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), master.Addr+" has maxmemory-policy allkeys-lru") {
		t.Fatalf("one master at allkeys-lru: %v; want ErrEvictionPolicy naming %s", err, master.Addr)
	}
	evs, err := f.Evictions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var unsafe []string
	for _, e := range evs {
		if e.Err != nil {
			t.Errorf("%s: %v", e.Server, e.Err)
		}
		if !e.Safe() {
			unsafe = append(unsafe, e.Server+" "+e.Policy)
		}
	}
	if len(evs) != 3 || len(unsafe) != 1 || unsafe[0] != master.Addr+" allkeys-lru" {
		t.Fatalf("Evictions read %d masters, unsafe %v; want 3, only %s at allkeys-lru", len(evs), unsafe, master.Addr)
	}
}

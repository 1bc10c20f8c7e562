package app

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// A worker pointed at a Redis whose maxmemory-policy is volatile-lru (the
// default of managed services) never becomes ready: Run ends with
// ErrEvictionPolicy in one line naming the server, the policy and the
// setting, before writing a single key.
func TestStartRefusesEvictingPolicy(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 1, "out": 1, "dlq": 1})
	srv := testenv.Redis(t, "--maxmemory-policy", "volatile-lru")
	r := replicas.Start(t, replicas.Config("evicting", k.Addrs(), srv.Addr), runWorker, nil)
	err := r.Fails(60 * time.Second)
	if !errors.Is(err, bloom.ErrEvictionPolicy) {
		t.Fatalf("Run: %v; want ErrEvictionPolicy", err)
	}
	for _, want := range []string{srv.Addr + " has maxmemory-policy volatile-lru", "set maxmemory-policy noeviction"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("%q is more than one line", err)
	}
	if n, err := testenv.RedisClient(t, srv).DBSize(t.Context()).Result(); err != nil || n != 0 {
		t.Errorf("%d keys in Redis (%v); want none written before the check", n, err)
	}
}

// The policy changed while the worker runs: the replica turns unready at
// its next maintenance pass (within 30 s), counts it, and is ready again
// at the pass after the policy is back to noeviction. It decides and
// forwards meanwhile.
func TestEvictionPolicyChangedWhileRunning(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
	srv := testenv.Redis(t)
	admin := testenv.RedisClient(t, srv)
	r := replicas.Start(t, replicas.Config("policy", k.Addrs(), srv.Addr), runWorker, nil)
	const limit = 75 * time.Second // two maintenance passes, on a slow machine
	safe := func(v float64) func() bool {
		return func() bool {
			m := r.Metrics()
			return m.Has("dedupe_redis_eviction_policy_safe", "server", srv.Addr) && m.Value("dedupe_redis_eviction_policy_safe", "server", srv.Addr) == v
		}
	}
	produceIDs(k, 0, 100)
	testenv.Eventually(t, limit, "ready, the policy safe and 100 events decided", func() bool {
		return r.Ready() && safe(1)() && r.Metrics().Value("dedupe_events_forwarded_total") == 100
	})

	configSet(t, admin, "maxmemory-policy", "volatile-lru")
	changed := time.Now()
	testenv.Eventually(t, limit, "unready under volatile-lru", func() bool {
		return r.Status("/readyz") == 503 && r.Metrics().Value("dedupe_ready") == 0 && safe(0)()
	})
	unready := time.Since(changed)
	if n := r.Metrics().Value("dedupe_redis_eviction_policy_unsafe_total"); n != 1 {
		t.Errorf("unsafe policy counted %g times, want 1", n)
	}
	produceIDs(k, 50, 150)
	testenv.Eventually(t, limit, "the new events forwarded while unready", func() bool {
		return r.Metrics().Value("dedupe_events_forwarded_total") == 150
	})

	configSet(t, admin, "maxmemory-policy", "noeviction")
	restored := time.Now()
	testenv.Eventually(t, limit, "ready at noeviction", func() bool { return r.Ready() && safe(1)() })
	t.Logf("unready %v after the policy changed to volatile-lru, ready %v after it was set back", unready.Round(time.Millisecond),
		time.Since(restored).Round(time.Millisecond))
}

// Redis at maxmemory under noeviction: the test fills it with keys of its
// own (no TTL) while the worker runs. Every test-and-set is refused whole,
// before the script runs, so the worker is not ready and forwards
// nothing while five attempts are refused; once the test deletes its keys
// the worker goes on by itself, and every distinct ID is forwarded exactly
// once.
func TestOutOfMemoryUnderNoeviction(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
	srv := testenv.Redis(t, "--maxmemory-policy", "noeviction", "--maxmemory", "4mb")
	admin := testenv.RedisClient(t, srv)
	cfg := replicas.Config("oom", k.Addrs(), srv.Addr)
	cfg.ExpectedPerWindow = 10_000 // nine windows live fit in 4 MB with room
	r := replicas.Start(t, cfg, runWorker, nil)
	const limit = 60 * time.Second
	verdict := func(m testenv.Metrics, v bloom.Verdict) float64 {
		return m.Value("dedupe_verdicts_total", "verdict", v.String())
	}
	settled := func(firstSeen, dups float64) func() bool {
		return func() bool {
			m := r.Metrics()
			return verdict(m, bloom.FirstSeen) == firstSeen && verdict(m, bloom.Duplicate) == dups &&
				m.Value("dedupe_events_forwarded_total") == firstSeen
		}
	}

	// e0..e999, and copies of e0..e499.
	produceIDs(k, 0, 1000)
	produceIDs(k, 0, 500)
	testenv.Eventually(t, limit, "ready with 1000 forwarded and 500 duplicates dropped", func() bool { return settled(1000, 500)() && r.Ready() })

	testenv.FillRedis(t, admin)
	filled := time.Now()
	rejected0, failed0 := testenv.ScriptStat(t, admin, "rejected_calls"), testenv.ScriptStat(t, admin, "failed_calls")
	// e500..e1499 (half copies of the first part), and copies of
	// e1000..e1499.
	produceIDs(k, 500, 1500)
	produceIDs(k, 1000, 1500)
	testenv.Eventually(t, limit, "unready", func() bool {
		m := r.Metrics()
		return r.Status("/readyz") == 503 && m.Has("dedupe_ready") && m.Value("dedupe_ready") == 0
	})
	unreadyAt := time.Now()
	unready := unreadyAt.Sub(filled)
	testenv.Eventually(t, limit, "five test-and-sets refused", func() bool {
		return r.Metrics().Value("dedupe_errors_total", "step", consumer.StepDecide) >= 5
	})
	if r.Ready() {
		t.Fatal("ready over maxmemory")
	}
	if !settled(1000, 500)() {
		t.Fatalf("decided or forwarded over maxmemory:\n%s", r.Metrics().Show("dedupe_"))
	}
	if n := len(k.Read("out")); n != 1000 {
		t.Fatalf("%d records in the output over maxmemory, want the 1000 of before", n)
	}
	// Refused before running (rejected), never failing inside (failed):
	// nothing of a batch is written.
	if rej, fail := testenv.ScriptStat(t, admin, "rejected_calls")-rejected0, testenv.ScriptStat(t, admin, "failed_calls")-failed0; rej < 5 || fail != 0 {
		t.Fatalf("script calls over maxmemory: %d rejected, %d failed inside; want 5 or more rejected and none failed", rej, fail)
	}

	keys, err := admin.Keys(t.Context(), "junk:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("junk keys: %v, %v", keys, err)
	}
	if err := admin.Del(t.Context(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	testenv.Eventually(t, limit, "ready again, 1500 forwarded and 1500 duplicates dropped", func() bool { return settled(1500, 1500)() && r.Ready() })
	recovered, down := time.Since(freed), time.Since(unreadyAt)

	// Every distinct ID once, each from one input offset; nothing
	// dead-lettered, nothing evicted.
	out := k.Read("out")
	seen := map[string]int{}
	for _, rec := range out {
		seen[clickstream.Header(rec, event.IDHeader)]++
	}
	for i := range 1500 {
		if id := fmt.Sprintf("e%d", i); seen[id] != 1 {
			t.Errorf("%s forwarded %d times, want once", id, seen[id])
		}
	}
	if len(out) != 1500 || len(seen) != 1500 || clickstream.DistinctSources(out) != 1500 {
		t.Errorf("%d records, %d IDs, %d sources in the output; want 1500 of each", len(out), len(seen), clickstream.DistinctSources(out))
	}
	if n := len(k.Read("dlq")); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	m := r.Metrics()
	if v := m.Value("dedupe_redis_evicted_keys", "server", srv.Addr); !m.Has("dedupe_redis_evicted_keys", "server", srv.Addr) || v != 0 {
		t.Errorf("evicted keys %g under noeviction, want a series at 0", v)
	}
	t.Logf("over maxmemory: unready %v after the fill, %g test-and-sets refused; ready with everything forwarded %v after the keys were deleted, not ready for %v in all; 0 lost, 0 duplicates passed",
		unready.Round(time.Millisecond), m.Value("dedupe_errors_total", "step", consumer.StepDecide), recovered.Round(time.Millisecond), down.Round(time.Millisecond))
}

// produceIDs produces {"id":"e<i>"} for i from lo to hi, each under a key
// of its own, so that they spread over the partitions.
func produceIDs(k *testenv.Kafka, lo, hi int) {
	var recs []*kgo.Record
	for i := lo; i < hi; i++ {
		recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, `{"id":"e%d"}`, i)})
	}
	k.Produce("in", recs...)
}

func configSet(t testing.TB, c *redis.Client, param, value string) {
	t.Helper()
	if err := c.ConfigSet(t.Context(), param, value).Err(); err != nil {
		t.Fatalf("CONFIG SET %s %s: %v", param, value, err)
	}
}

package app

import (
	"bufio"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// workerACL is the worker's Redis ACL in docs/security.md (the block
// after "<!-- redis-acl -->", written for the pipeline clicks as the user
// dedupe-clicks) for pipeline, user and password: the rule as
// redisproc.Options.Users takes it.
func workerACL(t *testing.T, pipeline, user, password string) string {
	t.Helper()
	f, err := os.Open("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rule string
	sc := bufio.NewScanner(f)
	for found, fence := false, false; sc.Scan(); {
		l := sc.Text()
		switch {
		case strings.TrimSpace(l) == "<!-- redis-acl -->":
			found = true
		case found && strings.HasPrefix(l, "```"):
			fence = true
		case fence:
			rule = l
		}
		if rule != "" {
			break
		}
	}
	const head = "user dedupe-clicks on >PASSWORD "
	if !strings.HasPrefix(rule, head) || !strings.Contains(rule, " ~dedupe:{clicks:* ") || !strings.Contains(rule, " -@all ") {
		t.Fatalf("docs/security.md: the line after <!-- redis-acl --> is %q; want %q, the key pattern ~dedupe:{clicks:* and -@all", rule, head+"...")
	}
	rule = strings.TrimPrefix(rule, head)
	rule = strings.ReplaceAll(rule, "{clicks:", "{"+pipeline+":")
	return user + " on >" + password + " " + rule
}

// noDenials fails the test if Redis logged an ACL denial on any of the
// masters client reaches (a *redis.Client or *redis.ClusterClient logged
// in as a user that may read the log): a command or key the worker used
// outside its rules, even one the client library shrugs off.
func noDenials(t *testing.T, client redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	check := func(ctx context.Context, c *redis.Client) error {
		entries, err := c.ACLLog(ctx, 100).Result()
		if err != nil {
			return err
		}
		for _, e := range entries {
			t.Errorf("%s: ACL denied %s %q to %s (in %s)", c.Options().Addr, e.Reason, e.Object, e.Username, e.Context)
		}
		return nil
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, check)
	case *redis.Client:
		err = check(ctx, c)
	}
	if err != nil {
		t.Fatalf("reading ACL LOG: %v", err)
	}
}

// theRulesBite checks that the user's rules are not wider than the
// docs/security.md says: the same connection that runs the worker's commands is
// refused a key outside the pipeline's and a command outside the list.
func theRulesBite(t *testing.T, c redis.UniversalClient, pipeline string) {
	t.Helper()
	ctx := context.Background()
	if err := c.Set(ctx, "dedupe:{"+pipeline+":0}:probe", "1", 0).Err(); err != nil {
		t.Errorf("SET of a key of the pipeline: %v; the rules should allow it", err)
	}
	for what, err := range map[string]error{
		"SET of another pipeline's key": c.Set(ctx, "dedupe:{other:0}:probe", "1", 0).Err(),
		"KEYS":                          c.Keys(ctx, "*").Err(),
		"CONFIG GET":                    c.ConfigGet(ctx, "maxmemory").Err(),
		"FLUSHALL":                      c.FlushAll(ctx).Err(),
	} {
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%s as the worker's user: %v; want NOPERM", what, err)
		}
	}
}

// aclAdmin and aclWorker are the users of the secured tests' Redis: the
// test's own, with every permission, and the worker's, with the documented one.
const (
	aclAdmin  = "admin"
	aclWorker = "dedupe-sec"
)

// withWorkerUser is o with the test's own user and the worker's.
func withWorkerUser(t *testing.T, o redisproc.Options, workerPassword string) redisproc.Options {
	o.User, o.Password = aclAdmin, password(t, "admin")
	o.Users = []string{workerACL(t, "sec", aclWorker, workerPassword)}
	return o
}

// The filter's maintenance stays within the documented ACL on passes after
// the first too (the first makes the windows and the marker; later ones
// keep the marker alive and look for lost windows), and so does a batch
// that needs a window not made yet: Redis logs no denial.
func TestMaintenanceWithinTheWorkersACL(t *testing.T) {
	workerPass := password(t, "worker")
	srv := testenv.RedisWith(t, withWorkerUser(t, redisproc.Options{}, workerPass))
	admin := testenv.RedisClient(t, srv)
	cfg := replicas.Config("sec", []string{"127.0.0.1:9"}, srv.Addr)
	cfg.RedisUsername, cfg.RedisPassword = aclWorker, config.Secret(workerPass)
	rc, err := NewRedis(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	f, err := NewFilter(cfg, rc)
	if err != nil {
		t.Fatal(err)
	}
	// A batch in a window from an hour ago, which no one made.
	at := time.Now().Add(-time.Hour)
	if _, err := f.TestAndSet(t.Context(), []bloom.Element{{ID: []byte("a"), Time: at, Source: bloom.Source{Topic: "in", Offset: 0}}}); err != nil {
		t.Fatal(err)
	}
	expireAts := func() int64 { return testenv.CommandStat(t, admin, "expireat", "calls") }
	for pass := range 2 {
		before := expireAts()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			f.Maintain(ctx)
		}()
		// The first pass makes the marker (the shard's key ending :m); the
		// second keeps it alive.
		what := []string{"the marker made", "the marker kept alive"}[pass]
		testenv.Eventually(t, 10*time.Second, what, func() bool {
			if pass == 0 {
				n, _ := admin.Exists(t.Context(), "dedupe:{sec:0}:m").Result()
				return n == 1
			}
			return expireAts() > before
		})
		cancel()
		<-done
	}
	noDenials(t, admin)
}

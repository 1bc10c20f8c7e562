package app

import (
	"bufio"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
)

// workerACL is the README's Redis ACL for the worker (the block after
// "<!-- redis-acl -->", written for the pipeline clicks as the user
// dedupe-clicks) for pipeline, user and password: the rule as
// redisproc.Options.Users takes it.
func workerACL(t *testing.T, pipeline, user, password string) string {
	t.Helper()
	f, err := os.Open("../../README.md")
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
		t.Fatalf("README: the line after <!-- redis-acl --> is %q; want %q, the key pattern ~dedupe:{clicks:* and -@all", rule, head+"...")
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
// README says: the same connection that runs the worker's commands is
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
// test's own, with every permission, and the worker's, with the README's.
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

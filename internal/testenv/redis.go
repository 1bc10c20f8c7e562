package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
)

// Redis starts a standalone redis-server for this test.
func Redis(t testing.TB, args ...string) *redisproc.Server {
	t.Helper()
	return RedisWith(t, redisproc.Options{}, args...)
}

// RedisWith starts a standalone redis-server for this test that makes
// clients log in, or speaks TLS only, or both.
func RedisWith(t testing.TB, o redisproc.Options, args ...string) *redisproc.Server {
	t.Helper()
	s, err := redisproc.StartWith(context.Background(), t.TempDir(), o, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}

// ClusterWith is Cluster with nodes that make clients log in, or speak TLS
// only, or both.
func ClusterWith(t testing.TB, replicas int, o redisproc.Options, args ...string) *redisproc.Cluster {
	t.Helper()
	c, err := redisproc.StartClusterWith(context.Background(), t.TempDir(), 3, replicas, o, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	return c
}

// RedisClient is a client of s with deadlines enabled (logged in and over TLS
// as s was started), closed after the test.
func RedisClient(t testing.TB, s *redisproc.Server) *redis.Client {
	t.Helper()
	o := s.ClientOptions()
	o.ContextTimeoutEnabled, o.ReadTimeout = true, clientReadTimeout
	return closeAfter(t, redis.NewClient(o))
}

// clientReadTimeout bounds a read of the tests' clients: long enough for
// a script over a large batch on a loaded machine.
const clientReadTimeout = 10 * time.Second

// closeAfter closes c when the test ends, and returns it.
func closeAfter[C interface{ Close() error }](t testing.TB, c C) C {
	t.Cleanup(func() { c.Close() })
	return c
}

// Cluster starts a Redis Cluster of three masters (with replicas replicas
// each) for this test; args go to every node (see redisproc.StartCluster).
func Cluster(t testing.TB, replicas int, args ...string) *redisproc.Cluster {
	t.Helper()
	return ClusterWith(t, replicas, redisproc.Options{}, args...)
}

// ClusterClient is a cluster client of c, closed after the test.
func ClusterClient(t testing.TB, c *redisproc.Cluster) *redis.ClusterClient {
	t.Helper()
	o := c.ClusterOptions()
	o.ContextTimeoutEnabled, o.ReadTimeout = true, clientReadTimeout
	return closeAfter(t, redis.NewClusterClient(o))
}

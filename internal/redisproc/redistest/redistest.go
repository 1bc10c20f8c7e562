// Package redistest gives tests real redis-server processes on loopback,
// stopped when the test ends.
package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
)

// Server starts a standalone redis-server for this test.
func Server(t testing.TB, args ...string) *redisproc.Server {
	t.Helper()
	s, err := redisproc.Start(context.Background(), t.TempDir(), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}

// Client is a client of s with deadlines enabled, closed after the test.
func Client(t testing.TB, s *redisproc.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// Cluster starts a Redis Cluster of three masters (with replicas replicas
// each) for this test.
func Cluster(t testing.TB, replicas int) *redisproc.Cluster {
	t.Helper()
	c, err := redisproc.StartCluster(context.Background(), t.TempDir(), 3, replicas)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	return c
}

// ClusterClient is a cluster client of c, closed after the test.
func ClusterClient(t testing.TB, c *redisproc.Cluster) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { cc.Close() })
	return cc
}

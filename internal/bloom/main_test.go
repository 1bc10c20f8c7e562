package bloom

import (
	"cmp"
	"context"
	"os"
	"sync"
	"testing"

	"dedupe-worker/internal/redisproc"
)

// testKind is the filter kind the engine's tests run with: bloom, or
// fingerprint with DEDUPE_TEST_FILTER=fingerprint (scripts/test runs both).
var testKind = func() Kind {
	k, err := ParseKind(cmp.Or(os.Getenv("DEDUPE_TEST_FILTER"), "bloom"))
	if err != nil {
		panic(err)
	}
	return k
}()

var (
	clusterOnce sync.Once
	cluster     *redisproc.Cluster
	clusterErr  error
	clusterDir  string
)

// sharedCluster is one three-master Redis Cluster for the package's tests
// (starting one takes seconds); tests use their own pipeline names.
func sharedCluster(t testing.TB) *redisproc.Cluster {
	t.Helper()
	clusterOnce.Do(func() {
		clusterDir, clusterErr = os.MkdirTemp("", "bloom-cluster")
		if clusterErr == nil {
			cluster, clusterErr = redisproc.StartCluster(context.Background(), clusterDir, 3, 0)
		}
	})
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	return cluster
}

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		cluster.Stop()
	}
	if clusterDir != "" {
		os.RemoveAll(clusterDir)
	}
	os.Exit(code)
}

package redisproc_test

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
)

// The server under test is the one the variables name: the make and
// version a start checks when the server matrix sets VersionVar.
func TestServerUnderTest(t *testing.T) {
	s, err := redisproc.StartTemp(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c := redis.NewClient(s.ClientOptions())
	defer c.Close()
	info, err := c.InfoMap(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	name, version := redisproc.ServerVersion(info["Server"])
	prog, _ := redisproc.ServerProgram()
	t.Logf("testing against %s %s (%s)", name, version, prog)
	if name == "" || version == "" || !strings.Contains(version, ".") {
		t.Fatalf("INFO server gave make %q and version %q", name, version)
	}
	if major, _, _ := strings.Cut(version, "."); len(major) < 2 && major < "7" {
		t.Errorf("%s %s: the worker needs 7.0 or later", name, version)
	}
	// A server that is not the one VersionVar names does not start.
	t.Setenv(redisproc.VersionVar, name+" 6.2")
	if s2, err := redisproc.StartTemp(t.Context()); err == nil {
		s2.Stop()
		t.Errorf("started with %s=%q against %s %s", redisproc.VersionVar, name+" 6.2", name, version)
	} else if !strings.Contains(err.Error(), redisproc.VersionVar) {
		t.Errorf("error %v does not name %s", err, redisproc.VersionVar)
	}
	for _, tc := range []struct {
		in   map[string]string
		want [2]string
	}{
		{map[string]string{"redis_version": "7.0.15", "redis_mode": "standalone"}, [2]string{"redis", "7.0.15"}},
		{map[string]string{"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.1.1"}, [2]string{"valkey", "8.1.1"}},
	} {
		if n, v := redisproc.ServerVersion(tc.in); n != tc.want[0] || v != tc.want[1] {
			t.Errorf("ServerVersion(%v) = %s %s, want %s %s", tc.in, n, v, tc.want[0], tc.want[1])
		}
	}
}

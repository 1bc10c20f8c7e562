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
	info, err := c.Info(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	name, version := redisproc.ServerVersion(info)
	prog, _ := redisproc.ServerProgram()
	t.Logf("testing against %s %s (%s)", name, version, prog)
	if name == "" || version == "" || !strings.Contains(version, ".") {
		t.Fatalf("INFO server gave make %q and version %q", name, version)
	}
	if major, _, _ := strings.Cut(version, "."); len(major) < 2 && major < "7" {
		t.Errorf("%s %s: the worker needs 7.0 or later", name, version)
	}
	// A server that is not the one redisproc.VersionVar names does not start.
	t.Setenv(redisproc.VersionVar, name+" 6.2")
	if s2, err := redisproc.StartTemp(t.Context()); err == nil {
		s2.Stop()
		t.Errorf("started with %s=%q against %s %s", redisproc.VersionVar, name+" 6.2", name, version)
	} else if !strings.Contains(err.Error(), redisproc.VersionVar) {
		t.Errorf("error %v does not name %s", err, redisproc.VersionVar)
	}
	for in, want := range map[string][2]string{
		"# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n":                     {"redis", "7.0.15"},
		"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n": {"valkey", "8.1.1"},
	} {
		if n, v := redisproc.ServerVersion(in); n != want[0] || v != want[1] {
			t.Errorf("redisproc.ServerVersion(%q) = %s %s, want %s %s", in, n, v, want[0], want[1])
		}
	}
}

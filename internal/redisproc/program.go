package redisproc

// Which programs run: redis-server and redis-cli from PATH, or the ones
// the server matrix names, and the check that a server started is the
// make and version it asked for.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrNotInstalled is returned when redis-server or redis-cli is not on PATH.
var ErrNotInstalled = errors.New("redis-server not found on PATH: install the Debian package redis-server (apt-get install redis-server)")

// ServerVar and CLIVar name other programs to start in place of
// redis-server and redis-cli on PATH: a server of another version or
// another make (scripts/fetch-servers writes them for Redis 8.0 and
// Valkey 8.1), so that every Redis-backed test runs against it.
const (
	ServerVar = "DEDUPE_TEST_REDIS_SERVER"
	CLIVar    = "DEDUPE_TEST_REDIS_CLI"
)

// program is the program of variable v, or def on PATH.
func program(v, def string) (string, error) {
	p := os.Getenv(v)
	if p == "" {
		p = def
	}
	path, err := exec.LookPath(p)
	if err != nil {
		if os.Getenv(v) != "" {
			return "", fmt.Errorf("%s=%s: %w", v, p, err)
		}
		return "", ErrNotInstalled
	}
	return path, nil
}

// ServerProgram is the redis-server started: ServerVar's, or redis-server
// on PATH.
func ServerProgram() (string, error) { return program(ServerVar, "redis-server") }

// CLIProgram is the redis-cli run: CLIVar's, or redis-cli on PATH.
func CLIProgram() (string, error) { return program(CLIVar, "redis-cli") }

// VersionVar, when set ("valkey 8.1", "redis 8.0"), is the server every
// start must find: the server matrix sets it with ServerVar, so a test
// run meant for one server cannot pass on another.
const VersionVar = "DEDUPE_TEST_REDIS_VERSION"

// checkVersion fails the start when the server is not the one VersionVar
// names.
func (s *Server) checkVersion(ctx context.Context, c *redis.Client) error {
	want := os.Getenv(VersionVar)
	if want == "" {
		return nil
	}
	server, err := info(ctx, c, "server")
	if err != nil {
		s.Kill()
		return fmt.Errorf("redis-server on %s: %w", s.Addr, err)
	}
	name, version := ServerVersion(server)
	wantName, wantVersion, _ := strings.Cut(want, " ")
	if name != wantName || !strings.HasPrefix(version+".", wantVersion+".") {
		s.Kill()
		return fmt.Errorf("%s is %q: the server started is %s %s", VersionVar, want, name, version)
	}
	return nil
}

// ServerVersion reads the make ("redis", "valkey") and version of a server
// from the fields of its INFO server section. Valkey reports a Redis
// version too, for clients that check it; its own is valkey_version.
func ServerVersion(server map[string]string) (name, version string) {
	name, version = server["server_name"], server["redis_version"]
	if name == "" {
		name = "redis"
	}
	if v := server[name+"_version"]; v != "" {
		version = v
	}
	return name, version
}

// Package redisproc starts and stops redis-server processes on loopback:
// for tests, benchmarks and the demo, never for production.
package redisproc

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process.
type Server struct {
	// Addr is where clients connect: the TLS port with Options.TLS.
	Addr string
	Dir  string
	prog string // the redis-server program, ServerProgram
	args []string
	opts Options
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
	// ownDir: Stop removes Dir.
	ownDir bool
}

// Start runs redis-server on a free loopback port with its files in dir
// (created if missing), no persistence unless args ask for it, and waits
// until it answers PING.
func Start(ctx context.Context, dir string, args ...string) (*Server, error) {
	return StartWith(ctx, dir, Options{}, args...)
}

// StartWith is Start for a server that makes clients log in, or speaks
// TLS only, or both; args are more redis-server arguments.
func StartWith(ctx context.Context, dir string, o Options, args ...string) (*Server, error) {
	prog, err := ServerProgram()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating redis dir: %w", err)
	}
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, args: args, opts: o, prog: prog}
		if last = s.start(ctx); last == nil {
			return s, nil
		}
	}
	return nil, last
}

// FreePort returns a loopback port that was free a moment ago, chosen
// at random below the kernel's ephemeral range (32768 and up on Linux by
// default). A port the kernel hands out for port 0 is an ephemeral one,
// which any outgoing connection (a client of the broker or of Redis) may
// take before the caller listens on it; ports below the range are taken
// only by a listener that asks for them.
func FreePort() (int, error) {
	var last error
	for range 100 {
		port := freePortLow + rand.IntN(freePortHigh-freePortLow)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			last = err
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("finding a free port from %d to %d: %w", freePortLow, freePortHigh, last)
}

// The ports FreePort chooses from: above the well-known services, and low
// enough that a Redis Cluster node's bus port (its port plus 10000) is
// below the ephemeral range too.
const (
	freePortLow  = 10000
	freePortHigh = 32768 - 10000
)

func (s *Server) start(ctx context.Context) error {
	_, port, _ := net.SplitHostPort(s.Addr)
	s.cmd = exec.Command(s.prog, s.argv(port)...)
	s.log = &bytes.Buffer{}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = procAttr()
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	co := s.ClientOptions()
	co.MaxRetries, co.DialTimeout = -1, 200*time.Millisecond
	c := redis.NewClient(co)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return s.checkVersion(ctx, c)
		}
		select {
		case <-s.done:
			return fmt.Errorf("redis-server on %s exited: %s", s.Addr, strings.TrimSpace(s.log.String()))
		case <-ctx.Done():
			s.Kill()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redis-server on %s did not answer within 10s: %w", s.Addr, err)
		}
	}
}

// StartTemp is Start in a new temporary directory, which Stop removes.
func StartTemp(ctx context.Context, args ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redis")
	if err != nil {
		return nil, fmt.Errorf("creating redis dir: %w", err)
	}
	s, err := Start(ctx, dir, args...)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.ownDir = true
	return s, nil
}

// FreeAddr is FreePort as 127.0.0.1:port; it panics if no port can be had.
func FreeAddr() string {
	port, err := FreePort()
	if err != nil {
		panic(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// Restart starts the server again on the same address and directory.
func (s *Server) Restart(ctx context.Context) error { return s.start(ctx) }

// Stop shuts the server down with SIGTERM, killing it after 5 s.
func (s *Server) Stop() error {
	if s.ownDir {
		defer os.RemoveAll(s.Dir)
	}
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	s.cmd.Process.Signal(syscall.SIGCONT)
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return nil
	case <-time.After(5 * time.Second):
		return s.Kill()
	}
}

// Kill ends the server at once (SIGKILL) and waits for it.
func (s *Server) Kill() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	s.cmd.Process.Kill()
	<-s.done
	return nil
}

// Running reports whether the process is up (started and not exited).
func (s *Server) Running() bool {
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Pause stops the process (SIGSTOP); Resume continues it.
func (s *Server) Pause() error  { return s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *Server) Resume() error { return s.cmd.Process.Signal(syscall.SIGCONT) }

// Log is what the server printed so far.
func (s *Server) Log() string { return s.log.String() }

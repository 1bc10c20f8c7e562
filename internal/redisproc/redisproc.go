// Package redisproc starts and stops redis-server processes on loopback:
// for tests, benchmarks and the demo, never for production.
package redisproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotInstalled is returned when redis-server or redis-cli is not on PATH.
var ErrNotInstalled = errors.New("redis-server not found on PATH: install the Debian package redis-server (apt-get install redis-server)")

// Server is one redis-server process.
type Server struct {
	Addr string
	Dir  string
	args []string
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
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNotInstalled
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
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, args: args}
		if last = s.start(ctx); last == nil {
			return s, nil
		}
	}
	return nil, last
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start(ctx context.Context) error {
	_, port, _ := net.SplitHostPort(s.Addr)
	argv := append([]string{
		"--port", port, "--bind", "127.0.0.1", "--dir", s.Dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", "", "--protected-mode", "no",
	}, s.args...)
	s.cmd = exec.Command("redis-server", argv...)
	s.log = &bytes.Buffer{}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
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

// CPUSeconds is the user and system CPU time the server behind c has used
// (INFO cpu).
func CPUSeconds(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var tot float64
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			tot += f
		}
	}
	return tot, nil
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

// Pause stops the process (SIGSTOP); Resume continues it.
func (s *Server) Pause() error  { return s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *Server) Resume() error { return s.cmd.Process.Signal(syscall.SIGCONT) }

// Log is what the server printed so far.
func (s *Server) Log() string { return s.log.String() }

// Cluster is a Redis Cluster of redis-server processes.
type Cluster struct {
	Nodes []*Server
}

// Addrs are the addresses of all nodes.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// StartCluster starts masters*(1+replicas) nodes under dir, joins them with
// redis-cli --cluster create and waits until every node reports the
// cluster healthy.
func StartCluster(ctx context.Context, dir string, masters, replicas int) (*Cluster, error) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return nil, ErrNotInstalled
	}
	c := &Cluster{}
	for i := 0; i < masters*(1+replicas); i++ {
		n, err := Start(ctx, filepath.Join(dir, fmt.Sprintf("node%d", i)),
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no")
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(cctx, "redis-cli", args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// WaitHealthy waits until every running node reports cluster_state:ok and
// agrees that all 16384 slots are served.
func (c *Cluster) WaitHealthy(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ok := true
		var last string
		for _, n := range c.Nodes {
			select {
			case <-n.done:
				continue
			default:
			}
			cl := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
			ictx, cancel := context.WithTimeout(ctx, time.Second)
			info, err := cl.ClusterInfo(ictx).Result()
			cancel()
			cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				ok, last = false, fmt.Sprintf("%s: %v %s", n.Addr, err, firstLine(info))
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster not healthy after %v: %s", limit, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimSpace(s)
}

// Stop stops every node.
func (c *Cluster) Stop() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Stop())
	}
	return errors.Join(errs...)
}

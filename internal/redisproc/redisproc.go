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
	info, err := c.InfoMap(ctx, "server").Result()
	if err != nil {
		s.Kill()
		return fmt.Errorf("redis-server on %s: INFO server: %w", s.Addr, err)
	}
	name, version := ServerVersion(info["Server"])
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

// InfoField is one field of an INFO section of the server c talks to.
func InfoField(ctx context.Context, c redis.UniversalClient, section, field string) (string, error) {
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return "", fmt.Errorf("INFO %s: %w", section, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO %s has no %s", section, field)
}

// UsedMemory is the server's used_memory in bytes.
func UsedMemory(ctx context.Context, c redis.UniversalClient) (int64, error) {
	v, err := InfoField(ctx, c, "memory", "used_memory")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
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

// Cluster is a Redis Cluster of redis-server processes.
type Cluster struct {
	Nodes []*Server
	// replicas is how many replicas each master was started with.
	replicas int
	opts     Options
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
// cluster healthy. args go to every node after the defaults, so they can
// override them: "--cluster-node-timeout", "500" makes a failover take
// about two seconds instead of five.
func StartCluster(ctx context.Context, dir string, masters, replicas int, args ...string) (*Cluster, error) {
	return StartClusterWith(ctx, dir, masters, replicas, Options{}, args...)
}

func startCluster(ctx context.Context, dir string, masters, replicas int, o Options, args []string) (*Cluster, error) {
	if _, err := CLIProgram(); err != nil {
		return nil, err
	}
	c := &Cluster{replicas: replicas, opts: o}
	for i := 0; i < masters*(1+replicas); i++ {
		// A replica's sync starts at once, not after the default 5 s wait
		// for more replicas to share a diskless transfer.
		nodeArgs := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
			"--repl-diskless-sync-delay", "0"}, args...)
		n, err := StartWith(ctx, filepath.Join(dir, fmt.Sprintf("node%d", i)), o, nodeArgs...)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	create := append([]string{"--cluster", "create"}, c.Addrs()...)
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if out, err := cli(cctx, o, create...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// WaitHealthy waits until every running node reports cluster_state:ok,
// agrees that all 16384 slots are served, and names only running nodes as
// the masters serving them: after a master is killed, until its replica
// has taken over.
func (c *Cluster) WaitHealthy(ctx context.Context, limit time.Duration) error {
	return c.wait(ctx, limit, false)
}

// WaitReplicated is WaitHealthy that also waits until every master has as
// many replicas in sync (state=online) and answering WAIT as it was
// started with: after a killed master is restarted, until it has rejoined
// as a replica and copied its new master's data.
func (c *Cluster) WaitReplicated(ctx context.Context, limit time.Duration) error {
	return c.wait(ctx, limit, true)
}

func (c *Cluster) wait(ctx context.Context, limit time.Duration, replicated bool) error {
	deadline := time.Now().Add(limit)
	for {
		err := c.check(ctx, replicated)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster not healthy after %v: %w", limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// check returns why the cluster is not healthy, or nil.
func (c *Cluster) check(ctx context.Context, replicated bool) error {
	masters := map[string]bool{}
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		err := func() error {
			cl := c.nodeClient(n.Addr)
			defer cl.Close()
			ictx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			info, err := cl.ClusterInfo(ictx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				return fmt.Errorf("%s: %v %s", n.Addr, err, firstLine(info))
			}
			slots, err := cl.ClusterSlots(ictx).Result()
			if err != nil {
				return fmt.Errorf("%s: %w", n.Addr, err)
			}
			for _, s := range slots {
				m := c.node(s.Nodes[0].Addr)
				if m == nil || !m.Running() {
					return fmt.Errorf("%s: slots %d-%d are served by %s, which is down", n.Addr, s.Start, s.End, s.Nodes[0].Addr)
				}
				masters[m.Addr] = true
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	if !replicated {
		return nil
	}
	for addr := range masters {
		if err := c.checkReplicas(ctx, addr); err != nil {
			return err
		}
	}
	return nil
}

// checkReplicas returns nil if the master at addr has its replicas in sync
// and acknowledging: a replica just done with its first sync can take up
// to a second to answer a WAIT.
func (c *Cluster) checkReplicas(ctx context.Context, addr string) error {
	cl := c.nodeClient(addr)
	defer cl.Close()
	ictx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	info, err := cl.Info(ictx, "replication").Result()
	if err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	if online := strings.Count(info, ",state=online,"); online < c.replicas {
		return fmt.Errorf("%s: %d of %d replicas in sync", addr, online, c.replicas)
	}
	// WAIT covers what the master had when this connection's last command
	// ran (the INFO above; newer Redis versions count only writes, and
	// answer at once here).
	acks, err := cl.Wait(ictx, c.replicas, 200*time.Millisecond).Result()
	if err != nil {
		return fmt.Errorf("%s: WAIT: %w", addr, err)
	}
	if int(acks) < c.replicas {
		return fmt.Errorf("%s: %d of %d replicas acknowledge", addr, acks, c.replicas)
	}
	return nil
}

// node is the node at addr, nil if none.
func (c *Cluster) node(addr string) *Server {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// Shard returns the master serving key's hash slot and that master's
// replicas, as the first running node sees them.
func (c *Cluster) Shard(ctx context.Context, key string) (master *Server, replicas []*Server, err error) {
	var n *Server
	for _, x := range c.Nodes {
		if x.Running() {
			n = x
			break
		}
	}
	if n == nil {
		return nil, nil, errors.New("no node of the cluster is running")
	}
	cl := c.nodeClient(n.Addr)
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	slot, err := cl.ClusterKeySlot(cctx, key).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", n.Addr, err)
	}
	slots, err := cl.ClusterSlots(cctx).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", n.Addr, err)
	}
	for _, s := range slots {
		if int(slot) < s.Start || int(slot) > s.End {
			continue
		}
		for i, sn := range s.Nodes {
			node := c.node(sn.Addr)
			if node == nil {
				return nil, nil, fmt.Errorf("%s names %s, not a node of this cluster", n.Addr, sn.Addr)
			}
			if i == 0 {
				master = node
			} else {
				replicas = append(replicas, node)
			}
		}
		return master, replicas, nil
	}
	return nil, nil, fmt.Errorf("%s: no node serves slot %d", n.Addr, slot)
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

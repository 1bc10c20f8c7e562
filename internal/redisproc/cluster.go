package redisproc

// A Redis Cluster of Servers: started and joined, waited on until it is
// healthy or its replicas are in sync, and asked which nodes hold a key.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

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

// StartClusterWith is StartCluster for nodes that make clients log in, or
// speak TLS only, or both; with TLS the cluster bus and replication use
// TLS too, and with a user the replicas log in to their masters as it.
func StartClusterWith(ctx context.Context, dir string, masters, replicas int, o Options, args ...string) (*Cluster, error) {
	if _, err := CLIProgram(); err != nil {
		return nil, err
	}
	if o.TLS != nil {
		args = append([]string{"--tls-cluster", "yes", "--tls-replication", "yes"}, args...)
	}
	if o.User != "" {
		args = append([]string{"--masteruser", o.User, "--masterauth", o.Password}, args...)
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

// Shard returns the master serving key's hash slot, as the first running
// node sees it, and the replicas connected to that master, as the master
// itself lists them. CLUSTER SLOTS is not asked for the replicas: it
// leaves out a replica until the node answering has heard by gossip that
// it has replicated something, which a test that has just started a
// cluster or restarted a node can meet.
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
		if master = c.node(s.Nodes[0].Addr); master == nil {
			return nil, nil, fmt.Errorf("%s names %s, not a node of this cluster", n.Addr, s.Nodes[0].Addr)
		}
		replicas, err = c.connectedReplicas(cctx, master.Addr)
		return master, replicas, err
	}
	return nil, nil, fmt.Errorf("%s: no node serves slot %d", n.Addr, slot)
}

// connectedReplicas are the nodes the master at addr lists as its
// replicas in INFO replication (slave<i>:ip=...,port=...,...).
func (c *Cluster) connectedReplicas(ctx context.Context, addr string) ([]*Server, error) {
	cl := c.nodeClient(addr)
	defer cl.Close()
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	var replicas []*Server
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "slave") || !strings.HasPrefix(fields, "ip=") {
			continue
		}
		var ip, port string
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "ip":
				ip = v
			case "port":
				port = v
			}
		}
		node := c.node(net.JoinHostPort(ip, port))
		if node == nil {
			return nil, fmt.Errorf("%s lists replica %s:%s, not a node of this cluster", addr, ip, port)
		}
		replicas = append(replicas, node)
	}
	return replicas, nil
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

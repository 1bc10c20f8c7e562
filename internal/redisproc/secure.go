package redisproc

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Options start a server with access control or TLS (StartWith).
type Options struct {
	// User and Password, when User is set, add an ACL user with every
	// permission and turn the default user off: clients must log in.
	User, Password string
	// Users are more ACL users, each a rule as the ACL file's "user"
	// directive takes it, without the word user: "worker on >pw ~k:* +get".
	// This package's own clients and redis-cli use User.
	Users []string
	// TLS, when set, makes the server accept TLS only: --port 0 and a TLS
	// port, which becomes Addr.
	TLS *TLS
}

// TLS is the TLS setup of a server.
type TLS struct {
	// CertFile, KeyFile and CAFile are the server's certificate, its key,
	// and the CA client certificates are checked against (PEM files).
	CertFile, KeyFile, CAFile string
	// AuthClients is redis-server's tls-auth-clients: "no" (the default
	// here), "optional" or "yes".
	AuthClients string
	// Client is the configuration of this package's own clients (start-up
	// and health checks): it must trust CAFile, and hold a client
	// certificate when AuthClients is yes.
	Client *tls.Config
	// ClientCertFile and ClientKeyFile are that client certificate as
	// files, for redis-cli; needed when AuthClients is yes.
	ClientCertFile, ClientKeyFile string
}

// ClientOptions are options for a client of s: its address, and the user,
// password and TLS configuration it was started with.
func (s *Server) ClientOptions() *redis.Options { return s.opts.client(s.Addr) }

// client are client options for the server at addr started with o.
func (o Options) client(addr string) *redis.Options {
	c := &redis.Options{Addr: addr, Username: o.User, Password: o.Password}
	if o.TLS != nil {
		c.TLSConfig = o.TLS.Client
	}
	return c
}

// argv is the redis-server command line for port.
func (s *Server) argv(port string) []string {
	o := s.opts
	argv := []string{"--port", port}
	if o.TLS != nil {
		auth := o.TLS.AuthClients
		if auth == "" {
			auth = "no"
		}
		argv = []string{"--port", "0", "--tls-port", port,
			"--tls-cert-file", o.TLS.CertFile, "--tls-key-file", o.TLS.KeyFile,
			"--tls-ca-cert-file", o.TLS.CAFile, "--tls-auth-clients", auth}
	}
	argv = append(argv, "--bind", "127.0.0.1", "--dir", s.Dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", "", "--protected-mode", "no")
	if o.User != "" {
		argv = append(argv, "--user", "default", "off", "--user", o.User, "on", ">"+o.Password, "~*", "&*", "+@all")
	}
	for _, u := range o.Users {
		argv = append(append(argv, "--user"), strings.Fields(u)...)
	}
	return append(argv, s.args...)
}

// ClusterOptions are options for a cluster client of c: the seeds, and
// the user, password and TLS configuration the nodes were started with.
func (c *Cluster) ClusterOptions() *redis.ClusterOptions {
	n := c.opts.client("")
	return &redis.ClusterOptions{Addrs: c.Addrs(), Username: n.Username, Password: n.Password, TLSConfig: n.TLSConfig}
}

// nodeClient is a client of the node at addr, which need not be one of
// c.Nodes, as the nodes' options say; it does not retry.
func (c *Cluster) nodeClient(addr string) *redis.Client {
	o := c.opts.client(addr)
	o.MaxRetries = -1
	return redis.NewClient(o)
}

// cli is a redis-cli command that logs in and speaks TLS as o says; the
// password is passed in the environment, not on the command line.
func cli(ctx context.Context, o Options, args ...string) *exec.Cmd {
	var pre []string
	if o.User != "" {
		pre = append(pre, "--user", o.User)
	}
	if o.TLS != nil {
		pre = append(pre, "--tls", "--cacert", o.TLS.CAFile)
		if o.TLS.ClientCertFile != "" {
			pre = append(pre, "--cert", o.TLS.ClientCertFile, "--key", o.TLS.ClientKeyFile)
		}
	}
	prog, err := CLIProgram()
	if err != nil {
		prog = "redis-cli" // its run then fails, saying it is not found
	}
	cmd := exec.CommandContext(ctx, prog, append(pre, args...)...)
	if o.User != "" {
		cmd.Env = append(os.Environ(), fmt.Sprintf("REDISCLI_AUTH=%s", o.Password))
	}
	return cmd
}

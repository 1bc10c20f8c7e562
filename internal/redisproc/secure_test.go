package redisproc_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testcerts"
	"dedupe-worker/internal/testenv"
)

func tlsOptions(certs *testcerts.Set, authClients string) *redisproc.TLS {
	return &redisproc.TLS{CertFile: certs.ServerCertFile, KeyFile: certs.ServerKeyFile, CAFile: certs.CAFile,
		AuthClients: authClients, Client: certs.ClientTLS(), ClientCertFile: certs.ClientCertFile, ClientKeyFile: certs.ClientKeyFile}
}

// A server with an ACL user over TLS only: its own options get in; no
// password, a wrong one, or no TLS do not.
func TestServerWithUserAndTLS(t *testing.T) {
	certs := testcerts.New(t)
	s := testenv.RedisWith(t, redisproc.Options{User: "app", Password: "app-pw", TLS: tlsOptions(certs, "yes")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testenv.RedisClient(t, s).Ping(ctx).Err(); err != nil {
		t.Fatalf("own options: %v", err)
	}
	try := func(what string, mutate func(o *redis.Options)) error {
		o := s.ClientOptions()
		o.MaxRetries, o.DialTimeout = -1, time.Second
		mutate(o)
		c := redis.NewClient(o)
		defer c.Close()
		err := c.Ping(ctx).Err()
		t.Logf("%s: %v", what, err)
		return err
	}
	if err := try("wrong password", func(o *redis.Options) { o.Password = "nope" }); !redis.IsAuthError(err) {
		t.Errorf("wrong password: %v, want an auth error", err)
	}
	if err := try("no user", func(o *redis.Options) { o.Username, o.Password = "", "" }); !redis.IsAuthError(err) {
		t.Errorf("no user: %v, want an auth error", err)
	}
	if err := try("no TLS", func(o *redis.Options) { o.TLSConfig = nil }); err == nil {
		t.Error("a plain connection to the TLS port worked")
	}
	if err := try("no client certificate", func(o *redis.Options) { o.TLSConfig = certs.ClientTLS(); o.TLSConfig.Certificates = nil }); err == nil {
		t.Error("a client without a certificate got in with tls-auth-clients yes")
	}
}

// A three-master Cluster whose nodes make clients log in and speak TLS
// only, on the bus as well.
func TestClusterWithUserAndTLS(t *testing.T) {
	certs := testcerts.New(t)
	c := testenv.ClusterWith(t, 0, redisproc.Options{User: "app", Password: "app-pw", TLS: tlsOptions(certs, "no")})
	cc := testenv.ClusterClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		if err := cc.Set(ctx, k, k, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	masters := 0
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		masters++
		return m.Ping(ctx).Err()
	}); err != nil || masters != 3 {
		t.Fatalf("%d masters: %v", masters, err)
	}
	o := c.ClusterOptions()
	o.Password, o.MaxRetries = "nope", -1
	bad := redis.NewClusterClient(o)
	defer bad.Close()
	if err := bad.Ping(ctx).Err(); err == nil {
		t.Fatal("a wrong password got in")
	} else {
		t.Logf("wrong password: %v", err)
	}
}

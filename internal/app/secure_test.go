package app

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	kgosasl "github.com/twmb/franz-go/pkg/sasl"
	kgoplain "github.com/twmb/franz-go/pkg/sasl/plain"
	kgoscram "github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/config"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/syncbuf"
	"dedupe-worker/internal/testcerts"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// password is a fresh random password, so that finding it in output
// cannot be a coincidence.
func password(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + "-" + hex.EncodeToString(b)
}

// startSecureKafka is a kfake broker with TLS and/or SASL whose test
// clients get in with the same settings.
func startSecureKafka(t *testing.T, pair *tlsPair, mech, user, pass string) *testenv.Kafka {
	t.Helper()
	var opts []kfake.Opt
	cl := []kgo.Opt{kgo.RequestRetries(3)}
	if pair != nil {
		opts = append(opts, kfake.TLS(pair.server))
		cl = append(cl, kgo.DialTLSConfig(pair.client))
	}
	if mech != "" {
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(mech, user, pass))
		var m kgosasl.Mechanism
		switch mech {
		case config.SASLPlain:
			m = kgoplain.Auth{User: user, Pass: pass}.AsMechanism()
		case config.SASLScramSHA256:
			m = kgoscram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
		case config.SASLScramSHA512:
			m = kgoscram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
		}
		cl = append(cl, kgo.SASL(m))
	}
	return testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 2}, opts...).WithClientOptions(cl...)
}

// tlsPair is the broker's TLS configuration and its clients'.
type tlsPair struct{ server, client *tls.Config }

func secureConfig(brokers, redisAddrs []string) config.Config {
	cfg := replicas.Config("sec", brokers, redisAddrs...)
	cfg.LogLevel = "debug"
	return cfg
}

// unready checks for d that the worker keeps running and is never ready.
func unready(t *testing.T, r *replicas.Replica, d time.Duration) {
	t.Helper()
	testenv.Throughout(t, d, "running and unready", func() bool {
		select {
		case <-r.Done():
			t.Fatalf("Run returned %v; want it to keep retrying", r.Err())
		default:
		}
		return !r.Ready()
	})
}

// endToEnd feeds 30 events (20 distinct IDs) and a malformed one through a
// running worker and checks what reaches the output and dead-letter
// topics: each first-seen event once, the malformed one with its reason.
func endToEnd(t *testing.T, k *testenv.Kafka, r *replicas.Replica) {
	t.Helper()
	var recs []*kgo.Record
	for i := 0; i < 30; i++ {
		recs = append(recs, &kgo.Record{Value: []byte(fmt.Sprintf(`{"id":"e%d"}`, i%20))})
	}
	recs = append(recs, &kgo.Record{Value: []byte(`{"id": oops`)})
	k.Produce("in", recs...)

	// Every event decided and delivered, by the worker's own count; then
	// the topics must hold exactly that.
	var m testenv.Metrics
	if !testenv.Until(20*time.Second, func() bool {
		m = r.Metrics()
		return m.Value("dedupe_events_forwarded_total") >= 20 && m.Value("dedupe_events_dead_lettered_total") >= 1 &&
			m.Value("dedupe_verdicts_total", "verdict", "duplicate") >= 10
	}) {
		t.Fatalf("not all 31 events went through within 20s:\n%s", m.Show("dedupe_"))
	}
	if got := m.Value("dedupe_verdicts_total", "pipeline", "sec", "verdict", "duplicate"); got != 10 {
		t.Errorf("%g duplicates decided, want 10", got)
	}
	out := k.Read("out")
	ids := map[string]int{}
	for _, rec := range out {
		ids[clickstream.Header(rec, event.IDHeader)]++
	}
	if len(out) != 20 || len(ids) != 20 {
		t.Fatalf("output: %d records, %d distinct IDs; want 20 and 20: %v", len(out), len(ids), ids)
	}
	for i := 0; i < 20; i++ {
		if ids[fmt.Sprintf("e%d", i)] != 1 {
			t.Errorf("e%d forwarded %d times", i, ids[fmt.Sprintf("e%d", i)])
		}
	}
	dlq := k.Read("dlq")
	if len(dlq) != 1 || string(dlq[0].Value) != `{"id": oops` {
		t.Fatalf("dead letters: %d, want the malformed event", len(dlq))
	}
	if clickstream.Header(dlq[0], event.ErrorHeader) == "" {
		t.Error("the dead letter has no reason header")
	}
	if !r.Ready() {
		t.Errorf("not ready after the events went through")
	}
}

func tlsOf(certs *testcerts.Set, requireClientCert bool) *tlsPair {
	return &tlsPair{server: certs.ServerTLS(requireClientCert), client: certs.ClientTLS()}
}

func redisTLS(certs *testcerts.Set, authClients string) *redisproc.TLS {
	return &redisproc.TLS{CertFile: certs.ServerCertFile, KeyFile: certs.ServerKeyFile, CAFile: certs.CAFile,
		AuthClients: authClients, Client: certs.ClientTLS(), ClientCertFile: certs.ClientCertFile, ClientKeyFile: certs.ClientKeyFile}
}

// capture is a JSON log (what the binary prints) in memory, shown on
// failure; go-redis's own log goes there too while it is in use.
type capture struct{ syncbuf.Buffer }

func (c *capture) Sync() error { return nil }

func (c *capture) Printf(_ context.Context, format string, v ...any) {
	fmt.Fprintf(c, "redis: "+format+"\n", v...)
}

func newCapture(t *testing.T) (*capture, *zap.Logger) {
	c := &capture{}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), c, zapcore.DebugLevel)
	warn := testenv.Logger(t, zapcore.WarnLevel).Core()
	return c, zap.New(zapcore.NewTee(core, warn))
}

// Kafka over TLS with SASL PLAIN, Redis with an ACL user over TLS with a
// client certificate, end to end through Run. Then the same servers with
// a wrong Kafka password and a wrong Redis password: each start fails
// with an error naming the variables, never ready. Nothing the worker
// logged (at debug level, go-redis's own log included), returned or
// exported as metrics shows either password.
func TestRunSecuredPlainAndPasswordsNeverShown(t *testing.T) {
	certs := testcerts.New(t)
	kafkaPass, redisPass := password(t, "kafka"), password(t, "redis")
	k := startSecureKafka(t, tlsOf(certs, false), config.SASLPlain, "dedupe", kafkaPass)
	srv := testenv.RedisWith(t, withWorkerUser(t, redisproc.Options{TLS: redisTLS(certs, "yes")}, redisPass))

	logs, logger := newCapture(t)
	redis.SetLogger(logs)
	defer redis.SetLogger(stderrRedisLogger{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)})

	cfg := secureConfig(k.Addrs(), []string{srv.Addr})
	cfg.KafkaTLS, cfg.KafkaTLSCAFile = true, certs.CAFile
	cfg.KafkaSASLMechanism, cfg.KafkaSASLUsername, cfg.KafkaSASLPassword = config.SASLPlain, "dedupe", config.Secret(kafkaPass)
	cfg.RedisUsername, cfg.RedisPassword = aclWorker, config.Secret(redisPass)
	cfg.RedisTLSCAFile, cfg.RedisTLSCertFile, cfg.RedisTLSKeyFile = certs.CAFile, certs.ClientCertFile, certs.ClientKeyFile

	start := time.Now()
	r := replicas.Start(t, cfg, runWorker, logger)
	endToEnd(t, k, r)
	_, metrics := r.Get("/metrics")
	if err := r.Stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// The worker ran as the least-privilege user of docs/security.md,
	// within it.
	admin := testenv.RedisClient(t, srv)
	noDenials(t, admin)
	wc, err := NewRedis(cfg)
	if err != nil {
		t.Fatal(err)
	}
	theRulesBite(t, wc, "sec")
	wc.Close()
	// The refused probes are in the log now: the runs below start clean.
	if err := admin.Do(context.Background(), "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("end to end in %v", time.Since(start).Round(time.Millisecond))

	var errs []string
	wrongKafka := cfg
	wrongKafka.HTTPAddr = redisproc.FreeAddr()
	wrongKafka.KafkaSASLPassword = config.Secret(kafkaPass + "x")
	err = replicas.Start(t, wrongKafka, runWorker, logger).Fails(10 * time.Second)
	logger.Error("exiting", zap.Error(err)) // as the binary does
	t.Logf("wrong Kafka password: %v", err)
	for _, name := range []string{"DEDUPE_KAFKA_SASL_USERNAME", "DEDUPE_KAFKA_SASL_PASSWORD"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error does not name %s", name)
		}
	}
	errs = append(errs, err.Error())

	wrongRedis := cfg
	wrongRedis.HTTPAddr = redisproc.FreeAddr()
	wrongRedis.RedisPassword = config.Secret(redisPass + "x")
	err = replicas.Start(t, wrongRedis, runWorker, logger).Fails(10 * time.Second)
	logger.Error("exiting", zap.Error(err))
	t.Logf("wrong Redis password: %v", err)
	for _, name := range []string{"DEDUPE_REDIS_USERNAME", "DEDUPE_REDIS_PASSWORD"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error does not name %s", name)
		}
	}
	errs = append(errs, err.Error())

	logText := logs.String()
	// The capture holds what it should: the runs, their settings and the
	// refusals; so finding no password in it means something.
	for _, want := range []string{`"kafka_sasl_username":"dedupe"`, `"redis_username":"` + aclWorker + `"`, "SASL", "WRONGPASS", "dedupe_events_in_total"} {
		if !strings.Contains(logText+metrics, want) {
			t.Errorf("the captured output lacks %q", want)
		}
	}
	for _, pw := range []string{kafkaPass, redisPass} {
		for what, text := range map[string]string{"logs": logText, "errors": strings.Join(errs, "\n"), "metrics": metrics} {
			if strings.Contains(text, pw) || strings.Contains(text, hex.EncodeToString([]byte(pw))) {
				t.Errorf("the %s show a password", what)
			}
		}
	}
	t.Logf("%d bytes of logs, %d of metrics checked", len(logText), len(metrics))
}

type stderrRedisLogger struct{ l *log.Logger }

func (s stderrRedisLogger) Printf(_ context.Context, format string, v ...any) {
	s.l.Printf(format, v...)
}

// Kafka with SCRAM: SHA-512 over TLS with a client certificate the broker
// requires, and SHA-256 without TLS; Redis with an ACL user, no TLS.
func TestRunSecuredSCRAM(t *testing.T) {
	certs := testcerts.New(t)
	for _, tc := range []struct {
		mech string
		tls  bool
	}{{config.SASLScramSHA512, true}, {config.SASLScramSHA256, false}} {
		t.Run(tc.mech, func(t *testing.T) {
			kafkaPass, redisPass := password(t, "kafka"), password(t, "redis")
			var pair *tlsPair
			if tc.tls {
				pair = tlsOf(certs, true)
			}
			k := startSecureKafka(t, pair, tc.mech, "dedupe", kafkaPass)
			srv := testenv.RedisWith(t, redisproc.Options{User: "dedupe", Password: redisPass})
			cfg := secureConfig(k.Addrs(), []string{srv.Addr})
			if tc.tls {
				cfg.KafkaTLSCAFile, cfg.KafkaTLSCertFile, cfg.KafkaTLSKeyFile = certs.CAFile, certs.ClientCertFile, certs.ClientKeyFile
			}
			cfg.KafkaSASLMechanism, cfg.KafkaSASLUsername, cfg.KafkaSASLPassword = tc.mech, "dedupe", config.Secret(kafkaPass)
			cfg.RedisUsername, cfg.RedisPassword = "dedupe", config.Secret(redisPass)
			runToEnd(t, k, cfg)

			wrong := cfg
			wrong.HTTPAddr = redisproc.FreeAddr()
			wrong.KafkaSASLPassword = "not-" + config.Secret(kafkaPass)
			err := replicas.Start(t, wrong, runWorker, nil).Fails(10 * time.Second)
			t.Logf("wrong password: %v", err)
			if !strings.Contains(err.Error(), "DEDUPE_KAFKA_SASL_PASSWORD") || strings.Contains(err.Error(), kafkaPass) {
				t.Errorf("wrong password: %v", err)
			}
		})
	}
}

// Certificates that cannot work stop the start with an error naming the
// variable to fix, and the worker is never ready. TLS switched off or on
// against a server that does not expect it cannot be told from a network
// fault (the server closes the connection, or waits): the worker retries,
// is not ready, and its warnings name the variables to check.
func TestRunRefusedCertificates(t *testing.T) {
	certs, other := testcerts.New(t), testcerts.New(t)
	k := startSecureKafka(t, tlsOf(certs, true), "", "", "")
	plainRedis := testenv.Redis(t)
	tlsRedis := testenv.RedisWith(t, redisproc.Options{TLS: redisTLS(certs, "no")})
	kafkaOK := func(c *config.Config) {
		c.KafkaTLSCAFile, c.KafkaTLSCertFile, c.KafkaTLSKeyFile = certs.CAFile, certs.ClientCertFile, certs.ClientKeyFile
	}
	for _, tc := range []struct {
		name  string
		fatal bool   // Run fails by itself; else it retries, unready
		want  string // named in the error, or in the warnings
		set   func(c *config.Config)
	}{
		{"Kafka certificate from another CA", true, "DEDUPE_KAFKA_TLS_CA_FILE", func(c *config.Config) {
			kafkaOK(c)
			c.KafkaTLSCAFile = other.CAFile
		}},
		{"Kafka wants a client certificate", true, "DEDUPE_KAFKA_TLS_CERT_FILE", func(c *config.Config) { c.KafkaTLSCAFile = certs.CAFile }},
		{"Kafka client certificate from another CA", true, "DEDUPE_KAFKA_TLS_CERT_FILE", func(c *config.Config) {
			c.KafkaTLSCAFile, c.KafkaTLSCertFile, c.KafkaTLSKeyFile = certs.CAFile, other.ClientCertFile, other.ClientKeyFile
		}},
		{"Kafka without TLS", false, "DEDUPE_KAFKA_TLS", func(c *config.Config) {}},
		{"Redis certificate from another CA", true, "DEDUPE_REDIS_TLS_CA_FILE", func(c *config.Config) {
			kafkaOK(c)
			c.RedisAddrs, c.RedisTLSCAFile = []string{tlsRedis.Addr}, other.CAFile
		}},
		{"Redis without TLS", false, "DEDUPE_REDIS_TLS", func(c *config.Config) {
			kafkaOK(c)
			c.RedisAddrs = []string{tlsRedis.Addr}
		}},
		{"Redis TLS to a plain server", false, "DEDUPE_REDIS_TLS", func(c *config.Config) {
			kafkaOK(c)
			c.RedisTLS = true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := secureConfig(k.Addrs(), []string{plainRedis.Addr})
			cfg.RedisTimeout = 500 * time.Millisecond
			tc.set(&cfg)
			logs, logger := newCapture(t)
			r := replicas.Start(t, cfg, runWorker, logger)
			if tc.fatal {
				err := r.Fails(10 * time.Second)
				t.Logf("%v", err)
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("the error does not name %s", tc.want)
				}
				return
			}
			unready(t, r, 2*time.Second)
			if err := r.Stop(); err != nil {
				t.Fatalf("Run, stopped while retrying: %v", err)
			}
			if !strings.Contains(logs.String(), "not reachable; retrying") || !strings.Contains(logs.String(), tc.want) {
				t.Errorf("no warning naming %s:\n%s", tc.want, logs.String())
			}
		})
	}
}

// A Redis Cluster whose nodes make clients log in and speak TLS only (the
// bus too): the worker gets through with the variables alone.
func TestRunRedisClusterACLTLS(t *testing.T) {
	certs := testcerts.New(t)
	redisPass := password(t, "redis")
	k := startSecureKafka(t, nil, "", "", "")
	c := testenv.ClusterWith(t, 0, withWorkerUser(t, redisproc.Options{TLS: redisTLS(certs, "no")}, redisPass))
	cfg := secureConfig(k.Addrs(), c.Addrs())
	cfg.Shards = 3
	cfg.RedisUsername, cfg.RedisPassword, cfg.RedisTLSCAFile = aclWorker, config.Secret(redisPass), certs.CAFile
	runToEnd(t, k, cfg)
	// The worker ran as the least-privilege user of docs/security.md,
	// within it, on every master.
	admin := redis.NewClusterClient(c.ClusterOptions())
	defer admin.Close()
	noDenials(t, admin)
}

// runToEnd runs a worker with cfg through endToEnd and stops it.
func runToEnd(t *testing.T, k *testenv.Kafka, cfg config.Config) {
	t.Helper()
	start := time.Now()
	r := replicas.Start(t, cfg, runWorker, nil)
	endToEnd(t, k, r)
	if err := r.Stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("end to end in %v", time.Since(start).Round(time.Millisecond))
}

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
	"go.uber.org/zap/zaptest"

	"dedupe-worker/config"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/sink"
	"dedupe-worker/internal/syncbuf"
	"dedupe-worker/internal/testcerts"
	"dedupe-worker/internal/testenv"
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

// secureKafka is a kfake broker with TLS and/or SASL, and the options its
// test clients need to get in.
type secureKafka struct {
	broker *kfake.Cluster
	opts   []kgo.Opt
}

func startSecureKafka(t *testing.T, pair *tlsPair, mech, user, pass string) *secureKafka {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(2, "in", "out", "dlq"), kfake.GroupMinSessionTimeout(500 * time.Millisecond)}
	var cl []kgo.Opt
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
	broker, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	return &secureKafka{broker: broker, opts: append(cl, kgo.SeedBrokers(broker.ListenAddrs()...), kgo.RequestRetries(3))}
}

// tlsPair is the broker's TLS configuration and its clients'.
type tlsPair struct{ server, client *tls.Config }

func (k *secureKafka) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(append(k.opts, kgo.DefaultProduceTopic("in"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

// consume reads topics from the start until want records have come or
// limit passes.
func (k *secureKafka) consume(t *testing.T, want int, limit time.Duration, topics ...string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append(k.opts, kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(limit)
	for len(recs) < want && time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	return recs
}

func secureConfig(brokers, redisAddrs []string) config.Config {
	return config.Config{
		Pipeline: "sec", KafkaBrokers: brokers, InputTopic: "in", OutputTopic: "out", DLQTopic: "dlq",
		GroupID: "dedupe-sec", RedisAddrs: redisAddrs, IDField: "id", Window: 10 * time.Minute, WindowMode: "rolling",
		WindowGrace: time.Minute, ExpectedPerWindow: 100_000, FalsePositiveRate: 1e-6, Shards: 1, BatchSize: 100,
		BatchLinger: 20 * time.Millisecond, HTTPAddr: redisproc.FreeAddr(), LogLevel: "debug", RedisTimeout: 2 * time.Second,
		KafkaTimeout: 5 * time.Second, KafkaSessionTimeout: 2 * time.Second, ShutdownTimeout: 10 * time.Second,
	}
}

// running is a worker started by startRun.
type running struct {
	cfg    config.Config
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned err
	err    error
}

func startRun(t *testing.T, cfg config.Config, log *zap.Logger) *running {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cfg: cfg, cancel: cancel, done: make(chan struct{})}
	go func() { r.err = Run(ctx, cfg, log); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(cfg.ShutdownTimeout + 10*time.Second):
		}
	})
	return r
}

// stop cancels the worker and returns what Run returned.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(r.cfg.ShutdownTimeout + 10*time.Second):
		t.Fatal("Run did not return within its shutdown bound")
		return nil
	}
}

// failure waits for Run to return an error by itself, and checks that the
// worker was never ready meanwhile.
func (r *running) failure(t *testing.T, limit time.Duration) error {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case <-r.done:
			if r.err == nil {
				t.Fatal("Run returned nil; want an error")
			}
			return r.err
		case <-deadline:
			t.Fatalf("Run did not fail within %v", limit)
		case <-time.After(50 * time.Millisecond):
			if c, _ := get("http://" + r.cfg.HTTPAddr + "/readyz"); c == 200 {
				t.Fatal("ready with a wrong setting")
			}
		}
	}
}

// unready checks for d that the worker stays up and is never ready.
func (r *running) unready(t *testing.T, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		select {
		case <-r.done:
			t.Fatalf("Run returned %v; want it to keep retrying", r.err)
		case <-time.After(50 * time.Millisecond):
		}
		if c, _ := get("http://" + r.cfg.HTTPAddr + "/readyz"); c == 200 {
			t.Fatal("ready with a wrong setting")
		}
	}
}

func (r *running) metrics() string {
	_, body := get("http://" + r.cfg.HTTPAddr + "/metrics")
	return body
}

// endToEnd feeds 30 events (20 distinct IDs) and a malformed one through a
// running worker and checks what reaches the output and dead-letter
// topics: each first-seen event once, the malformed one with its reason.
func endToEnd(t *testing.T, k *secureKafka, r *running) {
	t.Helper()
	var recs []*kgo.Record
	for i := 0; i < 30; i++ {
		recs = append(recs, &kgo.Record{Value: []byte(fmt.Sprintf(`{"id":"e%d"}`, i%20))})
	}
	recs = append(recs, &kgo.Record{Value: []byte(`{"id": oops`)})
	k.produce(t, recs...)

	out := k.consume(t, 20, 20*time.Second, "out")
	ids := map[string]int{}
	for _, rec := range out {
		for _, h := range rec.Headers {
			if h.Key == sink.IDHeader {
				ids[string(h.Value)]++
			}
		}
	}
	if len(out) != 20 || len(ids) != 20 {
		t.Fatalf("output: %d records, %d distinct IDs; want 20 and 20: %v", len(out), len(ids), ids)
	}
	for i := 0; i < 20; i++ {
		if ids[fmt.Sprintf("e%d", i)] != 1 {
			t.Errorf("e%d forwarded %d times", i, ids[fmt.Sprintf("e%d", i)])
		}
	}
	dlq := k.consume(t, 1, 10*time.Second, "dlq")
	if len(dlq) != 1 || string(dlq[0].Value) != `{"id": oops` {
		t.Fatalf("dead letters: %d, want the malformed event", len(dlq))
	}
	reason := ""
	for _, h := range dlq[0].Headers {
		if h.Key == sink.ErrorHeader {
			reason = string(h.Value)
		}
	}
	if reason == "" {
		t.Error("the dead letter has no reason header")
	}
	// The duplicates were decided, not lost on the way.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.metrics(), `dedupe_verdicts_total{pipeline="sec",verdict="duplicate"} 10`) {
		if time.Now().After(deadline) {
			t.Fatalf("no 10 duplicates in the metrics:\n%s", grepLines(r.metrics(), "dedupe_verdicts_total"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c, _ := get("http://" + r.cfg.HTTPAddr + "/readyz"); c != 200 {
		t.Errorf("readyz %d after the events went through", c)
	}
}

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
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
	warn := zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel)).Core()
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
	srv := testenv.RedisWith(t, redisproc.Options{User: "dedupe", Password: redisPass, TLS: redisTLS(certs, "yes")})

	logs, logger := newCapture(t)
	redis.SetLogger(logs)
	defer redis.SetLogger(stderrRedisLogger{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)})

	cfg := secureConfig(k.broker.ListenAddrs(), []string{srv.Addr})
	cfg.KafkaTLS, cfg.KafkaTLSCAFile = true, certs.CAFile
	cfg.KafkaSASLMechanism, cfg.KafkaSASLUsername, cfg.KafkaSASLPassword = config.SASLPlain, "dedupe", config.Secret(kafkaPass)
	cfg.RedisUsername, cfg.RedisPassword = "dedupe", config.Secret(redisPass)
	cfg.RedisTLSCAFile, cfg.RedisTLSCertFile, cfg.RedisTLSKeyFile = certs.CAFile, certs.ClientCertFile, certs.ClientKeyFile

	start := time.Now()
	r := startRun(t, cfg, logger)
	endToEnd(t, k, r)
	metrics := r.metrics()
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("end to end in %v", time.Since(start).Round(time.Millisecond))

	var errs []string
	wrongKafka := cfg
	wrongKafka.HTTPAddr = redisproc.FreeAddr()
	wrongKafka.KafkaSASLPassword = config.Secret(kafkaPass + "x")
	err := startRun(t, wrongKafka, logger).failure(t, 10*time.Second)
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
	err = startRun(t, wrongRedis, logger).failure(t, 10*time.Second)
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
	for _, want := range []string{`"kafka_sasl_username":"dedupe"`, `"redis_username":"dedupe"`, "SASL", "WRONGPASS", "dedupe_events_in_total"} {
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
			cfg := secureConfig(k.broker.ListenAddrs(), []string{srv.Addr})
			if tc.tls {
				cfg.KafkaTLSCAFile, cfg.KafkaTLSCertFile, cfg.KafkaTLSKeyFile = certs.CAFile, certs.ClientCertFile, certs.ClientKeyFile
			}
			cfg.KafkaSASLMechanism, cfg.KafkaSASLUsername, cfg.KafkaSASLPassword = tc.mech, "dedupe", config.Secret(kafkaPass)
			cfg.RedisUsername, cfg.RedisPassword = "dedupe", config.Secret(redisPass)
			runToEnd(t, k, cfg)

			wrong := cfg
			wrong.HTTPAddr = redisproc.FreeAddr()
			wrong.KafkaSASLPassword = "not-" + config.Secret(kafkaPass)
			err := startRun(t, wrong, zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel))).failure(t, 10*time.Second)
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
			cfg := secureConfig(k.broker.ListenAddrs(), []string{plainRedis.Addr})
			cfg.RedisTimeout = 500 * time.Millisecond
			tc.set(&cfg)
			logs, logger := newCapture(t)
			r := startRun(t, cfg, logger)
			if tc.fatal {
				err := r.failure(t, 10*time.Second)
				t.Logf("%v", err)
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("the error does not name %s", tc.want)
				}
				return
			}
			r.unready(t, 2*time.Second)
			if err := r.stop(t); err != nil {
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
	c := testenv.ClusterWith(t, 0, redisproc.Options{User: "dedupe", Password: redisPass, TLS: redisTLS(certs, "no")})
	cfg := secureConfig(k.broker.ListenAddrs(), c.Addrs())
	cfg.Shards = 3
	cfg.RedisUsername, cfg.RedisPassword, cfg.RedisTLSCAFile = "dedupe", config.Secret(redisPass), certs.CAFile
	runToEnd(t, k, cfg)
}

// runToEnd runs a worker with cfg through endToEnd and stops it.
func runToEnd(t *testing.T, k *secureKafka, cfg config.Config) {
	t.Helper()
	start := time.Now()
	r := startRun(t, cfg, zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel)))
	endToEnd(t, k, r)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("end to end in %v", time.Since(start).Round(time.Millisecond))
}

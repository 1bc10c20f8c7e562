package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"go.uber.org/zap"

	"dedupe-worker/config"
	"dedupe-worker/internal/kafkaconn"
	"dedupe-worker/internal/retry"
)

// kafkaConn is how every Kafka connection of the worker is made: the
// brokers, the TLS configuration and SASL mechanism (nil when off), the
// time-out and the client ID. It logs which security is in use, never a
// password.
func kafkaConn(cfg config.Config, log *zap.Logger) (kafkaconn.Conn, error) {
	tc, err := cfg.KafkaTLSConfig()
	if err != nil {
		return kafkaconn.Conn{}, err
	}
	mech, err := cfg.KafkaSASL()
	if err != nil {
		return kafkaconn.Conn{}, err
	}
	redisTLS := cfg.RedisTLS || cfg.RedisTLSCAFile != "" || cfg.RedisTLSCertFile != ""
	log.Info("connections", zap.Bool("kafka_tls", tc != nil), zap.Bool("kafka_tls_client_cert", cfg.KafkaTLSCertFile != ""),
		zap.String("kafka_sasl_mechanism", cfg.KafkaSASLMechanism), zap.String("kafka_sasl_username", cfg.KafkaSASLUsername),
		zap.Bool("redis_tls", redisTLS), zap.Bool("redis_tls_client_cert", cfg.RedisTLSCertFile != ""),
		zap.String("redis_username", cfg.RedisUsername), zap.Bool("redis_password", cfg.RedisPassword != ""))
	if mech != nil && mech.Name() == config.SASLPlain && tc == nil {
		log.Warn("DEDUPE_KAFKA_SASL_MECHANISM=PLAIN without DEDUPE_KAFKA_TLS sends the Kafka password unencrypted")
	}
	return kafkaconn.Conn{Brokers: cfg.KafkaBrokers, TLS: tc, SASL: mech, Timeout: cfg.KafkaTimeout, ClientID: kafkaconn.ClientID(cfg.GroupID)}, nil
}

// waitForServers checks that Kafka and Redis accept connections made as
// configured (TLS, SASL, ACL user) before the worker joins its group. It
// retries failures that can pass (a server down or restarting, a dropped
// connection) until ctx ends, and returns at once, naming the variables to
// fix, those that cannot: a refused password, an untrusted or refused
// certificate, a server that does not speak TLS. Each check is bounded by
// the Kafka or Redis timeout.
func waitForServers(ctx context.Context, cfg config.Config, conn kafkaconn.Conn, rc redis.UniversalClient, log *zap.Logger) error {
	// One connection per attempt, its SASL exchange watched.
	var probe *saslProbe
	checkKafka := func(ctx context.Context) error {
		c := conn
		if c.SASL != nil {
			probe = &saslProbe{Mechanism: c.SASL}
			c.SASL = probe
		}
		tr := c.Transport(time.Second, cfg.InputTopic)
		defer tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(ctx, c.Timeout)
		defer cancel()
		_, err := c.Client(tr).Metadata(ctx, &kafka.MetadataRequest{Topics: []string{cfg.InputTopic}})
		return err
	}
	kafkaFatal := func(err error) error { return kafkaFatal(err, probe) }
	kafkaVars := "DEDUPE_KAFKA_BROKERS, DEDUPE_KAFKA_TLS"
	if conn.SASL != nil {
		kafkaVars += ", DEDUPE_KAFKA_SASL_MECHANISM"
	}
	if err := retryUntil(ctx, log, "Kafka", kafkaVars, checkKafka, kafkaFatal); err != nil {
		return err
	}
	checkRedis := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
		defer cancel()
		return rc.Ping(ctx).Err()
	}
	return retryUntil(ctx, log, "Redis", "DEDUPE_REDIS_ADDRS, DEDUPE_REDIS_TLS", checkRedis, redisFatal)
}

// saslProbe is a SASL mechanism that records whether an exchange began
// and whether it finished. A broker ends a failed login by closing the
// connection (kfake does, and Kafka after an old-style handshake), which
// the client sees as a bare EOF; a connection lost after the exchange began
// and before it finished is taken for a refused login.
type saslProbe struct {
	sasl.Mechanism
	began, finished atomic.Bool
}

func (p *saslProbe) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	sm, ir, err := p.Mechanism.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	p.began.Store(true)
	return probeSession{sm, p}, ir, nil
}

// refused: the exchange began and did not finish.
func (p *saslProbe) refused() bool { return p != nil && p.began.Load() && !p.finished.Load() }

type probeSession struct {
	sasl.StateMachine
	p *saslProbe
}

func (s probeSession) Next(ctx context.Context, challenge []byte) (bool, []byte, error) {
	done, resp, err := s.StateMachine.Next(ctx, challenge)
	if done && err == nil {
		s.p.finished.Store(true)
	}
	return done, resp, err
}

// retryUntil calls check until it succeeds, ctx ends, or fatal turns its
// error into one that retrying cannot fix. Each failure is logged with the
// variables to check if it goes on.
func retryUntil(ctx context.Context, log *zap.Logger, what, vars string, check func(context.Context) error, fatal func(error) error) error {
	failures := 0
	err := retry.Do(ctx, retry.Calls, check, func(err error, wait time.Duration) error {
		if ferr := fatal(err); ferr != nil {
			return ferr
		}
		failures++
		log.Warn(what+" not reachable; retrying", zap.Error(err), zap.Duration("backoff", wait), zap.String("check", vars))
		return nil
	})
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err == nil && failures > 0:
		log.Info(what + " reachable")
	}
	return err
}

// kafkaFatal is the error to stop with when err, from a connection whose
// SASL exchange probe watched, cannot pass by retrying; nil otherwise.
func kafkaFatal(err error, probe *saslProbe) error {
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed), errors.Is(err, kafka.UnsupportedSASLMechanism), errors.Is(err, kafka.IllegalSASLState), probe.refused():
		return fmt.Errorf("Kafka refused the SASL login; check DEDUPE_KAFKA_SASL_MECHANISM, DEDUPE_KAFKA_SASL_USERNAME and DEDUPE_KAFKA_SASL_PASSWORD: %w", err)
	}
	if hint := tlsProblem(err, "DEDUPE_KAFKA_TLS"); hint != "" {
		return fmt.Errorf("Kafka: %s: %w", hint, err)
	}
	return nil
}

// redisFatal is kafkaFatal for Redis.
func redisFatal(err error) error {
	switch {
	case redis.IsAuthError(err):
		return fmt.Errorf("Redis refused the login; check DEDUPE_REDIS_USERNAME and DEDUPE_REDIS_PASSWORD: %w", err)
	case redis.IsPermissionError(err):
		return fmt.Errorf("the Redis user lacks a permission; check its ACL and DEDUPE_REDIS_USERNAME: %w", err)
	}
	if hint := tlsProblem(err, "DEDUPE_REDIS_TLS"); hint != "" {
		return fmt.Errorf("Redis: %s: %w", hint, err)
	}
	return nil
}

// tlsProblem describes a TLS failure that retrying cannot fix, naming the
// variables of the setting (name, name_CA_FILE, ...); "" for other errors.
func tlsProblem(err error, name string) string {
	var verr *tls.CertificateVerificationError
	var uerr x509.UnknownAuthorityError
	var herr x509.HostnameError
	var ierr x509.CertificateInvalidError
	var rerr tls.RecordHeaderError
	var oerr *net.OpError
	switch {
	case errors.As(err, &verr), errors.As(err, &uerr), errors.As(err, &herr), errors.As(err, &ierr):
		return "the server's certificate is not trusted; check " + name + "_CA_FILE"
	case errors.As(err, &rerr):
		return "the server does not speak TLS; check " + name + " and the address"
	case errors.As(err, &oerr) && oerr.Op == "remote error" && strings.Contains(oerr.Error(), "tls:"):
		return "the server refused the TLS handshake; check " + name + "_CERT_FILE and " + name + "_KEY_FILE"
	}
	return ""
}

package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testcerts"
	"dedupe-worker/internal/testenv"
)

// DEDUPE_REDIS_MIN_REPLICAS reaches the filter: against a server without
// replicas a test-and-set fails for want of them with 1, and succeeds
// with 0. The client NewRedis makes logs in and speaks TLS as configured.
func TestNewFilterMinReplicasAndRedisClient(t *testing.T) {
	certs := testcerts.New(t)
	srv := testenv.RedisWith(t, redisproc.Options{User: "w", Password: "w-pw", TLS: redisTLS(certs, "no")})
	cfg := secureConfig([]string{"127.0.0.1:1"}, []string{srv.Addr})
	cfg.RedisUsername, cfg.RedisPassword, cfg.RedisTLSCAFile = "w", "w-pw", certs.CAFile
	cfg.RedisTimeout = time.Second
	elems := []bloom.Element{{ID: []byte("a"), Time: time.Now(), Source: bloom.Source{Topic: "in", Partition: 0, Offset: 1}}}
	for _, tc := range []struct {
		min     int
		wantErr bool
	}{{1, true}, {0, false}} {
		cfg.RedisMinReplicas = tc.min
		cfg.Pipeline = "wiring" + string(rune('a'+tc.min))
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		rc, err := NewRedis(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		f, err := NewFilter(cfg, rc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = f.TestAndSet(ctx, elems)
		cancel()
		if got := errors.Is(err, bloom.ErrTooFewReplicas); got != tc.wantErr || (!tc.wantErr && err != nil) {
			t.Errorf("min replicas %d: %v", tc.min, err)
		}
	}

	// A file that went away after validation: NewRedis says which.
	cfg.RedisTLSCAFile = certs.Dir + "/gone.pem"
	if _, err := NewRedis(cfg); !errors.Is(err, config.ErrInvalid) {
		t.Errorf("NewRedis with a missing CA file: %v", err)
	}
}

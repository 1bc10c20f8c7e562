package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/internal/testcerts"
)

const testPassword = "pw-Zq81-never-shown"

// Each security setting out of place stops the start with one line naming
// its variable, and no message carries the password.
func TestSecurityValuesNameTheVariable(t *testing.T) {
	certs := testcerts.New(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name string // the variable the error must name
		env  map[string]string
	}{
		{"DEDUPE_KAFKA_SASL_MECHANISM", map[string]string{"DEDUPE_KAFKA_SASL_MECHANISM": "GSSAPI", "DEDUPE_KAFKA_SASL_USERNAME": "u", "DEDUPE_KAFKA_SASL_PASSWORD": testPassword}},
		{"DEDUPE_KAFKA_SASL_MECHANISM", map[string]string{"DEDUPE_KAFKA_SASL_USERNAME": "u", "DEDUPE_KAFKA_SASL_PASSWORD": testPassword}},
		{"DEDUPE_KAFKA_SASL_MECHANISM", map[string]string{"DEDUPE_KAFKA_SASL_PASSWORD": testPassword}},
		{"DEDUPE_KAFKA_SASL_USERNAME", map[string]string{"DEDUPE_KAFKA_SASL_MECHANISM": "PLAIN", "DEDUPE_KAFKA_SASL_PASSWORD": testPassword}},
		{"DEDUPE_KAFKA_SASL_PASSWORD", map[string]string{"DEDUPE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "DEDUPE_KAFKA_SASL_USERNAME": "u"}},
		// SASLprep refuses control characters; the SCRAM library's own
		// message would quote the password.
		{"DEDUPE_KAFKA_SASL_PASSWORD", map[string]string{"DEDUPE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "DEDUPE_KAFKA_SASL_USERNAME": "u", "DEDUPE_KAFKA_SASL_PASSWORD": testPassword + "\u0007"}},
		{"DEDUPE_KAFKA_SASL_USERNAME", map[string]string{"DEDUPE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "DEDUPE_KAFKA_SASL_USERNAME": "bell\u0007", "DEDUPE_KAFKA_SASL_PASSWORD": testPassword}},
		{"DEDUPE_KAFKA_TLS", map[string]string{"DEDUPE_KAFKA_TLS": "yes please"}},
		{"DEDUPE_KAFKA_TLS", map[string]string{"DEDUPE_KAFKA_TLS": "false", "DEDUPE_KAFKA_TLS_CA_FILE": certs.CAFile}},
		{"DEDUPE_KAFKA_TLS_CA_FILE", map[string]string{"DEDUPE_KAFKA_TLS_CA_FILE": missing}},
		{"DEDUPE_KAFKA_TLS_CA_FILE", map[string]string{"DEDUPE_KAFKA_TLS": "true", "DEDUPE_KAFKA_TLS_CA_FILE": notPEM}},
		{"DEDUPE_KAFKA_TLS_KEY_FILE", map[string]string{"DEDUPE_KAFKA_TLS_CERT_FILE": certs.ClientCertFile}},
		{"DEDUPE_KAFKA_TLS_CERT_FILE", map[string]string{"DEDUPE_KAFKA_TLS_KEY_FILE": certs.ClientKeyFile}},
		{"DEDUPE_KAFKA_TLS_CERT_FILE", map[string]string{"DEDUPE_KAFKA_TLS_CERT_FILE": certs.ClientCertFile, "DEDUPE_KAFKA_TLS_KEY_FILE": certs.ServerKeyFile}},
		{"DEDUPE_KAFKA_TLS_KEY_FILE", map[string]string{"DEDUPE_KAFKA_TLS_CERT_FILE": certs.ClientCertFile, "DEDUPE_KAFKA_TLS_KEY_FILE": missing}},
		{"DEDUPE_REDIS_PASSWORD", map[string]string{"DEDUPE_REDIS_USERNAME": "dedupe"}},
		{"DEDUPE_REDIS_TLS", map[string]string{"DEDUPE_REDIS_TLS": "false", "DEDUPE_REDIS_TLS_CERT_FILE": certs.ClientCertFile, "DEDUPE_REDIS_TLS_KEY_FILE": certs.ClientKeyFile}},
		{"DEDUPE_REDIS_TLS_CA_FILE", map[string]string{"DEDUPE_REDIS_TLS_CA_FILE": notPEM, "DEDUPE_REDIS_PASSWORD": testPassword}},
		{"DEDUPE_REDIS_TLS_KEY_FILE", map[string]string{"DEDUPE_REDIS_TLS_CERT_FILE": certs.ClientCertFile}},
		{"DEDUPE_REDIS_TLS_CERT_FILE", map[string]string{"DEDUPE_REDIS_TLS_CERT_FILE": certs.CAFile, "DEDUPE_REDIS_TLS_KEY_FILE": certs.ClientKeyFile}},
		{"DEDUPE_REDIS_MIN_REPLICAS", map[string]string{"DEDUPE_REDIS_MIN_REPLICAS": "6"}},
		{"DEDUPE_REDIS_MIN_REPLICAS", map[string]string{"DEDUPE_REDIS_MIN_REPLICAS": "-1"}},
		{"DEDUPE_REDIS_MIN_REPLICAS", map[string]string{"DEDUPE_REDIS_MIN_REPLICAS": "one"}},
	} {
		var keys []string
		for k := range tc.env {
			keys = append(keys, strings.TrimPrefix(k, "DEDUPE_"))
		}
		sort.Strings(keys)
		t.Run(tc.name+"/"+strings.Join(keys, ","), func(t *testing.T) {
			setValidEnvFile(t, "clicks.env")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.name+":") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%v; want one line naming %s", err, tc.name)
			}
			t.Log(err)
			if strings.Contains(err.Error(), testPassword) {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

func TestSecurityLoads(t *testing.T) {
	certs := testcerts.New(t)
	setEnvFile(t, "clicks.env")
	for k, v := range map[string]string{
		// A CA file alone turns TLS on.
		"DEDUPE_KAFKA_TLS_CA_FILE":    certs.CAFile,
		"DEDUPE_KAFKA_TLS_CERT_FILE":  certs.ClientCertFile,
		"DEDUPE_KAFKA_TLS_KEY_FILE":   certs.ClientKeyFile,
		"DEDUPE_KAFKA_SASL_MECHANISM": "scram-sha-512",
		"DEDUPE_KAFKA_SASL_USERNAME":  "dedupe",
		"DEDUPE_KAFKA_SASL_PASSWORD":  testPassword,
		"DEDUPE_REDIS_USERNAME":       "dedupe",
		"DEDUPE_REDIS_PASSWORD":       testPassword + "-redis",
		"DEDUPE_REDIS_TLS":            "true",
		"DEDUPE_REDIS_TLS_CA_FILE":    certs.CAFile,
		"DEDUPE_REDIS_MIN_REPLICAS":   "1",
	} {
		t.Setenv(k, v)
	}
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if !c.KafkaTLS || !c.RedisTLS || c.KafkaSASLMechanism != SASLScramSHA512 || c.RedisMinReplicas != 1 {
		t.Errorf("KafkaTLS %v, RedisTLS %v, mechanism %q, min replicas %d", c.KafkaTLS, c.RedisTLS, c.KafkaSASLMechanism, c.RedisMinReplicas)
	}
	ktls, err := c.KafkaTLSConfig()
	if err != nil || ktls == nil || ktls.RootCAs == nil || len(ktls.Certificates) != 1 {
		t.Fatalf("Kafka TLS %+v, %v", ktls, err)
	}
	rtls, err := c.RedisTLSConfig()
	if err != nil || rtls == nil || rtls.RootCAs == nil || len(rtls.Certificates) != 0 {
		t.Fatalf("Redis TLS %+v, %v", rtls, err)
	}
	m, err := c.KafkaSASL()
	if err != nil || m == nil || m.Name() != SASLScramSHA512 {
		t.Fatalf("SASL %v, %v", m, err)
	}
	if string(c.KafkaSASLPassword) != testPassword || string(c.RedisPassword) != testPassword+"-redis" {
		t.Fatal("the passwords were not loaded as given")
	}

	// The defaults: nothing secured.
	setEnvFile(t, "clicks.env")
	for _, k := range []string{"DEDUPE_KAFKA_TLS_CA_FILE", "DEDUPE_KAFKA_TLS_CERT_FILE", "DEDUPE_KAFKA_TLS_KEY_FILE", "DEDUPE_KAFKA_SASL_MECHANISM",
		"DEDUPE_KAFKA_SASL_USERNAME", "DEDUPE_KAFKA_SASL_PASSWORD", "DEDUPE_REDIS_USERNAME", "DEDUPE_REDIS_PASSWORD", "DEDUPE_REDIS_TLS",
		"DEDUPE_REDIS_TLS_CA_FILE", "DEDUPE_REDIS_MIN_REPLICAS"} {
		os.Unsetenv(k)
	}
	c, err = Load()
	if err != nil {
		t.Fatal(err)
	}
	ktls, _ = c.KafkaTLSConfig()
	rtls, _ = c.RedisTLSConfig()
	m, _ = c.KafkaSASL()
	if ktls != nil || rtls != nil || m != nil || c.RedisMinReplicas != 0 {
		t.Fatalf("defaults: Kafka TLS %v, Redis TLS %v, SASL %v, min replicas %d", ktls, rtls, m, c.RedisMinReplicas)
	}
}

// Printing or logging the whole configuration never shows a password.
func TestSecretsNeverPrinted(t *testing.T) {
	c := Config{Pipeline: "p", KafkaSASLUsername: "dedupe", KafkaSASLPassword: testPassword, RedisPassword: testPassword + "-redis"}
	var buf bytes.Buffer
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&buf), zapcore.DebugLevel)
	zap.New(core).Info("config", zap.Any("config", c), zap.Reflect("reflected", c), zap.Stringer("password", c.KafkaSASLPassword))
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string]string{
		"%v": fmt.Sprintf("%v", c), "%+v": fmt.Sprintf("%+v", c), "%#v": fmt.Sprintf("%#v", c),
		"%q": fmt.Sprintf("%q", c.RedisPassword), "%x": fmt.Sprintf("%x", c.RedisPassword),
		"json": string(js), "zap": buf.String(),
	}
	for how, out := range outs {
		if strings.Contains(out, "pw-Zq81") || strings.Contains(out, fmt.Sprintf("%x", testPassword)) {
			t.Errorf("%s shows the password: %s", how, out)
		}
		// Each output shows the placeholder (%x in hex), so none of them
		// is empty and passes the search above for want of text.
		marker := "redacted"
		if how == "%x" {
			marker = fmt.Sprintf("%x", marker)
		}
		if !strings.Contains(out, marker) {
			t.Errorf("%s: no %s in %q", how, marker, out)
		}
	}
	if Secret("").String() != "" {
		t.Error("an empty secret should print empty")
	}
}

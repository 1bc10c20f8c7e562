package config

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// SASL mechanisms of DEDUPE_KAFKA_SASL_MECHANISM.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// KafkaSASL is the SASL mechanism every Kafka connection authenticates
// with, or nil without DEDUPE_KAFKA_SASL_MECHANISM. Its errors name the
// variable and never carry the password.
func (c Config) KafkaSASL() (sasl.Mechanism, error) {
	mech := strings.ToUpper(strings.TrimSpace(c.KafkaSASLMechanism))
	user, pass := c.KafkaSASLUsername, string(c.KafkaSASLPassword)
	if mech == "" {
		if user != "" || pass != "" {
			return nil, bad("KAFKA_SASL_MECHANISM", "empty, but DEDUPE_KAFKA_SASL_USERNAME or DEDUPE_KAFKA_SASL_PASSWORD is set; want %s, %s or %s",
				SASLPlain, SASLScramSHA256, SASLScramSHA512)
		}
		return nil, nil
	}
	var algo scram.Algorithm
	switch mech {
	case SASLPlain:
	case SASLScramSHA256:
		algo = scram.SHA256
	case SASLScramSHA512:
		algo = scram.SHA512
	default:
		return nil, bad("KAFKA_SASL_MECHANISM", "%q: want %s, %s or %s, or empty for none", c.KafkaSASLMechanism,
			SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
	switch {
	case user == "":
		return nil, bad("KAFKA_SASL_USERNAME", "required with DEDUPE_KAFKA_SASL_MECHANISM=%s", mech)
	case pass == "":
		return nil, bad("KAFKA_SASL_PASSWORD", "required with DEDUPE_KAFKA_SASL_MECHANISM=%s", mech)
	case strings.ContainsRune(user, 0):
		return nil, bad("KAFKA_SASL_USERNAME", "contains a NUL character")
	case strings.ContainsRune(pass, 0):
		return nil, bad("KAFKA_SASL_PASSWORD", "contains a NUL character")
	}
	if algo == nil {
		return plain.Mechanism{Username: user, Password: pass}, nil
	}
	// The SCRAM client's own errors quote the password; they are replaced.
	if _, err := scram.Mechanism(algo, user, "x"); err != nil {
		return nil, bad("KAFKA_SASL_USERNAME", "%q is not valid for %s (SASLprep)", user, mech)
	}
	m, err := scram.Mechanism(algo, user, pass)
	if err != nil {
		return nil, bad("KAFKA_SASL_PASSWORD", "not valid for %s (SASLprep rejects a character)", mech)
	}
	return m, nil
}

// KafkaTLSConfig is the TLS configuration of every Kafka connection, or
// nil when TLS is off.
func (c Config) KafkaTLSConfig() (*tls.Config, error) {
	return tlsConfig("KAFKA_TLS", c.KafkaTLS, c.KafkaTLSCAFile, c.KafkaTLSCertFile, c.KafkaTLSKeyFile)
}

// RedisTLSConfig is the TLS configuration of every Redis connection, or
// nil when TLS is off.
func (c Config) RedisTLSConfig() (*tls.Config, error) {
	return tlsConfig("REDIS_TLS", c.RedisTLS, c.RedisTLSCAFile, c.RedisTLSCertFile, c.RedisTLSKeyFile)
}

// tlsConfig reads the files of one TLS setting; name is the variable of
// the switch, the files' variables are name_CA_FILE, name_CERT_FILE and
// name_KEY_FILE. A file turns TLS on. The server name is left empty: the
// clients take it from each address they dial.
func tlsConfig(name string, on bool, caFile, certFile, keyFile string) (*tls.Config, error) {
	if !on && caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, bad(name+"_CA_FILE", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, bad(name+"_CA_FILE", "%s holds no PEM certificate", caFile)
		}
		tc.RootCAs = pool
	}
	switch {
	case certFile != "" && keyFile == "":
		return nil, bad(name+"_KEY_FILE", "required with %s_%s_CERT_FILE", Prefix, name)
	case certFile == "" && keyFile != "":
		return nil, bad(name+"_CERT_FILE", "required with %s_%s_KEY_FILE", Prefix, name)
	case certFile != "":
		certPEM, err := os.ReadFile(certFile)
		if err != nil {
			return nil, bad(name+"_CERT_FILE", "%v", err)
		}
		keyPEM, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, bad(name+"_KEY_FILE", "%v", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, bad(name+"_CERT_FILE", "%s with key %s: %v", certFile, keyFile, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

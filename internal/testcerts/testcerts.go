// Package testcerts makes throwaway certificates for tests: a CA created
// at run time, a server certificate for 127.0.0.1, ::1 and localhost, and
// a client certificate, all signed by it and valid for a day. The PEM
// files are written to a test's temporary directory, so no key is ever
// kept in the repository.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Set is one CA with the server and client certificates it signed.
type Set struct {
	// Dir holds the files.
	Dir string
	// CAFile is the CA certificate (PEM).
	CAFile string
	// ServerCertFile and ServerKeyFile: the server's certificate and key
	// (PEM). The certificate is also good for client authentication, so a
	// server can present it to its peers (a Redis Cluster bus over TLS).
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile: a client certificate and its key.
	ClientCertFile, ClientKeyFile string

	// Pool trusts the CA only.
	Pool *x509.CertPool
	// Server and Client are the two key pairs, parsed.
	Server, Client tls.Certificate
}

// New makes a fresh Set in t.TempDir().
func New(t testing.TB) *Set {
	t.Helper()
	s, err := Make(t.TempDir(), "testcerts")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Make makes a fresh Set in dir; name goes into the subjects.
func Make(dir, name string) (*Set, error) {
	s := &Set{
		Dir:            dir,
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
	}
	ca, err := newCA(name+" CA", time.Now(), s.CAFile)
	if err != nil {
		return nil, err
	}
	s.Pool = x509.NewCertPool()
	s.Pool.AddCert(ca.cert)
	if s.Server, err = ca.leaf(name+" server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, true,
		s.ServerCertFile, s.ServerKeyFile); err != nil {
		return nil, err
	}
	if s.Client, err = ca.leaf(name+" client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false,
		s.ClientCertFile, s.ClientKeyFile); err != nil {
		return nil, err
	}
	return s, nil
}

// authority is a CA that signs the leaf certificates, each valid from an
// hour before now to a day after.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	now  time.Time
}

// newCA makes a self-signed CA named cn and writes its certificate to
// certFile.
func newCA(cn string, now time.Time, certFile string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating the CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key, now: now}, nil
}

// leaf makes a key and a certificate for cn, signed by a, for usage and,
// withNames, for 127.0.0.1, ::1 and localhost; it writes both and returns
// them as a key pair.
func (a *authority) leaf(cn string, usage []x509.ExtKeyUsage, withNames bool, certFile, keyFile string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    a.now.Add(-time.Hour),
		NotAfter:     a.now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
	if withNames {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("creating %s: %w", cn, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return tls.Certificate{}, err
	}
	if err := writePEM(keyFile, "PRIVATE KEY", keyDER); err != nil {
		return tls.Certificate{}, err
	}
	return tls.LoadX509KeyPair(certFile, keyFile)
}

// ServerTLS is a server configuration presenting the server certificate.
// With requireClientCert, clients must present a certificate the CA
// signed.
func (s *Set) ServerTLS(requireClientCert bool) *tls.Config {
	c := &tls.Config{Certificates: []tls.Certificate{s.Server}, MinVersion: tls.VersionTLS12}
	if requireClientCert {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = s.Pool
	}
	return c
}

// ClientTLS is a client configuration that trusts the CA and presents the
// client certificate when asked.
func (s *Set) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: s.Pool, Certificates: []tls.Certificate{s.Client}, MinVersion: tls.VersionTLS12}
}

// serial is a random certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}

// writePEM writes der as one PEM block of type typ, readable by the owner
// only.
func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

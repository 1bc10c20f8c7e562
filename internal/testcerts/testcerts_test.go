package testcerts

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"
)

// handshake runs a TLS handshake over loopback and returns the client's
// error (the server's when the client has none).
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	deadline := time.Now().Add(5 * time.Second)
	srvErr := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer conn.Close()
		conn.SetDeadline(deadline)
		s := tls.Server(conn, server)
		err = s.Handshake()
		if err == nil {
			// TLS 1.3 checks the client certificate after the client's
			// handshake is done; a read gets the verdict to the client.
			_, err = s.Write([]byte{1})
		}
		srvErr <- err
	}()
	conn, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(deadline)
	c := tls.Client(conn, client)
	err = c.Handshake()
	if err == nil {
		_, err = c.Read(make([]byte, 1))
	}
	conn.Close()
	if serr := <-srvErr; err == nil {
		err = serr
	}
	return err
}

func TestCertificates(t *testing.T) {
	s, other := New(t), New(t)
	for _, name := range []string{"127.0.0.1", "::1", "localhost"} {
		c := s.ClientTLS()
		c.ServerName = name
		if err := handshake(t, s.ServerTLS(true), c); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The server without client certificates accepts a good client, so
	// the refusals below are the name's and the CA's, not its own.
	c := s.ClientTLS()
	c.ServerName = "127.0.0.1"
	if err := handshake(t, s.ServerTLS(false), c); err != nil {
		t.Fatalf("without client certificates: %v", err)
	}
	c = s.ClientTLS()
	c.ServerName = "example.com"
	var hostErr x509.HostnameError
	if err := handshake(t, s.ServerTLS(false), c); !errors.As(err, &hostErr) {
		t.Errorf("a name not in the certificate: %v, want a hostname error", err)
	}
	c = other.ClientTLS()
	c.ServerName = "127.0.0.1"
	var caErr x509.UnknownAuthorityError
	if err := handshake(t, s.ServerTLS(false), c); !errors.As(err, &caErr) {
		t.Errorf("a client trusting another CA: %v, want an unknown authority error", err)
	}
	c = s.ClientTLS()
	c.ServerName, c.Certificates = "127.0.0.1", other.ClientTLS().Certificates
	if err := handshake(t, s.ServerTLS(true), c); err == nil {
		t.Error("a client certificate from another CA was accepted")
	}
}

package kafkaconn

import (
	"crypto/tls"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
)

// Every connection made from one Conn carries all of it: a field dropped
// from one of them (the producers once sent no client ID) fails here.
func TestEveryConnectionCarriesTheConn(t *testing.T) {
	c := Conn{Brokers: []string{"k1:9092", "k2:9092"}, TLS: &tls.Config{ServerName: "k"}, SASL: plain.Mechanism{Username: "u", Password: "p"},
		Timeout: 7 * time.Second, ClientID: ClientID("clicks")}

	d := c.Dialer()
	if d.Timeout != c.Timeout || d.TLS != c.TLS || d.SASLMechanism != c.SASL || d.ClientID != c.ClientID {
		t.Errorf("Dialer: %+v", d)
	}
	tr := c.Transport(time.Minute, "out")
	if tr.DialTimeout != c.Timeout || tr.TLS != c.TLS || tr.SASL != c.SASL || tr.ClientID != c.ClientID ||
		tr.IdleTimeout != time.Minute || !slices.Equal(tr.MetadataTopics, []string{"out"}) || tr.Dial == nil {
		t.Errorf("Transport: %+v", tr)
	}
	cl := c.Client(tr)
	if cl.Timeout != c.Timeout || cl.Transport != kafka.RoundTripper(tr) || cl.Addr.String() != "k1:9092,k2:9092" {
		t.Errorf("Client: %+v, address %s", cl, cl.Addr)
	}
}

// A member's ID starts with its client ID, so the ID says which group,
// host and process a member is.
func TestClientIDNamesGroupHostAndProcess(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	id := ClientID("clicks")
	want := "dedupe-worker.clicks." + host + "." + strconv.Itoa(os.Getpid())
	if id != want {
		t.Errorf("ClientID = %q, want %q", id, want)
	}
}

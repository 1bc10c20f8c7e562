// Package kafkaconn is how the worker reaches Kafka. One Conn, made once
// from the configuration, gives every connection the worker opens (the
// group reader's, the client that places a new group's first offsets, the
// producers', the start-up check's) the same brokers, TLS, SASL
// mechanism, time-out and client ID.
package kafkaconn

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// Conn is where Kafka is and how to connect to it.
type Conn struct {
	// Brokers are the bootstrap brokers, host:port. Required.
	Brokers []string
	// TLS, when set, secures every connection.
	TLS *tls.Config
	// SASL, when set, authenticates every connection.
	SASL sasl.Mechanism
	// Timeout bounds a dial and each request. Its default and limits are
	// those of the library that uses the Conn.
	Timeout time.Duration
	// ClientID names the process to the brokers (ClientID). Default:
	// kafka-go's.
	ClientID string
}

// ClientID is the client ID of a worker of group: "dedupe-worker.", the
// group, the host name and the process ID. A group member's ID starts with
// its client ID, so broker-side tools show which pod holds which
// partitions.
func ClientID(group string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("dedupe-worker.%s.%s.%d", group, host, os.Getpid())
}

// Dialer is the dialer of a kafka.Reader.
func (c Conn) Dialer() *kafka.Dialer {
	return &kafka.Dialer{Timeout: c.Timeout, TLS: c.TLS, SASLMechanism: c.SASL, ClientID: c.ClientID}
}

// Transport is a transport whose idle connections close after idle. It
// asks for the metadata of topics by name: from a cache of all topics, a
// topic the user may not read or write would just be missing (unknown),
// not refused, and would be retried for ever.
func (c Conn) Transport(idle time.Duration, topics ...string) *kafka.Transport {
	return &kafka.Transport{
		Dial:           (&net.Dialer{Timeout: c.Timeout}).DialContext,
		DialTimeout:    c.Timeout,
		IdleTimeout:    idle,
		TLS:            c.TLS,
		SASL:           c.SASL,
		ClientID:       c.ClientID,
		MetadataTopics: topics,
	}
}

// Client is a client of the brokers through tr, each request bounded by
// Timeout.
func (c Conn) Client(tr *kafka.Transport) *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(c.Brokers...), Timeout: c.Timeout, Transport: tr}
}

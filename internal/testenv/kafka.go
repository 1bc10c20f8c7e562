package testenv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/clickstream"
)

// Topics names the topics a broker starts with and their partition counts.
type Topics map[string]int32

// Kafka is a kfake broker (a Kafka-protocol broker over TCP) for one test,
// closed when the test ends. Its embedded Cluster injects faults.
type Kafka struct {
	*kfake.Cluster
	t testing.TB
	// clientOpts go to every client the test makes through Kafka: TLS
	// and SASL settings when the broker asks for them.
	clientOpts []kgo.Opt
}

// StartKafka starts a broker with topics. By default it has one broker
// and accepts session timeouts from 500 ms, so that tests see a dead
// group member quickly; opts come after these defaults and override them.
func StartKafka(t testing.TB, topics Topics, opts ...kfake.Opt) *Kafka {
	t.Helper()
	all := []kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(500 * time.Millisecond)}
	byCount := map[int32][]string{}
	for name, n := range topics {
		byCount[n] = append(byCount[n], name)
	}
	for n, names := range byCount {
		slices.Sort(names)
		all = append(all, kfake.SeedTopics(n, names...))
	}
	c, err := kfake.NewCluster(append(all, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &Kafka{Cluster: c, t: t}
}

// WithClientOptions makes every later client of k use opts as well (TLS,
// SASL), and returns k.
func (k *Kafka) WithClientOptions(opts ...kgo.Opt) *Kafka {
	k.clientOpts = append(k.clientOpts, opts...)
	return k
}

// Addrs are the broker's listen addresses.
func (k *Kafka) Addrs() []string { return k.ListenAddrs() }

// ClientOptions are the options that reach the broker: its addresses and
// the options given to WithClientOptions.
func (k *Kafka) ClientOptions() []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(k.Addrs()...)}, k.clientOpts...)
}

// Produce writes recs to topic and fails the test if the broker has not
// acknowledged all of them within 30 s.
func (k *Kafka) Produce(topic string, recs ...*kgo.Record) {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := clickstream.Produce(ctx, k.Addrs(), topic, recs, k.clientOpts...); err != nil {
		k.t.Fatalf("producing %d records to %s: %v", len(recs), topic, err)
	}
}

// Read returns every record topic holds when it is called, and fails the
// test if that takes more than a minute.
func (k *Kafka) Read(topic string) []*kgo.Record {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := clickstream.ReadToEnd(ctx, k.Addrs(), topic, k.clientOpts...)
	if err != nil {
		k.t.Fatal(err)
	}
	return recs
}

// AddACL adds a to the broker's ACLs, as an administrator's CreateACLs
// request does (the test's clients must log in as a superuser), and fails
// the test if the broker refuses it or has not answered within 30 s. The
// broker checks ACLs only when started with kfake.EnableACLs; the next
// request of any client is checked against the new set. An empty Host is
// any host, as for kfake.User.
func (k *Kafka) AddACL(a kfake.ACL) {
	k.t.Helper()
	c := kmsg.NewCreateACLsRequestCreation()
	c.Principal, c.Host = a.Principal, a.Host
	if c.Host == "" {
		c.Host = "*"
	}
	c.ResourceType, c.ResourceName, c.ResourcePatternType = a.Resource, a.Name, a.Pattern
	c.Operation, c.PermissionType = a.Operation, kmsg.ACLPermissionTypeDeny
	if a.Allow {
		c.PermissionType = kmsg.ACLPermissionTypeAllow
	}
	req := kmsg.NewPtrCreateACLsRequest()
	req.Creations = append(req.Creations, c)
	resp := k.request(fmt.Sprintf("adding the ACL %+v", a), req).(*kmsg.CreateACLsResponse)
	var err error
	if len(resp.Results) != 1 {
		err = errors.New("no result for the creation")
	} else {
		err = kerr.ErrorForCode(resp.Results[0].ErrorCode)
	}
	if err != nil {
		k.t.Fatalf("adding the ACL %+v: %v", a, err)
	}
}

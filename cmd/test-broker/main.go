// Command test-broker is the tests' Kafka-protocol broker (kfake) as a
// program, for the container tests: scripts/image-test puts it in a local
// image that stands in for Kafka where no Kafka image can be pulled.
//
//	test-broker serve -port N              run a one-node broker on 127.0.0.1:N until SIGTERM
//	test-broker create-topics -brokers HOST:PORT -partitions N TOPIC...
//	test-broker ping -brokers HOST:PORT    exit 0 once the broker answers
//
// It is not a Kafka: see docs/testing.md, "Test broker", for where its group
// coordinator differs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

const usage = `usage: test-broker serve -port N
       test-broker create-topics -brokers HOST:PORT[,...] [-partitions N] TOPIC...
       test-broker ping -brokers HOST:PORT[,...]`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	port := fs.Int("port", 9092, "serve: the port to listen on, on 127.0.0.1")
	brokers := fs.String("brokers", "127.0.0.1:9092", "create-topics, ping: the broker's address")
	partitions := fs.Int("partitions", 1, "create-topics: partitions per topic")
	timeout := fs.Duration("timeout", 10*time.Second, "create-topics, ping: how long to try")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, *port, stdout)
	case "create-topics":
		if fs.NArg() == 0 || *partitions < 1 {
			fmt.Fprintln(stderr, usage)
			return 2
		}
		err = withAdmin(ctx, *brokers, *timeout, func(ctx context.Context, adm *kadm.Client) error {
			return createTopics(ctx, adm, int32(*partitions), fs.Args(), stdout)
		})
	case "ping":
		err = withAdmin(ctx, *brokers, *timeout, func(ctx context.Context, adm *kadm.Client) error {
			_, err := adm.ListBrokers(ctx)
			return err
		})
	default:
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "test-broker %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// serve runs a one-node broker on 127.0.0.1:port (kfake listens on
// loopback only) until ctx ends. Topics are made by create-topics, as
// with a Kafka that does not create them on first use. Its groups take
// session timeouts from 500 ms, as in the tests.
func serve(ctx context.Context, port int, stdout io.Writer) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("-port %d: want 1 to 65535", port)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(stdout, "test-broker: listening on %s\n", strings.Join(c.ListenAddrs(), ","))
	<-ctx.Done()
	fmt.Fprintln(stdout, "test-broker: stopping")
	return nil
}

// withAdmin calls f with an admin client of brokers, within timeout.
func withAdmin(ctx context.Context, brokers string, timeout time.Duration, f func(context.Context, *kadm.Client) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.RetryTimeout(timeout))
	if err != nil {
		return err
	}
	defer cl.Close()
	return f(ctx, kadm.NewClient(cl))
}

// createTopics makes each topic with partitions partitions, replication 1;
// a topic that exists already is left as it is.
func createTopics(ctx context.Context, adm *kadm.Client, partitions int32, topics []string, stdout io.Writer) error {
	res, err := adm.CreateTopics(ctx, partitions, 1, nil, topics...)
	if err != nil {
		return err
	}
	for _, r := range res.Sorted() {
		switch {
		case r.Err == nil:
			fmt.Fprintf(stdout, "test-broker: created %s, %d partitions\n", r.Topic, partitions)
		case errors.Is(r.Err, kerr.TopicAlreadyExists):
			fmt.Fprintf(stdout, "test-broker: %s exists\n", r.Topic)
		default:
			return fmt.Errorf("creating %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

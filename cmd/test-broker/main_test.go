package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/redisproc"
)

// The broker serves on the port asked; create-topics makes the topics with
// their partitions and leaves an existing one; ping answers 0 while it
// serves and 1 once it is gone.
func TestServeCreateTopicsPing(t *testing.T) {
	port, err := redisproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, port, io.Discard) }()
	call := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, out := call("ping", "-brokers", addr); code != 0 {
		t.Fatalf("ping while serving: exit %d, %s", code, out)
	}
	if code, out := call("create-topics", "-brokers", addr, "-partitions", "6", "in", "out"); code != 0 || !strings.Contains(out, "created in, 6 partitions") {
		t.Fatalf("create-topics: exit %d, %s", code, out)
	}
	if code, out := call("create-topics", "-brokers", addr, "-partitions", "3", "in"); code != 0 || !strings.Contains(out, "in exists") {
		t.Errorf("create-topics of an existing topic: exit %d, %s", code, out)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	details, err := kadm.NewClient(cl).ListTopics(ctx, "in", "out")
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"in", "out"} {
		if n := len(details[topic].Partitions); n != 6 {
			t.Errorf("%s has %d partitions, want 6", topic, n)
		}
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return within 10 s of its context's end")
	}
	if code, out := call("ping", "-brokers", addr, "-timeout", "1s"); code != 1 || !strings.Contains(out, "test-broker ping:") {
		t.Errorf("ping with no broker: exit %d, %s; want 1 and a line naming the command", code, out)
	}
	if code, _ := call("serve", "-port", "0"); code != 1 {
		t.Errorf("serve -port 0: exit %d, want 1", code)
	}
	if code, _ := call("create-topics", "-brokers", addr); code != 2 {
		t.Errorf("create-topics without a topic: exit %d, want 2", code)
	}
}

package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"

	"dedupe-worker/internal/redisproc"
)

// broker is the broker child: a one-node Kafka-protocol broker on -port
// holding every topic, until SIGTERM. It says "ready" once it listens.
func broker(o options) error {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(o.port),
		kfake.SeedTopics(int32(o.partitions), inTopic, copyTopic, outTopic, dlqTopic))
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("ready")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}

// startBroker starts the broker child on a free port and waits until it
// is ready. It returns the broker's address and what stops it.
func startBroker(self string, o options) (addr string, stop func(), err error) {
	port, err := redisproc.FreePort()
	if err != nil {
		return "", nil, err
	}
	bro := exec.Command(self, "-role", "broker", "-port", strconv.Itoa(port), "-partitions", strconv.Itoa(o.partitions))
	bro.Stderr = os.Stderr
	out, _ := bro.StdoutPipe()
	if err := bro.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { bro.Process.Signal(syscall.SIGTERM); bro.Wait() }
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "ready" {
		stop()
		return "", nil, fmt.Errorf("broker did not start: %q", line)
	}
	return "127.0.0.1:" + strconv.Itoa(port), stop, nil
}

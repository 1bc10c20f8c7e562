// Command demo runs the whole click pipeline on this machine and verifies
// it: a Kafka-protocol broker (kfake), a redis-server, a click generator,
// two dedupe-worker replicas in one consumer group and a verifier that
// knows every duplicate. It needs Go and redis-server 7 or later on the
// PATH, nothing else.
//
//	go run ./cmd/demo [-n 200000] [-dup 0.07] [-bad 0.01] [-window 10m] [-p 1e-6] ...
//
// The test machinery it links (kfake, redisproc, clickstream) is why it is
// a command of its own: the dedupe-worker binary links none of it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"dedupe-worker/internal/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := demo.RunDemo(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Command clicks plays click traffic against a real Kafka, for the
// docker-compose demo and for trying a pipeline by hand. It is not part of
// the worker's image: the Dockerfile builds it into an image of its own.
//
//	clicks generate   produce click events to DEDUPE_INPUT_TOPIC
//	clicks count      count DEDUPE_OUTPUT_TOPIC by dedupe-source
//
// Both read DEDUPE_KAFKA_BROKERS and their topic variable, the worker's
// own names, so one env file serves the worker and its traffic.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: clicks generate [flags] | count [flags]
  generate  produce click events to DEDUPE_INPUT_TOPIC on DEDUPE_KAFKA_BROKERS,
            retrying until Kafka is up; flags -n (0: forever), -rate, -dup, -bad, -seed
  count     count DEDUPE_OUTPUT_TOPIC on DEDUPE_KAFKA_BROKERS by dedupe-source
            from the start until SIGTERM, printing running totals`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "generate":
		return RunGenerate(ctx, args[1:], stdout, stderr)
	case "count":
		return RunCount(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	}
	fmt.Fprintln(stderr, usage)
	return 2
}

// newFlagSet is the flag set of subcommand name: errors and usage, with
// what the subcommand does, go to stderr.
func newFlagSet(name, does string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: clicks %s [flags]\n\n%s\n", name, does)
		fs.PrintDefaults()
	}
	return fs
}

// Command dedupe-worker removes duplicate events from a Kafka topic.
//
//	dedupe-worker          run a worker configured by DEDUPE_* variables
//	dedupe-worker plan     print the filter sizing for n, p and a window
//	dedupe-worker stats    print the live filter statistics from Redis
//	dedupe-worker explain  say what the filter holds for an ID, or what was decided for an offset
//
// The demo (cmd/demo) and the click traffic tools (cmd/clicks) are
// commands of their own, so that this binary links no test machinery.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage: dedupe-worker [run | plan [flags] | stats | explain [flags]]
  run       consume, deduplicate and forward (the default); configured by DEDUPE_* variables
  plan      print the filter sizing and the memory of the windows live at once;
            flags -n, -p, -window, -mode, -max-lag, -shards default to the DEDUPE_* values
  stats     print the live filter statistics of the configured pipeline
  explain   read-only: -id ID -time T: the buckets, shard and stages a copy of the ID
            decided now would test, and whether each holds it; the ID may be given as
            -id-hex HEX (a binary key or header), -part P once per field of a composite,
            or -value FILE (DEDUPE_ID_FROM=value); -source topic/partition/offset
            (with the ID when there are several shards): the recorded verdict, or why there is none`

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch cmd {
	case "run":
		return runWorker(ctx, stderr)
	case "plan":
		return plan(args, stdout, stderr)
	case "stats":
		return stats(ctx, stdout, stderr)
	case "explain":
		return explain(ctx, args, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	}
	fmt.Fprintln(stderr, usage)
	return 2
}

// runWorker runs the worker the DEDUPE_* variables describe until ctx
// ends. A configuration it cannot load exits 2, one it cannot build or run
// 1, each with one line naming the cause.
func runWorker(ctx context.Context, stderr io.Writer) int {
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker:", err)
		return 2
	}
	log, err := newLogger(cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker:", err)
		return 2
	}
	defer log.Sync()
	w, err := app.New(cfg, log)
	if err == nil {
		err = w.Run(ctx)
	}
	if err != nil {
		log.Error("exiting", zap.Error(err))
		return 1
	}
	return 0
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	return cfg.Build()
}

func stats(ctx context.Context, stdout, stderr io.Writer) int {
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker:", err)
		return 2
	}
	rc, err := app.NewRedis(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker:", err)
		return 2
	}
	defer rc.Close()
	f, err := app.NewFilter(cfg, rc)
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker:", err)
		return 2
	}
	st, err := f.Stats(ctx, time.Now())
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker stats:", err)
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "window start (UTC)\tshard\tkey\tstate\tstages\tbits set\tfill (newest stage)\test. elements\tfalse-positive rate\toverfilled\ttest-only\tTTL\tbytes")
	missing := 0
	for _, s := range st {
		state := "live"
		switch {
		case s.Missing:
			state = "MISSING"
			missing++
		case !s.Exists:
			state = "expired"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%.4f\t%.0f\t%.2g\t%d\t%d\t%v\t%d\n", s.Start.Format(time.RFC3339), s.Shard, s.Key, state, s.Stages,
			s.BitsSet, s.Fill, s.Elements, s.FPR, s.Overfilled, s.TestOnly, s.TTL.Round(time.Second), s.Memory)
	}
	tw.Flush()
	if missing > 0 {
		fmt.Fprintf(stdout, "%d window keys MISSING though their windows are due to live: lost (a Redis restart without persistence, a flush, a failover to a replica that had not caught up; the workers log and count it, dedupe_filter_keys_lost_total), or no worker ran then\n", missing)
	}
	return 0
}

package demo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

// RunDemo is the demo command: it parses args, runs the demo with the
// progress on stderr and prints the report on stdout. It returns the exit
// code: 0 when the verifier found nothing lost, 1 otherwise or when the
// run failed, 2 for bad flags.
func RunDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./cmd/demo [flags]\n\nRuns a broker, redis-server, a click generator, two worker replicas and a verifier on this machine.")
		fs.PrintDefaults()
	}
	var o Options
	fs.IntVar(&o.N, "n", 200_000, "click events to produce")
	fs.Float64Var(&o.Dup, "dup", 0.07, "share of events that repeat an earlier click exactly")
	fs.Float64Var(&o.Bad, "bad", 0.01, "share of malformed events")
	fs.DurationVar(&o.Window, "window", 10*time.Minute, "deduplication window (rolling)")
	fs.Float64Var(&o.P, "p", 1e-6, "target false-positive rate of the filter at its capacity")
	fs.Int64Var(&o.Expected, "expected", 0, "filter capacity in distinct IDs per window (0: the distinct IDs this run will have)")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the click generator")
	fs.DurationVar(&o.Behind, "behind", 0, "stamp the events this long before the clock: a backlog read after an outage")
	fs.DurationVar(&o.MaxLag, "max-lag", time.Hour, "the workers' lag bound, DEDUPE_MAX_LAG")
	fs.Float64Var(&o.MaxGrowth, "max-growth", 64, "how far a window may grow past -expected, DEDUPE_MAX_GROWTH (1: no growth)")
	fs.StringVar(&o.IDFrom, "id-from", "json", "where the workers read the ID, DEDUPE_ID_FROM: json (the click_id field), key, header or value (a hash of the value)")
	fs.StringVar(&o.Mode, "mode", "drop", "the workers' DEDUPE_MODE: drop, or shadow (forward every event, duplicates marked)")
	fs.BoolVar(&o.Verbose, "v", false, "show the workers' warnings as they are logged")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dedupe-worker demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	o.Progress, o.Terminal = stderr, isTerminal(stderr)
	res, err := Run(ctx, o)
	if err != nil && ctx.Err() != nil {
		fmt.Fprintln(stderr, "\ndedupe-worker demo: interrupted; everything it started is stopped")
		return 1
	}
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker demo:", err)
		if errors.Is(err, ErrInvalidOptions) {
			return 2
		}
		if res != nil && res.Log != "" {
			fmt.Fprintf(stderr, "the workers logged:\n%s", res.Log)
		}
		return 1
	}
	res.Print(stdout)
	if !res.OK() {
		if res.Log != "" {
			fmt.Fprintf(stderr, "the workers logged:\n%s", res.Log)
		}
		return 1
	}
	return 0
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

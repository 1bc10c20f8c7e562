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
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
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
		if err := app.Run(ctx, cfg, log); err != nil {
			log.Error("exiting", zap.Error(err))
			return 1
		}
		return 0
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

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	return cfg.Build()
}

// envOr is the value of variable name (DEDUPE_ and name) read with
// parse, or def when it is not set. A value parse refuses is added to
// *bad, which plan reports instead of planning with the default.
func envOr[T any](bad *[]string, name string, def T, parse func(string) (T, error)) T {
	v, ok := os.LookupEnv(config.Prefix + "_" + name)
	if !ok || v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		*bad = append(*bad, fmt.Sprintf("%s_%s=%q: %v", config.Prefix, name, v, err))
		return def
	}
	return x
}

func plan(args []string, stdout, stderr io.Writer) int {
	// A misspelt variable would leave its flag at the default unnoticed.
	if err := config.CheckUnknown(os.Environ()); err != nil {
		fmt.Fprintln(stderr, "dedupe-worker plan:", err)
		return 2
	}
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// Each flag defaults to the pipeline's variable, or to its default.
	d := config.Defaults()
	var bad []string
	parseInt := func(s string) (int, error) { return strconv.Atoi(s) }
	parseInt64 := func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	parseFloat := func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }
	parseString := func(s string) (string, error) { return s, nil }
	n := fs.Int64("n", envOr(&bad, "EXPECTED_PER_WINDOW", d.ExpectedPerWindow, parseInt64), "distinct IDs expected per window")
	p := fs.Float64("p", envOr(&bad, "FALSE_POSITIVE_RATE", d.FalsePositiveRate, parseFloat), "target false-positive rate")
	window := fs.Duration("window", envOr(&bad, "WINDOW", d.Window, time.ParseDuration), "window length")
	mode := fs.String("mode", envOr(&bad, "WINDOW_MODE", d.WindowMode, parseString), "rolling or fixed")
	maxLag := fs.Duration("max-lag", envOr(&bad, "MAX_LAG", d.MaxLag, time.ParseDuration), "lag bound: how long after their event time events are still deduplicated")
	shards := fs.Int("shards", envOr(&bad, "SHARDS", d.Shards, parseInt), "least number of shards")
	growth := fs.Float64("max-growth", envOr(&bad, "MAX_GROWTH", d.MaxGrowth, parseFloat), "how far a window may grow past n (1: no growth)")
	factor := fs.Float64("memory-factor", envOr(&bad, "MEMORY_FACTOR", d.MemoryFactor, parseFloat), "most memory per ID, as a multiple of a classic filter's at stage 0's rate, within which the planner takes the fewest words, then the fewest shards")
	layout := fs.String("layout", envOr(&bad, "LAYOUT", d.Layout, parseString), "words x bits per word (4x4) instead of the planner's choice")
	redisTimeout := fs.Duration("redis-timeout", envOr(&bad, "REDIS_TIMEOUT", d.RedisTimeout, time.ParseDuration), "bound of one Redis call: with the size, how long before a window starts its keys are made")
	filter := fs.String("filter", envOr(&bad, "FILTER", d.Filter, parseString), "the filter kind: bloom or fingerprint (DEDUPE_FILTER)")
	rate := fs.Float64("rate", 0, "events per second: with it, the Redis cores and masters each kind needs at that rate")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if len(bad) > 0 {
		fmt.Fprintf(stderr, "dedupe-worker plan: %s\n", strings.Join(bad, "; "))
		return 2
	}
	var pinned bloom.Layout
	if *layout != "" {
		l, err := bloom.ParseLayout(*layout)
		if err != nil {
			fmt.Fprintln(stderr, "dedupe-worker plan:", err)
			return 2
		}
		pinned = l
	}
	m, err := bloom.ParseMode(*mode)
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker plan:", err)
		return 2
	}
	kind, err := bloom.ParseKind(*filter)
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker plan:", err)
		return 2
	}
	if kind != bloom.KindBloom && *layout != "" {
		fmt.Fprintln(stderr, "dedupe-worker plan: -layout is a Bloom filter's words and bits; not for -filter", kind)
		return 2
	}
	ids, err := idLine()
	if err != nil {
		fmt.Fprintln(stderr, "dedupe-worker plan:", err)
		return 2
	}
	if ids != "" {
		fmt.Fprintln(stdout, ids)
	}
	win := bloom.Window{Length: *window, Mode: m, MaxLag: *maxLag}
	// liveOf is how many windows of keys a plan keeps live at most: the
	// next window's keys are made PreallocateLead before it starts.
	liveOf := func(pl bloom.Plan) (int, time.Duration) {
		lead := bloom.PreallocateLead(pl, win, *redisTimeout)
		return win.Live(lead), lead
	}
	tw := tabwriter.NewWriter(stdout, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "n per window\twindow\ttarget p\tlayout\tshards\tbits/ID\tclassic bits/ID (k)\tMiB per window\twindows live\tMiB live\tachieved p")
	live := 0
	opt := bloom.PlanOptions{MinShards: *shards, MaxGrowth: *growth, MemoryFactor: *factor, Layout: pinned, Kind: kind}
	var asked bloom.Plan // the plan at -p, the first row
	for _, target := range []float64{*p, 1e-2, 1e-4, 1e-6, 1e-9} {
		pl, err := bloom.NewPlan(*n, target, opt)
		if err != nil {
			fmt.Fprintln(stderr, "dedupe-worker plan:", err)
			return 2
		}
		rowLive, lead := liveOf(pl)
		if live == 0 {
			live, asked = rowLive, pl
			fmt.Fprintf(stdout, "%s windows of %v with a lag bound of %v: at most %d windows of keys live at once at p = %g (the next window's keys are made %v before it starts; an event stamped ahead of the clock is deduplicated if its window starts within that lead, else it is future)\n",
				*mode, *window, *maxLag, live, target, lead.Round(time.Second))
			switch {
			case kind == bloom.KindFingerprint:
				fmt.Fprintf(stdout, "filter: fingerprint (-filter, DEDUPE_FILTER): tables of fingerprints of B bytes, the least memory whose rate holds at a load of at most %g; fpBxK is B-byte fingerprints in K keys per shard\n", bloom.FingerprintMaxLoad)
			case *layout != "":
				fmt.Fprintf(stdout, "layout: %s, as set (-layout, DEDUPE_LAYOUT): W words of B bits per ID\n", *layout)
			default:
				fmt.Fprintf(stdout, "layout: the fewest words per ID (each a Redis read, and a write for a new ID), then the fewest shards (each a script call per batch), whose window takes at most %gx the memory of a classic filter at stage 0's rate (-memory-factor, DEDUPE_MEMORY_FACTOR); WxB is W words of B bits\n", *factor)
			}
		}
		shape := pl.Layout.String()
		if pl.Kind == bloom.KindFingerprint {
			shape = fmt.Sprintf("fp%dx%d", pl.Stages[0].Bytes, pl.Stages[0].Parts)
		}
		fmt.Fprintf(tw, "%d\t%v\t%g\t%s\t%d\t%.1f\t%.1f (%d)\t%.0f\t%d\t%.0f\t%.2g\n", *n, *window, target,
			shape, pl.Shards, pl.BitsPerElement(),
			float64(pl.Standard.Bits)/float64(*n), pl.Standard.Hashes,
			float64(pl.Memory)/(1<<20), rowLive, float64(pl.Memory)*float64(rowLive)/(1<<20), pl.AchievedFPR)
		if target == *p && len(args) > 0 {
			break
		}
	}
	tw.Flush()
	if err := compareKinds(stdout, *n, *p, opt, win, *redisTimeout, *rate); err != nil {
		fmt.Fprintln(stderr, "dedupe-worker plan:", err)
		return 2
	}
	pl := asked
	if !pl.Growth() {
		return 0
	}
	fmt.Fprintf(stdout, "\ngrowth at p = %g: up to %d stages, the first at %g of p, each next taking the window to %dx at half the rate of the one before, %d IDs per window in all (%.0fx)\n",
		*p, len(pl.Stages), bloom.StageZeroShare, bloom.GrowthFactor, pl.Capacity(), float64(pl.Capacity())/float64(*n))
	if float64(pl.Capacity()) < *growth*float64(*n) {
		fmt.Fprintf(stdout, "a further stage would take more than %d keys of 128 MiB: the window grows to %.0fx, not %gx\n",
			bloom.MaxShards, float64(pl.Capacity())/float64(*n), *growth)
	}
	tw = tabwriter.NewWriter(stdout, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "load\tIDs per window\tstages\tkeys per shard of the newest\tMiB per window\tMiB live\tbound on p\tRedis reads+writes per new ID (BITFIELD sub-ops, or GETRANGE/SETRANGE calls)")
	for _, load := range []float64{1, 4, 16, 64} {
		mem, k := pl.GrownMemory(load)
		// The newest stage is read whole and written, each older stage
		// tested by one word (rarely more), and in rolling mode the previous
		// bucket's stages likewise.
		ops := 2*pl.Layout.Words + k - 1
		if m == bloom.Rolling {
			ops += k
		}
		if pl.Kind == bloom.KindFingerprint {
			// A read of each stage, of the bucket before's too, and a write.
			ops = k + 1
			if m == bloom.Rolling {
				ops += k
			}
		}
		fmt.Fprintf(tw, "%gx\t%d\t%d\t%d\t%.0f\t%.0f\t%.2g\t%d\n", load, int64(load*float64(*n)), k, pl.Stages[k-1].Parts, float64(mem)/(1<<20),
			float64(mem)*float64(live)/(1<<20), pl.GrownFPR(load), ops)
	}
	tw.Flush()
	return 0
}

// idLine says where the configured pipeline's IDs come from and what its
// mode does, when any of those variables is set: the sizing is the same
// for every source and mode, the line is there to check the variables.
// The error names a variable out of range.
func idLine() (string, error) {
	vars := map[string]string{}
	for _, name := range []string{"ID_FROM", "ID_FIELD", "ID_HEADER", "MODE"} {
		if v, ok := os.LookupEnv(config.Prefix + "_" + name); ok {
			vars[name] = v
		}
	}
	if len(vars) == 0 {
		return "", nil
	}
	src, err := config.ParseIDSource(vars["ID_FROM"], vars["ID_FIELD"], vars["ID_HEADER"])
	if err != nil {
		return "", err
	}
	mode := config.Defaults().Mode
	if v := vars["MODE"]; v != "" {
		mode = v
	}
	switch mode {
	case config.ModeDrop:
		return fmt.Sprintf("IDs: %s; mode drop: duplicates are dropped", src), nil
	case config.ModeShadow:
		return fmt.Sprintf("IDs: %s; mode shadow: every valid event is forwarded, duplicates marked dedupe-verdict: duplicate, in the same filters as drop", src), nil
	default:
		return "", fmt.Errorf("%w: %s_MODE: %q: want %s or %s", config.ErrInvalid, config.Prefix, mode, config.ModeDrop, config.ModeShadow)
	}
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

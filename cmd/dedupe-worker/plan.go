package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
)

// planFlags are plan's flags by the variable each stands for, without
// the prefix: a flag set on the command line replaces its variable.
var planFlags = map[string]string{"EXPECTED_PER_WINDOW": "n", "FALSE_POSITIVE_RATE": "p", "WINDOW": "window", "WINDOW_MODE": "mode",
	"MAX_LAG": "max-lag", "SHARDS": "shards", "MAX_GROWTH": "max-growth", "MEMORY_FACTOR": "memory-factor", "LAYOUT": "layout",
	"REDIS_TIMEOUT": "redis-timeout", "FILTER": "filter"}

// plan prints the filter sizing of the pipeline the DEDUPE_* variables
// describe, read and checked as the worker reads and checks them
// (config.LoadSizing), with the flags in place of their variables.
func plan(args []string, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, "dedupe-worker plan:", err)
		return 2
	}
	cfg, err := config.LoadSizing()
	if err != nil {
		return fail(err)
	}
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rate := bindPlanFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := cfg.ValidateSizing(); err != nil {
		return fail(flagError(fs, err))
	}
	ids, err := idLine(cfg)
	if err != nil {
		return fail(err)
	}
	if ids != "" {
		fmt.Fprintln(stdout, ids)
	}
	// With a flag, the rate asked for; else the common rates beside it.
	asked, err := printPlans(stdout, cfg, len(args) == 0)
	if err != nil {
		return fail(err)
	}
	if err := compareKinds(stdout, cfg, *rate); err != nil {
		return fail(err)
	}
	if asked.Plan.Growth() {
		printGrowth(stdout, cfg, asked)
	}
	return 0
}

// bindPlanFlags sets each flag of planFlags to write its field of c,
// defaulting to the field's value, and returns -rate.
func bindPlanFlags(fs *flag.FlagSet, c *config.Config) (rate *float64) {
	fs.Int64Var(&c.ExpectedPerWindow, "n", c.ExpectedPerWindow, "distinct IDs expected per window")
	fs.Float64Var(&c.FalsePositiveRate, "p", c.FalsePositiveRate, "target false-positive rate")
	fs.DurationVar(&c.Window, "window", c.Window, "window length")
	fs.StringVar(&c.WindowMode, "mode", c.WindowMode, "rolling or fixed")
	fs.DurationVar(&c.MaxLag, "max-lag", c.MaxLag, "lag bound: how long after their event time events are still deduplicated")
	fs.IntVar(&c.Shards, "shards", c.Shards, "least number of shards")
	fs.Float64Var(&c.MaxGrowth, "max-growth", c.MaxGrowth, "how far a window may grow past n (1: no growth)")
	fs.Float64Var(&c.MemoryFactor, "memory-factor", c.MemoryFactor, "most memory per ID, as a multiple of a classic filter's at stage 0's rate, within which the planner takes the fewest words, then the fewest shards")
	fs.StringVar(&c.Layout, "layout", c.Layout, "words x bits per word (4x4) instead of the planner's choice")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", c.RedisTimeout, "bound of one Redis call: with the size, how long before a window starts its keys are made")
	fs.StringVar(&c.Filter, "filter", c.Filter, "the filter kind: bloom or fingerprint (DEDUPE_FILTER)")
	return fs.Float64("rate", 0, "events per second: with it, the Redis cores and masters each kind needs at that rate")
}

// flagError names the flag of a variable out of range when the value came
// from that flag: -layout rather than DEDUPE_LAYOUT.
func flagError(fs *flag.FlagSet, err error) error {
	ve, ok := errors.AsType[*config.VarError](err)
	if !ok {
		return err
	}
	name, set := planFlags[ve.Var], false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if !set {
		return err
	}
	return fmt.Errorf("-%s: %s", name, ve.Msg)
}

// idLine says where the configured pipeline's IDs come from and what its
// mode does, when any of those variables is set: the sizing is the same
// for every source and mode, the line is there to check the variables.
// The error names a variable out of range.
func idLine(cfg config.Config) (string, error) {
	modes, err := cfg.Modes()
	if err != nil {
		return "", err
	}
	d := config.Defaults()
	if cfg.IDFrom == d.IDFrom && cfg.IDField == "" && cfg.IDHeader == "" && cfg.Mode == d.Mode {
		return "", nil
	}
	src, err := cfg.IDSource()
	if err != nil {
		return "", err
	}
	if modes.Shadow {
		return fmt.Sprintf("IDs: %s; mode shadow: every valid event is forwarded, duplicates marked dedupe-verdict: duplicate, in the same filters as drop", src), nil
	}
	return fmt.Sprintf("IDs: %s; mode drop: duplicates are dropped", src), nil
}

// printPlans prints the plan at cfg's rate, and with common the plans at
// the common rates after it, and returns the first.
func printPlans(w io.Writer, cfg config.Config, common bool) (config.Sizing, error) {
	asked, err := cfg.Sizing()
	if err != nil {
		return asked, err
	}
	win := asked.Window
	fmt.Fprintf(w, "%s windows of %v with a lag bound of %v: at most %d windows of keys live at once at p = %g (the next window's keys are made %v before it starts; an event stamped ahead of the clock is deduplicated if its window starts within that lead, else it is future)\n",
		win.Mode, win.Length, win.MaxLag, asked.Live, cfg.FalsePositiveRate, asked.Lead.Round(time.Second))
	switch {
	case asked.Plan.Kind == bloom.KindFingerprint:
		fmt.Fprintf(w, "filter: fingerprint (-filter, DEDUPE_FILTER): tables of fingerprints of B bytes, the least memory whose rate holds at a load of at most %g; fpBxK is B-byte fingerprints in K keys per shard\n", bloom.FingerprintMaxLoad)
	case cfg.Layout != "":
		fmt.Fprintf(w, "layout: %s, as set (-layout, DEDUPE_LAYOUT): W words of B bits per ID\n", cfg.Layout)
	default:
		fmt.Fprintf(w, "layout: the fewest words per ID (each a Redis read, and a write for a new ID), then the fewest shards (each a script call per batch), whose window takes at most %gx the memory of a classic filter at stage 0's rate (-memory-factor, DEDUPE_MEMORY_FACTOR); WxB is W words of B bits\n", cfg.MemoryFactor)
	}
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "n per window\twindow\ttarget p\tlayout\tshards\tbits/ID\tclassic bits/ID (k)\tMiB per window\twindows live\tMiB live\tachieved p")
	rates := []float64{cfg.FalsePositiveRate}
	if common {
		rates = append(rates, 1e-2, 1e-4, 1e-6, 1e-9)
	}
	for _, p := range rates {
		s, err := cfg.SizingAt(p)
		if err != nil {
			return asked, err
		}
		pl, n := s.Plan, float64(cfg.ExpectedPerWindow)
		fmt.Fprintf(tw, "%d\t%v\t%g\t%s\t%d\t%.1f\t%.1f (%d)\t%.0f\t%d\t%.0f\t%.2g\n", cfg.ExpectedPerWindow, win.Length, p, s.Shape(), pl.Shards,
			pl.BitsPerElement(), float64(pl.Standard.Bits)/n, pl.Standard.Hashes, mib(pl.Memory), s.Live, mib(s.LiveMemory()), pl.AchievedFPR)
	}
	return asked, tw.Flush()
}

// printGrowth prints how the asked plan's window grows: its stages, and a
// row per load.
func printGrowth(w io.Writer, cfg config.Config, s config.Sizing) {
	pl := s.Plan
	fmt.Fprintf(w, "\ngrowth at p = %g: up to %d stages, the first at %g of p, each next taking the window to %dx at half the rate of the one before, %d IDs per window in all (%.0fx)\n",
		cfg.FalsePositiveRate, len(pl.Stages), bloom.StageZeroShare, bloom.GrowthFactor, pl.Capacity(), s.GrowsTo())
	if s.GrowsTo() < cfg.MaxGrowth {
		fmt.Fprintf(w, "a further stage would take more than %d keys of 128 MiB: the window grows to %.0fx, not %gx\n", bloom.MaxShards, s.GrowsTo(), cfg.MaxGrowth)
	}
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "load\tIDs per window\tstages\tkeys per shard of the newest\tMiB per window\tMiB live\tbound on p\tRedis reads+writes per new ID (BITFIELD sub-ops, or GETRANGE/SETRANGE calls)")
	for _, load := range []float64{1, 4, 16, 64} {
		g := s.Grown(load)
		fmt.Fprintf(tw, "%gx\t%d\t%d\t%d\t%.0f\t%.0f\t%.2g\t%d\n", g.Load, g.IDs, g.Stages, g.Parts, mib(g.Memory), mib(g.LiveMemory), g.FPR, g.Ops)
	}
	tw.Flush()
}

// mib is bytes in MiB.
func mib(bytes uint64) float64 { return float64(bytes) / (1 << 20) }

package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"dedupe-worker/config"
)

// options are the bench's flags.
type options struct {
	n       int
	naiveN  int
	dup     float64
	batch   int
	p       float64
	methods string
	seed    uint64
	// backlog stamps the IDs a day before the clock, in a bucket that has
	// ended, as a backlog read after an outage.
	backlog bool
	// load is the distinct IDs over the planned n; growth the window's
	// DEDUPE_MAX_GROWTH.
	load, growth float64
	window       time.Duration
	maxLag       time.Duration
	// memoryFactor and layout choose the layout, as DEDUPE_MEMORY_FACTOR
	// and DEDUPE_LAYOUT do.
	memoryFactor float64
	layout       string
	// shards is the least shards per window, as DEDUPE_SHARDS.
	shards int
	// filter is the kind, as DEDUPE_FILTER.
	filter string
	// steady fills the window before the measured one first, as a
	// pipeline's steady state has it: a rolling test reads it.
	steady bool
}

// cases are named runs: flags given beside one override it.
var cases = map[string]func(o *options){
	// The click-log pipeline of the seed: a billion events a day, 7 million
	// distinct IDs per 10-minute window, at the rate it chose.
	"seed": func(o *options) {
		o.dup = 0.07
		o.n = int(math.Round(7_000_000 / (1 - o.dup)))
		o.p, o.window, o.methods = 1e-9, 10*time.Minute, "engine-rolling,setnx"
		// Planned 2% above the IDs it gets, as a pipeline is sized with
		// room: a window filled to its plan at the bench's rate makes its
		// next stage ahead of need, which the bytes per ID would count.
		o.load = 0.98
		// The window before full, as in a pipeline running for a while.
		o.steady = true
	},
}

// parseFlags reads the command line: the flags, the product's defaults
// where they say nothing, and a -case under the flags given beside it.
// It reports false when the command line is wrong, having said why.
func parseFlags() (options, bool) {
	var o options
	d := config.Defaults()
	caseName := flag.String("case", "", "a named run: seed (7 million distinct IDs per 10-minute window at p = 1e-9, planned 2% above, rolling with the window before full, against SET NX); other flags override it")
	flag.IntVar(&o.n, "n", 10_000_000, "IDs to test (16 bytes each)")
	flag.IntVar(&o.naiveN, "naive-n", 300_000, "IDs for the naive SETBIT script, which is slow")
	flag.Float64Var(&o.dup, "dup", 0.07, "share of IDs that repeat an earlier one")
	flag.IntVar(&o.batch, "batch", 1000, "IDs per batch")
	flag.Float64Var(&o.p, "p", d.FalsePositiveRate, "target false-positive rate (DEDUPE_FALSE_POSITIVE_RATE)")
	flag.DurationVar(&o.window, "window", d.Window, "window length (DEDUPE_WINDOW)")
	flag.StringVar(&o.methods, "methods", "engine-rolling,engine-fixed,setnx,naive", "methods to run, comma-separated")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the ID stream")
	flag.Float64Var(&o.load, "load", 1, "distinct IDs over the filter's planned n: above 1 the window grows (with -growth above 1)")
	flag.Float64Var(&o.growth, "growth", d.MaxGrowth, "how far a window may grow past its planned n (DEDUPE_MAX_GROWTH; 1: no growth)")
	flag.IntVar(&o.shards, "shards", d.Shards, "least keys per window (DEDUPE_SHARDS)")
	flag.StringVar(&o.filter, "filter", "bloom", "the filter kind: bloom or fingerprint (DEDUPE_FILTER)")
	flag.BoolVar(&o.steady, "steady", false, "fill the window before the measured one first, with as many other IDs (not measured): a rolling test then reads a full previous window, as in a pipeline's steady state")
	flag.Float64Var(&o.memoryFactor, "memory-factor", d.MemoryFactor, "most memory per ID as a multiple of a classic filter's at stage 0's rate, within which the planner takes the fewest words, then the fewest shards (DEDUPE_MEMORY_FACTOR)")
	flag.StringVar(&o.layout, "layout", d.Layout, "words x bits per word (4x4) instead of the planner's choice (DEDUPE_LAYOUT)")
	flag.DurationVar(&o.maxLag, "max-lag", d.MaxLag, "lag bound (DEDUPE_MAX_LAG): a run that outlasts it past its window's end gets late verdicts and fails")
	flag.BoolVar(&o.backlog, "backlog", false, "stamp the IDs a day back, in a window that has ended (a backlog; a 48h lag bound keeps it)")
	flag.Parse()
	if *caseName == "" {
		return o, true
	}
	set, ok := cases[*caseName]
	if !ok {
		fmt.Fprintf(os.Stderr, "bloom-bench: -case %q: want seed\n", *caseName)
		return o, false
	}
	set(&o)
	// Flags given beside the case win over it: parsed again, they set
	// only what they name.
	if err := flag.CommandLine.Parse(os.Args[1:]); err != nil {
		return o, false
	}
	return o, true
}

package main

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
)

// measured is the Redis CPU per ID of each kind as the benchmarks measured
// it (docs/benchmarks.md, bloom-bench -case seed): 7 million distinct IDs
// per 10-minute rolling window, the window before full, planned 2% above,
// growth on, on one server. plan quotes the nearest rate measured, and
// says which it is.
var measured = []struct {
	kind   bloom.Kind
	p      float64
	us     float64 // Redis CPU per ID
	setnx  float64 // SET NX's, in the same run
	server string
}{
	{bloom.KindBloom, 1e-6, 5.32, 1.88, "Redis 7.0.15"},
	{bloom.KindFingerprint, 1e-6, 3.41, 1.97, "Redis 7.0.15"},
	{bloom.KindBloom, 1e-9, 9.67, 1.96, "Redis 7.0.15"},
	{bloom.KindFingerprint, 1e-9, 3.45, 2.04, "Redis 7.0.15"},
}

// measuredCPU is the measured Redis CPU per ID of kind at the rate
// nearest p (on a log scale), with that rate and what it was measured on.
func measuredCPU(kind bloom.Kind, p float64) (us, setnx, at float64, server string) {
	best := math.Inf(1)
	for _, m := range measured {
		if d := math.Abs(math.Log10(m.p) - math.Log10(p)); m.kind == kind && d < best {
			best, us, setnx, at, server = d, m.us, m.setnx, m.p, m.server
		}
	}
	return us, setnx, at, server
}

// redisCalls says what a test-and-set costs Redis per new ID under plan,
// in the unit of its kind.
func redisCalls(pl bloom.Plan, mode bloom.Mode) string {
	if pl.Kind == bloom.KindFingerprint {
		if mode == bloom.Rolling {
			return "2 GETRANGE + 1 SETRANGE"
		}
		return "1 GETRANGE + 1 SETRANGE"
	}
	reads := pl.Layout.Words
	if mode == bloom.Rolling {
		reads++ // a word of the bucket before, most new IDs fail on the first
	}
	return fmt.Sprintf("%d BITFIELD sub-ops", reads+pl.Layout.Words)
}

// loadPerMaster is the share of a core plan sizes the masters for.
const loadPerMaster = 0.5

// compareKinds prints both kinds' plans for cfg side by side, and which
// it recommends and why: the least memory and Redis CPU per ID, or, where
// one kind wins one and loses the other, the trade.
func compareKinds(w io.Writer, cfg config.Config, rate float64) error {
	type row struct {
		config.Sizing
		us, setnx   float64
		at          float64
		server      string
		cores       float64
		masters     int
		memory, cpu float64
	}
	var rows []row
	n, p := cfg.ExpectedPerWindow, cfg.FalsePositiveRate
	for _, kind := range bloom.Kinds {
		c := cfg
		c.Filter = kind.String()
		if kind != bloom.KindBloom {
			c.Layout = ""
		}
		s, err := c.Sizing()
		if err != nil {
			return err
		}
		r := row{Sizing: s}
		r.us, r.setnx, r.at, r.server = measuredCPU(kind, p)
		r.cores = rate * r.us * 1e-6
		r.masters = max(1, int(math.Ceil(r.cores/loadPerMaster)))
		r.memory, r.cpu = float64(s.Plan.Memory), r.us
		rows = append(rows, r)
	}
	win := rows[0].Window
	fmt.Fprintf(w, "\nthe kinds compared for %d IDs per %v window at p = %g (DEDUPE_FILTER; Redis CPU as measured by the benchmarks at the nearest rate measured):\n", n, win.Length, p)
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	head := "kind\tMiB per window\tbytes/ID\tMiB live\tRedis work per new ID\tRedis CPU per ID\tvs SET NX"
	if rate > 0 {
		head += fmt.Sprintf("\tcores at %.0f/s\tmasters (at most %.0f%% of a core each)", rate, 100*loadPerMaster)
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		line := fmt.Sprintf("%s\t%.0f\t%.1f\t%.0f\t%s\t%.1f us (p = %g, %s)\t%.2fx", r.Plan.Kind, mib(r.Plan.Memory),
			float64(r.Plan.Memory)/float64(n), mib(r.LiveMemory()), redisCalls(r.Plan, win.Mode), r.us, r.at, r.server, r.setnx/r.us)
		if rate > 0 {
			line += fmt.Sprintf("\t%.2f\t%d", r.cores, r.masters)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	b, f := rows[0], rows[1]
	switch {
	case f.memory <= b.memory && f.cpu <= b.cpu:
		fmt.Fprintf(w, "recommended: fingerprint: %.0f%% of the Bloom filter's memory and %.0f%% of its Redis CPU per ID\n", 100*f.memory/b.memory, 100*f.cpu/b.cpu)
	case b.memory <= f.memory && b.cpu <= f.cpu:
		fmt.Fprintf(w, "recommended: bloom: %.0f%% of the fingerprint table's memory and %.0f%% of its Redis CPU per ID\n", 100*b.memory/f.memory, 100*b.cpu/f.cpu)
	case f.cpu < b.cpu:
		fmt.Fprintf(w, "a trade: fingerprint takes %.0f%% of the Bloom filter's Redis CPU per ID for %.0f%% of its memory; take it where Redis CPU binds\n", 100*f.cpu/b.cpu, 100*f.memory/b.memory)
	default:
		fmt.Fprintf(w, "a trade: bloom takes %.0f%% of the fingerprint table's Redis CPU per ID for %.0f%% of its memory; take it where Redis CPU binds\n", 100*b.cpu/f.cpu, 100*b.memory/f.memory)
	}
	return nil
}

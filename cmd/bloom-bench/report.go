package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// result is what one method's run measured.
type result struct {
	name       string
	n          int
	distinct   uint64
	wall       time.Duration
	redisCPU   float64 // seconds
	clientCPU  float64 // seconds
	memory     int64   // bytes
	falsePos   int
	falseNeg   int
	expectedFP float64
	note       string
	micros     map[string]int64 // time by command over the run (INFO commandstats)
}

// report prints the table. "vs SET NX" are ratios to the SET NX run of the
// same invocation: its throughput over SET NX's, and SET NX's Redis CPU per
// element over the method's (above 1 is cheaper than SET NX).
func report(rs []result) {
	var base, baseCPU float64
	for _, r := range rs {
		if r.name == "setnx" {
			base = float64(r.n) / r.wall.Seconds()
			baseCPU = r.redisCPU / float64(r.n)
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "method\tIDs\telements/s\tvs SET NX\tredis CPU us/el\tvs SET NX (CPU)\tclient CPU us/el\tbytes/distinct\tfalse pos\texpected FP\tdups passed\t")
	for _, r := range rs {
		rate := float64(r.n) / r.wall.Seconds()
		cpu := r.redisCPU / float64(r.n)
		ratio, cpuRatio := "-", "-"
		if base > 0 {
			ratio = fmt.Sprintf("%.2fx", rate/base)
		}
		if baseCPU > 0 && cpu > 0 {
			cpuRatio = fmt.Sprintf("%.2fx", baseCPU/cpu)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%.2f\t%s\t%.2f\t%.2f\t%d\t%.2f\t%d\t\n", r.name, r.n, rate, ratio,
			cpu*1e6, cpuRatio, r.clientCPU/float64(r.n)*1e6,
			float64(r.memory)/float64(r.distinct), r.falsePos, r.expectedFP, r.falseNeg)
	}
	tw.Flush()
	for _, r := range rs {
		if r.note != "" {
			fmt.Printf("%s: %s\n", r.name, r.note)
		}
		if sp := split(r); sp != "" {
			fmt.Printf("%s: %s\n", r.name, sp)
		}
	}
}

// split says where an engine run's Redis CPU per ID went, by INFO
// commandstats: the script's calls (evalsha) hold the commands they ran,
// each also counted under its own name; what the script's time leaves is
// the script's own Lua work: decoding the arguments, finding fingerprints
// or checking bits, bookkeeping, and turning each call's arguments and
// reply between Lua and Redis. What the CPU time leaves is outside any
// command: reading requests, writing replies, the event loop and the
// maintenance's own calls.
func split(r result) string {
	if r.micros == nil || r.micros["evalsha"] == 0 {
		return ""
	}
	per := func(us int64) float64 { return float64(us) / float64(r.n) }
	script := r.micros["evalsha"] + r.micros["eval"]
	var inner int64
	parts := []string{}
	for _, g := range []struct {
		name string
		cmds []string
	}{
		{"reads (getrange)", []string{"getrange"}},
		{"writes (setrange)", []string{"setrange"}},
		{"bitfield (Bloom filters' reads and writes, decision records)", []string{"bitfield", "bitfield_ro"}},
		{"growth records (hmget, hset)", []string{"hmget", "hset"}},
		{"other (exists, expireat, time)", []string{"exists", "expireat", "time"}},
	} {
		var us int64
		for _, c := range g.cmds {
			us += r.micros[c]
		}
		inner += us
		if us > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", g.name, per(us)))
		}
	}
	var total int64
	for _, v := range r.micros {
		total += v
	}
	outside := r.redisCPU*1e6 - float64(total-inner) // commands run by the script are inside evalsha's time
	return fmt.Sprintf("Redis CPU us per ID %.2f: script %.2f = Lua's own work %.2f + %s; outside the script (requests, replies, other commands) %.2f",
		r.redisCPU*1e6/float64(r.n), per(script), per(script-inner), strings.Join(parts, " + "), outside/float64(r.n))
}

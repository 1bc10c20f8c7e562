// Command e2e-bench measures the dedupe worker end to end against a bare
// kafka-go consume-then-produce copy with the same batch settings, on the
// same Kafka-protocol broker, in one run:
//
//	go run ./cmd/e2e-bench              # 1 million click events
//	go run ./cmd/e2e-bench -n 200000    # a quicker run
//
// The broker, the copy and the worker each run as a child process of this
// command, so the CPU time of each is its own (getrusage of the child);
// Redis CPU is read from INFO. The worker is built from a configuration
// by app.New, as the dedupe-worker command builds it: the same Redis
// client, maintenance and HTTP endpoints.
//
// options.go holds the flags, orchestrate.go the parent's run,
// broker.go the broker, produce.go the input, copy.go the bare copy,
// worker.go the worker, report.go what a child reports and the table.
package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

func main() {
	o := parseFlags()
	stopProfiles := startProfiles(o)
	var err error
	switch o.role {
	case "":
		err = orchestrate(o)
	case "broker":
		err = broker(o)
	case "copy":
		err = report(bareCopy(o))
	case "worker":
		err = report(worker(o))
	default:
		err = fmt.Errorf("unknown role %q", o.role)
	}
	stopProfiles()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-bench:", err)
		os.Exit(1)
	}
}

// startProfiles starts the CPU profile of the copy or the worker with
// -cpuprofile; what it returns stops it and writes the allocations over
// the whole run (for -sample_index=alloc_space).
func startProfiles(o options) (stop func()) {
	if o.cpuprofile == "" || (o.role != "worker" && o.role != "copy") {
		return func() {}
	}
	if f, err := os.Create(o.cpuprofile + "." + o.role); err == nil {
		pprof.StartCPUProfile(f)
	}
	return func() {
		pprof.StopCPUProfile() // a no-op if it did not start
		if f, err := os.Create(o.cpuprofile + "." + o.role + ".allocs"); err == nil {
			pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
)

// orchestrate is the parent's run: it starts the broker and redis-server,
// produces the input, runs the copy and then the worker as children on it,
// and prints the table.
func orchestrate(o options) error {
	if err := checkFlags(o); err != nil {
		return err
	}
	ctx := context.Background()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	brokers, stopBroker, err := startBroker(self, o)
	if err != nil {
		return err
	}
	defer stopBroker()
	srv, err := redisproc.StartTemp(ctx)
	if err != nil {
		return err
	}
	defer srv.Stop()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()

	size, err := produce(ctx, brokers, o)
	if err != nil {
		return err
	}
	fmt.Printf("%d click events of %.0f bytes on average, %.0f%% duplicates, %d partitions, batches of %d, linger %v; the worker's IDs from %s, mode %s\n",
		o.n, size, o.dup*100, o.partitions, o.batch, o.linger, idDesc(o), o.mode)

	var rows []result
	for _, role := range []string{"copy", "worker"} {
		cpu0 := redisCPU(ctx, rc)
		r, err := child(self, role, brokers, srv.Addr, o)
		if err != nil {
			return fmt.Errorf("%s: %w", role, err)
		}
		r.RedisCPU = redisCPU(ctx, rc) - cpu0
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "%s done\n", role)
	}
	return printTable(rows)
}

// child runs the copy or the worker as a child process and reads its
// report, adding the CPU time it used.
func child(self, role, brokers, redisAddr string, o options) (result, error) {
	cmd := exec.Command(self, "-role", role, "-brokers", brokers, "-redis", redisAddr, "-n", strconv.Itoa(o.n),
		"-batch", strconv.Itoa(o.batch), "-linger", o.linger.String(), "-dup", fmt.Sprint(o.dup), "-cpuprofile", o.cpuprofile,
		"-id-from", o.idFrom, "-id-field", o.idField, "-mode", o.mode)
	cmd.Stderr = os.Stderr
	outb, err := cmd.Output()
	if err != nil {
		return result{}, err
	}
	var r result
	lines := strings.Split(strings.TrimSpace(string(outb)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return result{}, fmt.Errorf("reading the report %q: %w", lines[len(lines)-1], err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	r.CPU = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	return r, nil
}

// redisCPU is the CPU time the server has used, in seconds (0 if unread).
func redisCPU(ctx context.Context, c *redis.Client) float64 {
	s, _ := redisproc.CPUSeconds(ctx, c)
	return s
}

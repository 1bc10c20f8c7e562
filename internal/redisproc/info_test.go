package redisproc_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testenv"
)

// The INFO readers give what the server reports: a field of a section, an
// error naming a field it lacks, used memory that grows by a 1 MiB value,
// the CPU time the server has spent, and the time by command, a script's
// commands both under their own names and in the script's.
func TestInfo(t *testing.T) {
	s := testenv.Redis(t)
	c := testenv.RedisClient(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	_, port, _ := net.SplitHostPort(s.Addr)
	if v, err := redisproc.InfoField(ctx, c, "server", "tcp_port"); err != nil || v != port {
		t.Errorf("INFO server tcp_port = %q, %v; want %s", v, err, port)
	}
	if _, err := redisproc.InfoField(ctx, c, "server", "no_such_field"); err == nil || !strings.Contains(err.Error(), "no_such_field") {
		t.Errorf("a missing field: error %v, want one naming it", err)
	}

	before, err := redisproc.UsedMemory(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "big", strings.Repeat("x", 1<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	after, err := redisproc.UsedMemory(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if before <= 0 || after-before < 1<<20 {
		t.Errorf("used_memory %d before and %d after a 1 MiB value", before, after)
	}

	if cpu, err := redisproc.CPUSeconds(ctx, c); err != nil || cpu <= 0 {
		t.Errorf("CPUSeconds = %v, %v; want a time above 0", cpu, err)
	}

	// 20,000 SETRANGE calls from one script: time under setrange, and at
	// least as much under eval.
	if err := c.Eval(ctx, "for i = 1, 20000 do redis.call('SETRANGE', KEYS[1], i, 'x') end", []string{"r"}).Err(); err != nil && err.Error() != "redis: nil" {
		t.Fatal(err)
	}
	us, err := redisproc.CommandMicros(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if us["setrange"] <= 0 || us["eval"] < us["setrange"] {
		t.Errorf("after a script of 20,000 SETRANGE calls: %d us in setrange and %d in eval; want some, and eval's at least as much", us["setrange"], us["eval"])
	}
}

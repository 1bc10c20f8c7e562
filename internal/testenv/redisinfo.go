package testenv

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
)

// InfoInt is a numeric field of an INFO section of the server behind c;
// it fails the test if the field is missing or not a number.
func InfoInt(t testing.TB, c *redis.Client, section, field string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := redisproc.InfoField(ctx, c, section, field)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("INFO %s %s: %q", section, field, v)
	}
	return n
}

// CommandStat is one field of a command's line in INFO commandstats
// (calls, rejected_calls, failed_calls), 0 if the command never ran.
func CommandStat(t testing.TB, c *redis.Client, command, field string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		stats, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("cmdstat_%s: %v", command, err)
				}
				return n
			}
		}
		t.Fatalf("cmdstat_%s has no %s: %s", command, field, line)
	}
	return 0
}

// ScriptStat is CommandStat summed over EVALSHA and EVAL: the scripts.
func ScriptStat(t testing.TB, c *redis.Client, field string) int64 {
	t.Helper()
	return CommandStat(t, c, "evalsha", field) + CommandStat(t, c, "eval", field)
}

// FillRedis writes junk keys ("junk:N", 256 kB, no expiry) until the
// server, which must have a maxmemory, refuses a write for want of
// memory, and checks that its used memory is then over maxmemory. Each
// SETRANGE is a small command that makes a 256 kB value, so the last one
// accepted takes Redis past its limit. Then the limit is lowered to
// 1 MiB below the memory used: right at the limit, Redis's used memory
// moves by tens of kilobytes on its own (client buffers are resized every
// so often), and a write slips through whenever it dips below. Freeing
// the junk keys gives back more than the margin.
func FillRedis(t testing.TB, c *redis.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("1000 junk keys of 256 kB and no OOM: is maxmemory set?")
		}
		err := c.SetRange(ctx, fmt.Sprintf("junk:%d", i), 256<<10, "x").Err()
		if err == nil {
			continue
		}
		if !strings.HasPrefix(err.Error(), "OOM") {
			t.Fatal(err)
		}
		break
	}
	used, limit := InfoInt(t, c, "memory", "used_memory"), InfoInt(t, c, "memory", "maxmemory")
	if limit == 0 || used <= limit {
		t.Fatalf("used memory %d after an OOM refusal, maxmemory %d", used, limit)
	}
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-1<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
}

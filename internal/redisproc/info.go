package redisproc

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// info is the fields of the INFO sections asked for, of the server c talks
// to, as go-redis parses them.
func info(ctx context.Context, c redis.UniversalClient, section string) (map[string]string, error) {
	sections, err := c.InfoMap(ctx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("INFO %s: %w", section, err)
	}
	fields := map[string]string{}
	for _, s := range sections {
		maps.Copy(fields, s)
	}
	return fields, nil
}

// InfoField is one field of an INFO section of the server c talks to.
func InfoField(ctx context.Context, c redis.UniversalClient, section, field string) (string, error) {
	fields, err := info(ctx, c, section)
	if err != nil {
		return "", err
	}
	v, ok := fields[field]
	if !ok {
		return "", fmt.Errorf("INFO %s has no %s", section, field)
	}
	return v, nil
}

// UsedMemory is the server's used_memory in bytes.
func UsedMemory(ctx context.Context, c redis.UniversalClient) (int64, error) {
	v, err := InfoField(ctx, c, "memory", "used_memory")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// CPUSeconds is the user and system CPU time the server behind c has used
// (INFO cpu).
func CPUSeconds(ctx context.Context, c *redis.Client) (float64, error) {
	fields, err := info(ctx, c, "cpu")
	if err != nil {
		return 0, err
	}
	var tot float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		f, _ := strconv.ParseFloat(fields[k], 64)
		tot += f
	}
	return tot, nil
}

// CommandMicros is the time the server behind c has spent in each command
// (INFO commandstats: usec, by command name in lower case), commands run
// by scripts included: a script's own entry (evalsha, eval) counts the
// commands it ran as well.
func CommandMicros(ctx context.Context, c redis.UniversalClient) (map[string]int64, error) {
	fields, err := info(ctx, c, "commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for k, v := range fields {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(v, ",") {
			if us, ok := strings.CutPrefix(kv, "usec="); ok {
				n, err := strconv.ParseInt(us, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("INFO commandstats: %s: %w", k, err)
				}
				out[name] = n
			}
		}
	}
	return out, nil
}

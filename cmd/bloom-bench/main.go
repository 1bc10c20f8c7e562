// Command bloom-bench measures the Bloom engine against two baselines in
// one run on one redis-server: a pipelined SET id 1 NX EX per element (exact,
// the throughput reference) and the naive Lua script that calls SETBIT once
// per bit. It prints one table: elements per second, Redis and client CPU per
// element and its ratio to SET NX's, Redis bytes per distinct element and
// false positives. The engine runs the product's defaults (config.Defaults:
// the rate, the window and its growth cap) unless flags say otherwise.
//
//	go run ./cmd/bloom-bench                 # 10 million IDs, the product's defaults
//	go run ./cmd/bloom-bench -n 1000000      # a quicker run
//	go run ./cmd/bloom-bench -case seed      # the click-log pipeline: 7 million IDs per 10 minutes at p = 1e-9
//
// options.go holds the flags and the named cases, stream.go the IDs and
// their ground truth, meter.go what is measured around a run, engine.go,
// setnx.go and naive.go the three methods, report.go the table.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/redisproc"
)

func main() {
	o, ok := parseFlags()
	if !ok {
		os.Exit(2)
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "bloom-bench:", err)
		os.Exit(1)
	}
}

// run starts a redis-server of its own, runs each method of o.methods on
// it, from an empty server each, and prints the table.
func run(ctx context.Context, o options) error {
	srv, err := redisproc.StartTemp(ctx)
	if err != nil {
		return err
	}
	defer srv.Stop()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, ReadTimeout: 30 * time.Second})
	defer c.Close()
	server, version := serverVersion(ctx, c)
	fmt.Printf("%s %s, %d IDs of 16 bytes, %.0f%% duplicates, batches of %d, p = %g, %v windows, lag bound %v, growth up to %gx, load %g of the plan\n",
		server, version, o.n, o.dup*100, o.batch, o.p, o.window, o.maxLag, o.growth, o.load)

	var results []result
	for _, m := range strings.Split(o.methods, ",") {
		if err := c.FlushAll(ctx).Err(); err != nil {
			return err
		}
		runM, ok := methods[m]
		if !ok {
			return fmt.Errorf("unknown method %q", m)
		}
		r, err := runM(ctx, c, o)
		if err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		r.name = m
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "%s done in %v\n", m, r.wall.Round(time.Millisecond))
	}
	report(results)
	return nil
}

// serverVersion names the server c is connected to, redis or valkey, and
// its version.
func serverVersion(ctx context.Context, c *redis.Client) (server, version string) {
	server = "redis"
	version, _ = redisproc.InfoField(ctx, c, "server", "redis_version")
	if v, err := redisproc.InfoField(ctx, c, "server", "valkey_version"); err == nil && v != "" {
		server, version = "valkey", v // Valkey gives the Redis version it is compatible with as redis_version
	}
	return server, version
}

// methods are the runs -methods names.
var methods = map[string]func(context.Context, *redis.Client, options) (result, error){
	"engine-rolling": func(ctx context.Context, c *redis.Client, o options) (result, error) {
		return runEngine(ctx, c, o, bloom.Rolling)
	},
	"engine-fixed": func(ctx context.Context, c *redis.Client, o options) (result, error) {
		return runEngine(ctx, c, o, bloom.Fixed)
	},
	"setnx": runSetNX,
	"naive": runNaive,
}

package main

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// runSetNX is the exact baseline: a pipelined SET id 1 NX EX per ID, a
// batch per pipeline.
func runSetNX(ctx context.Context, c *redis.Client, o options) (result, error) {
	s := &stream{rng: rand.New(rand.NewPCG(o.seed, 2)), dup: o.dup}
	r := result{n: o.n}
	idx := make([]uint64, o.batch)
	tr := newTruth(o.n)
	cmds := make([]*redis.BoolCmd, o.batch)
	m := startMeter(ctx, c)
	for done := 0; done < o.n; {
		k := min(o.batch, o.n-done)
		pipe := c.Pipeline()
		for i := 0; i < k; i++ {
			id, j := s.next()
			idx[i] = j
			cmds[i] = pipe.SetNX(ctx, string(id), "1", 24*time.Hour)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return r, err
		}
		for i := 0; i < k; i++ {
			tr.add(idx[i], cmds[i].Val())
		}
		done += k
	}
	m.stop(ctx, &r)
	r.distinct = s.distinct
	tr.finish(&r, s.distinct)
	return r, nil
}

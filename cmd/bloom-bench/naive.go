package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/spaolacci/murmur3"

	"dedupe-worker/internal/bloom"
)

// naiveLua sets each of an element's k bits with its own SETBIT call; the
// element is new if any bit was 0.
const naiveLua = `
local k = tonumber(ARGV[1])
local out = {}
for e = 0, (#ARGV - 1) / k - 1 do
  local new = 0
  for j = 1, k do
    if redis.call('SETBIT', KEYS[1], ARGV[1 + e * k + j], 1) == 0 then new = 1 end
  end
  out[#out + 1] = new
end
redis.call('EXPIRE', KEYS[1], 86400)
return out`

// runNaive runs the naive script on the first -naive-n IDs, with a classic
// filter sized for all of them.
func runNaive(ctx context.Context, c *redis.Client, o options) (result, error) {
	n := min(o.n, o.naiveN)
	// Sized for the full run, as the engine is, so memory compares.
	std := bloom.StandardSizing(int64(math.Round(float64(o.n)*(1-o.dup))), o.p)
	script := redis.NewScript(naiveLua)
	s := &stream{rng: rand.New(rand.NewPCG(o.seed, 2)), dup: o.dup}
	r := result{n: n}
	idx := make([]uint64, o.batch)
	tr := newTruth(n)
	// Create the key at full size first, as the engine does.
	mem0 := usedMemory(ctx, c)
	if err := c.SetBit(ctx, "naive", int64(std.Bits-1), 0).Err(); err != nil {
		return r, err
	}
	m := startMeter(ctx, c)
	m.mem0 = mem0
	args := make([]any, 0, 1+o.batch*std.Hashes)
	for done := 0; done < n; {
		k := min(o.batch, n-done)
		args = append(args[:0], std.Hashes)
		for i := 0; i < k; i++ {
			id, j := s.next()
			idx[i] = j
			h1, h2 := murmur3.Sum128(id)
			for j := 0; j < std.Hashes; j++ {
				args = append(args, strconv.FormatUint((h1+uint64(j)*h2)%std.Bits, 10))
			}
		}
		res, err := script.Run(ctx, c, []string{"naive"}, args...).Int64Slice()
		if err != nil {
			return r, err
		}
		for i, v := range res {
			tr.add(idx[i], v == 1)
		}
		done += k
	}
	m.stop(ctx, &r)
	tr.finish(&r, s.distinct)
	// Memory per distinct is the full filter over the full run's distinct IDs.
	r.distinct = uint64(math.Round(float64(o.n) * (1 - o.dup)))
	r.expectedFP = expectedFalsePositives(s.distinct, func(i float64) float64 {
		return bloom.StandardFPR(float64(std.Bits)/i, std.Hashes)
	})
	r.note = fmt.Sprintf("classic filter, k = %d, %d bits; run on the first %d IDs only, sized for all %d", std.Hashes, std.Bits, n, o.n)
	return r, nil
}

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
package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spaolacci/murmur3"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/redisproc"
)

type options struct {
	n       int
	naiveN  int
	dup     float64
	batch   int
	p       float64
	methods string
	seed    uint64
	// backlog stamps the IDs a day before the clock, in a bucket that has
	// ended, as a backlog read after an outage.
	backlog bool
	// load is the distinct IDs over the planned n; growth the window's
	// DEDUPE_MAX_GROWTH.
	load, growth float64
	window       time.Duration
	maxLag       time.Duration
	// memoryFactor and layout choose the layout, as DEDUPE_MEMORY_FACTOR
	// and DEDUPE_LAYOUT do.
	memoryFactor float64
	layout       string
	// shards is the least shards per window, as DEDUPE_SHARDS.
	shards int
	// filter is the kind, as DEDUPE_FILTER.
	filter string
	// steady fills the window before the measured one first, as a
	// pipeline's steady state has it: a rolling test reads it.
	steady bool
}

// cases are named runs: flags given beside one override it.
var cases = map[string]func(o *options){
	// The click-log pipeline of the seed: a billion events a day, 7 million
	// distinct IDs per 10-minute window, at the rate it chose.
	"seed": func(o *options) {
		o.dup = 0.07
		o.n = int(math.Round(7_000_000 / (1 - o.dup)))
		o.p, o.window, o.methods = 1e-9, 10*time.Minute, "engine-rolling,setnx"
		// Planned 2% above the IDs it gets, as a pipeline is sized with
		// room: a window filled to its plan at the bench's rate makes its
		// next stage ahead of need, which the bytes per ID would count.
		o.load = 0.98
		// The window before full, as in a pipeline running for a while.
		o.steady = true
	},
}

func main() {
	var o options
	d := config.Defaults()
	caseName := flag.String("case", "", "a named run: seed (7 million distinct IDs per 10-minute window at p = 1e-9, planned 2% above, rolling with the window before full, against SET NX); other flags override it")
	flag.IntVar(&o.n, "n", 10_000_000, "IDs to test (16 bytes each)")
	flag.IntVar(&o.naiveN, "naive-n", 300_000, "IDs for the naive SETBIT script, which is slow")
	flag.Float64Var(&o.dup, "dup", 0.07, "share of IDs that repeat an earlier one")
	flag.IntVar(&o.batch, "batch", 1000, "IDs per batch")
	flag.Float64Var(&o.p, "p", d.FalsePositiveRate, "target false-positive rate (DEDUPE_FALSE_POSITIVE_RATE)")
	flag.DurationVar(&o.window, "window", d.Window, "window length (DEDUPE_WINDOW)")
	flag.StringVar(&o.methods, "methods", "engine-rolling,engine-fixed,setnx,naive", "methods to run, comma-separated")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the ID stream")
	flag.Float64Var(&o.load, "load", 1, "distinct IDs over the filter's planned n: above 1 the window grows (with -growth above 1)")
	flag.Float64Var(&o.growth, "growth", d.MaxGrowth, "how far a window may grow past its planned n (DEDUPE_MAX_GROWTH; 1: no growth)")
	flag.IntVar(&o.shards, "shards", d.Shards, "least keys per window (DEDUPE_SHARDS)")
	flag.StringVar(&o.filter, "filter", "bloom", "the filter kind: bloom or fingerprint (DEDUPE_FILTER)")
	flag.BoolVar(&o.steady, "steady", false, "fill the window before the measured one first, with as many other IDs (not measured): a rolling test then reads a full previous window, as in a pipeline's steady state")
	flag.Float64Var(&o.memoryFactor, "memory-factor", d.MemoryFactor, "most memory per ID as a multiple of a classic filter's at stage 0's rate, within which the planner takes the fewest words, then the fewest shards (DEDUPE_MEMORY_FACTOR)")
	flag.StringVar(&o.layout, "layout", d.Layout, "words x bits per word (4x4) instead of the planner's choice (DEDUPE_LAYOUT)")
	flag.DurationVar(&o.maxLag, "max-lag", d.MaxLag, "lag bound (DEDUPE_MAX_LAG): a run that outlasts it past its window's end gets late verdicts and fails")
	flag.BoolVar(&o.backlog, "backlog", false, "stamp the IDs a day back, in a window that has ended (a backlog; a 48h lag bound keeps it)")
	flag.Parse()
	if *caseName != "" {
		set, ok := cases[*caseName]
		if !ok {
			fmt.Fprintf(os.Stderr, "bloom-bench: -case %q: want seed\n", *caseName)
			os.Exit(2)
		}
		set(&o)
		// Flags given beside the case win over it: parsed again, they set
		// only what they name.
		if err := flag.CommandLine.Parse(os.Args[1:]); err != nil {
			os.Exit(2)
		}
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "bloom-bench:", err)
		os.Exit(1)
	}
}

// stream yields IDs: each is, with probability dup, a copy of a uniformly
// chosen earlier distinct ID, else a new one. Distinct ID j is the hex of a
// bijective mix of j, so the ground truth needs no set.
type stream struct {
	rng      *rand.Rand
	dup      float64
	distinct uint64
}

func idOf(j uint64) []byte {
	z := j + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	var raw [8]byte
	for i := range raw {
		raw[i] = byte(z >> (8 * i))
	}
	return []byte(hex.EncodeToString(raw[:]))
}

// next returns an ID and its distinct index.
func (s *stream) next() ([]byte, uint64) {
	if s.distinct > 0 && s.rng.Float64() < s.dup {
		j := s.rng.Uint64N(s.distinct)
		return idOf(j), j
	}
	s.distinct++
	return idOf(s.distinct - 1), s.distinct - 1
}

// truth counts, per distinct ID, the copies a method passed as new. A
// method may pass any one copy of an ID (the engine orders a batch by
// partition), so errors are counted per ID: none passed is a false
// positive, more than one passed are duplicates let through.
type truth struct{ passed []uint8 }

func newTruth(n int) *truth { return &truth{passed: make([]uint8, n)} }

func (t *truth) add(j uint64, saidNew bool) {
	if saidNew && t.passed[j] < 255 {
		t.passed[j]++
	}
}

func (t *truth) finish(r *result, distinct uint64) {
	for _, n := range t.passed[:distinct] {
		if n == 0 {
			r.falsePos++
		} else {
			r.falseNeg += int(n) - 1
		}
	}
}

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

func run(ctx context.Context, o options) error {
	srv, err := redisproc.StartTemp(ctx)
	if err != nil {
		return err
	}
	defer srv.Stop()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, ReadTimeout: 30 * time.Second})
	defer c.Close()
	server := "redis"
	version, _ := redisproc.InfoField(ctx, c, "server", "redis_version")
	if v, err := redisproc.InfoField(ctx, c, "server", "valkey_version"); err == nil && v != "" {
		server, version = "valkey", v // Valkey gives the Redis version it is compatible with as redis_version
	}
	fmt.Printf("%s %s, %d IDs of 16 bytes, %.0f%% duplicates, batches of %d, p = %g, %v windows, lag bound %v, growth up to %gx, load %g of the plan\n",
		server, version, o.n, o.dup*100, o.batch, o.p, o.window, o.maxLag, o.growth, o.load)

	var results []result
	for _, m := range strings.Split(o.methods, ",") {
		if err := c.FlushAll(ctx).Err(); err != nil {
			return err
		}
		var r result
		var err error
		switch m {
		case "engine-rolling":
			r, err = runEngine(ctx, c, o, bloom.Rolling)
		case "engine-fixed":
			r, err = runEngine(ctx, c, o, bloom.Fixed)
		case "setnx":
			r, err = runSetNX(ctx, c, o)
		case "naive":
			r, err = runNaive(ctx, c, o)
		default:
			return fmt.Errorf("unknown method %q", m)
		}
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

// meter takes Redis CPU, client CPU, memory and wall time around a run.
type meter struct {
	c               *redis.Client
	redis0, client0 float64
	mem0            int64
	micros0         map[string]int64
	start           time.Time
}

func startMeter(ctx context.Context, c *redis.Client) *meter {
	m := &meter{c: c}
	m.redis0, m.mem0 = redisCPU(ctx, c), usedMemory(ctx, c)
	m.micros0, _ = redisproc.CommandMicros(ctx, c)
	m.client0 = clientCPU()
	m.start = time.Now()
	return m
}

func (m *meter) stop(ctx context.Context, r *result) {
	r.wall = time.Since(m.start)
	r.clientCPU = clientCPU() - m.client0
	r.redisCPU = redisCPU(ctx, m.c) - m.redis0
	r.memory = usedMemory(ctx, m.c) - m.mem0
	if us, err := redisproc.CommandMicros(ctx, m.c); err == nil {
		r.micros = map[string]int64{}
		for k, v := range us {
			if d := v - m.micros0[k]; d > 0 {
				r.micros[k] = d
			}
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

func clientCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func redisCPU(ctx context.Context, c *redis.Client) float64 {
	s, _ := redisproc.CPUSeconds(ctx, c)
	return s
}

func usedMemory(ctx context.Context, c *redis.Client) int64 {
	v, _ := redisproc.UsedMemory(ctx, c)
	return v
}

const partitions = 8

func runEngine(ctx context.Context, c *redis.Client, o options, mode bloom.Mode) (result, error) {
	distinct := int64(math.Round(float64(o.n) * (1 - o.dup)))
	kind, err := bloom.ParseKind(o.filter)
	if err != nil {
		return result{}, err
	}
	opt := bloom.PlanOptions{MinShards: o.shards, MaxGrowth: o.growth, MemoryFactor: o.memoryFactor, Kind: kind}
	if o.layout != "" {
		if opt.Layout, err = bloom.ParseLayout(o.layout); err != nil {
			return result{}, err
		}
	}
	plan, err := bloom.NewPlan(int64(math.Ceil(float64(distinct)/o.load)), o.p, opt)
	if err != nil {
		return result{}, err
	}
	// A tenth into the current window: far from its end, where a rolling
	// test reads the next bucket too, so that runs compare alike.
	now := time.Now().Truncate(o.window).Add(o.window / 10)
	at, lag := now, o.maxLag
	if o.backlog {
		at, lag = now.Add(-24*time.Hour), 48*time.Hour
	}
	f, err := bloom.New(c, bloom.Config{Pipeline: "bench", Plan: plan, Window: bloom.Window{Length: o.window, Mode: mode, MaxLag: lag},
		Now: func() time.Time { return now }})
	if err != nil {
		return result{}, err
	}
	mem0 := int64(0)
	var offsets [partitions]int64
	if o.steady {
		// The window before, full of other IDs (a stream of another seed),
		// decided now as a late part of it: made and filled, not measured.
		before := at.Add(-o.window)
		if err := f.Preallocate(ctx, before); err != nil {
			return result{}, err
		}
		other := &stream{rng: rand.New(rand.NewPCG(o.seed+1000, 3)), dup: o.dup}
		elems := make([]bloom.Element, o.batch)
		for done := 0; done < o.n; done += o.batch {
			for i := range elems {
				id, _ := other.next()
				p := int32((done + i) % partitions)
				elems[i] = bloom.Element{ID: append([]byte("before-"), id...), Time: before, Source: bloom.Source{Topic: "clicks", Partition: p, Offset: offsets[p]}}
				offsets[p]++
			}
			select {
			case <-f.GrowthWanted():
				if _, err := f.Grow(ctx, before); err != nil {
					return result{}, err
				}
			default:
			}
			if _, err := f.TestAndSet(ctx, elems); err != nil {
				return result{}, err
			}
		}
	}
	// Memory is counted from before the measured window's keys are made:
	// the value sent to preallocate them sits in a client buffer for a
	// while.
	mem0 = usedMemory(ctx, c)
	if err := f.Preallocate(ctx, at); err != nil {
		return result{}, err
	}
	s := &stream{rng: rand.New(rand.NewPCG(o.seed, 2)), dup: o.dup}
	r := result{n: o.n}
	elems := make([]bloom.Element, o.batch)
	idx := make([]uint64, o.batch)
	tr := newTruth(o.n)
	m := startMeter(ctx, c)
	m.mem0 = mem0
	for done := 0; done < o.n; {
		k := min(o.batch, o.n-done)
		for i := 0; i < k; i++ {
			id, j := s.next()
			p := int32((done + i) % partitions)
			elems[i] = bloom.Element{ID: id, Time: at, Source: bloom.Source{Topic: "clicks", Partition: p, Offset: offsets[p]}}
			offsets[p]++
			idx[i] = j
		}
		select {
		case <-f.GrowthWanted():
			if _, err := f.Grow(ctx, at); err != nil {
				return r, err
			}
		default:
		}
		vs, err := f.TestAndSet(ctx, elems[:k])
		if err != nil {
			return r, err
		}
		for i, v := range vs {
			if v != bloom.FirstSeen && v != bloom.Duplicate {
				// Late or future: not deduplicated, so neither a false
				// positive nor a duplicate passed; the run measures nothing.
				return r, fmt.Errorf("%s: element %d of batch %d decided %v: the run outlasted its window and the lag bound; raise -max-lag",
					mode, i, done/o.batch, v)
			}
			tr.add(idx[i], v == bloom.FirstSeen)
		}
		done += k
	}
	m.stop(ctx, &r)
	r.distinct = s.distinct
	tr.finish(&r, s.distinct)
	r.expectedFP = expectedFalsePositives(s.distinct, plan.FPRHolding)
	if o.steady && mode == bloom.Rolling {
		// Each new ID is tested against the full window before too.
		r.expectedFP += float64(s.distinct) * plan.FPRHolding(float64(s.distinct))
	}
	layout := fmt.Sprintf("layout %d words x %d bits", plan.Layout.Words, plan.Layout.BitsPerWord)
	if kind == bloom.KindFingerprint {
		st := plan.Stages[0]
		layout = fmt.Sprintf("fingerprints of %d bytes in %d part(s) of %d slots", st.Bytes, st.Parts, st.PartSlots)
	}
	r.note = fmt.Sprintf("%s, %d shard(s) of %d bits (%.1f bits per distinct), achieved p %.2e; a classic filter needs %.1f bits, k = %d",
		layout, plan.Shards, plan.ShardBits, float64(plan.Bits())/float64(s.distinct), plan.AchievedFPR,
		float64(plan.Standard.Bits)/float64(distinct), plan.Standard.Hashes)
	if plan.Growth() {
		g := f.GrowthStats()
		r.note += fmt.Sprintf("; planned n %d, growth up to %gx in %d stages: %d made, %d calls refused for a stage, %d waits (longest %v)",
			plan.Elements, o.growth, len(plan.Stages), g.Made, g.Refused, g.Waits, g.Longest.Round(time.Millisecond/10))
	}
	return r, nil
}

// expectedFalsePositives sums the false-positive rate seen by each of the d
// distinct insertions, fpr(i) being the rate after i insertions.
func expectedFalsePositives(d uint64, fpr func(i float64) float64) float64 {
	const steps = 2000
	var sum float64
	for s := 0; s < steps; s++ {
		i := (float64(s) + 0.5) / steps * float64(d)
		sum += fpr(i) * float64(d) / steps
	}
	return sum
}

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

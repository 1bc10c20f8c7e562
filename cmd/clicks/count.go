package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/clickstream"
)

// Totals are a downstream counter's running totals.
type Totals struct {
	Records int
	// Sources are the records distinct by dedupe-source: the events.
	Sources int
	// Replays are the records beyond one per source.
	Replays int
	// IDs are the distinct dedupe-id values.
	IDs int
	// NoSource are records without a dedupe-source header, each counted
	// as its own event.
	NoSource int
}

func (t Totals) String() string {
	s := fmt.Sprintf("records %d, distinct sources %d, replays %d, distinct dedupe-id %d", t.Records, t.Sources, t.Replays, t.IDs)
	if t.NoSource > 0 {
		s += fmt.Sprintf(", without dedupe-source %d", t.NoSource)
	}
	return s
}

// sourceSet holds dedupe-source values: per topic and partition, offsets in
// blocks of 4096 bits, so a dense run of offsets costs a bit each.
type sourceSet struct {
	parts map[string]map[int64]*[64]uint64
	other map[string]bool // values not of the form topic/partition/offset
}

// add reports whether src is new.
func (s *sourceSet) add(src string) bool {
	i := strings.LastIndexByte(src, '/')
	off, err := strconv.ParseInt(src[i+1:], 10, 64)
	if i <= 0 || err != nil || off < 0 || !strings.Contains(src[:i], "/") {
		if s.other == nil {
			s.other = map[string]bool{}
		}
		if s.other[src] {
			return false
		}
		s.other[src] = true
		return true
	}
	if s.parts == nil {
		s.parts = map[string]map[int64]*[64]uint64{}
	}
	blocks := s.parts[src[:i]]
	if blocks == nil {
		blocks = map[int64]*[64]uint64{}
		s.parts[src[:i]] = blocks
	}
	b := blocks[off>>12]
	if b == nil {
		b = new([64]uint64)
		blocks[off>>12] = b
	}
	w, bit := (off>>6)&63, uint64(1)<<(off&63)
	if b[w]&bit != 0 {
		return false
	}
	b[w] |= bit
	return true
}

// counter counts records the way an idempotent downstream consumer does:
// each dedupe-source once.
type counter struct {
	t       Totals
	sources sourceSet
	ids     map[string]struct{}
}

func (c *counter) add(r *kgo.Record) {
	c.t.Records++
	if id := clickstream.Header(r, clickstream.IDHeader); id != "" {
		if c.ids == nil {
			c.ids = map[string]struct{}{}
		}
		if _, ok := c.ids[id]; !ok {
			c.ids[id] = struct{}{}
			c.t.IDs++
		}
	}
	src, has := "", false
	for _, h := range r.Headers {
		if h.Key == clickstream.SourceHeader {
			src, has = string(h.Value), true
			break
		}
	}
	switch {
	case !has:
		c.t.NoSource++
		c.t.Sources++
	case c.sources.add(src):
		c.t.Sources++
	default:
		c.t.Replays++
	}
}

// CountOptions configure Count.
type CountOptions struct {
	Brokers []string
	Topic   string
	// Every is the interval of the totals lines written to Out.
	Every time.Duration
	Out   io.Writer
	// Log receives connection problems, at most one line per 30 s.
	Log io.Writer
}

// Count reads the topic from the start until ctx ends, writing the running
// totals to Out every Every and once more at the end, and returns them.
// It is not a group member: every run counts the whole topic again.
func Count(ctx context.Context, o CountOptions) (Totals, error) {
	if o.Every <= 0 {
		o.Every = 5 * time.Second
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...), kgo.ConsumeTopics(o.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20), kgo.RetryBackoffFn(retryBackoff),
		kgo.MetadataMinAge(500*time.Millisecond))
	if err != nil {
		return Totals{}, err
	}
	defer cl.Close()
	var c counter
	next := time.Now().Add(o.Every)
	var lastWarn time.Time
	seen := 0
	for {
		pctx, cancel := context.WithDeadline(ctx, next)
		fs := cl.PollFetches(pctx)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrClientClosed) {
				return
			}
			if time.Since(lastWarn) >= 30*time.Second {
				fmt.Fprintf(o.Log, "count: reading %s on %s: %v (retrying)\n", o.Topic, strings.Join(o.Brokers, ","), err)
				lastWarn = time.Now()
			}
		})
		fs.EachRecord(c.add)
		if ctx.Err() != nil {
			fmt.Fprintf(o.Out, "count: %v (final)\n", c.t)
			return c.t, nil
		}
		if !time.Now().Before(next) {
			fmt.Fprintf(o.Out, "count: %v\n", c.t)
			next = time.Now().Add(o.Every)
			if c.t.Records == seen && time.Since(lastWarn) >= 30*time.Second {
				// Nothing new: say so if the brokers cannot be reached.
				if err := why(ctx, cl, context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					fmt.Fprintf(o.Log, "count: cannot reach %s, retrying: %v\n", strings.Join(o.Brokers, ","), err)
					lastWarn = time.Now()
				}
			}
			seen = c.t.Records
		}
	}
}

// RunCount is the count command.
func RunCount(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("count", "Counts DEDUPE_OUTPUT_TOPIC on DEDUPE_KAFKA_BROKERS from the start by dedupe-source until SIGTERM.", stderr)
	o := CountOptions{Out: stdout, Log: stderr}
	fs.DurationVar(&o.Every, "every", 5*time.Second, "interval of the totals lines")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "clicks count: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var err error
	if o.Brokers, o.Topic, err = kafkaEnv("DEDUPE_OUTPUT_TOPIC"); err != nil {
		fmt.Fprintln(stderr, "clicks count:", err)
		return 2
	}
	if _, err := Count(ctx, o); err != nil {
		fmt.Fprintln(stderr, "clicks count:", err)
		return 1
	}
	return 0
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/record"
)

// explain answers "why was my event dropped?" from Redis, read-only, with
// the worker's own configuration.
func explain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	id := fs.String("id", "", "the event's ID")
	at := fs.String("time", "", "the event time: RFC 3339, or Unix seconds or milliseconds")
	src := fs.String("source", "", "topic/partition/offset of an input event, as in the dedupe-source header")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "dedupe-worker explain: "+format+"\n", a...)
		return code
	}
	if fs.NArg() > 0 || (*src == "" && (*id == "" || *at == "")) {
		return fail(2, "want -id ID -time T, or -source topic/partition/offset (and -id with several shards)")
	}
	var t time.Time
	if *at != "" {
		var err error
		if t, err = consumer.ParseEventTime(*at); err != nil {
			return fail(2, "-time %q: %v", *at, err)
		}
	}
	cfg, err := config.Load()
	if err != nil {
		return fail(2, "%v", err)
	}
	rc, err := app.NewRedis(cfg)
	if err != nil {
		return fail(2, "%v", err)
	}
	defer rc.Close()
	f, err := app.NewFilter(cfg, rc)
	if err != nil {
		return fail(2, "%v", err)
	}
	if *id != "" && *at != "" {
		if err := explainID(ctx, stdout, f, cfg, []byte(*id), t); err != nil {
			return fail(1, "%v", err)
		}
	}
	if *src != "" {
		s, ok := record.ParseSource([]byte(*src))
		if !ok {
			return fail(2, "-source %q: want topic/partition/offset", *src)
		}
		shard := 0
		switch {
		case *id != "":
			shard = f.ShardOf([]byte(*id))
		case f.Plan().Shards > 1:
			return fail(2, "%d shards: decision records are per shard; give -id, the event's ID, to find its shard", f.Plan().Shards)
		}
		if err := explainSource(ctx, stdout, f, bloom.Source{Topic: s.Topic, Partition: int32(s.Partition), Offset: s.Offset}, shard); err != nil {
			return fail(1, "%v", err)
		}
	}
	return 0
}

func explainID(ctx context.Context, w io.Writer, f *bloom.Filter, cfg config.Config, id []byte, t time.Time) error {
	e, err := f.Explain(ctx, id, t)
	if err != nil {
		return err
	}
	win := f.Windows()
	fmt.Fprintf(w, "ID %q, event time %s: %s window starting %s (bucket %d), shard %d\n",
		id, t.UTC().Format(time.RFC3339), cfg.WindowMode, win.Start(e.Bucket).Format(time.RFC3339), e.Bucket, e.Shard)
	fmt.Fprintf(w, "deduplicated until %s (the end of its window plus DEDUPE_MAX_LAG %v)\n", e.Deadline.Format(time.RFC3339), win.MaxLag)
	switch {
	case e.Future:
		fmt.Fprintf(w, "a copy decided now: future (stamped beyond the window after the clock's), not deduplicated: %s under DEDUPE_LATE_POLICY=%s\n", verbOf(cfg), cfg.LatePolicy)
	case e.Late:
		fmt.Fprintf(w, "a copy decided now: late (past its deadline), not deduplicated: %s under DEDUPE_LATE_POLICY=%s\n", verbOf(cfg), cfg.LatePolicy)
	case e.Seen():
		fmt.Fprintf(w, "a copy decided now: duplicate, dropped (a filter holds the ID: it was seen, or this is a false positive at about p = %g)\n", cfg.FalsePositiveRate)
	default:
		fmt.Fprintln(w, "a copy decided now: first seen, forwarded (no filter holds the ID)")
	}
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "window start (UTC)\tstage\tkey\texists\tTTL\tholds the ID")
	for _, p := range e.Probes {
		holds := "-"
		if p.Exists {
			holds = strconv.FormatBool(p.Holds)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%t\t%v\t%s\n", p.Start.Format(time.RFC3339), p.Stage, p.Key, p.Exists, p.TTL.Round(time.Second), holds)
	}
	return tw.Flush()
}

func verbOf(cfg config.Config) string {
	if cfg.LatePolicy == config.LateDeadLetter {
		return "dead-lettered"
	}
	return "forwarded with dedupe-undeduplicated"
}

func explainSource(ctx context.Context, w io.Writer, f *bloom.Filter, src bloom.Source, shard int) error {
	r, err := f.ExplainSource(ctx, src, shard)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "source %v, shard %d: record %s", src, shard, r.Key)
	if !r.Exists {
		fmt.Fprintln(w, " does not exist")
		fmt.Fprintln(w, "no verdict: nothing of this partition was decided in this shard, or the record expired with the filters it guards")
		return nil
	}
	fmt.Fprintf(w, ", TTL %v, decided up to offset %d\n", r.TTL.Round(time.Second), r.Watermark-1)
	switch r.Recorded {
	case bloom.RecordedForward:
		fmt.Fprintln(w, "recorded verdict: forwarded (first seen, or not deduplicated: late or future); a replay is forwarded again")
	case bloom.RecordedDrop:
		fmt.Fprintln(w, "recorded verdict: dropped as a duplicate; a replay is dropped again")
	case bloom.NotDecided:
		fmt.Fprintf(w, "no verdict: offset %d is past the highest decided (%d): not decided yet, or its event had another ID's shard (give -id)\n", src.Offset, r.Watermark-1)
	case bloom.Forgotten:
		fmt.Fprintf(w, "no verdict: offset %d is beyond the replay horizon (the record keeps the last %d offsets); a replay would be forwarded as replay_unknown\n", src.Offset, r.Horizon)
	}
	return nil
}

package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/event"
)

// explain answers "why was my event dropped?" from Redis, read-only, with
// the worker's own configuration.
func explain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var in idInput
	fs.StringVar(&in.id, "id", "", "the event's ID as the worker reads it: the JSON field's value, the key, the header's value, or the dedupe-id header")
	fs.StringVar(&in.hex, "id-hex", "", "the ID in hexadecimal, for binary keys and headers")
	fs.Func("part", "one field of a composite ID (DEDUPE_ID_FIELD with several paths), as the event has it; repeat in their order", func(s string) error {
		in.parts = append(in.parts, s)
		return nil
	})
	fs.StringVar(&in.valueFile, "value", "", "with DEDUPE_ID_FROM=value: a file holding the event's value, byte for byte (- for stdin)")
	at := fs.String("time", "", "the event time: RFC 3339, or Unix seconds or milliseconds")
	src := fs.String("source", "", "topic/partition/offset of an input event, as in the dedupe-source header")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "dedupe-worker explain: "+format+"\n", a...)
		return code
	}
	if fs.NArg() > 0 || (*src == "" && (!in.given() || *at == "")) {
		return fail(2, "want -id ID (or -id-hex, -part, -value) -time T, or -source topic/partition/offset (and the ID with several shards)")
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
	idSrc, err := cfg.IDSource()
	if err != nil {
		return fail(2, "%v", err)
	}
	var id []byte
	if in.given() {
		if id, err = in.resolve(idSrc, os.Stdin); err != nil {
			return fail(2, "%v", err)
		}
		if in.id == "" {
			fmt.Fprintf(stdout, "the worker makes the ID %q (%s)\n", id, idSrc)
		}
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
	if id != nil && *at != "" {
		if err := explainID(ctx, stdout, f, cfg, id, t); err != nil {
			return fail(1, "%v", err)
		}
	}
	if *src != "" {
		s, ok := event.ParseSource([]byte(*src))
		if !ok {
			return fail(2, "-source %q: want topic/partition/offset", *src)
		}
		var when time.Time
		if *at != "" {
			when = t
		}
		if err := explainSource(ctx, stdout, f, cfg, bloom.Source{Topic: s.Topic, Partition: int32(s.Partition), Offset: s.Offset}, id, when); err != nil {
			if errors.Is(err, bloom.ErrInvalidElement) {
				return fail(2, "%v (give -id, the event's ID, to find its shard)", err)
			}
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
	win := f.Window()
	fmt.Fprintf(w, "ID %q, event time %s: %s window starting %s (bucket %d), shard %d\n",
		id, t.UTC().Format(time.RFC3339), cfg.WindowMode, win.Start(e.Bucket).Format(time.RFC3339), e.Bucket, e.Shard)
	fmt.Fprintf(w, "deduplicated until %s (the end of its window plus DEDUPE_MAX_LAG %v)\n", e.Deadline.Format(time.RFC3339), win.MaxLag)
	switch {
	case e.Future:
		fmt.Fprintf(w, "a copy decided now: future (stamped so far ahead of the clock that its window starts after the next window's preallocation lead), not deduplicated: %s\n", lateAction(cfg))
	case e.Late:
		fmt.Fprintf(w, "a copy decided now: late (past its deadline), not deduplicated: %s\n", lateAction(cfg))
	case e.Seen() && cfg.Mode == config.ModeShadow:
		fmt.Fprintf(w, "a copy decided now: duplicate, forwarded with dedupe-verdict: duplicate under DEDUPE_MODE=shadow (a filter holds the ID: it was seen, or this is a false positive at about p = %g)\n", cfg.FalsePositiveRate)
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

// lateAction is what becomes of an event beyond the lag bound.
func lateAction(cfg config.Config) string {
	switch {
	case cfg.Mode == config.ModeShadow:
		return "forwarded with dedupe-undeduplicated, as every valid event under DEDUPE_MODE=shadow"
	case cfg.LatePolicy == config.LateDeadLetter:
		return "dead-lettered under DEDUPE_LATE_POLICY=" + cfg.LatePolicy
	}
	return "forwarded with dedupe-undeduplicated under DEDUPE_LATE_POLICY=" + cfg.LatePolicy
}

// idInput is the ID as the operator gives it: the ID itself (-id, -id-hex),
// the fields of a composite (-part), or the value it is the hash of
// (-value).
type idInput struct {
	id, hex   string
	parts     []string
	valueFile string
}

func (in idInput) given() bool {
	return in.id != "" || in.hex != "" || len(in.parts) > 0 || in.valueFile != ""
}

// resolve makes the ID the worker would make from what was given, for the
// pipeline's ID source; stdin is read for -value -.
func (in idInput) resolve(src consumer.IDSource, stdin io.Reader) ([]byte, error) {
	n := 0
	for _, set := range []bool{in.id != "", in.hex != "", len(in.parts) > 0, in.valueFile != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("give the ID one way: -id, -id-hex, -part (each field of a composite) or -value")
	}
	switch {
	case in.id != "":
		return []byte(in.id), nil
	case in.hex != "":
		b, err := hex.DecodeString(in.hex)
		if err != nil || len(b) == 0 {
			return nil, fmt.Errorf("-id-hex %q: want hexadecimal digits, two per byte", in.hex)
		}
		return b, nil
	case len(in.parts) > 0:
		if !src.Composite() {
			return nil, fmt.Errorf("-part is for a composite ID; this pipeline's ID is %s", src)
		}
		if len(in.parts) != len(src.Paths) {
			return nil, fmt.Errorf("%d -part flags; the ID is a %s: give one per field, in that order", len(in.parts), src)
		}
		parts := make([][]byte, len(in.parts))
		for i, p := range in.parts {
			if p == "" {
				return nil, fmt.Errorf("-part %d is empty; the worker dead-letters an event with an empty field", i+1)
			}
			parts[i] = []byte(p)
		}
		return consumer.AppendCompositeID(nil, parts...), nil
	}
	if src.Kind != consumer.ValueID {
		return nil, fmt.Errorf("-value is for DEDUPE_ID_FROM=value; this pipeline's ID is %s", src)
	}
	var v []byte
	var err error
	if in.valueFile == "-" {
		v, err = io.ReadAll(stdin)
	} else {
		v, err = os.ReadFile(in.valueFile)
	}
	if err != nil {
		return nil, fmt.Errorf("-value: %w", err)
	}
	if len(v) == 0 {
		return nil, errors.New("-value: empty; the worker dead-letters an event with an empty value")
	}
	return consumer.AppendValueID(nil, v), nil
}

func explainSource(ctx context.Context, w io.Writer, f *bloom.Filter, cfg config.Config, src bloom.Source, id []byte, t time.Time) error {
	r, err := f.ExplainSource(ctx, src, id, t)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "source %v, shard %d: record %s", src, r.Shard, r.Key)
	if !r.Exists {
		fmt.Fprintln(w, " does not exist")
		fmt.Fprintln(w, "no verdict: nothing of this partition was decided in this shard, or the record expired with the filters it guards")
		return nil
	}
	fmt.Fprintf(w, ", TTL %v, decided up to offset %d\n", r.TTL.Round(time.Second), r.Watermark-1)
	if src.Offset < r.Delivered {
		fmt.Fprintf(w, "delivered: the partition was delivered up to offset %d; a replay is committed without being forwarded, dropped or dead-lettered again\n", r.Delivered-1)
	}
	switch r.Recorded {
	case bloom.RecordedForward:
		fmt.Fprintln(w, "recorded verdict: forwarded (first seen, or not deduplicated: late or future); a replay is forwarded again")
	case bloom.RecordedDrop:
		if cfg.Mode == config.ModeShadow {
			fmt.Fprintln(w, "recorded verdict: a duplicate, forwarded with dedupe-verdict: duplicate under DEDUPE_MODE=shadow; a replay is marked so again (and dropped under drop)")
			break
		}
		fmt.Fprintln(w, "recorded verdict: dropped as a duplicate; a replay is dropped again")
	case bloom.NotDecided:
		fmt.Fprintf(w, "no verdict: offset %d is past the highest decided (%d): not decided yet, or its event had another ID's shard (give -id)\n", src.Offset, r.Watermark-1)
	case bloom.Forgotten:
		fmt.Fprintf(w, "no verdict: offset %d is beyond the replay horizon (the record keeps the last %d offsets); a replay would be forwarded as replay_unknown\n", src.Offset, r.Horizon)
	}
	return nil
}

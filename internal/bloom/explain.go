package bloom

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Probe is one filter key a decision about an ID reads: a stage of a
// bucket's filter in the ID's shard.
type Probe struct {
	Bucket int64
	Start  time.Time // of the bucket's window
	Stage  int
	// Key is the stage's key in the ID's shard; of a stage in several
	// parts, the part holding the ID's first word. Exists and TTL are of
	// every part holding one of its words (TTL the shortest).
	Key    string
	Exists bool
	TTL    time.Duration
	// Holds: every bit of the ID is set in this key. An ID a filter holds
	// was added to it, or is a false positive of it.
	Holds bool
}

// Explanation says what a decision about an ID with an event time would
// read now, and what it would find.
type Explanation struct {
	Bucket   int64 // of the event time
	Shard    int
	Deadline time.Time // the end of the bucket plus the lag bound
	// Late and Future: a decision now would not test the filters at all.
	Late, Future bool
	// Probes are the keys a decision now would test, bucket by bucket in
	// time order: the previous one (rolling windows), the event's own, the
	// next one (rolling, once the event's bucket has ended).
	Probes []Probe
}

// Seen reports whether a copy of the ID decided now would be taken for a
// duplicate: some probe holds it.
func (e Explanation) Seen() bool {
	for _, p := range e.Probes {
		if p.Holds {
			return true
		}
	}
	return false
}

// Explain reads, without writing anything, which buckets, shard and
// stages a decision about id with event time t would test now, and
// whether each holds it, each window by the plan recorded with it. It is
// for tooling (dedupe-worker explain), not the hot path.
func (f *Filter) Explain(ctx context.Context, id []byte, t time.Time) (Explanation, error) {
	if len(id) == 0 || t.IsZero() {
		return Explanation{}, fmt.Errorf("%w: an ID and an event time are needed", ErrInvalidElement)
	}
	w := f.cfg.Window
	at := w.place(t, f.cfg.Now(), f.cfg.MaxFutureSkew, f.cfg.MaxClockSkew)
	e := Explanation{Bucket: at.bucket, Deadline: w.Deadline(t), Late: at.status == Late, Future: at.status == Future}
	for _, b := range at.buckets() {
		wp, err := f.planOf(ctx, b, false)
		if err != nil {
			return e, err
		}
		var loc location
		wp.locate(id, &loc)
		if b == at.bucket {
			e.Shard = loc.shard
		}
		for st := range wp.plan.Stages {
			p := Probe{Bucket: b, Start: w.Start(b), Stage: st}
			if err := f.probe(ctx, wp, &p, &loc); err != nil {
				return e, err
			}
			if !p.Exists && st > 0 {
				break // later stages are made in order
			}
			e.Probes = append(e.Probes, p)
		}
	}
	return e, nil
}

// probe reads whether p's keys exist, their TTL, and the ID's words (or
// fingerprint) in them.
func (f *Filter) probe(ctx context.Context, wp *windowPlan, p *Probe, loc *location) error {
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	if wp.plan.Kind == KindFingerprint {
		return f.probeFingerprint(cctx, wp, p, loc)
	}
	// The ID's words, by the key that holds them.
	type word struct {
		j   int
		off uint64
	}
	var keys []string
	byKey := map[string][]word{}
	for j := 0; j < wp.plan.Layout.Words; j++ {
		key, off := wp.stageKey(loc.shard, p.Bucket, 0), loc.word[j]
		if p.Stage > 0 {
			var pt int
			pt, off = stageWord(loc.u[j], wp.plan.Stages[p.Stage])
			key = wp.partKey(loc.shard, p.Bucket, p.Stage, pt)
		}
		if byKey[key] == nil {
			keys = append(keys, key)
		}
		byKey[key] = append(byKey[key], word{j, off})
	}
	p.Key, p.Exists, p.Holds = keys[0], true, true
	for i, key := range keys {
		ttl, err := f.client.PTTL(cctx, key).Result()
		if err != nil {
			return fmt.Errorf("%w: reading the TTL of %s: %w", ErrRedis, key, err)
		}
		if ttl == -2 {
			p.Exists, p.Holds, p.TTL = false, false, 0
			return nil
		}
		if i == 0 || max(ttl, 0) < p.TTL {
			p.TTL = max(ttl, 0)
		}
		args := make([]any, 0, 3*len(byKey[key]))
		for _, w := range byKey[key] {
			args = append(args, "GET", fmt.Sprintf("u%d", WordBits), w.off)
		}
		vals, err := f.client.BitField(cctx, key, args...).Result()
		if err != nil {
			return fmt.Errorf("%w: reading %s: %w", ErrRedis, key, err)
		}
		if len(vals) != len(byKey[key]) {
			return fmt.Errorf("%w: reading %s: %d words for %d asked", ErrRedis, key, len(vals), len(byKey[key]))
		}
		for k, v := range vals {
			j := byKey[key][k].j
			mask := uint64(loc.hi[j])<<26 | uint64(loc.lo[j])
			p.Holds = p.Holds && uint64(v)&mask == mask
		}
	}
	return nil
}

// RecordExplanation is what the decision record of a source's partition
// (in one shard) says of it.
type RecordExplanation struct {
	Key    string
	Shard  int
	Exists bool
	TTL    time.Duration
	// Watermark is one past the highest offset decided in this shard's
	// record of the partition; Horizon how far back it reaches.
	Watermark, Horizon int64
	Recorded           Recorded
	// Delivered is the record's delivered mark: every offset of the
	// partition below it was delivered, and a replay of one is skipped.
	Delivered int64
}

// ExplainSource reads, without writing anything, the decision record of
// src: the verdict a replay of it would get, or why there is none. A
// source's record is that of its event's window's plan and of its ID's
// shard under that plan: give the event's ID and time; without the time
// the record of this replica's own plan is read, and without the ID shard
// 0's, which is the only shard of a plan that has one.
func (f *Filter) ExplainSource(ctx context.Context, src Source, id []byte, t time.Time) (RecordExplanation, error) {
	wp := f.own
	if !t.IsZero() {
		var err error
		if wp, err = f.planOf(ctx, f.cfg.Window.Bucket(t), false); err != nil {
			return RecordExplanation{}, err
		}
	}
	shard := 0
	if id != nil {
		var loc location
		wp.locate(id, &loc)
		shard = loc.shard
	} else if wp.plan.Shards > 1 {
		return RecordExplanation{}, fmt.Errorf("%w: %d shards: decision records are per shard; give the event's ID to find its shard", ErrInvalidElement, wp.plan.Shards)
	}
	r := RecordExplanation{Key: wp.recordKey(shard, src.Topic, src.Partition), Shard: shard, Horizon: f.cfg.ReplayHorizon}
	cctx, cancel := f.callCtx(ctx)
	defer cancel()
	rec, err := f.client.Get(cctx, r.Key).Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		return r, fmt.Errorf("%w: reading %s: %w", ErrRedis, r.Key, err)
	}
	ttl, err := f.client.PTTL(cctx, r.Key).Result()
	if err != nil {
		return r, fmt.Errorf("%w: reading the TTL of %s: %w", ErrRedis, r.Key, err)
	}
	r.Exists, r.TTL, r.Watermark = len(rec) >= 8, max(ttl, 0), watermark(rec)
	r.Recorded = decodeRecorded(rec, src.Offset, f.cfg.ReplayHorizon)
	r.Delivered = deliveredMark(rec, f.cfg.ReplayHorizon)
	return r, nil
}

package demo

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/clicktest"
	"dedupe-worker/internal/consumer"
)

// input is one produced event as the ground truth knows it.
type input struct {
	partition int32
	offset    int64
	id        int32 // index into truth.ids; -1 when malformed
}

// truth is what the demo produced.
type truth struct {
	clicktest.Truth
	ids     []string // distinct valid IDs, in order of first appearance
	idIndex map[string]int32
	idTime  []int64 // event time (Unix ms) of each ID; its copies carry it too
	inputs  []input
	valid   int // valid events: first copies and repeats
}

func newTruth(n int) *truth {
	return &truth{Truth: clicktest.Truth{Valid: map[string]bool{}}, idIndex: map[string]int32{}, inputs: make([]input, 0, n)}
}

// add records e, produced at partition p and offset off.
func (t *truth) add(e clicktest.Event, p int32, off int64) {
	t.Add(e)
	in := input{partition: p, offset: off, id: -1}
	if e.ID != "" {
		t.valid++
		i, ok := t.idIndex[e.ID]
		if !ok {
			i = int32(len(t.ids))
			t.idIndex[e.ID] = i
			t.ids = append(t.ids, e.ID)
			t.idTime = append(t.idTime, e.Time.UnixMilli())
		}
		in.id = i
	}
	t.inputs = append(t.inputs, in)
}

// replayHorizon is how many offsets per partition a decision record
// reaches back: bloom.Config's default ReplayHorizon, which app.NewFilter
// keeps.
const replayHorizon = 65536

// recorded is a decision read from a decision record.
type recorded uint8

const (
	notDecided  recorded = iota // at or above the record's watermark
	overwritten                 // older than the record reaches
	recordedFirst
	recordedDuplicate
)

// readRecords returns the decision records of partition p of topic, one
// per shard (nil where a shard has none).
func readRecords(ctx context.Context, rc redis.UniversalClient, f *bloom.Filter, topic string, p int32) ([][]byte, error) {
	out := make([][]byte, f.Plan().Shards)
	for s := range out {
		b, err := rc.Get(ctx, f.RecordKey(s, topic, p)).Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		out[s] = b
	}
	return out, nil
}

// decision reads offset off from the decision records of its partition.
// In a record, bits 0 to 62 hold the watermark (the highest offset decided
// in that shard, plus one) and bit 64 + off mod R the decision on off, 1
// for forwarded and 0 for duplicate, bits counted from the most
// significant bit of the first byte as Redis counts them. Only the shard
// of the event's ID decides it; the other shards' records hold 0 at that
// offset or nothing, so an offset decided anywhere reads 1 in some record
// if it was forwarded. That holds while the partition has fewer than R
// offsets, so that no position of the ring was used twice.
func decision(recs [][]byte, off int64) recorded {
	var mark int64
	first := false
	for _, rec := range recs {
		if len(rec) < 8 {
			continue
		}
		mark = max(mark, int64(binary.BigEndian.Uint64(rec[:8])>>1))
		pos := 64 + off%replayHorizon
		if int(pos/8) < len(rec) && rec[pos/8]>>(7-pos%8)&1 == 1 {
			first = true
		}
	}
	switch {
	case off >= mark:
		return notDecided
	case off < mark-replayHorizon:
		return overwritten
	case first:
		return recordedFirst
	}
	return recordedDuplicate
}

// fates is what became of the valid IDs.
type fates struct {
	forwardedIDs   int // distinct valid IDs forwarded at least once
	falsePositives int // never forwarded; every copy was decided duplicate
	lost           int // never forwarded though a copy was decided first seen
	unclassified   int // never forwarded; a copy's decision cannot be read
	// recordedFirst and recordedDup count the decisions the records hold
	// for the valid events.
	recordedFirst, recordedDup, recordedNone int
}

// classify splits the valid IDs never forwarded into false positives and
// losses by the decisions recorded for their copies.
func classify(tr *truth, out []*kgo.Record, records map[int32][][]byte) fates {
	var f fates
	forwarded := make([]bool, len(tr.ids))
	for _, r := range out {
		if i, ok := tr.idIndex[clicktest.Header(r, clicktest.IDHeader)]; ok && !forwarded[i] {
			forwarded[i] = true
			f.forwardedIDs++
		}
	}
	// Per ID never forwarded: whether any copy was decided first seen, and
	// whether any copy's decision is unreadable.
	const anyFirst, anyUnknown = 1, 2
	flags := make([]uint8, len(tr.ids))
	for _, in := range tr.inputs {
		if in.id < 0 {
			continue
		}
		d := decision(records[in.partition], in.offset)
		switch d {
		case recordedFirst:
			f.recordedFirst++
		case recordedDuplicate:
			f.recordedDup++
		default:
			f.recordedNone++
		}
		if forwarded[in.id] {
			continue
		}
		switch d {
		case recordedFirst:
			flags[in.id] |= anyFirst
		case notDecided, overwritten:
			flags[in.id] |= anyUnknown
		}
	}
	for i := range tr.ids {
		switch {
		case forwarded[i]:
		case flags[i]&anyFirst != 0:
			f.lost++
		case flags[i]&anyUnknown != 0:
			f.unclassified++
		default:
			f.falsePositives++
		}
	}
	return f
}

// deadReasons counts dead letters (distinct by dedupe-source) by the
// reason in their dedupe-error header, named as the worker's metric
// labels name them.
func deadReasons(dead []*kgo.Record) map[string]int {
	reasons := []struct {
		err   error
		label string
	}{
		{consumer.ErrNotJSON, "not_json"}, {consumer.ErrTooDeep, "too_deep"}, {consumer.ErrNoID, "no_id"},
		{consumer.ErrEmptyID, "empty_id"}, {consumer.ErrBadID, "bad_id"}, {consumer.ErrNoTime, "no_time"},
		{consumer.ErrBadTime, "bad_time"}, {consumer.ErrInvalidUTF8, "invalid_utf8"}, {consumer.ErrTooLarge, "too_large"},
	}
	seen := map[string]bool{}
	out := map[string]int{}
	for _, r := range dead {
		src := clicktest.Header(r, clicktest.SourceHeader)
		if seen[src] {
			continue
		}
		seen[src] = true
		msg, label := clicktest.Header(r, clicktest.ErrorHeader), "other"
		for _, x := range reasons {
			if strings.Contains(msg, x.err.Error()) {
				label = x.label
				break
			}
		}
		out[label]++
	}
	return out
}

// expectedFalsePositives is the mean and variance of the number of false
// positives among the first tests of perBucket[b] distinct IDs per window
// bucket b. The test of the i-th new ID of a bucket finds a filter of
// plan.Bits() bits holding i IDs, so it is a false positive with
// probability fpr(i) = BlockedFPR(bits/i); an ID that is a false positive
// has all its bits set already, so setting them changes nothing and the
// filter is what i insertions make either way. In rolling mode a test also
// reads the previous bucket, full by then: 1 - (1 - fpr(prev))(1 - fpr(i)).
func expectedFalsePositives(plan bloom.Plan, rolling bool, perBucket map[int64]int) (mean, variance float64) {
	fpr := func(i float64) float64 {
		if i <= 0 {
			return 0
		}
		return bloom.BlockedFPR(float64(plan.Bits())/i, plan.Layout)
	}
	buckets := make([]int64, 0, len(perBucket))
	for b := range perBucket {
		buckets = append(buckets, b)
	}
	slices.Sort(buckets)
	for _, b := range buckets {
		d := float64(perBucket[b])
		var prev float64
		if n, ok := perBucket[b-1]; ok && rolling {
			prev = fpr(float64(n))
		}
		steps := min(perBucket[b], 2000)
		w := d / float64(steps)
		for s := 0; s < steps; s++ {
			i := (float64(s) + 0.5) * w
			p := 1 - (1-prev)*(1-fpr(i))
			mean += p * w
			variance += p * (1 - p) * w
		}
	}
	return mean, variance
}

// within reports whether observed is within a generous statistical bound
// of a count with this mean and variance: six standard deviations, plus 5%
// of the mean for the approximations of the model, plus 3.
func within(observed int, mean, variance float64) bool {
	return math.Abs(float64(observed)-mean) <= 6*math.Sqrt(variance)+0.05*mean+3
}

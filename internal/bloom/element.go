package bloom

// What the caller passes in (elements and their sources) and gets back
// (verdicts).

import (
	"time"

	"dedupe-worker/internal/event"
)

// Source is where an element was read, a Kafka topic, partition and
// offset: the event format's source (the same type, not a copy), which
// the worker writes in every message's dedupe-source header.
type Source = event.Source

// MaxOffset is the largest source offset accepted: Lua numbers are exact to
// 2^53, and offsets are kept with room to spare.
const MaxOffset = 1<<52 - 1

// Element is one event to deduplicate.
type Element struct {
	// ID identifies the event; copies of an event share it. Any bytes, not
	// empty.
	ID []byte
	// Time is the event time; it chooses the window bucket.
	Time time.Time
	// Source is unique per event read; replays of it get the same verdict.
	Source Source
}

// Verdict is the decision on one element.
type Verdict uint8

const (
	// FirstSeen: not seen before in the window; forward it.
	FirstSeen Verdict = iota + 1
	// Duplicate: seen before in the window; drop it.
	Duplicate
	// ReplayedFirstSeen: this source offset was decided FirstSeen before;
	// forward it again.
	ReplayedFirstSeen
	// ReplayedDuplicate: this source offset was decided Duplicate before.
	ReplayedDuplicate
	// ReplayUnknown: this source offset was decided before, further back
	// than the decision record reaches; forwarded, as losing it would be
	// worse than passing a copy.
	ReplayUnknown
	// Late: the event is processed at or after its Window.Deadline, its
	// bucket's end plus MaxLag, by the caller's clock or the Redis
	// server's: its keys may be gone, so it is not deduplicated (no key is
	// written). A replay is judged by the clock at the replay: an offset
	// recorded forward (first seen, late or future) whose event is late
	// now is Late again, so a caller's policy for late events holds on
	// replays; the record keeps one bit per offset, forward or drop, so a
	// first-seen event replayed after its deadline is Late too.
	Late
	// Future: the event's bucket is after the bucket of the clock plus
	// Config.MaxFutureSkew; not deduplicated, no key written. A replay of
	// it is Future while it still is, and ReplayedFirstSeen after.
	Future
	// ReplayedDelivered: this source offset is below its partition's
	// delivered mark (Filter.Delivered): it was decided and delivered
	// before, and is neither forwarded nor dropped again, only committed.
	ReplayedDelivered
)

// ProbeAnswer is Decide's answer for a probe.
type ProbeAnswer uint8

const (
	// ProbeNew: not decided before (now it is).
	ProbeNew ProbeAnswer = iota
	// ProbeDecided: decided before and not delivered: its replica may be
	// delivering it still, or died before it did.
	ProbeDecided
	// ProbeDelivered: delivered before.
	ProbeDelivered
)

// probed and answerDecided carry a probe's answers ProbeNew and
// ProbeDecided through decode; never returned as verdicts.
const (
	probed        Verdict = 255
	answerDecided Verdict = 254
)

var verdictNames = [...]string{"invalid", "first_seen", "duplicate", "replayed_first_seen", "replayed_duplicate", "replay_unknown", "late", "future", "replayed_delivered"}

// Verdicts lists every verdict, in the order of their values: loops over
// verdicts use it, so a new verdict is never left out.
func Verdicts() []Verdict {
	vs := make([]Verdict, 0, len(verdictNames)-1)
	for v := 1; v < len(verdictNames); v++ {
		vs = append(vs, Verdict(v))
	}
	return vs
}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return verdictNames[0]
}

// Forward reports whether the element is to be passed on: not for a
// duplicate, nor for a replay delivered before.
func (v Verdict) Forward() bool {
	return v != Duplicate && v != ReplayedDuplicate && v != ReplayedDelivered
}

// Label is v as the output labels it (event.VerdictHeader, and the
// verdict label of dedupe_partition_verdicts_total): event.First for a
// verdict to forward, event.Duplicate for one to drop. The event format
// keeps two values because a reader of the output needs no more; the
// engine's verdicts say why.
func (v Verdict) Label() event.Verdict {
	if v.Forward() {
		return event.First
	}
	return event.Duplicate
}

// Package event owns the format of what the worker writes about each event:
// the headers it adds to forwarded messages and dead letters, the source
// identity (where the event was read) that downstream counts deduplicate
// replays by and the engine keys its decision records by, the dead-letter
// reasons, and the verdicts shadow mode marks forwarded events with.
// The worker writes it; the output balancer, the demo, the tools and the
// tests read it, all through this package.
package event

import (
	"bytes"
	"errors"
	"strconv"
)

// Headers the worker adds.
const (
	// SourceHeader is on every message the worker writes: the
	// topic/partition/offset of the input message it was made from.
	// Downstream counts drop replays by it.
	SourceHeader = "dedupe-source"
	// IDHeader carries the element ID of a forwarded message.
	IDHeader = "dedupe-id"
	// ErrorHeader carries, on a dead letter, why it could not be
	// deduplicated, in words.
	ErrorHeader = "dedupe-error"
	// ReasonHeader carries, on a dead letter, the reason as its label
	// (Reason.String): what programs read.
	ReasonHeader = "dedupe-reason"
	// UndeduplicatedHeader marks a message forwarded without deduplication
	// because it was beyond the lag bound: "late" or "future". A copy of it
	// may have been forwarded before.
	UndeduplicatedHeader = "dedupe-undeduplicated"
	// VerdictHeader is on every deduplicated message forwarded in shadow
	// mode: what drop mode would have done with it, as a Verdict label
	// ("first" or "duplicate"); on every copy sent to the duplicates
	// topic ("duplicate"); and on every event forwarded unchecked
	// (Unchecked).
	VerdictHeader = "dedupe-verdict"
	// Unchecked is the VerdictHeader value of an event forwarded without
	// its test-and-set, while the filter failed and the worker was set to
	// fail open: a copy of it may have been forwarded before.
	Unchecked = "unchecked"
)

// Verdict is what drop mode does with a deduplicated event: forward it
// (First: seen for the first time, a replay of one, or a replay older
// than the decision records) or drop it (Duplicate). Shadow mode forwards
// both and says which in the VerdictHeader; the per-partition verdict
// metric counts them in either mode.
type Verdict uint8

// The verdicts.
const (
	First Verdict = iota
	Duplicate
)

var verdictLabels = [...]string{"first", "duplicate"}

// verdictValues are the labels as header values, shared by every message
// (never written to).
var verdictValues = [...][]byte{[]byte(verdictLabels[First]), []byte(verdictLabels[Duplicate])}

// Verdicts are all the verdicts, in order.
func Verdicts() []Verdict { return []Verdict{First, Duplicate} }

// String is the verdict's label: the VerdictHeader value and the verdict
// label of dedupe_partition_verdicts_total.
func (v Verdict) String() string {
	if int(v) < len(verdictLabels) {
		return verdictLabels[v]
	}
	return "unknown"
}

// Value is the VerdictHeader value of v. The slice is shared: callers
// must not write to it.
func (v Verdict) Value() []byte {
	if int(v) < len(verdictValues) {
		return verdictValues[v]
	}
	return []byte(v.String())
}

// ParseVerdict reads a VerdictHeader value.
func ParseVerdict(b []byte) (Verdict, bool) {
	for i, l := range verdictLabels {
		if string(b) == l {
			return Verdict(i), true
		}
	}
	return 0, false
}

// Source is where an input message was: its topic, partition and offset.
// The worker writes it in the SourceHeader of what it forwards and
// dead-letters, and the engine keys its decision records and delivered
// marks by it (bloom.Element.Source).
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
}

// String is the SourceHeader value of s, topic/partition/offset.
func (s Source) String() string { return string(s.Append(nil)) }

// Append appends the SourceHeader value of s to b.
func (s Source) Append(b []byte) []byte {
	b = append(b, s.Topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(s.Partition), 10)
	b = append(b, '/')
	return strconv.AppendInt(b, s.Offset, 10)
}

// ParseSource reads a SourceHeader value. Topic names cannot hold '/', so
// the last two fields are the partition and the offset.
func ParseSource(v []byte) (Source, bool) {
	j, p, o, ok := parseSource(v)
	if !ok {
		return Source{}, false
	}
	return Source{Topic: string(v[:j]), Partition: int32(p), Offset: o}, true
}

// SourcePartition is the partition of a SourceHeader value that
// ParseSource reads, without making the rest: the output balancer needs it
// for every message. ok is ParseSource's.
func SourcePartition(v []byte) (partition int, ok bool) {
	_, p, _, ok := parseSource(v)
	return p, ok
}

// parseSource reads a SourceHeader value: the topic is v[:topicEnd].
func parseSource(v []byte) (topicEnd, partition int, offset int64, ok bool) {
	i := bytes.LastIndexByte(v, '/')
	if i <= 0 {
		return 0, 0, 0, false
	}
	j := bytes.LastIndexByte(v[:i], '/')
	if j <= 0 {
		return 0, 0, 0, false
	}
	p, err := strconv.ParseInt(string(v[j+1:i]), 10, 32) // Kafka's partitions are int32
	if err != nil || p < 0 {
		return 0, 0, 0, false
	}
	o, err := strconv.ParseInt(string(v[i+1:]), 10, 64)
	if err != nil || o < 0 {
		return 0, 0, 0, false
	}
	return j, int(p), o, true
}

// Reason is why a message went to the dead-letter topic. Its label
// (String) is the ReasonHeader value and the reason label of
// dedupe_events_dead_lettered_total; the error that sends a message there
// carries it (Reason.Err, ReasonOf).
type Reason uint8

// The reasons.
const (
	// Other: an error that carries no reason.
	Other Reason = iota
	// NotJSON: the ID is read from JSON fields, and the value is not JSON.
	NotJSON
	// TooDeep: the value nests deeper than the worker parses.
	TooDeep
	// NoID: the JSON field of the ID is missing.
	NoID
	// EmptyID: the ID, or a part of a composite, is empty.
	EmptyID
	// BadID: the JSON field of the ID is not a string or a number.
	BadID
	// NoTime: the event time is missing.
	NoTime
	// BadTime: the event time is in no form the worker reads.
	BadTime
	// InvalidUTF8: the ID is a JSON string that is not valid UTF-8.
	InvalidUTF8
	// TooLarge: the message is too large to be written again with the
	// headers the worker adds; its dead letter has no value.
	TooLarge
	// Late: processed after the lag bound, under the dead-letter policy.
	Late
	// Future: stamped so far ahead of the clock that its window starts
	// after the next window's preallocation lead, under the dead-letter
	// policy.
	Future
	// Refused: the output topic refused the forwarded event as invalid
	// (INVALID_RECORD, INVALID_TIMESTAMP, CORRUPT_MESSAGE).
	Refused
	// NoKey: the ID is the message key, and the message has none (a null
	// key and an empty one read the same).
	NoKey
	// NoHeader: the ID is a header the message does not carry.
	NoHeader
	// EmptyHeader: the ID header is there, with an empty value.
	EmptyHeader
	// EmptyValue: the ID is the hash of the value, and the value is empty.
	EmptyValue
	// NoIDPart: the ID is a composite of JSON fields, and one is missing.
	NoIDPart
)

// reasonLabels is the one table of the reasons: each constant's label.
var reasonLabels = [...]string{
	Other: "other", NotJSON: "not_json", TooDeep: "too_deep", NoID: "no_id", EmptyID: "empty_id", BadID: "bad_id",
	NoTime: "no_time", BadTime: "bad_time", InvalidUTF8: "invalid_utf8", TooLarge: "too_large", Late: "late", Future: "future",
	Refused: "refused", NoKey: "no_key", NoHeader: "no_header", EmptyHeader: "empty_header", EmptyValue: "empty_value",
	NoIDPart: "no_id_part",
}

// Reasons are all the reasons, in order: loops over them (metrics made at
// 0, tests) use this rather than the last constant.
func Reasons() []Reason {
	rs := make([]Reason, len(reasonLabels))
	for i := range rs {
		rs[i] = Reason(i)
	}
	return rs
}

// String is the reason's label: the ReasonHeader value and the reason
// label of dedupe_events_dead_lettered_total.
func (r Reason) String() string {
	if int(r) < len(reasonLabels) {
		return reasonLabels[r]
	}
	return reasonLabels[Other]
}

// ParseReason reads a label; an unknown one is Other.
func ParseReason(label string) Reason {
	for i, l := range reasonLabels {
		if l == label {
			return Reason(i)
		}
	}
	return Other
}

// Err returns a new error with the text msg that carries r: ReasonOf finds
// r in it, and in any error that wraps it. Each call makes a distinct
// error: make one per cause, once, and test for it with errors.Is.
func (r Reason) Err(msg string) error { return &reasonError{reason: r, msg: msg} }

// reasonError is an error of Reason.Err.
type reasonError struct {
	reason Reason
	msg    string
}

func (e *reasonError) Error() string { return e.msg }

// DeadLetterReason is the reason e carries.
func (e *reasonError) DeadLetterReason() Reason { return e.reason }

// ReasonOf is the reason a dead-letter error carries: that of the first
// error in its chain with a method DeadLetterReason() Reason (the errors
// of Reason.Err have one), or Other when none has. It reads types, never
// the text.
func ReasonOf(err error) Reason {
	if r, ok := errors.AsType[interface {
		error
		DeadLetterReason() Reason
	}](err); ok {
		return r.DeadLetterReason()
	}
	return Other
}

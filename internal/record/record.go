// Package record owns the format of what the worker writes: the headers it
// adds to forwarded messages and dead letters, the source identity that
// downstream counts deduplicate replays by, and the dead-letter reasons.
// The worker writes it; the output balancer, the demo, the tools and the
// tests read it, all through this package.
package record

import (
	"bytes"
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
)

// Source is where an input message was: its topic, partition and offset.
type Source struct {
	Topic     string
	Partition int
	Offset    int64
}

// AppendSource appends the SourceHeader value of a source,
// topic/partition/offset, to b.
func AppendSource(b []byte, topic string, partition int, offset int64) []byte {
	b = append(b, topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, '/')
	return strconv.AppendInt(b, offset, 10)
}

// ParseSource reads a SourceHeader value. Topic names cannot hold '/', so
// the last two fields are the partition and the offset.
func ParseSource(v []byte) (Source, bool) {
	i := bytes.LastIndexByte(v, '/')
	if i <= 0 {
		return Source{}, false
	}
	j := bytes.LastIndexByte(v[:i], '/')
	if j <= 0 {
		return Source{}, false
	}
	p, err := strconv.Atoi(string(v[j+1 : i]))
	if err != nil || p < 0 {
		return Source{}, false
	}
	o, err := strconv.ParseInt(string(v[i+1:]), 10, 64)
	if err != nil || o < 0 {
		return Source{}, false
	}
	return Source{Topic: string(v[:j]), Partition: p, Offset: o}, true
}

// Reason is why a message went to the dead-letter topic.
type Reason uint8

// The reasons.
const (
	Other Reason = iota
	NotJSON
	TooDeep
	NoID
	EmptyID
	BadID
	NoTime
	BadTime
	InvalidUTF8
	TooLarge
	Late
	Future
	// Refused: the output topic refused the forwarded event as invalid
	// (INVALID_RECORD, INVALID_TIMESTAMP, CORRUPT_MESSAGE).
	Refused
)

var reasonLabels = [...]string{"other", "not_json", "too_deep", "no_id", "empty_id", "bad_id", "no_time", "bad_time", "invalid_utf8",
	"too_large", "late", "future", "refused"}

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

package sink

// The record set of a produce request, encoded here rather than by
// kafka-go's generic encoder, which writes every field of every record
// (and of each of its headers) through a call of its own: for the
// worker's records, with two headers each, that was a tenth of its CPU.
// The bytes are those kafka-go writes for the same messages (a test holds
// them equal): the record set's size, then one record batch (magic 2, no
// compression, create time, no producer ID).

import (
	"encoding/binary"
	"hash/crc32"
	"time"

	"github.com/segmentio/kafka-go"
)

// castagnoli is the CRC of a record batch (CRC-32C).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Offsets of the fields of a record batch that are filled in last.
const (
	batchLengthAt = 8  // int32: the bytes after it
	crcAt         = 17 // uint32: CRC-32C of the bytes after it
	attributesAt  = 21 // where the CRC starts
)

// appendRecordSet appends to b the record set of the messages of msgs at
// order, in that order, as kafka-go's protocol.RecordSet (version 2)
// writes it. A message whose time is zero (or within the first millisecond
// of 1970) is stamped now, in Unix milliseconds, as kafka-go stamps it.
// order must not be empty.
func appendRecordSet(b []byte, msgs []kafka.Message, order []int, now int64) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint32(b, 0) // the set's size, filled in last
	batch := len(b)
	first := millis(msgs[order[0]].Time, now)
	maxTime := int64(0) // kafka-go's starting point, kept for equal bytes
	for _, i := range order {
		maxTime = max(maxTime, millis(msgs[i].Time, now))
	}
	b = binary.BigEndian.AppendUint64(b, 0)          // base offset
	b = binary.BigEndian.AppendUint32(b, 0)          // batch length, filled in last
	b = binary.BigEndian.AppendUint32(b, 0xffffffff) // partition leader epoch: -1
	b = append(b, 2)                                 // magic
	b = binary.BigEndian.AppendUint32(b, 0)          // CRC, filled in last
	b = binary.BigEndian.AppendUint16(b, 0)          // attributes
	b = binary.BigEndian.AppendUint32(b, uint32(len(order)-1))
	b = binary.BigEndian.AppendUint64(b, uint64(first))
	b = binary.BigEndian.AppendUint64(b, uint64(maxTime))
	b = binary.BigEndian.AppendUint64(b, 0xffffffffffffffff) // producer ID: -1
	b = binary.BigEndian.AppendUint16(b, 0xffff)             // producer epoch: -1
	b = binary.BigEndian.AppendUint32(b, 0xffffffff)         // base sequence: -1
	b = binary.BigEndian.AppendUint32(b, uint32(len(order)))
	for k, i := range order {
		m := &msgs[i]
		delta := millis(m.Time, now) - first
		n := 1 + zigzagLen(delta) + zigzagLen(int64(k)) + nullBytesLen(m.Key) + nullBytesLen(m.Value) + zigzagLen(int64(len(m.Headers)))
		for _, h := range m.Headers {
			n += zigzagLen(int64(len(h.Key))) + len(h.Key) + nullBytesLen(h.Value)
		}
		b = binary.AppendVarint(b, int64(n))
		b = append(b, 0) // record attributes
		b = binary.AppendVarint(b, delta)
		b = binary.AppendVarint(b, int64(k))
		b = appendNullBytes(b, m.Key)
		b = appendNullBytes(b, m.Value)
		b = binary.AppendVarint(b, int64(len(m.Headers)))
		for _, h := range m.Headers {
			b = binary.AppendVarint(b, int64(len(h.Key)))
			b = append(b, h.Key...)
			b = appendNullBytes(b, h.Value)
		}
	}
	binary.BigEndian.PutUint32(b[batch+batchLengthAt:], uint32(len(b)-batch-12))
	binary.BigEndian.PutUint32(b[batch+crcAt:], crc32.Checksum(b[batch+attributesAt:], castagnoli))
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-batch))
	return b
}

// millis is t in Unix milliseconds as kafka-go reckons it: now for a zero
// t, and for one that comes to 0.
func millis(t time.Time, now int64) int64 {
	ms := int64(0)
	if !t.IsZero() {
		ms = t.UnixNano() / int64(time.Millisecond)
	}
	if ms == 0 {
		return now
	}
	return ms
}

// nowMillis is the time appendRecordSet stamps a message without one with.
func nowMillis() int64 { return millis(time.Now(), 0) }

// appendNullBytes appends v with its length as a varint, -1 for nil.
func appendNullBytes(b, v []byte) []byte {
	if v == nil {
		return binary.AppendVarint(b, -1)
	}
	return append(binary.AppendVarint(b, int64(len(v))), v...)
}

// zigzagLen is the length of v as a zig-zag varint (binary.AppendVarint).
func zigzagLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// nullBytesLen is the length appendNullBytes appends for v.
func nullBytesLen(v []byte) int {
	if v == nil {
		return zigzagLen(-1)
	}
	return zigzagLen(int64(len(v))) + len(v)
}

package consumer

// The IDs the worker makes rather than reads: a composite of JSON fields
// and the hash of a value. Their encodings are fixed: filters in Redis
// hold IDs made with them.

import (
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"github.com/spaolacci/murmur3"
)

// AppendCompositeID appends to dst the ID of a composite made of parts,
// as the worker makes it from several JSON fields: each part, in the
// order of the ID source's paths, as its length in bytes (decimal), ':',
// its bytes and ',' (a netstring). So ("a", "bc") is 1:a,2:bc, and ("ab",
// "c") is 2:ab,1:c,: parts that split differently never make the same ID.
// A part is a string field's content (unescaped) or a number's JSON text.
func AppendCompositeID(dst []byte, parts ...[]byte) []byte {
	for _, p := range parts {
		dst = appendCompositePart(dst, view(p))
	}
	return dst
}

func appendCompositePart(dst []byte, p string) []byte {
	dst = strconv.AppendInt(dst, int64(len(p)), 10)
	dst = append(dst, ':')
	dst = append(dst, p...)
	return append(dst, ',')
}

// compositePartLen is the encoded length of a part of n bytes.
func compositePartLen(n int) int {
	digits := 1
	for x := n; x >= 10; x /= 10 {
		digits++
	}
	return digits + n + 2
}

// ValueIDLen is the length of a value ID: 32 hexadecimal digits.
const ValueIDLen = 32

// AppendValueID appends to dst the ID of a message whose ID is its value:
// the 128-bit MurmurHash3 (x64) of the value, h1 then h2, big-endian, in
// lowercase hexadecimal. Byte-identical values get the same ID.
func AppendValueID(dst, value []byte) []byte {
	h1, h2 := murmur3.Sum128(value)
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], h1)
	binary.BigEndian.PutUint64(raw[8:], h2)
	return hex.AppendEncode(dst, raw[:])
}

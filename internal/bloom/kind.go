package bloom

import (
	"fmt"
	"strings"
)

// Kind is what a window's filter is made of.
type Kind uint8

const (
	// KindBloom is a blocked Bloom filter in Redis bitmaps: each element
	// sets a few bits in a few 52-bit words (the package doc, Sizing). The
	// default, and the only kind before the fingerprint table.
	KindBloom Kind = iota
	// KindFingerprint is a table of fingerprints with linear probing in
	// Redis strings: each element is a few bytes in the first free slot at
	// or after its home, read and written whole (the package doc,
	// Fingerprints).
	KindFingerprint
)

// Kinds lists the kinds, in the order plan compares them.
var Kinds = []Kind{KindBloom, KindFingerprint}

var kindNames = [...]string{KindBloom: "bloom", KindFingerprint: "fingerprint"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind_%d", uint8(k))
}

// ParseKind reads "bloom" or "fingerprint".
func ParseKind(s string) (Kind, error) {
	for k, name := range kindNames {
		if strings.EqualFold(s, name) {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("%w: filter kind %q: want bloom or fingerprint", ErrInvalidPlan, s)
}

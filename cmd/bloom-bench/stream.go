package main

import (
	"encoding/hex"
	"math/rand/v2"
)

// stream yields IDs: each is, with probability dup, a copy of a uniformly
// chosen earlier distinct ID, else a new one. Distinct ID j is the hex of a
// bijective mix of j, so the ground truth needs no set.
type stream struct {
	rng      *rand.Rand
	dup      float64
	distinct uint64
}

func idOf(j uint64) []byte {
	z := j + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	var raw [8]byte
	for i := range raw {
		raw[i] = byte(z >> (8 * i))
	}
	return []byte(hex.EncodeToString(raw[:]))
}

// next returns an ID and its distinct index.
func (s *stream) next() ([]byte, uint64) {
	if s.distinct > 0 && s.rng.Float64() < s.dup {
		j := s.rng.Uint64N(s.distinct)
		return idOf(j), j
	}
	s.distinct++
	return idOf(s.distinct - 1), s.distinct - 1
}

// truth counts, per distinct ID, the copies a method passed as new. A
// method may pass any one copy of an ID (the engine orders a batch by
// partition), so errors are counted per ID: none passed is a false
// positive, more than one passed are duplicates let through.
type truth struct{ passed []uint8 }

func newTruth(n int) *truth { return &truth{passed: make([]uint8, n)} }

func (t *truth) add(j uint64, saidNew bool) {
	if saidNew && t.passed[j] < 255 {
		t.passed[j]++
	}
}

func (t *truth) finish(r *result, distinct uint64) {
	for _, n := range t.passed[:distinct] {
		if n == 0 {
			r.falsePos++
		} else {
			r.falseNeg += int(n) - 1
		}
	}
}

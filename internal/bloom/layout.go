package bloom

import (
	"math"
	"math/bits"

	"github.com/spaolacci/murmur3"
)

// location is where one element lives: its shard, and in that shard's
// bitmap the bit offset of each of its words with the bits to set there,
// split into the high and low 26 bits of the 52-bit word value.
type location struct {
	shard  int
	word   [MaxWords]uint64 // bit offset of the word in the shard
	hi, lo [MaxWords]uint32
	// u is each word's position in [0, 1): the output that gave its index,
	// as a double. Stage i >= 1 of a window puts the word at index
	// floor(u * words of the stage), in Go and in the script alike. The
	// fingerprint kind has one position, u[0], and its fingerprint, fp
	// (fingerprint.go).
	u  [MaxWords]float64
	fp uint64
}

// stageWord is the part and the bit offset in it of a word at position u
// in a stage st: word floor(u * words of the stage on a shard), in parts of
// PartBits. The script computes the same with the same double arithmetic.
func stageWord(u float64, st Stage) (part int, off uint64) {
	w := uint64(math.Floor(u * float64(st.ShardBits/WordBits)))
	per := st.PartBits / WordBits
	return int(w / per), w % per * WordBits
}

// golden is the splitmix64 increment (2^64 / φ).
const golden = 0x9e3779b97f4a7c15

// splitmix64 advances *s and returns the next output of the splitmix64
// generator (Steele, Lea and Flood), a bijective mixer of good quality.
func splitmix64(s *uint64) uint64 {
	*s += golden
	z := *s
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// reduce maps x uniformly onto [0, n) by the high word of x*n.
func reduce(x, n uint64) uint64 {
	hi, _ := bits.Mul64(x, n)
	return hi
}

// locate computes the location of id under the plan. This mapping is stored in Redis for
// as long as a window lives and is shared by replicas of different
// versions: it must never change (golden tests pin it). A new mapping needs
// a new layout version, which gives new key names.
//
// h1, h2 = MurmurHash3 x64 128 (seed 0) of id. The shard is reduce(h2,
// shards). A splitmix64 stream seeded with h1 then yields, per word, one
// output for the word index (reduce(out, words per shard)) and one or more
// outputs whose 16-bit pieces, reduced onto [0, 52), give distinct bit
// positions; position i is value bit 51-i of the word, because BITFIELD
// reads the first bit of a field as its most significant.
func (w *windowPlan) locate(id []byte, loc *location) { locate(&w.plan, id, loc) }

// locate is the location of id under plan p (see windowPlan.locate).
func locate(p *Plan, id []byte, loc *location) {
	h1, h2 := murmur3.Sum128(id)
	if p.Kind == KindFingerprint {
		locateFingerprint(h1, h2, p.Shards, loc)
		return
	}
	loc.shard = int(reduce(h2, uint64(p.Shards)))
	nwords := p.ShardBits / WordBits
	s := h1
	for j := 0; j < p.Layout.Words; j++ {
		out := splitmix64(&s)
		loc.word[j] = reduce(out, nwords) * WordBits
		loc.u[j] = float64(out>>11) * 0x1p-53
		var mask uint64
		set := 0
		for set < p.Layout.BitsPerWord {
			r := splitmix64(&s)
			for piece := 0; piece < 4 && set < p.Layout.BitsPerWord; piece++ {
				pos := (r >> (16 * piece) & 0xffff) * WordBits >> 16
				bit := uint64(1) << (WordBits - 1 - pos)
				if mask&bit == 0 {
					mask |= bit
					set++
				}
			}
		}
		loc.hi[j] = uint32(mask >> 26)
		loc.lo[j] = uint32(mask & (1<<26 - 1))
	}
}

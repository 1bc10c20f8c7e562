package bloom

// How Redis allocates the keys: the sizes a plan rounds to.

import (
	"math"
	"math/bits"
)

// keyBits sizes one key of at least bits bits (up to limit): the
// allocator's class it takes, and the bits that fill it, a multiple of
// WordBits. Filling the class costs no memory and lowers the rate.
func keyBits(bits, limit uint64) (class, filled uint64) {
	words := (bits + WordBits - 1) / WordBits
	class = allocClass((words*WordBits+7)/8 + shardOverhead)
	return class, min((class-shardOverhead)*8, limit) / WordBits * WordBits
}

// keyBytes is the length of a key of bits bits: a bitmap's last byte may
// be partly used (bits is a multiple of WordBits, which 8 does not divide).
// A key made shorter would grow, and be reallocated, by the first write to
// its last word.
func keyBytes(bits uint64) uint64 { return (bits + 7) / 8 }

// maxStagePartBits bounds one key of a stage past the first: 128 MiB.
// Each key of a stage is made in one SET, which Redis passes whole to its
// replicas, and a replica's output buffer has a hard limit of 256 MB by
// default.
const maxStagePartBits = MaxKeyBits / 4

// perShardCount is what one shard counts as its share of n elements:
// elements are spread over the shards by hash, evenly on average, with a
// standard deviation of about the square root of the share. Three of them
// are added, so that a window at its planned size does not make any shard
// grow; the shard's rate at that fill is above its target by a few
// percent of it at most for shares of thousands.
func perShardCount(n int64, shards int) int64 {
	if shards == 1 {
		return n
	}
	m := float64(n) / float64(shards)
	return int64(math.Ceil(m + 3*math.Sqrt(m)))
}

// shardOverhead is the bytes beside the bitmap in one allocation: the sds
// header and terminator, with room to spare.
const shardOverhead = 64

// allocClass is the size jemalloc (Redis's default allocator) hands out for
// a request of size bytes: above 16 KiB its classes are spaced at a quarter
// of the enclosing power of two. Filling the class costs no memory and
// lowers the false-positive rate.
func allocClass(size uint64) uint64 {
	if size <= 16<<10 {
		return (size + 15) &^ 15
	}
	// Classes in (2^k, 2^(k+1)] are 2^k + i*2^(k-2), i = 1..4.
	k := 63 - bits.LeadingZeros64(size-1)
	step := uint64(1) << (k - 2)
	return (size + step - 1) / step * step
}

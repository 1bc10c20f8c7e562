package consumer

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/segmentio/kafka-go"
)

// batchOffsets keeps the first message of each partition and offset of a
// batch and drops the later ones, as a set of every offset would: in
// batches that ascend, that interleave partitions, that go back after a
// re-fetch, and that repeat offsets; and again after a reset.
func TestFirstOfEachOffset(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var o batchOffsets
	for round := range 200 {
		// Ascending offsets on three partitions, interleaved; from some
		// rounds on, a re-fetch repeats a stretch of one partition.
		var batch []kafka.Message
		next := []int64{0, 100, 5}
		for range 50 + rng.IntN(50) {
			p := rng.IntN(len(next))
			batch = append(batch, kafka.Message{Partition: p, Offset: next[p]})
			next[p]++
		}
		if round%2 == 1 {
			p := rng.IntN(len(next))
			from := next[p] - 1 - int64(rng.IntN(10))
			for off := from; off < next[p]+3; off++ {
				batch = append(batch, kafka.Message{Partition: p, Offset: off})
			}
		}
		want := map[[2]int64]bool{}
		var wantKept, kept []int
		for i, m := range batch {
			k := [2]int64{int64(m.Partition), m.Offset}
			if !want[k] {
				want[k] = true
				wantKept = append(wantKept, i)
			}
		}
		o.reset()
		for i := range batch {
			if o.first(batch, i) {
				kept = append(kept, i)
			}
		}
		if !slices.Equal(kept, wantKept) {
			t.Fatalf("round %d: kept %v, want %v", round, kept, wantKept)
		}
		if repeats := len(batch) - len(wantKept); round%2 == 1 && repeats == 0 {
			t.Fatalf("round %d repeats no offset: the test tests nothing", round)
		}
	}
}

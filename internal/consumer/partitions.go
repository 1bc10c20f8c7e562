package consumer

// The batch's partitions: one scan (partitionSlots) serves the three
// things the worker keeps per partition of a batch: the highest offset
// while offsets ascend (batchOffsets), the message to commit (highest),
// and the first and duplicate verdicts (partitionVerdicts).

import (
	"github.com/segmentio/kafka-go"

	"dedupe-worker/internal/event"
)

// partitionSlots numbers the partitions of a batch in the order they first
// appear. A batch holds a few partitions, mostly in runs, so a short list
// searched from its last entry finds a partition at once, where a map
// would hash every message.
type partitionSlots struct{ parts []int }

// reset readies s for a new batch.
func (s *partitionSlots) reset() { s.parts = s.parts[:0] }

// slot is partition p's number, and whether p is new to the batch.
func (s *partitionSlots) slot(p int) (int, bool) {
	for k := len(s.parts) - 1; k >= 0; k-- {
		if s.parts[k] == p {
			return k, false
		}
	}
	s.parts = append(s.parts, p)
	return len(s.parts) - 1, true
}

// batchOffsets finds the offsets a batch holds more than once. A
// partition's offsets come in ascending order unless kafka-go fetched
// again, so while they do, the highest offset per partition tells that an
// offset is new; from the first that does not on, every offset is noted in
// a set.
type batchOffsets struct {
	slots partitionSlots
	// highest is each slot's highest offset so far, while they ascend.
	highest []int64
	// seen holds the batch's offsets once one did not ascend (any is set).
	seen map[[2]int64]struct{}
	any  bool
}

// reset readies o for a new batch.
func (o *batchOffsets) reset() {
	o.slots.reset()
	o.highest = o.highest[:0]
	if o.any {
		clear(o.seen)
		o.any = false
	}
}

// first reports whether batch[i] is the first message of the batch with
// its partition and offset; batch[:i] went through first before it.
func (o *batchOffsets) first(batch []kafka.Message, i int) bool {
	m := &batch[i]
	if !o.any {
		k, isNew := o.slots.slot(m.Partition)
		switch {
		case isNew:
			o.highest = append(o.highest, m.Offset)
			return true
		case m.Offset > o.highest[k]:
			o.highest[k] = m.Offset
			return true
		}
		// The first offset that does not ascend: batch[:i] are all new.
		o.any = true
		if o.seen == nil {
			o.seen = make(map[[2]int64]struct{}, len(batch))
		}
		for j := range batch[:i] {
			o.seen[[2]int64{int64(batch[j].Partition), batch[j].Offset}] = struct{}{}
		}
	}
	k := [2]int64{int64(m.Partition), m.Offset}
	if _, dup := o.seen[k]; dup {
		return false
	}
	o.seen[k] = struct{}{}
	return true
}

// highest appends to into, per partition of batch in the order they first
// appear, the message with the highest offset: what a commit names.
func highest(batch []kafka.Message, into []kafka.Message) []kafka.Message {
	// at is the index in batch of each slot's highest so far, so that a
	// message is copied once.
	var partsBuf, atBuf [16]int
	slots, at := partitionSlots{parts: partsBuf[:0]}, atBuf[:0]
	for i := range batch {
		k, isNew := slots.slot(batch[i].Partition)
		switch {
		case isNew:
			at = append(at, i)
		case batch[i].Offset > batch[at[k]].Offset:
			at[k] = i
		}
	}
	for _, i := range at {
		into = append(into, batch[i])
	}
	return into
}

// partitionVerdicts counts a batch's first and duplicate verdicts per
// input partition: n[k], by event.Verdict, for the partition of slot k.
type partitionVerdicts struct {
	slots partitionSlots
	n     [][2]int
}

// reset readies c for a new batch.
func (c *partitionVerdicts) reset() {
	c.slots.reset()
	c.n = c.n[:0]
}

// add counts verdict v of partition p.
func (c *partitionVerdicts) add(p int, v event.Verdict) {
	k, isNew := c.slots.slot(p)
	if isNew {
		c.n = append(c.n, [2]int{})
	}
	c.n[k][v]++
}

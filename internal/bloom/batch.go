package bloom

// The buffers of one test-and-set call, and the order its elements are
// sent in.

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"
)

// item is one element with everything derived from it: its placement,
// its window's plan (wp) and its location under it; and, for each
// neighbour the test reads whose plan is another, that plan and the
// location under it (else nil).
type item struct {
	loc  location
	at   placement
	wp   *windowPlan
	src  *Source
	t    time.Time // the event time, which at is placed by
	id   []byte
	nbWP [2]*windowPlan // the previous and the next bucket's plan, when other than wp
	nb   [2]location
}

// nbPlan is the plan of neighbour i of the item.
func (it *item) nbPlan(i int) *windowPlan {
	wp, _ := it.neighbour(i)
	return wp
}

// neighbour returns the plan of neighbour i (0: previous, 1: next) of
// the item and its location under it.
func (it *item) neighbour(i int) (*windowPlan, *location) {
	if it.nbWP[i] != nil {
		return it.nbWP[i], &it.nb[i]
	}
	return it.wp, &it.loc
}

// shardBucket is one shard's filter of one bucket: the keys of its
// stages and its growth record.
type shardBucket struct {
	shard  int
	bucket int64
}

// bucketGroup is the elements of a call decided in one shardBucket; they
// share the bucket's placement, so the same neighbours, and the shards of
// the neighbours they read (-1: not read), which differ from their own
// only under another plan.
type bucketGroup struct {
	shard      int
	at         placement
	prev, next int
}

func (g bucketGroup) own() shardBucket { return shardBucket{g.shard, g.at.bucket} }

// shardPartition is a source partition's decision record in one shard of
// a plan.
type shardPartition struct {
	wp        *windowPlan
	shard     int
	topic     string
	partition int32
}

// partitionRun is where the items of one shardPartition go in the call
// order: n items from start, placed of them so far.
type partitionRun struct {
	key              shardPartition
	n, start, placed int
}

// batch holds the reusable buffers of one call.
type batch struct {
	items []item
	order []int
	// now is the clock when the batch was prepared: every item is placed
	// by it, and the decision records' expiry is counted from it.
	now time.Time
	// planned are the windows' plans found for the items placed by now
	// (planFor).
	planned []planned
	// keys are the script's KEYS; keyIdx gives each one's 1-based index.
	keys   []string
	keyIdx map[string]int
	// The script's arguments (protocol.go): the plans, the partition
	// runs, the elements, the bucket groups, the buckets the call reads,
	// and where the elements are (two slots per plan).
	plansArg, runsArg, elemsArg, groupsArg, bucketsArg []byte
	locArgs                                            [][]byte
	scratch                                            []byte
	// plans are the distinct plans of the windows the call reads.
	plans []*windowPlan
	// groups are the bucket groups of the call, ascending by bucket; and
	// the plans of each one's own bucket and neighbours.
	groups  []bucketGroup
	groupWP [][3]*windowPlan
	// refOf numbers the buckets the call reads, its groups' own and their
	// neighbours (1-based); refs lists them by number.
	refOf map[shardBucket]int
	refs  []shardBucket
	// sources are the batch's sources, to refuse one twice before
	// anything is written.
	sources map[Source]struct{}
	// runOf, runs and runIdx put the items in call order (sortForCall).
	runOf  map[shardPartition]int
	runs   []partitionRun
	runIdx []int
}

var batchPool = sync.Pool{New: func() any {
	return &batch{keyIdx: map[string]int{}, runOf: map[shardPartition]int{}, refOf: map[shardBucket]int{}, sources: map[Source]struct{}{}}
}}

func getBatch() *batch { return batchPool.Get().(*batch) }

// putBatch returns b to the pool. Its items keep their capacity but drop
// their pointers into the caller's elements.
func putBatch(b *batch) {
	clear(b.items)
	b.items = b.items[:0]
	clear(b.keyIdx)
	batchPool.Put(b)
}

// key is the 1-based index of k in the script's KEYS, added if new.
func (b *batch) key(k string) int {
	if i, ok := b.keyIdx[k]; ok {
		return i
	}
	b.keys = append(b.keys, k)
	b.keyIdx[k] = len(b.keys)
	return len(b.keys)
}

// sortForCall sets b.order to the call order of the items: by (shard,
// plan, topic, partition), keeping arrival order inside a run (a stable
// counting sort: a batch has few runs), then by offset, which Kafka input
// already has. A source that appears twice is an ErrInvalidElement.
func (b *batch) sortForCall() error {
	clear(b.runOf)
	b.runs = b.runs[:0]
	b.order = slices.Grow(b.order[:0], len(b.items))[:len(b.items)]
	b.runIdx = slices.Grow(b.runIdx[:0], len(b.items))[:len(b.items)]
	for i := range b.items {
		it := &b.items[i]
		k := shardPartition{it.wp, it.loc.shard, it.src.Topic, it.src.Partition}
		r, ok := b.runOf[k]
		if !ok {
			r = len(b.runs)
			b.runOf[k] = r
			b.runs = append(b.runs, partitionRun{key: k})
		}
		b.runs[r].n++
		b.runIdx[i] = r
	}
	rank := make([]int, len(b.runs))
	for i := range rank {
		rank[i] = i
	}
	slices.SortFunc(rank, func(x, y int) int {
		a, c := b.runs[x].key, b.runs[y].key
		return cmp.Or(cmp.Compare(a.shard, c.shard), cmp.Compare(a.wp.tag, c.wp.tag), cmp.Compare(a.topic, c.topic), cmp.Compare(a.partition, c.partition))
	})
	start := 0
	for _, r := range rank {
		b.runs[r].start = start
		start += b.runs[r].n
	}
	for i := range b.items {
		r := &b.runs[b.runIdx[i]]
		b.order[r.start+r.placed] = i
		r.placed++
	}
	for _, r := range b.runs {
		if err := b.sortByOffset(b.order[r.start : r.start+r.n]); err != nil {
			return err
		}
	}
	return nil
}

// sortByOffset sorts one partition's run by offset, unless it is sorted
// already, and refuses an offset that appears twice.
func (b *batch) sortByOffset(run []int) error {
	offset := func(k int) int64 { return b.items[run[k]].src.Offset }
	sorted := true
	for k := 1; k < len(run); k++ {
		if offset(k) <= offset(k-1) {
			sorted = false
			break
		}
	}
	if sorted {
		return nil
	}
	slices.SortStableFunc(run, func(x, y int) int { return cmp.Compare(b.items[x].src.Offset, b.items[y].src.Offset) })
	for k := 1; k < len(run); k++ {
		if offset(k) == offset(k-1) {
			return fmt.Errorf("%w: source %v appears twice in the batch", ErrInvalidElement, *b.items[run[k]].src)
		}
	}
	return nil
}

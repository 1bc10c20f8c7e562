package sink

// One call: the messages of a round, or of a half of a refused batch, sorted
// by output partition, cut into record batches of at most BatchSize
// messages and MaxBatchBytes bytes, and sent one produce request per batch.
// A partition's requests go one at a time, in order; the partitions' go at
// once. Each message's answer is its batch's. A batch not yet sent when its
// call gave up is never sent: so a partition has at most one produce request
// on the wire, and a Write that gave up leaves behind at most that one.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

// call sends the messages at g and returns one answer per message, the
// broker's answer to its batch (nil: acknowledged). Before anything is
// sent, a closed Writer answers io.ErrClosedPipe for every message, and a
// topic whose partitions cannot be read the error of its metadata. When
// ctx ends before every answer came, call returns ctx's error instead of
// answers; the produce requests already sent go on in the background, until
// their answer or Config.Timeout, and Close waits for them; the batches
// not sent yet are not sent (errAbandoned).
func (s *send) call(ctx context.Context, g []int) ([]error, error) {
	s.calls++
	answers := make([]error, len(g))
	n, err := s.w.partitions(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		for k := range answers {
			answers[k] = err
		}
		return answers, nil
	}
	// order is the indexes in msgs of the messages at g, sorted by
	// partition, each partition's in the order of g, and pos[j] the place in
	// g of order[j]. A request may still read order after call gave up on
	// it, so it is new for each call.
	order := make([]int, len(g))
	pos := make([]int, len(g))
	part := make([]int, len(g))
	starts := make([]int, n+1) // partition p's messages are order[starts[p]:starts[p+1]]
	for k, i := range g {
		part[k] = partitionOf(&s.msgs[i], n)
		starts[part[k]+1]++
	}
	for p := range n {
		starts[p+1] += starts[p]
	}
	next := append([]int(nil), starts[:n]...)
	for k, i := range g {
		j := next[part[k]]
		next[part[k]]++
		order[j], pos[j] = i, k
	}
	var reqs []*request
	for p := range n {
		if lo, hi := starts[p], starts[p+1]; lo < hi {
			reqs = append(reqs, &request{ctx: ctx, partition: p, batches: s.w.batches(s.msgs, order, lo, hi)})
		}
	}
	if !s.w.start(reqs) {
		for k := range answers {
			answers[k] = io.ErrClosedPipe
		}
		return answers, nil
	}
	finished := make(chan *request, len(reqs))
	for _, r := range reqs {
		go s.w.send(r, s.msgs, order, finished)
	}
	for range reqs {
		select {
		case r := <-finished:
			for _, b := range r.batches {
				for j := b.lo; j < b.hi; j++ {
					answers[pos[j]] = b.err
				}
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return answers, nil
}

// request is what one call sends to one partition: its batches, in order.
type request struct {
	// ctx is the call's: once it ends, the batches not sent are not.
	ctx       context.Context
	partition int
	batches   []batch
	// after is closed once the partition's previous requests are answered;
	// done is closed once this one's are.
	after, done chan struct{}
}

// batch is the messages at order[lo:hi] of a call, one produce request,
// and the broker's answer.
type batch struct {
	lo, hi int
	err    error
}

// batches cuts the messages of msgs at order[lo:hi], one partition's, into
// record batches as kafka-go's writer would: a batch takes messages until
// it holds BatchSize of them or MaxBatchBytes bytes, or the next one would
// take it over MaxBatchBytes.
func (w *Writer) batches(msgs []kafka.Message, order []int, lo, hi int) []batch {
	var bs []batch
	first, size := lo, 0
	for j := lo; j < hi; j++ {
		n := recordSize(&msgs[order[j]])
		if j > first && size+n > MaxBatchBytes {
			bs = append(bs, batch{lo: first, hi: j})
			first, size = j, 0
		}
		size += n
		if j+1-first >= w.batchSize || size >= MaxBatchBytes {
			bs = append(bs, batch{lo: first, hi: j + 1})
			first, size = j+1, 0
		}
	}
	if first < hi {
		bs = append(bs, batch{lo: first, hi: hi})
	}
	return bs
}

// start queues reqs behind the requests under way to their partitions and
// counts them, or reports false when w is closed.
func (w *Writer) start(reqs []*request) bool {
	w.state.Lock()
	defer w.state.Unlock()
	if w.closed {
		return false
	}
	for _, r := range reqs {
		r.after, r.done = w.tails[r.partition], make(chan struct{})
		w.tails[r.partition] = r.done
	}
	w.requests.Add(len(reqs))
	return true
}

// errAbandoned is the answer of a batch not sent because its call had
// given up on it.
var errAbandoned = errors.New("not sent: the write gave up before its turn")

// send sends r's batches of msgs one after the other, once the
// partition's previous requests are answered, and hands r to finished.
// Once r's call has given up (r.ctx ended), the batches left are not sent:
// a message its caller will send again must not go out from here too, and
// a slow partition must not pile up the work of every Write that gave up
// on it. It still waits for the requests before it, so that the
// partition's next request starts only once the one on the wire is
// answered.
func (w *Writer) send(r *request, msgs []kafka.Message, order []int, finished chan<- *request) {
	defer w.requests.Done()
	defer close(r.done)
	if r.after != nil {
		<-r.after
	}
	for i := range r.batches {
		b := &r.batches[i]
		if err := r.ctx.Err(); err != nil {
			b.err = fmt.Errorf("%w: %w", errAbandoned, err)
			continue
		}
		b.err = w.produce(r.partition, &records{msgs: msgs, order: order[b.lo:b.hi]})
	}
	finished <- r
}

// produce sends recs to partition in one produce request, once, and
// returns the broker's answer. It is not cancelled with the Write that
// sent it: a request on its way is finished, within Config.Timeout.
func (w *Writer) produce(partition int, recs *records) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	gen := w.metadataGen.Load()
	res, err := w.client.Produce(ctx, &kafka.ProduceRequest{Topic: w.topic, Partition: partition,
		RequiredAcks: kafka.RequireAll, Records: recs})
	if err == nil && res != nil {
		err = res.Error
	}
	if err != nil {
		w.log.Warn("a produce request failed", zap.Int("partition", partition), zap.Int("messages", len(recs.order)), zap.Error(err))
		if staleMetadata(err) {
			w.refreshMetadata(gen)
		}
	}
	return err
}

// staleMetadata reports whether a produce answer says that the writer's
// idea of the partition's leader is out of date, as Kafka's own producer
// takes them (its InvalidMetadataException and its subclasses).
func staleMetadata(err error) bool {
	code, ok := errors.AsType[kafka.Error](err)
	if !ok {
		return false
	}
	switch code {
	case kafka.NotLeaderForPartition, kafka.LeaderNotAvailable, kafka.UnknownTopicOrPartition,
		kafka.KafkaStorageError, kafka.FencedLeaderEpoch, kafka.UnknownLeaderEpoch, kafka.BrokerNotAvailable:
		return true
	}
	return false
}

// refreshMetadata makes the next request read the cluster's metadata
// afresh, once per generation of it: a leader move answered by several
// partitions' requests at once refreshes it once. kafka-go's transport
// reads metadata on its own timer only (up to 6 s apart) and has no call
// to read it now; dropping its connection pool does it, since a new pool
// reads the metadata before its first request. Requests under way keep
// the old pool until they end.
func (w *Writer) refreshMetadata(gen uint64) {
	if w.metadataGen.CompareAndSwap(gen, gen+1) {
		w.transport.CloseIdleConnections()
	}
}

// partitions is the number of partitions of the topic, from the
// transport's metadata cache.
func (w *Writer) partitions(ctx context.Context) (int, error) {
	md, err := w.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{w.topic}})
	if err != nil {
		return 0, err
	}
	for _, t := range md.Topics {
		if t.Name != w.topic {
			continue
		}
		if t.Error != nil {
			return 0, t.Error
		}
		if len(t.Partitions) == 0 {
			break
		}
		return len(t.Partitions), nil
	}
	return 0, kafka.UnknownTopicOrPartition
}

// records reads the messages of msgs at order as the records of a
// produce request, without copying them.
type records struct {
	msgs       []kafka.Message
	order      []int
	next       int
	rec        kafka.Record
	key, value bytesReader
}

func (r *records) ReadRecord() (*kafka.Record, error) {
	if r.next >= len(r.order) {
		return nil, io.EOF
	}
	m := &r.msgs[r.order[r.next]]
	r.next++
	r.rec = kafka.Record{Time: m.Time, Headers: m.Headers}
	if m.Key != nil {
		r.key.Reset(m.Key)
		r.rec.Key = &r.key
	}
	if m.Value != nil {
		r.value.Reset(m.Value)
		r.rec.Value = &r.value
	}
	return &r.rec, nil
}

// bytesReader is a record's key or value.
type bytesReader struct{ bytes.Reader }

func (*bytesReader) Close() error { return nil }

package clickstream

// Kafka: writing records to a topic, reading a topic back to its end, and
// the offsets a group has committed.

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Produce writes recs to topic; opts are further client options (TLS,
// SASL).
func Produce(ctx context.Context, brokers []string, topic string, recs []*kgo.Record, opts ...kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		// Batches below a broker's default limit (1048588 bytes); a record of
		// up to about a megabyte still fits alone.
		kgo.ProducerBatchMaxBytes(1_040_000)}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// ReadToEnd reads every record of topic up to the end offsets its
// partitions have when it is called, or until ctx ends; opts are further
// client options (TLS, SASL).
func ReadToEnd(ctx context.Context, brokers []string, topic string, opts ...kgo.Opt) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchMaxBytes(64 << 20)}, opts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := EndOffsets(ctx, cl, topic)
	if err != nil {
		return nil, err
	}
	parts := map[int32]kgo.Offset{}
	left := 0
	for p, end := range ends {
		if end > 0 {
			parts[p] = kgo.NewOffset().AtStart()
			left++
		}
	}
	if left == 0 {
		return nil, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts})
	var out []*kgo.Record
	done := map[int32]bool{}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return out, fmt.Errorf("reading %s: %d partitions not read to the end: %w", topic, left, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= ends[r.Partition] {
				return
			}
			out = append(out, r)
			if r.Offset == ends[r.Partition]-1 && !done[r.Partition] {
				done[r.Partition] = true
				left--
			}
		})
	}
	return out, nil
}

// EndOffsets returns the end offset (the next offset to be written) of
// every partition of topic.
func EndOffsets(ctx context.Context, cl *kgo.Client, topic string) (map[int32]int64, error) {
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	mreq.Topics = append(mreq.Topics, mt)
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	if len(mresp.Topics) != 1 {
		return nil, fmt.Errorf("metadata of %s: %d topics in the reply", topic, len(mresp.Topics))
	}
	if err := kerr.ErrorForCode(mresp.Topics[0].ErrorCode); err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	lreq := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	for _, p := range mresp.Topics[0].Partitions {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition = p.Partition
		lp.Timestamp = -1 // the end
		lt.Partitions = append(lt.Partitions, lp)
	}
	lreq.Topics = append(lreq.Topics, lt)
	lresp, err := lreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	ends := map[int32]int64{}
	for _, t := range lresp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("end offset of %s/%d: %w", topic, p.Partition, err)
			}
			ends[p.Partition] = p.Offset
		}
	}
	if len(ends) != len(mresp.Topics[0].Partitions) {
		return nil, fmt.Errorf("end offsets of %s: %d of %d partitions answered", topic, len(ends), len(mresp.Topics[0].Partitions))
	}
	return ends, nil
}

// Committed returns the offsets group has committed for the partitions of
// topic; a partition without a commit is missing from the map, and so is
// every partition of a group that has not committed yet.
func Committed(ctx context.Context, cl *kgo.Client, group, topic string, partitions int32) (map[int32]int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	g := kmsg.NewOffsetFetchRequestGroup()
	g.Group = group
	t := kmsg.NewOffsetFetchRequestGroupTopic()
	t.Topic = topic
	for p := int32(0); p < partitions; p++ {
		t.Partitions = append(t.Partitions, p)
	}
	g.Topics = append(g.Topics, t)
	req.Groups = append(req.Groups, g)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	out := map[int32]int64{}
	add := func(code int16, p int32, off int64) error {
		if err := kerr.ErrorForCode(code); err != nil {
			return fmt.Errorf("committed offset of %s/%d: %w", topic, p, err)
		}
		if off >= 0 {
			out[p] = off
		}
		return nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	for _, rg := range resp.Groups {
		switch err := kerr.ErrorForCode(rg.ErrorCode); {
		case errors.Is(err, kerr.GroupIDNotFound): // no commit yet
			continue
		case err != nil:
			return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
		}
		for _, rt := range rg.Topics {
			for _, rp := range rt.Partitions {
				if err := add(rp.ErrorCode, rp.Partition, rp.Offset); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := add(rp.ErrorCode, rp.Partition, rp.Offset); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

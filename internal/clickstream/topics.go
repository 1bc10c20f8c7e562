package clickstream

// Kafka: writing records to a topic, reading a topic back to its end, and
// the offsets a group has committed.

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
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
	listed, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	if len(ends) == 0 {
		return nil, fmt.Errorf("end offsets of %s: no partition answered", topic)
	}
	return ends, nil
}

// Committed returns the offsets group has committed for the partitions of
// topic; a partition without a commit is missing from the map, and so is
// every partition of a group that has not committed yet.
func Committed(ctx context.Context, cl *kgo.Client, group, topic string) (map[int32]int64, error) {
	resp, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	switch {
	case errors.Is(err, kerr.GroupIDNotFound): // no commit yet
		return map[int32]int64{}, nil
	case err == nil:
		err = resp.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	out := map[int32]int64{}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.At >= 0 {
			out[o.Partition] = o.At
		}
	})
	return out, nil
}

package demo

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// committed returns the offsets group has committed for the partitions of
// topic; a partition without a commit is missing from the map.
func committed(ctx context.Context, cl *kgo.Client, group, topic string, partitions int32) (map[int32]int64, error) {
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
		if err := kerr.ErrorForCode(rg.ErrorCode); err != nil {
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

// groupState returns the state of group and its member count.
func groupState(ctx context.Context, cl *kgo.Client, group string) (string, int, error) {
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return "", 0, fmt.Errorf("describing group %s: %w", group, err)
	}
	if len(resp.Groups) != 1 {
		return "", 0, fmt.Errorf("describing group %s: %d groups in the reply", group, len(resp.Groups))
	}
	g := resp.Groups[0]
	if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
		return "", 0, fmt.Errorf("describing group %s: %w", group, err)
	}
	return g.State, len(g.Members), nil
}

package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
)

// Start is where a consumer group with no committed offsets begins
// reading. The zero value is the earliest offset.
//
// kafka-go's Reader applies its StartOffset to every partition without a
// commit, also after a rebalance, so a later start would skip whatever
// arrived in between. SetStart therefore commits the start once, before
// the Reader runs, and the Reader keeps StartOffset FirstOffset.
type Start struct {
	// Latest starts at the end of each partition when the worker starts.
	Latest bool
	// At, if not zero, starts at the first message whose Kafka timestamp
	// is at or after At; a partition with no such message starts at its
	// end.
	At time.Time
}

// String is "earliest", "latest", or the time in RFC 3339 (UTC).
func (s Start) String() string {
	switch {
	case s.Latest:
		return "latest"
	case !s.At.IsZero():
		return s.At.UTC().Format(time.RFC3339Nano)
	default:
		return "earliest"
	}
}

// earliest reports whether s is the earliest offset, which a new group
// gets from the Reader without any commit.
func (s Start) earliest() bool { return !s.Latest && s.At.IsZero() }

// SetStart commits the start offsets of group on every partition of topic,
// unless s is the earliest offset (nothing to do) or the group already has
// a committed offset on any partition of topic (it is not new: nothing is
// changed). It reports whether it committed. Every Kafka request is
// bounded by timeout (if positive) and cancelled with ctx. Latest takes
// precedence over At.
//
// The commit is made as by a group with no members (generation -1, no
// member ID), which Kafka accepts only while the group is empty. If it is
// refused because another replica started the group meanwhile, SetStart
// returns false once the group has commits, and the refusal otherwise.
// Kafka has no conditional commit: replicas that all find the group
// without commits all commit, and the last one's offsets stand.
func SetStart(ctx context.Context, c *kafka.Client, group, topic string, s Start, timeout time.Duration) (committed bool, err error) {
	if s.earliest() {
		return false, nil
	}
	// kafka-go may answer metadata from its cache without looking at ctx.
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("consumer group %q: setting its start on topic %q: %w", group, topic, err)
	}
	g := &groupStart{c: c, group: group, topic: topic, timeout: timeout}
	partitions, err := g.partitions(ctx)
	if err != nil {
		return false, err
	}
	has, err := g.hasCommits(ctx, partitions)
	if err != nil || has {
		return false, err
	}
	offsets, err := g.offsets(ctx, partitions, s)
	if err != nil {
		return false, err
	}

	commits := make([]kafka.OffsetCommit, len(partitions))
	for i, p := range partitions {
		commits[i] = kafka.OffsetCommit{Partition: p, Offset: offsets[p]}
	}
	rctx, cancel := g.request(ctx)
	resp, err := c.OffsetCommit(rctx, &kafka.OffsetCommitRequest{
		GroupID:      group,
		GenerationID: -1,
		Topics:       map[string][]kafka.OffsetCommit{topic: commits},
	})
	cancel()
	if err == nil {
		err = commitError(resp, topic, partitions)
	}
	if err == nil {
		return true, nil
	}
	if errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.RebalanceInProgress) {
		// Refused because the group is no longer empty: another replica
		// started it. That is fine once the group has commits.
		if has, ferr := g.hasCommits(ctx, partitions); ferr == nil && has {
			return false, nil
		}
	}
	return false, fmt.Errorf("consumer group %q: committing the %s offsets of topic %q: %w", group, s, topic, err)
}

// groupStart holds what the requests of SetStart share.
type groupStart struct {
	c            *kafka.Client
	group, topic string
	timeout      time.Duration
}

// request is the context of one request: ctx, bounded by the timeout.
func (g *groupStart) request(ctx context.Context) (context.Context, context.CancelFunc) {
	if g.timeout > 0 {
		return context.WithTimeout(ctx, g.timeout)
	}
	return context.WithCancel(ctx)
}

// partitions lists the partitions of the topic.
func (g *groupStart) partitions(ctx context.Context) ([]int, error) {
	rctx, cancel := g.request(ctx)
	defer cancel()
	resp, err := g.c.Metadata(rctx, &kafka.MetadataRequest{Topics: []string{g.topic}})
	if err != nil {
		return nil, fmt.Errorf("consumer group %q: listing the partitions of topic %q: %w", g.group, g.topic, err)
	}
	i := slices.IndexFunc(resp.Topics, func(t kafka.Topic) bool { return t.Name == g.topic })
	if i < 0 {
		return nil, fmt.Errorf("consumer group %q: topic %q is not in the broker's metadata", g.group, g.topic)
	}
	t := resp.Topics[i]
	if t.Error != nil {
		return nil, fmt.Errorf("consumer group %q: listing the partitions of topic %q: %w", g.group, g.topic, t.Error)
	}
	if len(t.Partitions) == 0 {
		return nil, fmt.Errorf("consumer group %q: topic %q has no partitions", g.group, g.topic)
	}
	ps := make([]int, len(t.Partitions))
	for j, p := range t.Partitions {
		ps[j] = p.ID
	}
	slices.Sort(ps)
	return ps, nil
}

// hasCommits reports whether the group has a committed offset on any of
// partitions.
func (g *groupStart) hasCommits(ctx context.Context, partitions []int) (bool, error) {
	rctx, cancel := g.request(ctx)
	defer cancel()
	resp, err := g.c.OffsetFetch(rctx, &kafka.OffsetFetchRequest{GroupID: g.group, Topics: map[string][]int{g.topic: partitions}})
	if err != nil {
		return false, fmt.Errorf("consumer group %q: fetching its committed offsets of topic %q: %w", g.group, g.topic, err)
	}
	// Kafka answers for a group it does not know with offset -1; kfake
	// says GROUP_ID_NOT_FOUND instead. Either way there are no commits.
	if errors.Is(resp.Error, kafka.GroupIdNotFound) {
		return false, nil
	}
	if resp.Error != nil {
		return false, fmt.Errorf("consumer group %q: fetching its committed offsets of topic %q: %w", g.group, g.topic, resp.Error)
	}
	has := false
	for _, p := range resp.Topics[g.topic] {
		if p.Error != nil {
			return false, fmt.Errorf("consumer group %q: fetching its committed offset of partition %d of topic %q: %w", g.group, p.Partition, g.topic, p.Error)
		}
		if p.CommittedOffset >= 0 {
			has = true
		}
	}
	return has, nil
}

// offsets finds the offset s stands for on each of partitions.
func (g *groupStart) offsets(ctx context.Context, partitions []int, s Start) (map[int]int64, error) {
	// The ends are listed before the times, so that a partition with no
	// message at or after At starts no later than its end at the time of
	// the lookup: a message produced in between is not skipped.
	ends, err := g.list(ctx, partitions, "latest", kafka.LastOffsetOf)
	if err != nil {
		return nil, err
	}
	offsets := make(map[int]int64, len(partitions))
	for _, p := range partitions {
		if offsets[p] = ends[p].LastOffset; offsets[p] < 0 {
			return nil, fmt.Errorf("consumer group %q: listing the latest offsets of topic %q: none for partition %d", g.group, g.topic, p)
		}
	}
	if s.Latest {
		return offsets, nil
	}
	at, err := g.list(ctx, partitions, s.String(), func(p int) kafka.OffsetRequest { return kafka.TimeOffsetOf(p, s.At) })
	if err != nil {
		return nil, err
	}
	for _, p := range partitions {
		// The broker answers offset -1 when no message is at or after
		// At; kafka-go then leaves Offsets empty.
		for off := range at[p].Offsets {
			if off >= 0 {
				offsets[p] = off
			}
		}
	}
	return offsets, nil
}

// list lists the offsets req asks for on each of partitions; what names
// them in errors.
func (g *groupStart) list(ctx context.Context, partitions []int, what string, req func(p int) kafka.OffsetRequest) (map[int]kafka.PartitionOffsets, error) {
	reqs := make([]kafka.OffsetRequest, len(partitions))
	for i, p := range partitions {
		reqs[i] = req(p)
	}
	rctx, cancel := g.request(ctx)
	defer cancel()
	resp, err := g.c.ListOffsets(rctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{g.topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("consumer group %q: listing the %s offsets of topic %q: %w", g.group, what, g.topic, err)
	}
	out := make(map[int]kafka.PartitionOffsets, len(partitions))
	for _, po := range resp.Topics[g.topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("consumer group %q: listing the %s offset of partition %d of topic %q: %w", g.group, what, po.Partition, g.topic, po.Error)
		}
		out[po.Partition] = po
	}
	for _, p := range partitions {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("consumer group %q: listing the %s offsets of topic %q: no answer for partition %d", g.group, what, g.topic, p)
		}
	}
	return out, nil
}

// commitError is the first error resp reports for partitions of topic,
// or an error if it leaves one of them unanswered.
func commitError(resp *kafka.OffsetCommitResponse, topic string, partitions []int) error {
	answered := make(map[int]bool, len(partitions))
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return fmt.Errorf("partition %d: %w", p.Partition, p.Error)
		}
		answered[p.Partition] = true
	}
	for _, p := range partitions {
		if !answered[p] {
			return fmt.Errorf("partition %d: no answer", p)
		}
	}
	return nil
}

package demo

// The demo's waits on the consumer group: until both replicas have joined
// it, and until it has committed every offset produced.

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/clickstream"
)

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

// poll calls try every 100 ms, each call bounded by 5 s, until try reports
// done (nil) or an error to give up with (that error), a replica stops
// early (early's error), or ctx ends (ctx's error).
func poll(ctx context.Context, early func() error, try func(context.Context) (done bool, err error)) error {
	for {
		if err := early(); err != nil {
			return err
		}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		done, err := try(tctx)
		cancel()
		if done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitForGroup waits until both replicas are members of the group and it
// is stable, so that they share the partitions from the first event.
func waitForGroup(ctx context.Context, cl *kgo.Client, early func() error) error {
	deadline := time.Now().Add(60 * time.Second)
	return poll(ctx, early, func(ctx context.Context) (bool, error) {
		state, members, err := groupState(ctx, cl, Group)
		if err == nil && state == "Stable" && members == Replicas {
			return true, nil
		}
		last := fmt.Sprintf("state %s, %d members", state, members)
		if err != nil {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("the replicas did not form group %s within 60s: %s", Group, last)
		}
		return false, nil
	})
}

// waitCommitted waits until the group's committed offsets reach ends,
// failing after a minute without progress.
func waitCommitted(ctx context.Context, cl *kgo.Client, partitions int32, ends map[int32]int64, early func() error) error {
	var want int64
	for _, e := range ends {
		want += e
	}
	var best int64 = -1
	lastMove := time.Now()
	return poll(ctx, early, func(ctx context.Context) (bool, error) {
		got, err := clickstream.Committed(ctx, cl, Group, InputTopic)
		if err == nil {
			var sum int64
			done := true
			for p, e := range ends {
				sum += min(got[p], e)
				if got[p] < e {
					done = false
				}
			}
			if done {
				return true, nil
			}
			if sum > best {
				best, lastMove = sum, time.Now()
			}
		}
		if time.Since(lastMove) > time.Minute {
			return false, fmt.Errorf("the replicas committed nothing for a minute: %d of %d offsets committed (last error: %v)", max(best, 0), want, err)
		}
		return false, nil
	})
}

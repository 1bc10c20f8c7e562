package demo

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
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

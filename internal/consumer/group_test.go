package consumer

import (
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/internal/kafkaconn"
	"dedupe-worker/internal/testenv"
)

// The test broker's coordinator (kfake) restarts its rebalance timer at
// every JoinGroup and removes members that did not rejoin only when that
// timer fires. Each case below starts with a member that joined and then
// died without leaving (a stand-in for a replica killed with kill -9,
// whose session the broker does not expire for a minute), then starts N
// readers whose joins are spread evenly over kafka-go's join period: the
// worst case for the timer. A Kafka coordinator would remove the dead
// member one rebalance timeout after the first reader joined.
//   - With the timings this project had before (rebalance timeout equal
//     to the session timeout of 10 s, back-off 0.5 s), two readers
//     re-send their joins every 15.5 s, 7.75 s apart: the timer never
//     fires, the dead member stays, the group does not become stable, and
//     every abandoned join leaves one more member behind. The test
//     watches one period; in the fault suite's crash burst this lasted
//     minutes.
//   - With GroupTimingsFor(10 s), two and three readers leave the timer
//     a gap longer than the rebalance timeout within one join period: the
//     dead member is removed and the group becomes stable with exactly
//     the live readers.
func TestGroupOutlivesDeadMember(t *testing.T) {
	before := GroupTimings{Session: 10 * time.Second, Heartbeat: 2 * time.Second, Rebalance: 10 * time.Second, JoinBackoff: 500 * time.Millisecond}
	now := GroupTimingsFor(10 * time.Second)
	for _, c := range []struct {
		name    string
		g       GroupTimings
		readers int
		stalls  bool
	}{
		{"before, 2 readers", before, 2, true},
		{"now, 2 readers", now, 2, false},
		{"now, 3 readers", now, 3, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newGroupRig(t)
			r.deadMember()
			period := c.g.JoinPeriod()
			start := time.Now()
			var last time.Time
			for i := range c.readers {
				hold(time.Duration(i)*period/time.Duration(c.readers) - time.Since(start))
				last = time.Now()
				r.startReader(c.g)
			}
			if c.stalls {
				// A period after the last reader joined (and a second for
				// its reconnection), every reader has given up a join and
				// sent another: the joins are spaced as at the start, so
				// what held until then goes on holding.
				window := period + time.Second
				var most int
				testenv.Throughout(t, window, "a group that is not stable, with the dead member in it", func() bool {
					d := r.describe()
					most = max(most, len(d.Members))
					return d.State != "Stable" && r.has(d, r.dead)
				})
				t.Logf("%v after the last reader joined: still %s, most members listed %d (%d readers)", window, r.describe().State, most, c.readers)
				if most < c.readers+2 {
					t.Errorf("at most %d members listed: the abandoned joins did not stay in the group", most)
				}
				return
			}
			// The timer fires within one period of the last reader's join;
			// the group then completes (the dead member may be made leader
			// and hold the sync barrier one rebalance timeout more), and a
			// reader that was between joins joins again.
			limit := 3*period + 2*c.g.Rebalance
			var d kmsg.DescribeGroupsResponseGroup
			testenv.Eventually(t, limit, fmt.Sprintf("a stable group of the %d readers", c.readers), func() bool {
				d = r.describe()
				return d.State == "Stable" && len(d.Members) == c.readers && !r.has(d, r.dead)
			})
			t.Logf("stable with %d members %v after the last reader joined", len(d.Members), time.Since(last).Round(10*time.Millisecond))
		})
	}
}

// hold lets d pass: the spacing of the readers' joins is the fault the
// test injects, not something it waits for.
func hold(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}

const (
	groupTopic = "in"
	groupName  = "dedupe-group-test"
)

// groupRig is a broker with topic "in" of six partitions, a client for
// the test's own requests, and the readers the test starts.
type groupRig struct {
	t    *testing.T
	k    *testenv.Kafka
	cl   *kgo.Client
	dead string // the member ID of the dead member
}

func newGroupRig(t *testing.T) *groupRig {
	t.Helper()
	k := testenv.StartKafka(t, testenv.Topics{groupTopic: 6})
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &groupRig{t: t, k: k, cl: cl}
}

// request sends one request of the test's own with a deadline.
func (r *groupRig) request(req kmsg.Request) kmsg.Response { return request(r.t, r.cl, req) }

// deadMember makes the group's first member: it joins with a session
// timeout of a minute, becomes leader, syncs, and then sends nothing more
// (no heartbeat, no LeaveGroup), as a process killed with SIGKILL would.
// Its rebalance timeout (1 s) is below every reader's (2.5 s and more), so
// that the readers' set the timer: the broker times a rebalance by the
// largest of its members'. It is not less, because the broker also waits
// that long for the sync after the join: the dead member's own sync,
// sent at once, must not miss it on a loaded machine.
func (r *groupRig) deadMember() {
	r.t.Helper()
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{groupTopic}
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group = groupName
	join.SessionTimeoutMillis = 60_000
	join.RebalanceTimeoutMillis = 1000
	join.ProtocolType = "consumer"
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = "range", meta.AppendTo(nil)
	join.Protocols = append(join.Protocols, p)
	var resp *kmsg.JoinGroupResponse
	for range 2 { // a first join without a member ID is answered with one
		resp = r.request(join).(*kmsg.JoinGroupResponse)
		if resp.ErrorCode != kerr.MemberIDRequired.Code {
			break
		}
		join.MemberID = resp.MemberID
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		r.t.Fatalf("the dead member's join: %v", err)
	}
	if resp.LeaderID != resp.MemberID {
		r.t.Fatalf("the dead member is not the leader of its own group: %s, leader %s", resp.MemberID, resp.LeaderID)
	}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.Generation, sync.MemberID = groupName, resp.Generation, resp.MemberID
	sync.ProtocolType, sync.Protocol = kmsg.StringPtr("consumer"), resp.Protocol
	if err := kerr.ErrorForCode(r.request(sync).(*kmsg.SyncGroupResponse).ErrorCode); err != nil {
		r.t.Fatalf("the dead member's sync: %v", err)
	}
	r.dead = resp.MemberID
	if d := r.describe(); d.State != "Stable" || len(d.Members) != 1 {
		r.t.Fatalf("after the dead member's sync the group is %s with %d members", d.State, len(d.Members))
	}
}

// startReader starts a reader of the group with the timings g, closed
// when the test ends, after the broker: a reader whose join the broker
// holds would otherwise wait for its deadline to close.
func (r *groupRig) startReader(g GroupTimings) {
	cfg := Config{Kafka: kafkaconn.Conn{Brokers: r.k.Addrs(), Timeout: 5 * time.Second}, Topic: groupTopic, GroupID: groupName, BatchSize: 100}
	rd := kafka.NewReader(readerConfig(cfg, g, testenv.Logger(r.t, zapcore.ErrorLevel)))
	r.t.Cleanup(func() { rd.Close() })
	r.t.Cleanup(r.k.Close)
}

// describe is the group as the broker describes it.
func (r *groupRig) describe() kmsg.DescribeGroupsResponseGroup {
	r.t.Helper()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{groupName}
	resp := r.request(req).(*kmsg.DescribeGroupsResponse)
	if len(resp.Groups) != 1 {
		r.t.Fatalf("describing the group: %d groups in the answer", len(resp.Groups))
	}
	return resp.Groups[0]
}

// has reports whether member is listed in d.
func (r *groupRig) has(d kmsg.DescribeGroupsResponseGroup, member string) bool {
	for _, m := range d.Members {
		if m.MemberID == member {
			return true
		}
	}
	return false
}

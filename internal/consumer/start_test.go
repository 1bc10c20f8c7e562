package consumer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/testenv"
)

// startRig is a broker with topic "in" of three partitions and the
// clients a test of SetStart needs.
type startRig struct {
	t  *testing.T
	k  *testenv.Kafka
	kc *kafka.Client // the client SetStart uses
	cl *kgo.Client   // for the test's own requests
}

const startPartitions = 3

func newStartRig(t *testing.T) *startRig {
	t.Helper()
	k := testenv.StartKafka(t, testenv.Topics{"in": startPartitions})
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &startRig{t: t, k: k, kc: &kafka.Client{Addr: kafka.TCP(k.Addrs()...), Timeout: 5 * time.Second}, cl: cl}
}

// produce writes recs to "in", each to the partition it names, and
// returns, per partition, the offset after the last record written.
func (r *startRig) produce(recs ...*kgo.Record) map[int32]int64 {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := clickstream.Produce(ctx, r.k.Addrs(), "in", recs, kgo.RecordPartitioner(kgo.ManualPartitioner())); err != nil {
		r.t.Fatalf("producing %d records: %v", len(recs), err)
	}
	ends := map[int32]int64{}
	for _, rec := range recs {
		ends[rec.Partition] = max(ends[rec.Partition], rec.Offset+1)
	}
	return ends
}

// committed is the group's committed offsets on "in".
func (r *startRig) committed(group string) map[int32]int64 {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := clickstream.Committed(ctx, r.cl, group, "in")
	if errors.Is(err, kerr.GroupIDNotFound) { // kfake's answer for a group it has never seen
		return map[int32]int64{}
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return got
}

// commit commits offset on partition of "in" for group as a group with no
// members does, independently of the code under test.
// wantCommitted fails the test unless group has committed exactly want,
// an offset on every partition.
func (r *startRig) wantCommitted(group string, want map[int32]int64) {
	r.t.Helper()
	got := r.committed(group)
	if len(got) != startPartitions || len(want) != startPartitions {
		r.t.Fatalf("committed %v, want %v: an offset on each of %d partitions", got, want, startPartitions)
	}
	for p, off := range want {
		if got[p] != off {
			r.t.Errorf("partition %d: committed %d, want %d", p, got[p], off)
		}
	}
}

func (r *startRig) commit(group string, partition int32, offset int64) {
	r.t.Helper()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = group
	req.Generation = -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = "in"
	rt.TopicID = r.topicID("in") // OffsetCommit v10 names topics by ID
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition = partition
	rp.Offset = offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := r.request(req).(*kmsg.OffsetCommitResponse)
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		r.t.Fatalf("commit answered %+v, want one partition", resp.Topics)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode); err != nil {
		r.t.Fatalf("committing %d on partition %d: %v", offset, partition, err)
	}
}

func (r *startRig) request(req kmsg.Request) kmsg.Response { return request(r.t, r.cl, req) }

// request sends one request of the test's own with cl, with a deadline,
// and fails the test if it gets no answer.
func request(t testing.TB, cl *kgo.Client, req kmsg.Request) kmsg.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Request(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// topicID is the ID of topic.
func (r *startRig) topicID(topic string) [16]byte {
	r.t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp := r.request(req).(*kmsg.MetadataResponse)
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		r.t.Fatalf("metadata of %s: %+v", topic, resp.Topics)
	}
	return resp.Topics[0].TopicID
}

func (r *startRig) setStart(ctx context.Context, group, topic string, s Start) (bool, error) {
	return SetStart(ctx, r.kc, group, topic, s, 5*time.Second)
}

func rec(partition int32, value string, ts time.Time) *kgo.Record {
	return &kgo.Record{Partition: partition, Value: []byte(value), Timestamp: ts}
}

// oneOnEach is a record on each partition of "in", stamped now.
func oneOnEach(value string) []*kgo.Record {
	var recs []*kgo.Record
	for p := int32(0); p < startPartitions; p++ {
		recs = append(recs, rec(p, fmt.Sprintf("%s-%d", value, p), time.Now()))
	}
	return recs
}

func TestStartString(t *testing.T) {
	at := time.Date(2001, 2, 3, 4, 5, 6, 0, time.FixedZone("X", 3600))
	for _, c := range []struct {
		s    Start
		want string
	}{
		{Start{}, "earliest"},
		{Start{Latest: true}, "latest"},
		{Start{At: at}, "2001-02-03T03:05:06Z"},
	} {
		if got := c.s.String(); got != c.want {
			t.Errorf("%#v.String() = %q, want %q", c.s, got, c.want)
		}
	}
}

// The earliest offset is what a new group gets from the Reader anyway:
// nothing is committed.
func TestStartEarliestCommitsNothing(t *testing.T) {
	r := newStartRig(t)
	r.produce(oneOnEach("old")...)
	ok, err := r.setStart(context.Background(), "g", "in", Start{})
	if err != nil || ok {
		t.Fatalf("SetStart(earliest) = %v, %v; want false, nil", ok, err)
	}
	if got := r.committed("g"); len(got) != 0 {
		t.Fatalf("committed %v, want nothing", got)
	}
}

// A new group starting at the latest offset gets each partition's end
// committed, and a Reader in the group (StartOffset FirstOffset) then
// reads only what is produced afterwards.
func TestStartLatest(t *testing.T) {
	r := newStartRig(t)
	recs := oneOnEach("old")
	recs = append(recs, rec(0, "old-0b", time.Now()), rec(2, "old-2b", time.Now()))
	ends := r.produce(recs...)
	if len(ends) != startPartitions {
		t.Fatalf("records on partitions %v, want all %d", ends, startPartitions)
	}

	ok, err := r.setStart(context.Background(), "g", "in", Start{Latest: true})
	if err != nil || !ok {
		t.Fatalf("SetStart(latest) = %v, %v; want true, nil", ok, err)
	}
	r.wantCommitted("g", ends)

	r.produce(oneOnEach("new")...)
	rd := kafka.NewReader(kafka.ReaderConfig{
		Brokers:     r.k.Addrs(),
		GroupID:     "g",
		Topic:       "in",
		StartOffset: kafka.FirstOffset,
		MaxWait:     100 * time.Millisecond,
	})
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := map[int]bool{}
	for len(seen) < startPartitions {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("after %d messages: %v", len(seen), err)
		}
		if seen[m.Partition] {
			t.Fatalf("partition %d: a second message %q at %d; only one was produced after the start", m.Partition, m.Value, m.Offset)
		}
		seen[m.Partition] = true
		if want := fmt.Sprintf("new-%d", m.Partition); string(m.Value) != want {
			t.Errorf("partition %d: first message %q at %d, want %q (produced after the start)", m.Partition, m.Value, m.Offset, want)
		}
	}
}

// A new group starting at a time gets, on each partition, the first
// record stamped at or after it; a partition whose records are all older
// starts at its end.
func TestStartAtTime(t *testing.T) {
	r := newStartRig(t)
	now := time.Now().Truncate(time.Millisecond)
	at := now.Add(-time.Hour)
	ends := r.produce(
		rec(0, "a", now.Add(-3*time.Hour)), rec(0, "b", now.Add(-2*time.Hour)), rec(0, "c", now.Add(-30*time.Minute)), rec(0, "d", now.Add(-10*time.Minute)),
		rec(1, "a", at.Add(-time.Millisecond)), rec(1, "b", at), rec(1, "c", now.Add(-5*time.Minute)),
		rec(2, "a", now.Add(-5*time.Hour)), rec(2, "b", now.Add(-4*time.Hour)),
	)
	if len(ends) != startPartitions || ends[2] != 2 {
		t.Fatalf("records end at %v, want all %d partitions, partition 2 at 2", ends, startPartitions)
	}
	want := map[int32]int64{0: 2, 1: 1, 2: ends[2]}

	ok, err := r.setStart(context.Background(), "g", "in", Start{At: at})
	if err != nil || !ok {
		t.Fatalf("SetStart(%v) = %v, %v; want true, nil", at, ok, err)
	}
	r.wantCommitted("g", want)
}

// A group with a commit on any partition is not new: SetStart leaves it
// as it is, also the partitions without a commit.
func TestStartExistingGroupUnchanged(t *testing.T) {
	r := newStartRig(t)
	r.produce(oneOnEach("old")...)
	r.commit("g", 1, 0)

	for _, s := range []Start{{Latest: true}, {At: time.Now().Add(-time.Minute)}} {
		ok, err := r.setStart(context.Background(), "g", "in", s)
		if err != nil || ok {
			t.Fatalf("SetStart(%v) = %v, %v; want false, nil", s, ok, err)
		}
		if got := r.committed("g"); len(got) != 1 || got[1] != 0 {
			t.Fatalf("after SetStart(%v): committed %v, want only partition 1 at 0", s, got)
		}
	}
}

func TestStartUnknownTopic(t *testing.T) {
	r := newStartRig(t)
	ok, err := r.setStart(context.Background(), "g", "missing", Start{Latest: true})
	if err == nil || ok {
		t.Fatalf("SetStart on a missing topic = %v, %v; want an error", ok, err)
	}
	if !strings.Contains(err.Error(), `"missing"`) {
		t.Fatalf("error %q does not name the topic", err)
	}
}

// stall makes the broker hold the next OffsetFetch until the test ends,
// calling arrived when it comes in.
func (r *startRig) stall(arrived func()) {
	release := make(chan struct{})
	r.t.Cleanup(func() { close(release) }) // before the broker closes
	r.k.ControlKey(int16(kmsg.OffsetFetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		arrived()
		r.k.SleepControl(func() { <-release })
		return nil, nil, false
	})
}

func TestStartCancelled(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		r := newStartRig(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		ok, err := r.setStart(ctx, "g", "in", Start{Latest: true})
		if !errors.Is(err, context.Canceled) || ok {
			t.Fatalf("SetStart = %v, %v; want context.Canceled", ok, err)
		}
	})
	t.Run("during a request", func(t *testing.T) {
		r := newStartRig(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r.stall(cancel)
		start := time.Now()
		ok, err := SetStart(ctx, r.kc, "g", "in", Start{Latest: true}, time.Minute)
		if !errors.Is(err, context.Canceled) || ok {
			t.Fatalf("SetStart = %v, %v; want context.Canceled", ok, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("SetStart returned %v after the cancel", d)
		}
	})
	t.Run("request timeout", func(t *testing.T) {
		r := newStartRig(t)
		r.stall(func() {})
		start := time.Now()
		ok, err := SetStart(context.Background(), &kafka.Client{Addr: kafka.TCP(r.k.Addrs()...)}, "g", "in", Start{Latest: true}, 300*time.Millisecond)
		// kafka-go sets the deadline on the connection: the error is
		// the connection's timeout rather than the context's.
		if !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)) || ok {
			t.Fatalf("SetStart = %v, %v; want a timeout", ok, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("SetStart returned after %v with a 300ms timeout", d)
		}
	})
}

// refuseCommit makes the broker refuse the next OffsetCommit with code on
// every partition, as Kafka does once the group has members.
func (r *startRig) refuseCommit(code int16) {
	r.k.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, t := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = t.Topic
			for _, p := range t.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = p.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// Another replica joined and committed between SetStart's look at the
// group and its commit: the commit is refused, and SetStart leaves the
// other replica's commits alone.
func TestStartRefusedAfterAnotherReplica(t *testing.T) {
	r := newStartRig(t)
	r.produce(oneOnEach("old")...)
	r.commit("g", 0, 1)
	// The first fetch sees the group as it was before the other replica.
	r.k.ControlKey(int16(kmsg.OffsetFetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.OffsetFetchRequest)
		resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
		if len(req.Topics) == 0 {
			t.Errorf("OffsetFetch v%d with no topics; the fake answer expects some", req.Version)
		}
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetFetchResponseTopic()
			st.Topic = rt.Topic
			for _, p := range rt.Partitions {
				sp := kmsg.NewOffsetFetchResponseTopicPartition()
				sp.Partition = p
				sp.Offset = -1
				sp.LeaderEpoch = -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	r.refuseCommit(kerr.UnknownMemberID.Code)

	ok, err := r.setStart(context.Background(), "g", "in", Start{Latest: true})
	if err != nil || ok {
		t.Fatalf("SetStart = %v, %v; want false, nil", ok, err)
	}
	if got := r.committed("g"); len(got) != 1 || got[0] != 1 {
		t.Fatalf("committed %v, want only the other replica's partition 0 at 1", got)
	}
}

// A refused commit with still no commits in the group is an error.
func TestStartRefusedWithoutCommits(t *testing.T) {
	r := newStartRig(t)
	r.produce(oneOnEach("old")...)
	r.refuseCommit(kerr.RebalanceInProgress.Code)

	ok, err := r.setStart(context.Background(), "g", "in", Start{Latest: true})
	if !errors.Is(err, kafka.RebalanceInProgress) || ok {
		t.Fatalf("SetStart = %v, %v; want REBALANCE_IN_PROGRESS", ok, err)
	}
	if got := r.committed("g"); len(got) != 0 {
		t.Fatalf("committed %v, want nothing", got)
	}
}

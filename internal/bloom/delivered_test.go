package bloom

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// Delivered marks, on a single server and on a 3-master Cluster, with a
// plan of four shards so that a partition's elements are in several
// records: a replay below the mark is ReplayedDelivered in any record, a
// probe is answered from its home record (new, decided before, or
// delivered), marks never go down, other partitions are untouched, and
// every record written has an expiry.
func TestDeliveredMarks(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		testDeliveredMarks(t, testenv.RedisClient(t, testenv.Redis(t)))
	})
	t.Run("cluster", func(t *testing.T) {
		testDeliveredMarks(t, testenv.ClusterClient(t, testenv.Cluster(t, 0)))
	})
}

func testDeliveredMarks(t *testing.T, c redis.UniversalClient) {
	ctx := t.Context()
	now := testenv.Now()
	plan, err := NewPlan(100_000, 1e-6, PlanOptions{MinShards: 4, Kind: testKind})
	if err != nil {
		t.Fatal(err)
	}
	f := newFilter(t, c, now, 100_000, 1e-6, func(cfg *Config) { cfg.Plan = plan })
	// Partition 0: offsets 0-19, each ID twice (0-9 and 10-19), offsets
	// 20 and 21 dead letters (probes).
	batch := func(from, to int64) []Element {
		var es []Element
		for o := from; o < to; o++ {
			es = append(es, el(fmt.Sprintf("id-%d", o%10), 0, o, now))
		}
		return es
	}
	probes := []Source{{Topic: "t", Partition: 0, Offset: 20}, {Topic: "t", Partition: 0, Offset: 21}}
	decide := func(es []Element, ps []Source) Decision {
		t.Helper()
		d, err := f.Decide(ctx, es, ps)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Verdicts) != len(es) || len(d.Probes) != len(ps) {
			t.Fatalf("%d verdicts and %d probe answers for %d elements and %d probes", len(d.Verdicts), len(d.Probes), len(es), len(ps))
		}
		return d
	}
	count := func(vs []Verdict) map[Verdict]int {
		n := map[Verdict]int{}
		for _, v := range vs {
			n[v]++
		}
		return n
	}
	first := decide(batch(0, 20), probes)
	if n := count(first.Verdicts); n[FirstSeen] != 10 || n[Duplicate] != 10 {
		t.Fatalf("first decision: %v, want 10 first seen and 10 duplicates", n)
	}
	if first.Probes[0] != ProbeNew || first.Probes[1] != ProbeNew {
		t.Fatalf("probes asked first: %v, want new", first.Probes)
	}
	if shards := map[int]bool{}; func() int {
		for _, r := range first.records {
			shards[r.shard] = true
		}
		return len(shards)
	}() < 2 {
		t.Fatalf("the batch's elements are in %d shard(s); the test needs several", len(shards))
	}
	// Decided, not delivered: replays get the recorded decisions.
	again := decide(batch(0, 20), probes)
	if n := count(again.Verdicts); n[ReplayedFirstSeen] != 10 || n[ReplayedDuplicate] != 10 {
		t.Fatalf("replay before the mark: %v, want the recorded decisions", n)
	}
	if again.Probes[0] != ProbeDecided || again.Probes[1] != ProbeDecided {
		t.Fatalf("probes asked again before the mark: %v, want decided", again.Probes)
	}
	if err := f.Delivered(ctx, first, []Source{{Topic: "t", Partition: 0, Offset: 21}}); err != nil {
		t.Fatal(err)
	}
	replay := decide(batch(0, 20), probes)
	if n := count(replay.Verdicts); n[ReplayedDelivered] != 20 {
		t.Fatalf("replay after the mark: %v, want 20 replayed_delivered", n)
	}
	if replay.Probes[0] != ProbeDelivered || replay.Probes[1] != ProbeDelivered {
		t.Fatalf("probes after the mark: %v, want both delivered", replay.Probes)
	}
	// Other batch boundaries: offsets 15-29, of which 22-29 are new.
	mixed := decide(batch(15, 30), []Source{{Topic: "t", Partition: 0, Offset: 30}})
	for i, v := range mixed.Verdicts {
		want := ReplayedDelivered
		if 15+int64(i) >= 22 {
			want = Duplicate // id-2 ... id-9 again
		}
		if v != want {
			t.Errorf("offset %d: %v, want %v", 15+i, v, want)
		}
	}
	if mixed.Probes[0] != ProbeNew {
		t.Errorf("a probe above the mark and the watermark: %v, want new", mixed.Probes[0])
	}
	// A lower mark does not lower it.
	if err := f.Delivered(ctx, first, []Source{{Topic: "t", Partition: 0, Offset: 3}}); err != nil {
		t.Fatal(err)
	}
	if d := decide([]Element{el("id-0", 0, 10, now)}, nil); d.Verdicts[0] != ReplayedDelivered {
		t.Errorf("after a lower mark, offset 10 is %v, want replayed_delivered", d.Verdicts[0])
	}
	// Another partition is not marked.
	if d := decide([]Element{el("other", 1, 0, now)}, nil); d.Verdicts[0] != FirstSeen {
		t.Errorf("partition 1, offset 0: %v, want first_seen", d.Verdicts[0])
	}
	// A partition whose batches held only dead letters: its home record.
	onlyDead := decide(nil, []Source{{Topic: "t", Partition: 2, Offset: 4}, {Topic: "t", Partition: 2, Offset: 5}})
	if onlyDead.Probes[0] != ProbeNew || onlyDead.Probes[1] != ProbeNew {
		t.Fatalf("dead letters of partition 2 asked first: %v", onlyDead.Probes)
	}
	if d := decide(nil, []Source{{Topic: "t", Partition: 2, Offset: 4}, {Topic: "t", Partition: 2, Offset: 5}}); d.Probes[0] != ProbeDecided || d.Probes[1] != ProbeDecided {
		t.Fatalf("dead letters of partition 2 asked again: %v, want decided", d.Probes)
	}
	if err := f.Delivered(ctx, onlyDead, []Source{{Topic: "t", Partition: 2, Offset: 4}}); err != nil {
		t.Fatal(err)
	}
	if d := decide(nil, []Source{{Topic: "t", Partition: 2, Offset: 4}, {Topic: "t", Partition: 2, Offset: 5}}); d.Probes[0] != ProbeDelivered || d.Probes[1] != ProbeDecided {
		t.Errorf("dead letters of partition 2 after a mark at 5: %v, want delivered and decided", d.Probes)
	}
	// Every key, the records marked included, has an expiry.
	assertAllKeysExpire(t, c)
	// A refused mark says why.
	if err := f.Delivered(context.Background(), first, []Source{{Topic: "", Partition: 0, Offset: 1}}); err == nil {
		t.Error("a mark without a topic was accepted")
	}
}

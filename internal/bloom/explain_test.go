package bloom

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"dedupe-worker/internal/testenv"
)

// Explain finds an added ID in the key of its bucket and shard, and a new
// one nowhere; ExplainSource gives each decided offset its verdict, and
// says why there is none for the others. Both write nothing.
func TestExplain(t *testing.T) {
	// A minute into the current bucket: far from its end, where a test
	// reads the next bucket too.
	t0 := testenv.Now().Truncate(10 * time.Minute).Add(time.Minute)
	c := testenv.RedisClient(t, testenv.Redis(t))
	f := newFilter(t, c, t0, 10_000, 1e-6, nil)
	var es []Element
	for i := range 200 {
		es = append(es, el(fmt.Sprintf("seen-%d", i%150), 0, int64(i), t0))
	}
	v := verdicts(t, f, es...)
	keys, err := c.DBSize(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}

	bucket := f.Window().Bucket(t0)
	for i := range 150 {
		e, err := f.Explain(t.Context(), []byte(fmt.Sprintf("seen-%d", i)), t0)
		if err != nil {
			t.Fatal(err)
		}
		// Rolling and live: the previous bucket and this one, stage 0.
		if len(e.Probes) != 2 || e.Probes[0].Bucket != bucket-1 || e.Probes[1].Bucket != bucket || e.Bucket != bucket || e.Late || e.Future {
			t.Fatalf("seen-%d: %+v", i, e)
		}
		p := e.Probes[1]
		// The key of stage 0, or of its part holding the ID.
		if !p.Exists || !p.Holds || !strings.HasPrefix(p.Key, f.own.filterKey(e.Shard, bucket)) || p.TTL <= 0 {
			t.Fatalf("seen-%d: probe of its own bucket %+v; want it to exist and hold the ID", i, p)
		}
		if !e.Seen() || e.Probes[0].Holds {
			t.Fatalf("seen-%d: seen %t, held by the previous window %t", i, e.Seen(), e.Probes[0].Holds)
		}
	}
	held := 0
	for i := range 2000 {
		e, err := f.Explain(t.Context(), []byte(fmt.Sprintf("new-%d", i)), t0)
		if err != nil {
			t.Fatal(err)
		}
		if e.Seen() {
			held++
		}
	}
	// 150 IDs in a filter sized for 10,000 at 1e-6: a false positive among
	// 2,000 probes is all but impossible.
	if held != 0 {
		t.Errorf("%d of 2000 new IDs held", held)
	}
	// Late and future event times are said to be.
	if e, _ := f.Explain(t.Context(), []byte("seen-1"), t0.Add(-3*time.Hour)); !e.Late {
		t.Errorf("3h old: %+v, want late", e)
	}
	if e, _ := f.Explain(t.Context(), []byte("seen-1"), t0.Add(3*time.Hour)); !e.Future {
		t.Errorf("3h ahead: %+v, want future", e)
	}

	for i := range es {
		r, err := f.ExplainSource(t.Context(), es[i].Source, es[i].ID, es[i].Time)
		if err != nil {
			t.Fatal(err)
		}
		want := RecordedForward
		if v[i] == Duplicate {
			want = RecordedDrop
		}
		// Each shard keeps its own record of the partition, up to the
		// highest offset it decided.
		if !r.Exists || r.Recorded != want || r.Watermark <= es[i].Source.Offset || r.Watermark > 200 || r.TTL <= 0 {
			t.Fatalf("offset %d (verdict %v): %+v, want %v", i, v[i], r, want)
		}
	}
	if r, _ := f.ExplainSource(t.Context(), Source{Topic: "t", Partition: 0, Offset: 500}, nil, time.Time{}); !r.Exists || r.Recorded != NotDecided {
		t.Errorf("an offset past the watermark: %+v", r)
	}
	if r, _ := f.ExplainSource(t.Context(), Source{Topic: "t", Partition: 9, Offset: 1}, nil, time.Time{}); r.Exists || r.Recorded != NotDecided {
		t.Errorf("a partition never decided: %+v", r)
	}
	if after, err := c.DBSize(t.Context()).Result(); err != nil || after != keys {
		t.Errorf("keys before %d, after %d (%v): explain wrote", keys, after, err)
	}
}

package clickstream

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"
)

// A Stream has the shares it was asked for, repeats are exact copies of
// earlier valid events, valid events parse with their ID, and the choices
// depend on the seed only.
func TestStream(t *testing.T) {
	const n = 50_000
	clock := time.Now().Truncate(time.Millisecond)
	s := NewStream(0.07, 0.01, 3, func() time.Time { clock = clock.Add(time.Millisecond); return clock })
	again := NewStream(0.07, 0.01, 3, nil)
	other := NewStream(0.07, 0.01, 4, nil)
	seen := map[string][]byte{}
	var tr Truth
	dups, bad := 0, 0
	for i := 0; i < n; i++ {
		e := s.Next()
		tr.Add(e)
		if a := again.Next(); a.ID != e.ID || a.Dup != e.Dup {
			t.Fatalf("event %d: %q/%v with the same seed, %q/%v", i, e.ID, e.Dup, a.ID, a.Dup)
		}
		if o := other.Next(); o.ID != "" && o.ID == e.ID {
			t.Fatalf("event %d: ID %q under two seeds", i, e.ID)
		}
		switch {
		case e.ID == "":
			bad++
			if bytes.Contains(e.Value, []byte(`"click_id":"click-`)) {
				t.Fatalf("malformed event %d has a click ID: %s", i, e.Value)
			}
		case e.Dup:
			dups++
			if prev, ok := seen[e.ID]; !ok || !bytes.Equal(prev, e.Value) {
				t.Fatalf("repeat %d of %q is not a copy of an earlier event", i, e.ID)
			}
		default:
			if _, ok := seen[e.ID]; ok {
				t.Fatalf("new event %d reuses ID %q", i, e.ID)
			}
			var v struct {
				ID string `json:"click_id"`
				TS int64  `json:"ts"`
			}
			if err := json.Unmarshal(e.Value, &v); err != nil || v.ID != e.ID || v.TS != e.Time.UnixMilli() || v.TS != clock.UnixMilli() {
				t.Fatalf("event %d: %s (%v)", i, e.Value, err)
			}
			seen[e.ID] = e.Value
		}
	}
	if math.Abs(float64(dups)/n-0.07) > 0.005 || math.Abs(float64(bad)/n-0.01) > 0.002 {
		t.Fatalf("%d repeats, %d malformed in %d", dups, bad, n)
	}
	if tr.Total != n || tr.Malformed != bad || len(tr.Valid) != n-bad-dups {
		t.Fatalf("truth: total %d, malformed %d, valid %d", tr.Total, tr.Malformed, len(tr.Valid))
	}
}

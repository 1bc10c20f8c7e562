package bloom

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"testing"
	"time"
)

// goldenPlan is a fixed layout; the golden locations below were computed
// once and must never change: filters in Redis outlive deploys, and
// replicas of different versions share them.
var goldenPlan = Plan{Shards: 7, ShardBits: 52 * 1_000_003, Layout: Layout{Words: 4, BitsPerWord: 4}}

func describe(loc location, words int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "shard %d:", loc.shard)
	for j := 0; j < words; j++ {
		fmt.Fprintf(&b, " %d/%07x/%07x", loc.word[j], loc.hi[j], loc.lo[j])
	}
	return b.String()
}

func TestLocateGolden(t *testing.T) {
	f := &Filter{own: &windowPlan{plan: goldenPlan}}
	golden := map[string]string{
		"":                                     "shard 0: 45932276/0000828/0080000 50485968/0100204/1000000 17020952/0098000/0100000 40120496/0003002/0800000",
		"click-1":                              "shard 1: 35381476/0001100/2000400 50584144/0040000/0800c00 45726408/0003400/0000001 1354652/0000140/1010000",
		"click-2":                              "shard 6: 27878968/0042000/0020100 17392180/1010020/0000004 12289628/0012000/0010200 1391832/0420000/0201000",
		"3f2b9c1e-7d4a-4e8b-9a1c-2b3d4e5f6a7b": "shard 5: 47614996/0408000/0020400 15185768/0021000/0008001 17889820/0001000/008a000 4023552/0a00000/1000200",
		"\x00\x01\xfe\xff":                     "shard 5: 3872960/0020002/0400004 3651752/020040a/0000000 22217832/1000000/0101200 22065368/0001500/0000080",
		strings.Repeat("long", 1000):           "shard 6: 35831536/0084000/0400400 2004912/0040008/1010000 11514204/0004804/0004000 37900720/0182000/0000100",
	}
	var loc location
	for id, want := range golden {
		f.own.locate([]byte(id), &loc)
		if got := describe(loc, 4); got != want {
			t.Errorf("locate(%.20q) =\n\t%s\nwant\n\t%s\nThe element-to-bits mapping changed: every live filter would be corrupted.", id, got, want)
		}
	}
	// Another layout of the same version.
	f = &Filter{own: &windowPlan{plan: Plan{Shards: 1, ShardBits: 52 * 999_983, Layout: Layout{Words: 3, BitsPerWord: 5}}}}
	f.own.locate([]byte("click-1"), &loc)
	if got, want := describe(loc, 3), "shard 0: 35380800/0001100/2000420 41456272/000a400/0000060 1354600/0000140/1011000"; got != want {
		t.Errorf("3x5 layout: %s, want %s", got, want)
	}
}

// Every word holds exactly BitsPerWord bits and stays inside its shard.
func TestLocateShape(t *testing.T) {
	f := &Filter{own: &windowPlan{plan: goldenPlan}}
	var loc location
	shards := make([]int, goldenPlan.Shards)
	for i := 0; i < 70_000; i++ {
		f.own.locate([]byte(fmt.Sprint("id-", i)), &loc)
		shards[loc.shard]++
		for j := 0; j < 4; j++ {
			mask := uint64(loc.hi[j])<<26 | uint64(loc.lo[j])
			if n := bits.OnesCount64(mask); n != 4 || mask>>52 != 0 {
				t.Fatalf("word %d of id-%d has mask %x", j, i, mask)
			}
			if loc.word[j]%WordBits != 0 || loc.word[j]+WordBits > goldenPlan.ShardBits {
				t.Fatalf("word %d of id-%d at bit %d", j, i, loc.word[j])
			}
		}
	}
	for s, n := range shards {
		if n < 9_500 || n > 10_500 {
			t.Errorf("shard %d got %d of 70000", s, n)
		}
	}
}

// A window without growth in the layout an earlier version chose keeps
// that version's keys when the layout is set (PlanOptions.Layout) and,
// where that version took more shards than the fewest within the memory
// bound, the shard count (PlanOptions.MinShards): these tags were computed
// by the version whose planner took the fewest words within 15% of a
// classic filter's bits, in the shard count of least memory (08dce86).
func TestSetLayoutKeepsEarlierKeys(t *testing.T) {
	for _, tc := range []struct {
		n      int64
		p      float64
		layout Layout
		shards int // DEDUPE_SHARDS: the earlier version's count, where it took more than the fewest within the bound
		tag    string
	}{
		{7_000_000, 1e-6, Layout{4, 4}, 0, "v1-3e36b357"},
		{1_000_000_000, 1e-9, Layout{6, 4}, 0, "v1-7fe33ae4"},
		{100_000, 1e-3, Layout{2, 4}, 0, "v1-356306b7"},
		{7_000_000, 1e-9, Layout{6, 4}, 3, "v1-bd4553cd"},
		{1_000_000_000, 1e-6, Layout{4, 4}, 18, "v1-ac8299ee"},
	} {
		pl, err := NewPlan(tc.n, tc.p, PlanOptions{MaxGrowth: 1, Layout: tc.layout, MinShards: tc.shards})
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Plan: pl, Window: Window{Length: 10 * time.Minute, Mode: Rolling}, ReplayHorizon: DefaultReplayHorizon}
		if got := layoutTag(cfg, pl); got != tc.tag {
			t.Errorf("n=%d p=%g in %v: tag %s, want %s", tc.n, tc.p, tc.layout, got, tc.tag)
		}
		if auto, _ := NewPlan(tc.n, tc.p, PlanOptions{MaxGrowth: 1}); auto.Layout == tc.layout && tc.p < 1e-3 {
			t.Errorf("n=%d p=%g: the planner still takes %v; the test no longer shows a set layout at work", tc.n, tc.p, tc.layout)
		}
	}
}

// A layout is written words x bits; anything else, or out of range, is
// refused.
func TestParseLayout(t *testing.T) {
	if l, err := ParseLayout("4x5"); err != nil || l != (Layout{4, 5}) || l.String() != "4x5" {
		t.Errorf("4x5: %v, %v", l, err)
	}
	for _, bad := range []string{"", "4", "4x", "x4", "0x4", "9x4", "4x0", "4x17", "4x4x4", " 4x4", "04x4"} {
		if _, err := ParseLayout(bad); !errors.Is(err, ErrInvalidPlan) {
			t.Errorf("%q: %v, want ErrInvalidPlan", bad, err)
		}
	}
}

// A set layout is checked as a chosen one is: its range, and the memory
// cap.
func TestSetLayoutIsChecked(t *testing.T) {
	if _, err := NewPlan(1000, 1e-6, PlanOptions{Layout: Layout{9, 4}}); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("9 words: %v, want ErrInvalidPlan", err)
	}
	if _, err := NewPlan(1_000_000, 1e-6, PlanOptions{Layout: Layout{3, 5}, MaxMemory: 1 << 20}); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("over MaxMemory: %v, want ErrInvalidPlan", err)
	}
}

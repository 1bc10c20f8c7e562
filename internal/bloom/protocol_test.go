package bloom

import (
	"context"
	"encoding/binary"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/tinylib/msgp/msgp"

	"dedupe-worker/internal/testenv"
)

// The script declares protocol.go's numbers under the same names: every
// name it declares with a number is one of Go's, with Go's value.
func TestScriptProtocol(t *testing.T) {
	goValues := map[string]int{
		"argRing": argRing, "argRecordExpire": argRecordExpire, "argPlans": argPlans, "argBuckets": argBuckets,
		"argGroups": argGroups, "argRuns": argRuns, "argElements": argElements, "argLocations": argLocations,
		"planFieldKind": planFieldKind, "planFieldStages": planFieldStages, "planFieldCaps": planFieldCaps,
		"planFieldSizes": planFieldSizes, "planFieldPerPart": planFieldPerPart, "planFieldLeads": planFieldLeads,
		"planFieldWidths": planFieldWidths, "kindCodeBloom": kindCodeBloom, "kindCodeFingerprint": kindCodeFingerprint,
		"groupFieldRef": groupFieldRef, "groupFieldPrev": groupFieldPrev, "groupFieldNext": groupFieldNext,
		"groupFieldExpiry": groupFieldExpiry, "groupFieldDeadline": groupFieldDeadline, "groupStride": groupStride,
		"runStride": runStride, "elementBytes": elementBytes, "probeGroup": probeGroup, "recordRingBit": recordRingBit,
		"fpLocationBytes": fpLocationBytes, "fpLocPosition": fpLocPosition, "fpLocFingerprint": fpLocFingerprint,
		"fpLocPart": fpLocPart, "fpLocHome": fpLocHome, "fpLocFrom": fpLocFrom, "fpLocTo": fpLocTo,
		"fpFirstRead": fpFirstRead, "fpProbeLimit": fpProbeLimit,
	}
	decl := regexp.MustCompile(`(?m)^local ([a-zA-Z, ]+) = ([0-9, ]+)(?: --.*)?$`)
	src := scriptSource()
	seen := map[string]bool{}
	for _, m := range decl.FindAllStringSubmatch(src, -1) {
		names, values := strings.Split(m[1], ","), strings.Split(m[2], ",")
		if len(names) != len(values) {
			t.Fatalf("script: %q declares %d names and %d values", m[0], len(names), len(values))
		}
		for i, name := range names {
			name = strings.TrimSpace(name)
			want, ours := goValues[name]
			if !ours {
				continue // the script's own constants (CHUNK, RATE_MS, ...)
			}
			got, _ := strconv.Atoi(strings.TrimSpace(values[i]))
			if got != want {
				t.Errorf("script: %s = %d, protocol.go says %d", name, got, want)
			}
			seen[name] = true
		}
	}
	for name := range goValues {
		if !seen[name] {
			t.Errorf("script does not declare %s", name)
		}
	}
	for code, name := range map[byte]string{codeNew: "N", codeDuplicate: "D", codeUntested: "U", codeReplayedNew: "n",
		codeReplayedDup: "d", codeReplayUnknown: "u", codeDelivered: "k", codeProbeDecided: "y", codeProbeNew: "x", replyRefused: "!", replyWanted: "+"} {
		if !strings.Contains(src, "'"+name+"'") {
			t.Errorf("script never writes reply code %q (%s)", code, name)
		}
	}
}

// handCall is one script call built by hand from protocol.go's names, for
// one Bloom plan of one word of mask 1 (the word's lowest bit), so that a
// test states every slot it sends.
type handCall struct {
	stages      int
	caps, leads []int64
	wordsPer    []int64 // words per shard, and per key, of each stage
	keys        []string
	buckets     [][]int // plan, growth record, first key of each stage
	groups      [][5]string
	runs        []int
	elems       []byte
	masks, offs []any
	positions   []float64
}

func (h *handCall) element(offset int64, group int, wordOffset int64) {
	var e [8]byte
	binary.BigEndian.PutUint64(e[:], uint64(offset))
	h.elems = append(h.elems, e[1:]...)
	h.elems = binary.BigEndian.AppendUint16(h.elems, uint16(group))
	h.masks = append(h.masks, int64(1))
	h.offs = append(h.offs, strconv.FormatInt(wordOffset, 10))
	h.positions = append(h.positions, float64(wordOffset/52)/1000) // stage 1's word: stage 0's index
}

func (h *handCall) run(t *testing.T, c *redis.Client) string {
	t.Helper()
	plan := msgp.AppendArrayHeader(nil, 1)
	plan = msgp.AppendArrayHeader(plan, planFieldWidths)
	plan = msgp.AppendInt(plan, kindCodeBloom)
	plan = msgp.AppendInt(plan, h.stages)
	for _, list := range [][]int64{h.caps, h.wordsPer, h.wordsPer, h.leads} {
		plan = msgp.AppendArrayHeader(plan, uint32(h.stages))
		for _, v := range list {
			plan = msgp.AppendInt64(plan, v)
		}
	}
	plan = msgp.AppendArrayHeader(plan, uint32(h.stages))
	for range h.stages {
		plan = msgp.AppendInt(plan, 1) // one word per element
	}
	buckets := msgp.AppendArrayHeader(nil, uint32(len(h.buckets)))
	for _, b := range h.buckets {
		buckets = msgp.AppendArrayHeader(buckets, uint32(len(b)))
		for _, v := range b {
			buckets = msgp.AppendInt(buckets, v)
		}
	}
	groups := msgp.AppendArrayHeader(nil, uint32(groupStride*len(h.groups)))
	for _, g := range h.groups {
		for k, v := range g {
			if k < groupFieldExpiry-1 {
				n, _ := strconv.Atoi(v)
				groups = msgp.AppendInt(groups, n)
			} else {
				groups = msgp.AppendString(groups, v)
			}
		}
	}
	runs := msgp.AppendArrayHeader(nil, uint32(len(h.runs)))
	for _, v := range h.runs {
		runs = msgp.AppendInt(runs, v)
	}
	// Per element its word's mask, then (with stages) its position.
	loc := msgp.AppendArrayHeader(nil, uint32(2*len(h.masks)))
	for i := range h.masks {
		loc = msgp.AppendInt64(loc, h.masks[i].(int64))
		loc = msgp.AppendFloat64(loc, h.positions[i])
	}
	offs := msgp.AppendArrayHeader(nil, uint32(len(h.offs)))
	for _, o := range h.offs {
		offs = msgp.AppendString(offs, o.(string))
	}
	argv := make([]any, argLocations+1)
	argv[argRing-1], argv[argRecordExpire-1], argv[argPlans-1] = 1024, strconv.FormatInt(math.MaxInt32, 10), plan
	argv[argBuckets-1], argv[argGroups-1], argv[argRuns-1], argv[argElements-1] = buckets, groups, runs, h.elems
	argv[argLocations-1], argv[argLocations] = loc, offs
	res, err := testAndSetScript.Run(context.Background(), c, h.keys, argv...).Text()
	if err != nil {
		t.Fatalf("script, %d elements on %v: %v", len(h.masks), h.keys, err)
	}
	return res
}

// The script called with hand-built arguments: a call that needs a stage
// not made is refused ("!" and the stage), naming it and writing nothing;
// a stage due ahead is asked for ("+"); and a partition run longer than
// one BITFIELD call takes (64 sub-operations) is read and written in
// several, its verdicts in order.
func TestScriptByHand(t *testing.T) {
	c := testenv.RedisClient(t, testenv.Redis(t))
	far := strconv.FormatInt(math.MaxInt32, 10)
	// Two stages of 1,000 words, stage 0 taking 10 elements; bucket 1 is
	// keys 2 (its growth record), 3 and 4 (its stages); key 1 the record.
	base := func() *handCall {
		return &handCall{stages: 2, caps: []int64{10, 100}, leads: []int64{0, 1000}, wordsPer: []int64{1000, 1000},
			keys:    []string{"hand:r", "hand:g", "hand:s0", "hand:s1"},
			buckets: [][]int{{1, 2, 3, 4}},
			groups:  [][5]string{{"1", "0", "0", far, far}}}
	}

	// Stage 0 not made: refused, nothing written.
	h := base()
	h.runs = []int{1, 1}
	h.element(0, 1, 0)
	if got := h.run(t, c); got != "!1:0" {
		t.Fatalf("a call into a stage not made: %q, want !1:0", got)
	}
	if n, _ := c.DBSize(t.Context()).Result(); n != 0 {
		t.Fatalf("a refused call wrote %d keys", n)
	}

	// Stage 0 made: 70 new elements, one partition run: the record is read
	// and written in two BITFIELD calls; the 11th element on needs stage 1.
	if err := c.Set(t.Context(), "hand:s0", make([]byte, 1000*52/8+1), 0).Err(); err != nil {
		t.Fatal(err)
	}
	h = base()
	h.runs = []int{1, 70}
	for i := range 70 {
		h.element(int64(i), 1, int64(i*52))
	}
	if got := h.run(t, c); got != "!1:1" {
		t.Fatalf("70 new elements into a stage of 10, the next not made: %q, want !1:1", got)
	}
	// Stage 1 made: 70 new, the growth record due for nothing more.
	if err := c.Set(t.Context(), "hand:s1", make([]byte, 1000*52/8+1), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := h.run(t, c); got != strings.Repeat("N", 70) {
		t.Fatalf("70 new elements: %q", got)
	}
	// The same 70 again: replays of the record, read in two calls.
	if got := h.run(t, c); got != strings.Repeat("n", 70) {
		t.Fatalf("their replays: %q", got)
	}
	// A stage due ahead: the growth record says inserts fill at 1,000 a
	// second into stage 0 of a fresh bucket, 5 from full, and stage 1's
	// lead is a second: the call asks for stage 1.
	h = base()
	h.keys = []string{"hand:r2", "hand:g2", "hand:s0", "hand:t1"}
	if err := c.HSet(t.Context(), "hand:g2", "k", 0, "n", 4, "r", 1000, "t", 0).Err(); err != nil {
		t.Fatal(err)
	}
	h.runs = []int{1, 1}
	h.element(0, 1, 52*500)
	if got := h.run(t, c); got != "N+1:1" {
		t.Fatalf("a stage due within its lead: %q, want N+1:1", got)
	}
}

package clickstream

// Whole inputs made at once, with their truth: Generate's clicks, and
// Hostile's records meant to break a parser or a worker's memory.

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Generate makes n click events (plus the odd ones): dupShare of them
// repeat an earlier click exactly, badShare are malformed. Times are now.
func Generate(n int, dupShare, badShare float64, seed uint64) ([]*kgo.Record, Truth) {
	rng := rand.New(rand.NewPCG(seed, 2))
	tr := Truth{Valid: map[string]bool{}, Total: n}
	now := time.Now().UnixMilli()
	var values []string
	recs := make([]*kgo.Record, 0, n+2*len(odd))
	for i := 0; i < n; i++ {
		var v string
		switch r := rng.Float64(); {
		case r < badShare:
			v = string(malformedValue(tr.Malformed, now))
			tr.bad([]byte(v))
		case r < badShare+dupShare && len(values) > 0:
			v = values[rng.IntN(len(values))]
		default:
			id := fmt.Sprintf("click-%d", i)
			v = string(clickValue(id, now, i%97, i%1013))
			values = append(values, v)
			tr.Valid[id] = true
		}
		recs = append(recs, &kgo.Record{Key: []byte(strconv.Itoa(i % 64)), Value: []byte(v)})
		if i == n/3 || i == 2*n/3 {
			for _, o := range odd {
				recs = append(recs, &kgo.Record{Key: []byte(o.id), Value: fmt.Appendf(nil, o.value, now)})
				tr.Valid[o.id] = true
				tr.Total++
			}
		}
	}
	return recs, tr
}

// Hostile adds to recs and tr, at random places, records meant to break
// a parser or a worker's memory, each with a known fate: random bytes;
// payloads of about a megabyte that nest a million levels, nest too deep
// after a valid ID, or stop in the middle (all dead letters); valid
// megabyte events, each sent twice; IDs that are large or fractional
// numbers, null, empty, arrays, duplicated keys, and one ID written with
// and without JSON escapes (the same ID); and a valid event just below the
// broker's size limit, too large to forward with the worker's headers,
// which is dead-lettered without its value. It returns the new stream.
func Hostile(recs []*kgo.Record, tr *Truth, seed uint64) []*kgo.Record {
	rng := rand.New(rand.NewPCG(seed, 7))
	now := time.Now().UnixMilli()
	var add []*kgo.Record
	put := func(v []byte, validID string) {
		add = append(add, &kgo.Record{Key: []byte("hostile"), Value: v})
		tr.Total++
		if validID == "" {
			tr.bad(v)
		} else {
			tr.Valid[validID] = true
		}
	}
	for i := 0; i < 300; i++ {
		b := make([]byte, 1+rng.IntN(4096))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if i%3 == 0 {
			b[0] = '{' // looks like JSON for a byte
		}
		put(b, "")
	}
	const mb = 1_000_000 // under a broker's default message size limit
	pad := strings.Repeat("x", mb-100)
	for i := 0; i < 3; i++ {
		put([]byte(strings.Repeat("[", mb-i)), "")
		put(fmt.Appendf(nil, `{"click_id":"deep-%d","ts":%d,"x":%s1%s}`, i, now, strings.Repeat("[", 100_000), strings.Repeat("]", 100_000)), "")
		put(fmt.Appendf(nil, `{"click_id":"cut-%d","ts":%d,"pad":"%s`, i, now, pad), "")
		huge := fmt.Appendf(nil, `{"click_id":"huge-%d","ts":%d,"pad":"%s"}`, i, now, pad)
		put(huge, fmt.Sprintf("huge-%d", i))
		put(huge, fmt.Sprintf("huge-%d", i))
	}
	// A valid event too large to produce again with the worker's headers
	// (though small enough for the input): dead-lettered without its value.
	add = append(add, &kgo.Record{Key: []byte("hostile"), Value: fmt.Appendf(nil, `{"click_id":"too-big","ts":%d,"pad":"%s"}`, now, strings.Repeat("y", 1_037_000))})
	tr.Total++
	tr.bad(nil)
	for _, c := range []struct{ v, id string }{
		{`{"click_id":-12.5e3,"ts":%d}`, "-12.5e3"},
		{`{"click_id":123456789012345678901234567890,"ts":%d}`, "123456789012345678901234567890"},
		{`{"click_id":null,"ts":%d}`, ""},
		{`{"click_id":"","ts":%d}`, ""},
		{`{"click_id":[],"ts":%d}`, ""},
		{`{"click_id":"dk-1","click_id":null,"ts":%d}`, "dk-1"},
		{`{"click_id":null,"click_id":"dk-2","ts":%d}`, ""},
		{`{"click_id":"\u00e9t\u00e9-1","ts":%d}`, "\u00e9t\u00e9-1"},
		{`{"click_id":"été-1","ts":%d}`, "été-1"},
	} {
		put(fmt.Appendf(nil, c.v, now), c.id)
	}
	out := make([]*kgo.Record, 0, len(recs)+len(add))
	for _, r := range recs {
		for len(add) > 0 && rng.IntN(len(recs)) < len(add) {
			out = append(out, add[0])
			add = add[1:]
		}
		out = append(out, r)
	}
	return append(out, add...)
}

// Package clicktest makes click-event streams with known duplicates and
// malformed records, and checks what a pipeline made of them: the ground
// truth for end-to-end and fault-injection tests.
package clicktest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/sink"
)

// The headers the worker adds.
const (
	SourceHeader = sink.SourceHeader
	IDHeader     = sink.IDHeader
	ErrorHeader  = sink.ErrorHeader
)

// Truth is what an input stream holds.
type Truth struct {
	Valid     map[string]bool // distinct valid click IDs
	Malformed int
	// Bad are the distinct malformed payloads.
	Bad   map[string]bool
	Total int
}

func (t *Truth) bad(v []byte) {
	if t.Bad == nil {
		t.Bad = map[string]bool{}
	}
	t.Bad[string(v)] = true
	t.Malformed++
}

// malformed are the broken forms, in turn.
var malformed = []string{`not json`, `{"click_id":null,"ts":%d}`, `{"click_id":"","ts":%d}`, `{"ts":%d}`,
	`{"click_id":"x-%d","ts":"yesterday"}`, `{"click_id":{"a":1},"ts":%d}`, strings.Repeat("[", 300) + `%d`, "\xff\xfe%d",
	"{\"click_id\":\"bad-\xff\xfe\",\"ts\":%d}", `{"click_id":true,"ts":%d}`, `{"click_id":"y","ts":%d`}

// odd are valid but unusual events, each added twice: a number ID, a
// duplicated key (the first counts), an escaped ID, a 600 kB payload.
var odd = []struct{ id, value string }{
	{"4242", `{"click_id":4242,"ts":%d}`},
	{"first", `{"click_id":"first","click_id":"second","ts":%d}`},
	{`q"uote\`, `{"click_id":"q\"uote\\","ts":%d}`},
	{"big", `{"click_id":"big","ts":%d,"pad":"` + strings.Repeat("x", 600<<10) + `"}`},
}

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
			v = fmt.Sprintf(malformed[tr.Malformed%len(malformed)], now)
			tr.bad([]byte(v))
		case r < badShare+dupShare && len(values) > 0:
			v = values[rng.IntN(len(values))]
		default:
			id := fmt.Sprintf("click-%d", i)
			v = fmt.Sprintf(`{"click_id":%q,"ts":%d,"page":"/p/%d","user":"u%d"}`, id, now, i%97, i%1013)
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

// Produce writes recs to topic.
func Produce(ctx context.Context, brokers []string, topic string, recs []*kgo.Record) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		// Batches below a broker's default limit (1048588 bytes); a record of
		// up to about a megabyte still fits alone.
		kgo.ProducerBatchMaxBytes(1_040_000))
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// ReadAll reads every record of topic, stopping after 1.5 s without one.
func ReadAll(brokers []string, topic string) ([]*kgo.Record, error) {
	return ReadFor(brokers, topic, 0)
}

// ReadFor is ReadAll that also stops after limit (if not 0): a snapshot
// while the topic is still being written.
func ReadFor(brokers []string, topic string, limit time.Duration) ([]*kgo.Record, error) {
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r); n++ })
		if n == 0 || (limit > 0 && time.Since(start) > limit) {
			return out, nil
		}
	}
}

// Header returns the value of header key of r.
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// DistinctSources counts the distinct dedupe-source values of rs.
func DistinctSources(rs []*kgo.Record) int {
	seen := map[string]bool{}
	for _, r := range rs {
		seen[Header(r, SourceHeader)] = true
	}
	return len(seen)
}

// Report is what the output and dead-letter topics say about a run.
type Report struct {
	Distinct       int // distinct valid IDs in the input
	Lost           int // distinct valid IDs never forwarded
	DuplicatesPass int // IDs forwarded from more than one source
	Unknown        int // forwarded IDs not in the input
	Conflicts      int // a source forwarded with two different IDs
	OutRecords     int
	Replays        int // output records beyond one per source
	Malformed      int
	DeadMissing    int // malformed inputs never dead-lettered
	NoReason       int // dead letters without dedupe-error
	WrongDead      int // dead letters whose payload is not a malformed input
	OrderBreaks    int // first copies of one input partition out of order
}

// Check compares the topics with the truth.
func Check(tr Truth, out, dead []*kgo.Record) Report {
	rep := Report{Distinct: len(tr.Valid), OutRecords: len(out), Malformed: tr.Malformed}
	sources := map[string]string{}
	last := map[string]int64{}
	for _, r := range out {
		src, id := Header(r, SourceHeader), Header(r, IDHeader)
		if prev, ok := sources[src]; ok {
			if prev != id {
				rep.Conflicts++
			}
			rep.Replays++
			continue
		}
		sources[src] = id
		parts := strings.Split(src, "/")
		if len(parts) == 3 {
			off, _ := strconv.ParseInt(parts[2], 10, 64)
			key := fmt.Sprintf("%d<-%s", r.Partition, parts[1])
			if prev, ok := last[key]; ok && off < prev {
				rep.OrderBreaks++
			}
			last[key] = off
		}
	}
	perID := map[string]int{}
	for _, id := range sources {
		perID[id]++
	}
	for id := range tr.Valid {
		switch n := perID[id]; {
		case n == 0:
			rep.Lost++
		case n > 1:
			rep.DuplicatesPass++
		}
	}
	for id := range perID {
		if !tr.Valid[id] {
			rep.Unknown++
		}
	}
	deadSources := map[string]bool{}
	deadValues := map[string]bool{}
	for _, r := range dead {
		if Header(r, ErrorHeader) == "" {
			rep.NoReason++
		}
		if !tr.Bad[string(r.Value)] {
			rep.WrongDead++
		}
		deadSources[Header(r, SourceHeader)] = true
		deadValues[string(r.Value)] = true
	}
	missingValues := 0
	for v := range tr.Bad {
		if !deadValues[v] {
			missingValues++
		}
	}
	rep.DeadMissing = max(tr.Malformed-len(deadSources), missingValues, 0)
	return rep
}

// OK reports whether nothing was lost or mangled.
func (r Report) OK() bool {
	return r.Lost == 0 && r.DuplicatesPass == 0 && r.Unknown == 0 && r.Conflicts == 0 && r.DeadMissing == 0 && r.NoReason == 0 &&
		r.WrongDead == 0 && r.OrderBreaks == 0
}

func (r Report) String() string {
	return fmt.Sprintf("distinct %d, lost %d, duplicates passed %d, unknown %d, conflicts %d, output %d (replays %d), malformed %d, dead-letter missing %d, without reason %d, wrongly dead %d, order breaks %d",
		r.Distinct, r.Lost, r.DuplicatesPass, r.Unknown, r.Conflicts, r.OutRecords, r.Replays, r.Malformed, r.DeadMissing, r.NoReason, r.WrongDead, r.OrderBreaks)
}

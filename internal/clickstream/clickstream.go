// Package clickstream makes click-event streams with known duplicates and
// malformed records, and checks what a pipeline made of them: the ground
// truth for end-to-end and fault-injection tests.
package clickstream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"dedupe-worker/internal/record"
)

// The headers the worker adds.
const (
	SourceHeader = record.SourceHeader
	IDHeader     = record.IDHeader
	ErrorHeader  = record.ErrorHeader
	ReasonHeader = record.ReasonHeader
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

// Produce writes recs to topic; opts are further client options (TLS,
// SASL).
func Produce(ctx context.Context, brokers []string, topic string, recs []*kgo.Record, opts ...kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		// Batches below a broker's default limit (1048588 bytes); a record of
		// up to about a megabyte still fits alone.
		kgo.ProducerBatchMaxBytes(1_040_000)}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, recs...).FirstErr()
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
		if Header(r, ErrorHeader) == "" || record.ParseReason(Header(r, ReasonHeader)) == record.Other {
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

// Event is one click event of a Stream and what it is in the ground truth.
type Event struct {
	Key, Value []byte
	// ID is the click ID; empty when the event is malformed.
	ID string
	// Dup: the event repeats an earlier one exactly (its value, event time
	// included), under a new key.
	Dup bool
	// Time is the event time the value carries (or would, if malformed).
	Time time.Time
}

// Stream makes click events one at a time, without end: the streaming
// form of Generate for load generators and long runs. Each event is,
// independently, malformed with probability bad (the forms of Generate,
// in turn), an exact repeat of one of the last Recent valid events with
// probability dup, and otherwise a new click stamped with the clock.
// Click IDs carry a prefix drawn from the seed, so streams with different
// seeds share no ID. Not safe for concurrent use.
type Stream struct {
	rng      *rand.Rand
	dup, bad float64
	prefix   string
	now      func() time.Time
	recent   []Event
	next     int // where the next valid event goes in recent, once full
	n        int
	badN     int
}

// Recent is how many past valid events a Stream draws its repeats from.
const Recent = 100_000

// StreamIDs are the click IDs of the first n events of a stream, with
// repeats, sorted, and how many are distinct.
func StreamIDs(n int, dup, bad float64, seed uint64) ([]string, int) {
	s := NewStream(dup, bad, seed, nil)
	var ids []string
	distinct := map[string]bool{}
	for range n {
		if e := s.Next(); e.ID != "" {
			ids = append(ids, e.ID)
			distinct[e.ID] = true
		}
	}
	slices.Sort(ids)
	return ids, len(distinct)
}

// NewStream returns a stream with the given shares of duplicates and
// malformed events; now is the clock (time.Now if nil).
func NewStream(dup, bad float64, seed uint64, now func() time.Time) *Stream {
	if now == nil {
		now = time.Now
	}
	rng := rand.New(rand.NewPCG(seed, 3))
	return &Stream{rng: rng, dup: dup, bad: bad, prefix: fmt.Sprintf("%08x", rng.Uint32()), now: now}
}

// Next returns the next event.
func (s *Stream) Next() Event {
	i := s.n
	s.n++
	t := s.now()
	ms := t.UnixMilli()
	key := []byte(fmt.Sprintf("u%d", s.rng.IntN(10_000)))
	switch r := s.rng.Float64(); {
	case r < s.bad:
		v := fmt.Sprintf(malformed[s.badN%len(malformed)], ms)
		s.badN++
		return Event{Key: key, Value: []byte(v), Time: time.UnixMilli(ms)}
	case r < s.bad+s.dup && len(s.recent) > 0:
		e := s.recent[s.rng.IntN(len(s.recent))]
		e.Key, e.Dup = key, true
		return e
	}
	id := fmt.Sprintf("click-%s-%d", s.prefix, i)
	e := Event{Key: key, ID: id, Time: time.UnixMilli(ms),
		Value: fmt.Appendf(nil, `{"click_id":%q,"ts":%d,"page":"/p/%d","user":"u%d"}`, id, ms, i%97, s.rng.IntN(100_000))}
	if len(s.recent) < Recent {
		s.recent = append(s.recent, e)
	} else {
		s.recent[s.next] = e
		s.next = (s.next + 1) % Recent
	}
	return e
}

// Add counts e into t.
func (t *Truth) Add(e Event) {
	if t.Valid == nil {
		t.Valid = map[string]bool{}
	}
	t.Total++
	if e.ID == "" {
		t.bad(e.Value)
		return
	}
	t.Valid[e.ID] = true
}

// ReadToEnd reads every record of topic up to the end offsets its
// partitions have when it is called, or until ctx ends; opts are further
// client options (TLS, SASL).
func ReadToEnd(ctx context.Context, brokers []string, topic string, opts ...kgo.Opt) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchMaxBytes(64 << 20)}, opts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := EndOffsets(ctx, cl, topic)
	if err != nil {
		return nil, err
	}
	parts := map[int32]kgo.Offset{}
	left := 0
	for p, end := range ends {
		if end > 0 {
			parts[p] = kgo.NewOffset().AtStart()
			left++
		}
	}
	if left == 0 {
		return nil, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts})
	var out []*kgo.Record
	done := map[int32]bool{}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return out, fmt.Errorf("reading %s: %d partitions not read to the end: %w", topic, left, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= ends[r.Partition] {
				return
			}
			out = append(out, r)
			if r.Offset == ends[r.Partition]-1 && !done[r.Partition] {
				done[r.Partition] = true
				left--
			}
		})
	}
	return out, nil
}

// EndOffsets returns the end offset (the next offset to be written) of
// every partition of topic.
func EndOffsets(ctx context.Context, cl *kgo.Client, topic string) (map[int32]int64, error) {
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	mreq.Topics = append(mreq.Topics, mt)
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	if len(mresp.Topics) != 1 {
		return nil, fmt.Errorf("metadata of %s: %d topics in the reply", topic, len(mresp.Topics))
	}
	if err := kerr.ErrorForCode(mresp.Topics[0].ErrorCode); err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	lreq := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	for _, p := range mresp.Topics[0].Partitions {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition = p.Partition
		lp.Timestamp = -1 // the end
		lt.Partitions = append(lt.Partitions, lp)
	}
	lreq.Topics = append(lreq.Topics, lt)
	lresp, err := lreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	ends := map[int32]int64{}
	for _, t := range lresp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("end offset of %s/%d: %w", topic, p.Partition, err)
			}
			ends[p.Partition] = p.Offset
		}
	}
	if len(ends) != len(mresp.Topics[0].Partitions) {
		return nil, fmt.Errorf("end offsets of %s: %d of %d partitions answered", topic, len(ends), len(mresp.Topics[0].Partitions))
	}
	return ends, nil
}

// Committed returns the offsets group has committed for the partitions of
// topic; a partition without a commit is missing from the map, and so is
// every partition of a group that has not committed yet.
func Committed(ctx context.Context, cl *kgo.Client, group, topic string, partitions int32) (map[int32]int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	g := kmsg.NewOffsetFetchRequestGroup()
	g.Group = group
	t := kmsg.NewOffsetFetchRequestGroupTopic()
	t.Topic = topic
	for p := int32(0); p < partitions; p++ {
		t.Partitions = append(t.Partitions, p)
	}
	g.Topics = append(g.Topics, t)
	req.Groups = append(req.Groups, g)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	out := map[int32]int64{}
	add := func(code int16, p int32, off int64) error {
		if err := kerr.ErrorForCode(code); err != nil {
			return fmt.Errorf("committed offset of %s/%d: %w", topic, p, err)
		}
		if off >= 0 {
			out[p] = off
		}
		return nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	for _, rg := range resp.Groups {
		switch err := kerr.ErrorForCode(rg.ErrorCode); {
		case errors.Is(err, kerr.GroupIDNotFound): // no commit yet
			continue
		case err != nil:
			return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
		}
		for _, rt := range rg.Topics {
			for _, rp := range rt.Partitions {
				if err := add(rp.ErrorCode, rp.Partition, rp.Offset); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := add(rp.ErrorCode, rp.Partition, rp.Offset); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

package consumer

// The decide stage: from a batch of messages to the messages to forward
// and to dead-letter. The Extractor reads each message's ID and event time,
// one test-and-set (the Filter) decides the batch, and each verdict becomes
// a forwarded message with the record format's headers, a dead letter with
// its reason, or nothing.

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/segmentio/kafka-go"
	"github.com/spaolacci/murmur3"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"dedupe-worker/config"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/record"
	"dedupe-worker/internal/sink"
)

// decide extracts the IDs of a batch and runs its test-and-set, retrying
// until it succeeds or ctx ends.
func (w *Worker) decide(ctx context.Context, b *buffers) error {
	batch := b.batch
	w.m.eventsIn.Add(float64(len(batch)))
	elems, idx, dead := b.elems[:0], b.idx[:0], b.dead[:0]
	// After a rebalance or a re-fetch kafka-go can deliver an offset twice
	// in one batch; the copy is decided once (and committed with the rest).
	seen := b.seen
	clear(seen)
	// Composite and value IDs are made in the header blocks, which live
	// as long as the batch's messages.
	hb := &b.hb
	hb.reset()
	for i := range batch {
		m := &batch[i]
		k := [2]int64{int64(m.Partition), m.Offset}
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if size := messageBytes(m); size > maxMessageBytes {
			// It could be produced neither forward nor as a dead letter, and
			// would stop the partition: dead-letter it without its value.
			tl := *m
			tl.Value = nil
			dead = append(dead, deadLetter(&tl, fmt.Errorf("%w: %d bytes", ErrTooLarge, size)))
			w.m.deadLettered.WithLabelValues(record.TooLarge.String()).Inc()
			continue
		}
		id, at, err := w.cfg.Extractor.extract(m, hb)
		if err != nil {
			dead = append(dead, deadLetter(m, err))
			w.m.deadLettered.WithLabelValues(reasonOf(err).String()).Inc()
			continue
		}
		elems = append(elems, bloom.Element{ID: id, Time: at, Source: bloom.Source{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset}})
		idx = append(idx, i)
	}
	b.elems, b.idx, b.dead = elems, idx, dead

	var verdicts []bloom.Verdict
	if len(elems) > 0 {
		err := w.retry(ctx, &w.deciding, StepDecide, "", func(ctx context.Context) error {
			t := time.Now()
			v, err := w.filter.TestAndSet(ctx, elems)
			w.m.redisSeconds.Observe(time.Since(t).Seconds())
			verdicts = v
			return err
		})
		if err != nil {
			return err
		}
	}
	out := b.out[:0]
	var counts [bloom.Future + 1]int
	// Per input partition, first and duplicate verdicts: a batch holds a
	// few partitions, mostly in runs.
	var pcBuf [16]partitionCount
	pc := pcBuf[:0]
	shadow := w.cfg.Shadow
	deadLetterLate := w.cfg.DeadLetterLate && !shadow
	now := w.cfg.Now()
	firstLate := -1
	for k, v := range verdicts {
		counts[v]++
		w.m.eventLag.Observe(max(now.Sub(elems[k].Time), 0).Seconds())
		m := &batch[idx[k]]
		id := kafka.Header{Key: record.IDHeader, Value: elems[k].ID}
		if v == bloom.Late || v == bloom.Future {
			if firstLate < 0 {
				firstLate = k
			}
			if deadLetterLate {
				dead = append(dead, deadLetter(m, fmt.Errorf("%w; event time %s", beyondBound(v), elems[k].Time.UTC().Format(time.RFC3339Nano))))
				w.m.deadLettered.WithLabelValues(reasonOf(beyondBound(v)).String()).Inc()
				continue
			}
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: hb.with(m, id, kafka.Header{Key: record.UndeduplicatedHeader, Value: []byte(v.String())})})
			continue
		}
		rv := record.First
		if !v.Forward() {
			rv = record.Duplicate
		}
		pc = countPartition(pc, int32(m.Partition), rv)
		switch {
		case shadow:
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time,
				Headers: hb.with(m, id, kafka.Header{Key: record.VerdictHeader, Value: rv.Value()})})
		case rv == record.First:
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time, Headers: hb.with(m, id)})
		}
	}
	b.out, b.dead = out, dead
	for v, n := range counts {
		if n > 0 {
			w.m.verdicts.WithLabelValues(bloom.Verdict(v).String()).Add(float64(n))
		}
	}
	for _, c := range pc {
		w.m.addPartitionVerdicts(w.cfg.Topic, c.partition, c.n)
	}
	if firstLate >= 0 {
		e := elems[firstLate]
		action := "forwarded undeduplicated"
		if deadLetterLate {
			action = "dead-lettered"
		}
		w.lateLog.Warn("events beyond the lag bound "+action, zap.Int("late", counts[bloom.Late]), zap.Int("future", counts[bloom.Future]),
			zap.Stringer("first", e.Source), zap.Time("first_event_time", e.Time), zap.Duration("first_lag", now.Sub(e.Time)))
	}
	return nil
}

// partitionCount counts a batch's verdicts of one input partition, by
// record.Verdict.
type partitionCount struct {
	partition int32
	n         [2]int
}

// countPartition counts verdict v of partition p into pc, which it
// returns.
func countPartition(pc []partitionCount, p int32, v record.Verdict) []partitionCount {
	if n := len(pc); n > 0 && pc[n-1].partition == p {
		pc[n-1].n[v]++
		return pc
	}
	for i := range pc {
		if pc[i].partition == p {
			pc[i].n[v]++
			return pc
		}
	}
	c := partitionCount{partition: p}
	c.n[v]++
	return append(pc, c)
}

// beyondBound is the dead-letter reason of a Late or Future verdict.
func beyondBound(v bloom.Verdict) error {
	if v == bloom.Future {
		return ErrFuture
	}
	return ErrLate
}

// The dead-letter reasons of events beyond the lag bound, under
// DeadLetterLate.
var (
	ErrLate   = errors.New("late: processed after the lag bound (max lag past the end of its event time's window), not deduplicated")
	ErrFuture = errors.New("future: event time beyond the end of the window after the clock's, not deduplicated")
)

func source(m *kafka.Message) kafka.Header {
	return kafka.Header{Key: record.SourceHeader, Value: record.AppendSource(nil, m.Topic, m.Partition, m.Offset)}
}

// headerBuf hands out the headers of forwarded messages from a few large
// blocks instead of several small allocations per message: the input's
// headers, then dedupe-source, then the extra ones. The ID aliases the input
// message, which lives as long as the batch. A block that fills up is
// left to the messages that use it and replaced by one twice as large, so
// after a few batches one block holds a whole batch and reset reuses it.
type headerBuf struct {
	headers []kafka.Header
	bytes   []byte
}

// reset makes the current blocks reusable; call it only once no message
// refers to the headers handed out before.
func (b *headerBuf) reset() {
	b.headers, b.bytes = b.headers[:0], b.bytes[:0]
}

// take hands out n bytes that live as long as the messages of the batch:
// the ID of a composite or a value.
func (b *headerBuf) take(n int) []byte {
	if b == nil {
		return make([]byte, n)
	}
	if cap(b.bytes)-len(b.bytes) < n {
		b.bytes = make([]byte, 0, max(n, 2*cap(b.bytes), 8<<10))
	}
	start := len(b.bytes)
	b.bytes = b.bytes[:start+n]
	return b.bytes[start : start+n : start+n]
}

func (b *headerBuf) with(m *kafka.Message, extra ...kafka.Header) []kafka.Header {
	n := len(m.Headers) + 1 + len(extra)
	if cap(b.headers)-len(b.headers) < n {
		b.headers = make([]kafka.Header, 0, max(n, 2*cap(b.headers), 256))
	}
	if need := len(m.Topic) + 42; cap(b.bytes)-len(b.bytes) < need {
		b.bytes = make([]byte, 0, max(need, 2*cap(b.bytes), 8<<10))
	}
	start := len(b.bytes)
	b.bytes = record.AppendSource(b.bytes, m.Topic, m.Partition, m.Offset)
	src := b.bytes[start:len(b.bytes):len(b.bytes)]
	first := len(b.headers)
	b.headers = append(b.headers, m.Headers...)
	b.headers = append(b.headers, kafka.Header{Key: record.SourceHeader, Value: src})
	b.headers = append(b.headers, extra...)
	return b.headers[first:len(b.headers):len(b.headers)]
}

// ErrTooLarge dead-letters a message too large to produce again with the
// headers the worker adds; its dead letter has no value, and its
// dedupe-source header says where the original is.
var ErrTooLarge = fmt.Errorf("message is larger than the producer's limit of %d bytes less %d for headers; the value is left out, see dedupe-source",
	sink.MaxBatchBytes, headerAllowance)

// headerAllowance is room left for the headers the worker adds.
const headerAllowance = 4096

const maxMessageBytes = sink.MaxBatchBytes - headerAllowance

// deadLetter is the input unchanged, with the reason and its source.
func deadLetter(m *kafka.Message, reason error) kafka.Message {
	h := make([]kafka.Header, 0, len(m.Headers)+3)
	h = append(h, m.Headers...)
	h = append(h, source(m), kafka.Header{Key: record.ErrorHeader, Value: []byte(reason.Error())},
		kafka.Header{Key: record.ReasonHeader, Value: []byte(reasonOf(reason).String())})
	return kafka.Message{Key: m.Key, Value: m.Value, Headers: h, Time: m.Time}
}

// reasons map the errors a message is dead-lettered for to their reasons.
var reasons = []struct {
	err    error
	reason record.Reason
}{
	{ErrNotJSON, record.NotJSON}, {ErrTooDeep, record.TooDeep}, {ErrNoID, record.NoID}, {ErrEmptyID, record.EmptyID},
	{ErrBadID, record.BadID}, {ErrNoTime, record.NoTime}, {ErrBadTime, record.BadTime}, {ErrInvalidUTF8, record.InvalidUTF8},
	{ErrTooLarge, record.TooLarge}, {ErrLate, record.Late}, {ErrFuture, record.Future},
	{ErrNoKey, record.NoKey}, {ErrNoHeader, record.NoHeader}, {ErrEmptyHeader, record.EmptyHeader},
	{ErrEmptyValue, record.EmptyValue}, {ErrNoIDPart, record.NoIDPart},
}

// reasonOf is the reason of a dead-letter error, by its type, never by its
// text.
func reasonOf(err error) record.Reason {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return record.Other
}

// MaxJSONDepth bounds the nesting of JSON payloads: deeper input goes to
// the dead-letter topic instead of recursing that deep in the parser. A
// payload shorter than this cannot nest deeper, so it is not scanned.
const MaxJSONDepth = 256

// Extractor reads the element ID and event time of a message. It is safe
// for concurrent use.
type Extractor struct {
	src config.IDSource
	// idPaths are the gjson paths of the ID's fields (JSONID): one, or the
	// parts of a composite.
	idPaths []string
	// partErrs are the dead-letter errors of each part of a composite,
	// made once: missing, empty, not a string or number, not UTF-8.
	partErrs   [][4]error
	timePath   string // gjson path of the event time; empty: timeHeader
	timeHeader string // header of the event time; empty: the timestamp
}

// NewExtractor builds an Extractor that reads the ID from src and the
// event time from the JSON field path timeField, from the header
// timeHeader, or else from the message timestamp. Only a JSON source
// parses the value, so timeField needs one; the error says so, or that
// both timeField and timeHeader are set.
func NewExtractor(src config.IDSource, timeField, timeHeader string) (*Extractor, error) {
	e := &Extractor{src: src, timeHeader: timeHeader}
	switch src.Kind {
	case config.JSONID:
		if len(src.Paths) == 0 || len(src.Paths) > config.MaxIDParts {
			return nil, fmt.Errorf("consumer: %d ID fields: want 1 to %d", len(src.Paths), config.MaxIDParts)
		}
		for _, p := range src.Paths {
			e.idPaths = append(e.idPaths, gjsonPath(p))
			name := strings.Join(p, ".")
			e.partErrs = append(e.partErrs, [4]error{fmt.Errorf("%w: %s", ErrNoIDPart, name), fmt.Errorf("%w: part %s", ErrEmptyID, name),
				fmt.Errorf("%w: part %s", ErrBadID, name), fmt.Errorf("%w: part %s", ErrInvalidUTF8, name)})
		}
	case config.KeyID, config.ValueID:
	case config.HeaderID:
		if src.Header == "" {
			return nil, errors.New("consumer: the ID header has no name")
		}
	default:
		return nil, fmt.Errorf("consumer: unknown ID source %d", src.Kind)
	}
	switch {
	case timeField != "" && timeHeader != "":
		return nil, errors.New("consumer: the event time comes from a JSON field or a header, not both")
	case timeField != "" && src.Kind != config.JSONID:
		return nil, fmt.Errorf("consumer: the event time from a JSON field needs the ID from JSON fields, not from %s: the value is not parsed", src.Kind)
	case timeField != "":
		e.timePath = gjsonPath(strings.Split(timeField, "."))
	}
	return e, nil
}

// Source is where the Extractor reads the ID.
func (e *Extractor) Source() config.IDSource { return e.src }

// gjsonPath joins field names, escaping gjson's special characters so a
// field name is always taken literally.
func gjsonPath(fields []string) string {
	esc := make([]string, len(fields))
	for i, f := range fields {
		esc[i] = gjson.Escape(f)
	}
	return strings.Join(esc, ".")
}

// Reasons for the dead-letter topic, in its dedupe-error header.
var (
	ErrNotJSON     = errors.New("payload is not valid JSON")
	ErrTooDeep     = fmt.Errorf("payload nests deeper than %d levels", MaxJSONDepth)
	ErrNoID        = errors.New("element ID is missing")
	ErrEmptyID     = errors.New("element ID is empty")
	ErrBadID       = errors.New("element ID is not a string or a number")
	ErrNoTime      = errors.New("event time is missing")
	ErrBadTime     = errors.New("event time is not Unix seconds, Unix milliseconds or RFC 3339")
	ErrInvalidUTF8 = errors.New("element ID is not valid UTF-8")
	ErrNoKey       = errors.New("element ID is the message key, and the message has none (or an empty one)")
	ErrNoHeader    = errors.New("element ID is a header the message does not carry")
	ErrEmptyHeader = errors.New("element ID is a header, and its value is empty")
	ErrEmptyValue  = errors.New("element ID is the hash of the value, and the value is empty")
	ErrNoIDPart    = errors.New("element ID is a composite, and a field of it is missing")
)

// Extract returns the ID and event time of m, or the reason it cannot be
// deduplicated. The ID may alias m's memory.
func (e *Extractor) Extract(m *kafka.Message) ([]byte, time.Time, error) {
	return e.extract(m, nil)
}

// extract is Extract making composite and value IDs in ids (new memory
// when nil).
func (e *Extractor) extract(m *kafka.Message, ids *headerBuf) ([]byte, time.Time, error) {
	var id []byte
	switch e.src.Kind {
	case config.JSONID:
		if len(m.Value) > MaxJSONDepth && depthExceeds(m.Value, MaxJSONDepth) {
			return nil, time.Time{}, ErrTooDeep
		}
		if !gjson.ValidBytes(m.Value) {
			return nil, time.Time{}, ErrNotJSON
		}
		var err error
		if len(e.idPaths) == 1 {
			id, err = jsonID(m.Value, e.idPaths[0])
		} else {
			id, err = e.compositeID(m.Value, ids)
		}
		if err != nil {
			return nil, time.Time{}, err
		}
	case config.KeyID:
		// kafka-go reads a null key and an empty one alike, as nil.
		if len(m.Key) == 0 {
			return nil, time.Time{}, ErrNoKey
		}
		id = m.Key
	case config.HeaderID:
		found := false
		for _, h := range m.Headers {
			if h.Key == e.src.Header {
				id, found = h.Value, true
				break
			}
		}
		switch {
		case !found:
			return nil, time.Time{}, ErrNoHeader
		case len(id) == 0:
			return nil, time.Time{}, ErrEmptyHeader
		}
	case config.ValueID:
		if len(m.Value) == 0 {
			return nil, time.Time{}, ErrEmptyValue
		}
		id = AppendValueID(ids.take(ValueIDLen)[:0], m.Value)
	}
	t, err := e.eventTime(m)
	if err != nil {
		return nil, time.Time{}, err
	}
	return id, t, nil
}

// jsonID reads the ID at gjson path p of valid JSON v: a string's
// content or a number's text, aliasing v when it can.
func jsonID(v []byte, p string) ([]byte, error) {
	var id []byte
	r := gjson.Get(view(v), p)
	switch r.Type {
	case gjson.String:
		if !utf8.ValidString(r.Str) {
			return nil, ErrInvalidUTF8
		}
		// Without escapes the ID is the raw bytes between the quotes:
		// alias the message instead of copying.
		if r.Index > 0 && len(r.Raw) == len(r.Str)+2 {
			id = v[r.Index+1 : r.Index+1+len(r.Str) : r.Index+1+len(r.Str)]
		} else {
			id = []byte(r.Str)
		}
	case gjson.Number:
		id = v[r.Index : r.Index+len(r.Raw) : r.Index+len(r.Raw)]
	case gjson.Null:
		if !r.Exists() {
			return nil, ErrNoID
		}
		return nil, ErrBadID
	default:
		return nil, ErrBadID
	}
	if len(id) == 0 {
		return nil, ErrEmptyID
	}
	return id, nil
}

// compositeID reads each field of a composite ID from valid JSON v, as
// jsonID reads one, and encodes them (AppendCompositeID) in ids.
func (e *Extractor) compositeID(v []byte, ids *headerBuf) ([]byte, error) {
	var parts [config.MaxIDParts]string
	n := 0
	for i, p := range e.idPaths {
		r := gjson.Get(view(v), p)
		switch r.Type {
		case gjson.String:
			if !utf8.ValidString(r.Str) {
				return nil, e.partErrs[i][3]
			}
			parts[i] = r.Str // a view of v, or unescaped
		case gjson.Number:
			parts[i] = r.Raw
		case gjson.Null:
			if !r.Exists() {
				return nil, e.partErrs[i][0]
			}
			return nil, e.partErrs[i][2]
		default:
			return nil, e.partErrs[i][2]
		}
		if parts[i] == "" {
			return nil, e.partErrs[i][1]
		}
		n += compositePartLen(len(parts[i]))
	}
	id := ids.take(n)[:0]
	for _, p := range parts[:len(e.idPaths)] {
		id = appendCompositePart(id, p)
	}
	return id, nil
}

// AppendCompositeID appends to dst the ID of a composite made of parts,
// as the worker makes it from several JSON fields: each part, in the
// order of DEDUPE_ID_FIELD, as its length in bytes (decimal), ':', its
// bytes and ',' (a netstring). So ("a", "bc") is 1:a,2:bc, and ("ab", "c")
// is 2:ab,1:c,: parts that split differently never make the same ID. A
// part is a string field's content (unescaped) or a number's JSON text.
// The encoding is fixed: filters in Redis hold IDs made with it.
func AppendCompositeID(dst []byte, parts ...[]byte) []byte {
	for _, p := range parts {
		dst = appendCompositePart(dst, view(p))
	}
	return dst
}

func appendCompositePart(dst []byte, p string) []byte {
	dst = strconv.AppendInt(dst, int64(len(p)), 10)
	dst = append(dst, ':')
	dst = append(dst, p...)
	return append(dst, ',')
}

// compositePartLen is the encoded length of a part of n bytes.
func compositePartLen(n int) int {
	digits := 1
	for x := n; x >= 10; x /= 10 {
		digits++
	}
	return digits + n + 2
}

// ValueIDLen is the length of a value ID: 32 hexadecimal digits.
const ValueIDLen = 32

// AppendValueID appends to dst the ID of a message whose ID is its value:
// the 128-bit MurmurHash3 (x64) of the value, h1 then h2, big-endian, in
// lowercase hexadecimal. Byte-identical values get the same ID; the
// encoding is fixed, as filters in Redis hold IDs made with it.
func AppendValueID(dst, value []byte) []byte {
	h1, h2 := murmur3.Sum128(value)
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], h1)
	binary.BigEndian.PutUint64(raw[8:], h2)
	return hex.AppendEncode(dst, raw[:])
}

func (e *Extractor) eventTime(m *kafka.Message) (time.Time, error) {
	switch {
	case e.timePath != "":
		r := gjson.Get(view(m.Value), e.timePath)
		switch r.Type {
		case gjson.Number:
			return unixTime(r.Raw)
		case gjson.String:
			return ParseEventTime(r.Str)
		case gjson.Null:
			if !r.Exists() {
				return time.Time{}, ErrNoTime
			}
		}
		return time.Time{}, ErrBadTime
	case e.timeHeader != "":
		for _, h := range m.Headers {
			if h.Key == e.timeHeader {
				return ParseEventTime(view(h.Value))
			}
		}
		return time.Time{}, ErrNoTime
	}
	if m.Time.IsZero() || m.Time.Unix() <= 0 {
		return time.Time{}, ErrNoTime
	}
	return m.Time, nil
}

// ParseEventTime reads an event time written as a string, as the worker
// reads it: Unix seconds or milliseconds (see unixTime), or RFC 3339.
// The error is ErrBadTime.
func ParseEventTime(s string) (time.Time, error) {
	if t, err := unixTime(s); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, ErrBadTime
	}
	return t, nil
}

// unixTime reads whole Unix seconds or milliseconds: values from 1e11 on
// are milliseconds (1e11 seconds is the year 5138).
func unixTime(s string) (time.Time, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != f || f < 1 || f > 1e16 {
			return time.Time{}, ErrBadTime
		}
		n = int64(f)
	}
	switch {
	case n <= 0 || n >= 1e16:
		return time.Time{}, ErrBadTime
	case n >= 1e11:
		return time.UnixMilli(n).UTC(), nil
	default:
		return time.Unix(n, 0).UTC(), nil
	}
}

// depthExceeds reports whether JSON-ish input b nests arrays and objects
// deeper than limit, skipping brackets inside strings.
func depthExceeds(b []byte, limit int) bool {
	depth := 0
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > limit {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
}

// view is b as a string without a copy. gjson.GetBytes copies every
// result it returns; reading through a view leaves the results pointing
// into the message, which outlives them. Nothing may write b meanwhile.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

package consumer

// The Extractor: where a message's element ID and event time are, and
// the dead-letter reason of a message without them.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/segmentio/kafka-go"
	"github.com/tidwall/gjson"

	"dedupe-worker/internal/event"
)

// Reasons for the dead-letter topic, in its dedupe-error header; each
// carries its event.Reason.
var (
	ErrNotJSON     = event.NotJSON.Err("payload is not valid JSON")
	ErrTooDeep     = event.TooDeep.Err(fmt.Sprintf("payload nests deeper than %d levels", MaxJSONDepth))
	ErrNoID        = event.NoID.Err("element ID is missing")
	ErrEmptyID     = event.EmptyID.Err("element ID is empty")
	ErrBadID       = event.BadID.Err("element ID is not a string or a number")
	ErrNoTime      = event.NoTime.Err("event time is missing")
	ErrBadTime     = event.BadTime.Err("event time is not Unix seconds, Unix milliseconds or RFC 3339")
	ErrInvalidUTF8 = event.InvalidUTF8.Err("element ID is not valid UTF-8")
	ErrNoKey       = event.NoKey.Err("element ID is the message key, and the message has none (or an empty one)")
	ErrNoHeader    = event.NoHeader.Err("element ID is a header the message does not carry")
	ErrEmptyHeader = event.EmptyHeader.Err("element ID is a header, and its value is empty")
	ErrEmptyValue  = event.EmptyValue.Err("element ID is the hash of the value, and the value is empty")
	ErrNoIDPart    = event.NoIDPart.Err("element ID is a composite, and a field of it is missing")
)

// Extractor reads the element ID and event time of a message. It is safe
// for concurrent use.
type Extractor struct {
	src IDSource
	// idPaths are the gjson paths of the ID's fields (JSONID): one, or the
	// parts of a composite.
	idPaths []string
	// partErrs are the dead-letter errors of each part of a composite,
	// made once.
	partErrs   []partErrors
	timePath   string // gjson path of the event time; empty: timeHeader
	timeHeader string // header of the event time; empty: the timestamp
}

// partErrors are the dead-letter errors of one part of a composite ID,
// naming the part.
type partErrors struct {
	missing, empty, notStringOrNumber, invalidUTF8 error
}

// NewExtractor builds an Extractor that reads the ID from src and the
// event time from the JSON field path timeField (ParsePath), from the
// header timeHeader, or else from the message timestamp. Only a JSON
// source parses the value, so timeField needs one; the error says so, or
// that both timeField and timeHeader are set, or what is wrong with src
// or timeField.
func NewExtractor(src IDSource, timeField, timeHeader string) (*Extractor, error) {
	e := &Extractor{src: src, timeHeader: timeHeader}
	switch src.Kind {
	case JSONID:
		if len(src.Paths) == 0 || len(src.Paths) > MaxIDParts {
			return nil, fmt.Errorf("consumer: %d ID fields: want 1 to %d", len(src.Paths), MaxIDParts)
		}
		for _, p := range src.Paths {
			e.idPaths = append(e.idPaths, gjsonPath(p))
			name := strings.Join(p, ".")
			e.partErrs = append(e.partErrs, partErrors{missing: fmt.Errorf("%w: %s", ErrNoIDPart, name), empty: fmt.Errorf("%w: part %s", ErrEmptyID, name),
				notStringOrNumber: fmt.Errorf("%w: part %s", ErrBadID, name), invalidUTF8: fmt.Errorf("%w: part %s", ErrInvalidUTF8, name)})
		}
	case KeyID, ValueID:
	case HeaderID:
		if src.Header == "" {
			return nil, errors.New("consumer: the ID header has no name")
		}
	default:
		return nil, fmt.Errorf("consumer: unknown ID source %d", src.Kind)
	}
	switch {
	case timeField != "" && timeHeader != "":
		return nil, errors.New("consumer: the event time comes from a JSON field or a header, not both")
	case timeField != "" && src.Kind != JSONID:
		return nil, fmt.Errorf("consumer: the event time from a JSON field needs the ID from JSON fields, not from %s: the value is not parsed", src.Kind)
	case timeField != "":
		p, err := ParsePath(timeField)
		if err != nil {
			return nil, fmt.Errorf("consumer: the event time's JSON field: %w", err)
		}
		e.timePath = gjsonPath(p)
	}
	return e, nil
}

// gjsonPath joins field names, escaping gjson's special characters so a
// field name is always taken literally.
func gjsonPath(fields []string) string {
	esc := make([]string, len(fields))
	for i, f := range fields {
		esc[i] = gjson.Escape(f)
	}
	return strings.Join(esc, ".")
}

// extract returns the ID and event time of m, or the reason it cannot be
// deduplicated. The ID may alias m's memory; composite and value IDs are
// made in ids (new memory when nil).
func (e *Extractor) extract(m *kafka.Message, ids *headerBuf) ([]byte, time.Time, error) {
	var id []byte
	switch e.src.Kind {
	case JSONID:
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
	case KeyID:
		// kafka-go reads a null key and an empty one alike, as nil.
		if len(m.Key) == 0 {
			return nil, time.Time{}, ErrNoKey
		}
		id = m.Key
	case HeaderID:
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
	case ValueID:
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
	var parts [MaxIDParts]string
	n := 0
	for i, p := range e.idPaths {
		r := gjson.Get(view(v), p)
		switch r.Type {
		case gjson.String:
			if !utf8.ValidString(r.Str) {
				return nil, e.partErrs[i].invalidUTF8
			}
			parts[i] = r.Str // a view of v, or unescaped
		case gjson.Number:
			parts[i] = r.Raw
		case gjson.Null:
			if !r.Exists() {
				return nil, e.partErrs[i].missing
			}
			return nil, e.partErrs[i].notStringOrNumber
		default:
			return nil, e.partErrs[i].notStringOrNumber
		}
		if parts[i] == "" {
			return nil, e.partErrs[i].empty
		}
		n += compositePartLen(len(parts[i]))
	}
	id := ids.take(n)[:0]
	for _, p := range parts[:len(e.idPaths)] {
		id = appendCompositePart(id, p)
	}
	return id, nil
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

// view is b as a string without a copy. gjson.GetBytes copies every
// result it returns; reading through a view leaves the results pointing
// into the message, which outlives them. Nothing may write b meanwhile.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

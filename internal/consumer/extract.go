package consumer

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

	"dedupe-worker/config"
)

// MaxJSONDepth bounds the nesting of JSON payloads: deeper input goes to
// the dead-letter topic instead of recursing that deep in the parser. A
// payload shorter than this cannot nest deeper, so it is not scanned.
const MaxJSONDepth = 256

// Extractor reads the element ID and event time of a message.
type Extractor struct {
	id       config.IDSource
	idPath   string // gjson path
	timePath string // gjson path; empty: the message timestamp
	needJSON bool
}

// NewExtractor builds an Extractor from DEDUPE_ID_FIELD and
// DEDUPE_TIME_FIELD values.
func NewExtractor(idField, timeField string) (*Extractor, error) {
	src, err := config.ParseIDField(idField)
	if err != nil {
		return nil, err
	}
	e := &Extractor{id: src}
	if src.Kind == config.JSONID {
		e.idPath = gjsonPath(src.Path)
		e.needJSON = true
	}
	if timeField != "" {
		e.timePath = gjsonPath(strings.Split(timeField, "."))
		e.needJSON = true
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
)

// Extract returns the ID and event time of m, or the reason it cannot be
// deduplicated. The ID may alias m's memory.
func (e *Extractor) Extract(m *kafka.Message) ([]byte, time.Time, error) {
	if e.needJSON {
		if len(m.Value) > MaxJSONDepth && depthExceeds(m.Value, MaxJSONDepth) {
			return nil, time.Time{}, ErrTooDeep
		}
		if !gjson.ValidBytes(m.Value) {
			return nil, time.Time{}, ErrNotJSON
		}
	}
	var id []byte
	switch e.id.Kind {
	case config.KeyID:
		id = m.Key
		if id == nil {
			return nil, time.Time{}, ErrNoID
		}
	case config.HeaderID:
		found := false
		for _, h := range m.Headers {
			if h.Key == e.id.Header {
				id, found = h.Value, true
				break
			}
		}
		if !found {
			return nil, time.Time{}, ErrNoID
		}
	default:
		r := gjson.Get(view(m.Value), e.idPath)
		switch r.Type {
		case gjson.String:
			if !utf8.ValidString(r.Str) {
				return nil, time.Time{}, ErrInvalidUTF8
			}
			// Without escapes the ID is the raw bytes between the quotes:
			// alias the message instead of copying.
			if r.Index > 0 && len(r.Raw) == len(r.Str)+2 {
				id = m.Value[r.Index+1 : r.Index+1+len(r.Str) : r.Index+1+len(r.Str)]
			} else {
				id = []byte(r.Str)
			}
		case gjson.Number:
			id = m.Value[r.Index : r.Index+len(r.Raw) : r.Index+len(r.Raw)]
		case gjson.Null:
			if !r.Exists() {
				return nil, time.Time{}, ErrNoID
			}
			return nil, time.Time{}, ErrBadID
		default:
			return nil, time.Time{}, ErrBadID
		}
	}
	if len(id) == 0 {
		return nil, time.Time{}, ErrEmptyID
	}
	t, err := e.eventTime(m)
	if err != nil {
		return nil, time.Time{}, err
	}
	return id, t, nil
}

func (e *Extractor) eventTime(m *kafka.Message) (time.Time, error) {
	if e.timePath == "" {
		if m.Time.IsZero() || m.Time.Unix() <= 0 {
			return time.Time{}, ErrNoTime
		}
		return m.Time, nil
	}
	r := gjson.Get(view(m.Value), e.timePath)
	switch r.Type {
	case gjson.Number:
		return unixTime(r.Raw)
	case gjson.String:
		if t, err := unixTime(r.Str); err == nil {
			return t, nil
		}
		t, err := time.Parse(time.RFC3339Nano, r.Str)
		if err != nil {
			return time.Time{}, ErrBadTime
		}
		return t, nil
	case gjson.Null:
		if !r.Exists() {
			return time.Time{}, ErrNoTime
		}
	}
	return time.Time{}, ErrBadTime
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

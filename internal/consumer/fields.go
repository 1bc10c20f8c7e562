package consumer

// Checking a JSON value and reading its ID and time fields in one pass,
// when the value is an object and each field a top-level one: gjson reads
// the value once to check it (gjson.Valid) and once more for each field
// (gjson.Get), from the start, and the worker reads two or more per event.

import (
	"strings"

	"github.com/tidwall/gjson"
)

// scanObject reads v in one pass when v is a JSON object: it reports
// whether v is valid JSON as gjson.Valid does, and reads the values of
// the top-level fields names into out (one per name) as
// gjson.Get(v, gjson.Escape(name)) reads each: the field's first
// occurrence or, when v has none, the zero Result; only Num is left
// unset. Nested objects and arrays are checked by gjson.Valid. scanObject
// reports false, with out undefined, when v is not valid JSON and when it
// cannot tell: v is not an object, or a key holds an escape (gjson compares
// keys unescaped) before every name is found. The caller then checks v and
// reads each field with gjson.
func scanObject(v string, names []string, out []gjson.Result) bool {
	i := skipSpace(v, 0)
	if i == len(v) || v[i] != '{' {
		return false
	}
	clear(out) // a field found has a Raw
	left := len(names)
	if i = skipSpace(v, i+1); i < len(v) && v[i] == '}' {
		return skipSpace(v, i+1) == len(v)
	}
	for {
		if i == len(v) || v[i] != '"' {
			return false
		}
		end, escaped, ok := scanString(v, i)
		if !ok || escaped && left > 0 {
			return false
		}
		key := v[i+1 : end-1]
		if i = skipSpace(v, end); i == len(v) || v[i] != ':' {
			return false
		}
		start := skipSpace(v, i+1)
		if i, ok = scanValue(v, start); !ok {
			return false
		}
		for k := 0; left > 0 && k < len(names); k++ {
			if out[k].Raw == "" && key == names[k] {
				out[k] = result(v, start, i)
				left--
			}
		}
		if i = skipSpace(v, i); i == len(v) {
			return false
		}
		switch v[i] {
		case ',':
			i = skipSpace(v, i+1)
		case '}':
			return skipSpace(v, i+1) == len(v)
		default:
			return false
		}
	}
}

// scanValue checks the JSON value that starts at v[i] and returns the
// index just past it; ok is false when it is not valid.
func scanValue(v string, i int) (end int, ok bool) {
	if i == len(v) {
		return i, false
	}
	switch c := v[i]; {
	case c == '"':
		end, _, ok = scanString(v, i)
		return end, ok
	case c == '-' || c >= '0' && c <= '9':
		return scanNumber(v, i)
	case c == '{' || c == '[':
		end = skipValue(v, i)
		return end, gjson.Valid(v[i:end])
	case strings.HasPrefix(v[i:], "true"):
		return i + 4, true
	case strings.HasPrefix(v[i:], "false"):
		return i + 5, true
	case strings.HasPrefix(v[i:], "null"):
		return i + 4, true
	}
	return i, false
}

// scanString checks the JSON string whose opening quote is v[i] and
// returns the index just past its closing quote, and whether it holds an
// escape. A string holds no byte below 0x20, and each backslash starts
// one of the escapes of RFC 8259.
func scanString(v string, i int) (end int, escaped, ok bool) {
	for i++; ; i++ {
		for i < len(v) && plain[v[i]] {
			i++
		}
		if i == len(v) || v[i] < 0x20 {
			return i, escaped, false
		}
		if v[i] == '"' {
			return i + 1, escaped, true
		}
		escaped = true // v[i] is a backslash
		if i++; i == len(v) {
			return i, escaped, false
		}
		switch v[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			if i+4 >= len(v) || !isHex(v[i+1]) || !isHex(v[i+2]) || !isHex(v[i+3]) || !isHex(v[i+4]) {
				return i, escaped, false
			}
			i += 4
		default:
			return i, escaped, false
		}
	}
}

// plain holds the bytes a JSON string holds as they are: all but the
// quote, the backslash and those below 0x20.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// scanNumber checks the JSON number that starts at v[i], an optional minus
// then a digit, and returns the index just past it.
func scanNumber(v string, i int) (end int, ok bool) {
	if v[i] == '-' {
		if i++; i == len(v) || !isDigit(v[i]) {
			return i, false
		}
	}
	if v[i] == '0' { // no leading zeros: what follows is checked by the caller
		i++
	} else {
		i = skipDigits(v, i)
	}
	if i < len(v) && v[i] == '.' {
		if i++; i == len(v) || !isDigit(v[i]) {
			return i, false
		}
		i = skipDigits(v, i)
	}
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		if i++; i < len(v) && (v[i] == '+' || v[i] == '-') {
			i++
		}
		if i == len(v) || !isDigit(v[i]) {
			return i, false
		}
		i = skipDigits(v, i)
	}
	return i, true
}

func skipDigits(v string, i int) int {
	for i < len(v) && isDigit(v[i]) {
		i++
	}
	return i
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// result is the gjson.Result of v[start:end], one value of v, as gjson.Get
// gives it (without Num).
func result(v string, start, end int) gjson.Result {
	raw := v[start:end]
	switch c := raw[0]; {
	case c == '"' && strings.IndexByte(raw, '\\') < 0:
		return gjson.Result{Type: gjson.String, Raw: raw, Str: raw[1 : len(raw)-1], Index: start}
	case c == '-' || c >= '0' && c <= '9':
		return gjson.Result{Type: gjson.Number, Raw: raw, Index: start}
	}
	// A string with escapes, an object, an array, true, false or null.
	r := gjson.Parse(raw)
	r.Index = start
	return r
}

// skipSpace is the index of the first byte of v from i on that is not
// JSON whitespace, or len(v).
func skipSpace(v string, i int) int {
	for i < len(v) && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r') {
		i++
	}
	return i
}

// skipValue is the index just past the value that starts at v[i], in
// valid JSON v.
func skipValue(v string, i int) int {
	switch v[i] {
	case '"':
		return skipString(v, i)
	case '{', '[':
		depth := 0
		for i < len(v) {
			switch v[i] {
			case '"':
				i = skipString(v, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	// A number, true, false or null: up to the next delimiter.
	for i < len(v) {
		switch v[i] {
		case ' ', '\t', '\n', '\r', ',', '}', ']':
			return i
		}
		i++
	}
	return i
}

// skipString is the index just past the string whose opening quote is
// v[i], in valid JSON v.
func skipString(v string, i int) int {
	for i++; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

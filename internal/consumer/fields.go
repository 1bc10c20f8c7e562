package consumer

// Reading the ID and time fields of a JSON value in one pass, when each is
// a top-level field: gjson.Get reads one field per pass, from the start of
// the value, and the worker reads two or more per event.

import (
	"strings"

	"github.com/tidwall/gjson"
)

// topLevel reads from v, valid JSON (gjson.Valid), the values of the
// top-level fields names in one pass, into out (one per name): each as
// gjson.Get(v, gjson.Escape(name)) reads it, the field's first occurrence
// or, when v has none, the zero Result; only Num is left unset. The pass
// ends once every name is found. topLevel reports false, with out
// undefined, when it cannot tell: v is not an object, or a key holds an
// escape (gjson compares keys unescaped) before every name is found. The
// caller then reads each field with gjson.Get.
func topLevel(v string, names []string, out []gjson.Result) bool {
	i := skipSpace(v, 0)
	if i == len(v) || v[i] != '{' {
		return false
	}
	clear(out) // a field found has a Raw
	left := len(names)
	i++
	for left > 0 {
		// Bounds are checked although v is valid JSON: no input can make
		// the pass read out of range.
		if i = skipSpace(v, i); i < len(v) && v[i] == ',' {
			i = skipSpace(v, i+1)
		}
		if i >= len(v) || v[i] == '}' {
			break
		}
		end := i + 1 // v[i] is the key's opening quote
		for end < len(v) && v[end] != '"' {
			if v[end] == '\\' {
				return false
			}
			end++
		}
		key := v[i+1 : min(end, len(v))]
		start := skipSpace(v, skipSpace(v, end+1)+1) // past the colon
		if start >= len(v) {
			return false
		}
		i = skipValue(v, start)
		for k, name := range names {
			if out[k].Raw == "" && key == name {
				out[k] = result(v, start, i)
				left--
			}
		}
	}
	return true
}

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

package consumer

// MaxJSONDepth bounds the nesting of JSON payloads: deeper input goes to
// the dead-letter topic instead of recursing that deep in the parser. A
// payload shorter than this cannot nest deeper, so it is not scanned.
const MaxJSONDepth = 256

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

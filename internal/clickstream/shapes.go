package clickstream

// The shapes of the events: a valid click, the malformed forms, and the
// valid but unusual ones.

import (
	"fmt"
	"strings"
)

// clickValue is the value of a valid click event.
func clickValue(id string, ms int64, page, user int) []byte {
	return fmt.Appendf(nil, `{"click_id":%q,"ts":%d,"page":"/p/%d","user":"u%d"}`, id, ms, page, user)
}

// malformed are the broken forms, in turn.
var malformed = []string{`not json`, `{"click_id":null,"ts":%d}`, `{"click_id":"","ts":%d}`, `{"ts":%d}`,
	`{"click_id":"x-%d","ts":"yesterday"}`, `{"click_id":{"a":1},"ts":%d}`, strings.Repeat("[", 300) + `%d`, "\xff\xfe%d",
	"{\"click_id\":\"bad-\xff\xfe\",\"ts\":%d}", `{"click_id":true,"ts":%d}`, `{"click_id":"y","ts":%d`}

// malformedValue is the i-th malformed event, in turn through the forms,
// stamped ms where the form has a time.
func malformedValue(i int, ms int64) []byte {
	return fmt.Appendf(nil, malformed[i%len(malformed)], ms)
}

// odd are valid but unusual events, each added twice: a number ID, a
// duplicated key (the first counts), an escaped ID, a 600 kB payload.
var odd = []struct{ id, value string }{
	{"4242", `{"click_id":4242,"ts":%d}`},
	{"first", `{"click_id":"first","click_id":"second","ts":%d}`},
	{`q"uote\`, `{"click_id":"q\"uote\\","ts":%d}`},
	{"big", `{"click_id":"big","ts":%d,"pad":"` + strings.Repeat("x", 600<<10) + `"}`},
}

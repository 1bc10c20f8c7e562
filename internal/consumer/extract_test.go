package consumer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"dedupe-worker/internal/event"
)

// extractor is the Extractor of the JSON field path idField (with its
// forms key and header:NAME) and the time field path timeField.
func extractor(t testing.TB, idField, timeField string) *Extractor {
	t.Helper()
	src, err := ParseIDSource("json", idField, "")
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewExtractor(src, timeField, "")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestExtract(t *testing.T) {
	// Any second will do: the one the test runs in, written in each form.
	ts := time.Now().UTC().Truncate(time.Second)
	sec, ms, rfc := strconv.FormatInt(ts.Unix(), 10), strconv.FormatInt(ts.UnixMilli(), 10), ts.Format(time.RFC3339)
	for _, tc := range []struct {
		name, idField, timeField string
		msg                      kafka.Message
		id                       string
		at                       time.Time
		err                      error
	}{
		{"string id, seconds", "click_id", "ts", kafka.Message{Value: []byte(`{"click_id":"c1","ts":` + sec + `}`)}, "c1", ts, nil},
		{"nested id, millis", "meta.id", "ts", kafka.Message{Value: []byte(`{"meta":{"id":"m1"},"ts":` + ms + `}`)}, "m1", ts, nil},
		{"rfc3339", "id", "t", kafka.Message{Value: []byte(`{"id":"a","t":"` + rfc + `"}`)}, "a", ts, nil},
		{"numeric string time", "id", "t", kafka.Message{Value: []byte(`{"id":"a","t":"` + sec + `"}`)}, "a", ts, nil},
		{"number id keeps its text", "id", "", kafka.Message{Value: []byte(`{"id":12345}`), Time: ts}, "12345", ts, nil},
		{"message timestamp", "id", "", kafka.Message{Value: []byte(`{"id":"a"}`), Time: ts}, "a", ts, nil},
		{"key", "key", "", kafka.Message{Key: []byte("k1"), Value: []byte("not json"), Time: ts}, "k1", ts, nil},
		{"header", "header:x-id", "", kafka.Message{Headers: []kafka.Header{{Key: "x-id", Value: []byte("h1")}}, Time: ts}, "h1", ts, nil},
		{"field with dots escaped", "a*b", "", kafka.Message{Value: []byte(`{"a*b":"x","axb":"y"}`), Time: ts}, "x", ts, nil},
		{"first of duplicated keys", "id", "", kafka.Message{Value: []byte(`{"id":"first","id":"second"}`), Time: ts}, "first", ts, nil},
		{"not json", "id", "", kafka.Message{Value: []byte(`id=1`), Time: ts}, "", time.Time{}, ErrNotJSON},
		{"truncated json", "id", "", kafka.Message{Value: []byte(`{"id":"a"`), Time: ts}, "", time.Time{}, ErrNotJSON},
		{"missing id", "id", "", kafka.Message{Value: []byte(`{"x":1}`), Time: ts}, "", time.Time{}, ErrNoID},
		{"null id", "id", "", kafka.Message{Value: []byte(`{"id":null}`), Time: ts}, "", time.Time{}, ErrBadID},
		{"empty id", "id", "", kafka.Message{Value: []byte(`{"id":""}`), Time: ts}, "", time.Time{}, ErrEmptyID},
		{"object id", "id", "", kafka.Message{Value: []byte(`{"id":{"a":1}}`), Time: ts}, "", time.Time{}, ErrBadID},
		{"bool id", "id", "", kafka.Message{Value: []byte(`{"id":true}`), Time: ts}, "", time.Time{}, ErrBadID},
		{"no key", "key", "", kafka.Message{Value: []byte(`{}`), Time: ts}, "", time.Time{}, ErrNoKey},
		{"empty key", "key", "", kafka.Message{Key: []byte{}, Value: []byte(`{}`), Time: ts}, "", time.Time{}, ErrNoKey},
		{"no header", "header:x-id", "", kafka.Message{Time: ts}, "", time.Time{}, ErrNoHeader},
		{"empty header", "header:x-id", "", kafka.Message{Headers: []kafka.Header{{Key: "x-id"}}, Time: ts}, "", time.Time{}, ErrEmptyHeader},
		{"composite", "tenant, meta.id", "", kafka.Message{Value: []byte(`{"tenant":"t1","meta":{"id":"a:b,"}}`), Time: ts}, "2:t1,4:a:b,,", ts, nil},
		{"composite with a number and escapes", "n,s", "", kafka.Message{Value: []byte(`{"s":"q\"u","n":42}`), Time: ts}, "2:42,3:q\"u,", ts, nil},
		{"composite part missing", "tenant,id", "", kafka.Message{Value: []byte(`{"id":"a"}`), Time: ts}, "", time.Time{}, ErrNoIDPart},
		{"composite part empty", "tenant,id", "", kafka.Message{Value: []byte(`{"tenant":"","id":"a"}`), Time: ts}, "", time.Time{}, ErrEmptyID},
		{"composite part null", "tenant,id", "", kafka.Message{Value: []byte(`{"tenant":null,"id":"a"}`), Time: ts}, "", time.Time{}, ErrBadID},
		{"composite part an object", "tenant,id", "", kafka.Message{Value: []byte(`{"tenant":{},"id":"a"}`), Time: ts}, "", time.Time{}, ErrBadID},
		{"composite of not json", "tenant,id", "", kafka.Message{Value: []byte(`tenant=1`), Time: ts}, "", time.Time{}, ErrNotJSON},
		{"no timestamp", "id", "", kafka.Message{Value: []byte(`{"id":"a"}`)}, "", time.Time{}, ErrNoTime},
		{"missing time field", "id", "ts", kafka.Message{Value: []byte(`{"id":"a"}`)}, "", time.Time{}, ErrNoTime},
		{"bad time", "id", "ts", kafka.Message{Value: []byte(`{"id":"a","ts":"yesterday"}`)}, "", time.Time{}, ErrBadTime},
		{"negative time", "id", "ts", kafka.Message{Value: []byte(`{"id":"a","ts":-5}`)}, "", time.Time{}, ErrBadTime},
		{"too deep", "id", "", kafka.Message{Value: []byte(strings.Repeat("[", 100000)), Time: ts}, "", time.Time{}, ErrTooDeep},
		{"invalid utf-8 id", "id", "", kafka.Message{Value: []byte("{\"id\":\"\xff\xfe\"}"), Time: ts}, "", time.Time{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, at, err := extractor(t, tc.idField, tc.timeField).Extract(&tc.msg)
			if tc.name == "invalid utf-8 id" {
				// Either a reason or the raw bytes, never a crash.
				if err == nil && len(id) == 0 {
					t.Fatal("no ID and no reason")
				}
				return
			}
			if !errors.Is(err, tc.err) || string(id) != tc.id || !at.Equal(tc.at) {
				t.Fatalf("got %q %v %v, want %q %v %v", id, at, err, tc.id, tc.at, tc.err)
			}
		})
	}
}

// FuzzExtract: any payload gives an ID and a time, or a reason; never a
// panic, never an empty ID without a reason.
func FuzzExtract(f *testing.F) {
	now := time.Now().UTC()
	for _, s := range []string{
		`{"click_id":"c1","ts":` + strconv.FormatInt(now.Unix(), 10) + `}`, `{"click_id":12,"ts":"` + now.Format(time.RFC3339) + `"}`,
		`{"click_id":null}`, `[]`, `{"click_id":"a","click_id":"b"}`, "\xff\xfe", `{"click_id":{"x":[1,2,{"y":"z"}]}}`,
		strings.Repeat(`{"a":`, 300), `{"click_id":"\u00e9\ud800","ts":1e12}`, `{"ts":99999999999999999999}`,
	} {
		f.Add([]byte(s))
	}
	e := extractor(f, "click_id", "ts")
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := kafka.Message{Value: payload}
		id, at, err := e.Extract(&m)
		if err == nil && (len(id) == 0 || at.IsZero()) {
			t.Fatalf("no error but id %q time %v", id, at)
		}
	})
}

func BenchmarkExtract(b *testing.B) {
	e := extractor(b, "click_id", "ts")
	ms := strconv.FormatInt(time.Now().UnixMilli(), 10)
	m := kafka.Message{Value: []byte(`{"click_id":"c-000000123456-9f3a2b1c","ts":` + ms + `,"user":"u-0012345","page":"/products/04242","ref":"campaign-042","ua":"Mozilla/5.0"}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := e.Extract(&m); err != nil {
			b.Fatal(err)
		}
	}
}

// The sources that do not parse the value: the key, a header and the
// value's hash take any bytes, and the event time comes from a header or
// the timestamp.
func TestExtractWithoutParsing(t *testing.T) {
	ts := time.Now().UTC().Truncate(time.Millisecond)
	ms := strconv.FormatInt(ts.UnixMilli(), 10)
	binary := []byte{0x00, 0x00, 0x00, 0x00, 0x2a, 0x02, 0xff, 0xfe, '{', '['} // Avro in the Confluent framing: not JSON, not UTF-8
	deep := []byte(strings.Repeat("[", 100000))
	for _, tc := range []struct {
		name       string
		src        IDSource
		timeHeader string
		msg        kafka.Message
		id         string
		at         time.Time
		err        error
	}{
		{"binary key", IDSource{Kind: KeyID}, "", kafka.Message{Key: binary, Value: binary, Time: ts}, string(binary), ts, nil},
		{"key, a deep value", IDSource{Kind: KeyID}, "", kafka.Message{Key: []byte("k"), Value: deep, Time: ts}, "k", ts, nil},
		{"header", IDSource{Kind: HeaderID, Header: "x-id"}, "", kafka.Message{Value: binary, Time: ts,
			Headers: []kafka.Header{{Key: "other", Value: []byte("no")}, {Key: "x-id", Value: binary}}}, string(binary), ts, nil},
		{"value", IDSource{Kind: ValueID}, "", kafka.Message{Value: binary, Time: ts}, string(AppendValueID(nil, binary)), ts, nil},
		{"time header, millis", IDSource{Kind: KeyID}, "event-time",
			kafka.Message{Key: []byte("k"), Headers: []kafka.Header{{Key: "event-time", Value: []byte(ms)}}}, "k", ts, nil},
		{"time header, RFC 3339", IDSource{Kind: ValueID}, "event-time",
			kafka.Message{Value: binary, Headers: []kafka.Header{{Key: "event-time", Value: []byte(ts.Format(time.RFC3339Nano))}}}, string(AppendValueID(nil, binary)), ts, nil},
		{"time header missing", IDSource{Kind: KeyID}, "event-time", kafka.Message{Key: []byte("k"), Time: ts}, "", time.Time{}, ErrNoTime},
		{"time header unreadable", IDSource{Kind: KeyID}, "event-time",
			kafka.Message{Key: []byte("k"), Headers: []kafka.Header{{Key: "event-time", Value: []byte("noon")}}}, "", time.Time{}, ErrBadTime},
		{"no timestamp", IDSource{Kind: HeaderID, Header: "x-id"}, "", kafka.Message{Headers: []kafka.Header{{Key: "x-id", Value: []byte("h")}}}, "", time.Time{}, ErrNoTime},
		{"no key", IDSource{Kind: KeyID}, "", kafka.Message{Value: binary, Time: ts}, "", time.Time{}, ErrNoKey},
		{"no header", IDSource{Kind: HeaderID, Header: "x-id"}, "", kafka.Message{Value: binary, Time: ts,
			Headers: []kafka.Header{{Key: "X-Id", Value: []byte("case differs")}}}, "", time.Time{}, ErrNoHeader},
		{"empty header", IDSource{Kind: HeaderID, Header: "x-id"}, "", kafka.Message{Time: ts, Headers: []kafka.Header{{Key: "x-id", Value: []byte{}}}}, "", time.Time{}, ErrEmptyHeader},
		{"empty value", IDSource{Kind: ValueID}, "", kafka.Message{Key: []byte("k"), Time: ts}, "", time.Time{}, ErrEmptyValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewExtractor(tc.src, "", tc.timeHeader)
			if err != nil {
				t.Fatal(err)
			}
			id, at, err := e.Extract(&tc.msg)
			if !errors.Is(err, tc.err) || string(id) != tc.id || !at.Equal(tc.at) {
				t.Fatalf("got %q %v %v, want %q %v %v", id, at, err, tc.id, tc.at, tc.err)
			}
		})
	}
	if _, err := NewExtractor(IDSource{Kind: KeyID}, "ts", ""); err == nil {
		t.Error("a JSON time field with the ID from the key: no error")
	}
	// The event time's path is read as the ID's paths are.
	for _, bad := range []string{".", "a.", "a..b", strings.Repeat("a.", MaxPathFields) + "a"} {
		if _, err := NewExtractor(IDSource{Kind: JSONID, Paths: [][]string{{"id"}}}, bad, ""); err == nil {
			t.Errorf("an event time at %q: no error", bad)
		}
	}
}

// Every dead-letter error of the Extractor has a reason of its own,
// found by its type, and every reason the Extractor gives is a label of
// event.Reasons.
func TestExtractReasons(t *testing.T) {
	want := map[error]event.Reason{ErrNotJSON: event.NotJSON, ErrTooDeep: event.TooDeep, ErrNoID: event.NoID, ErrEmptyID: event.EmptyID,
		ErrBadID: event.BadID, ErrNoTime: event.NoTime, ErrBadTime: event.BadTime, ErrInvalidUTF8: event.InvalidUTF8,
		ErrNoKey: event.NoKey, ErrNoHeader: event.NoHeader, ErrEmptyHeader: event.EmptyHeader, ErrEmptyValue: event.EmptyValue,
		ErrNoIDPart: event.NoIDPart, ErrTooLarge: event.TooLarge, ErrLate: event.Late, ErrFuture: event.Future}
	labels := map[string]bool{}
	for _, r := range event.Reasons() {
		labels[r.String()] = true
	}
	for err, r := range want {
		// Wrapped as the composite's parts wrap them.
		if got := event.ReasonOf(fmt.Errorf("%w: part x", err)); got != r || !labels[got.String()] {
			t.Errorf("%v: reason %v, want %v", err, got, r)
		}
	}
}

// The IDs the filters in Redis hold must not change across versions: a
// single JSON field's ID is its bytes as before composites existed, a
// composite's and a value's are pinned here.
func TestIDsGolden(t *testing.T) {
	ts := time.Now()
	for _, tc := range []struct {
		idField, value, id string
	}{
		{"click_id", `{"click_id":"click-0001","ts":1}`, "click-0001"},
		{"click_id", `{"click_id":4242}`, "4242"},
		{"click_id", `{"click_id":-12.5e3}`, "-12.5e3"},
		{"click_id", `{"click_id":"q\"uote\\"}`, `q"uote\`},
		{"click_id", `{"click_id":"\u00e9t\u00e9"}`, "été"},
		{"meta.id", `{"meta":{"id":"m-1"}}`, "m-1"},
		{"a,b", `{"a":"a","b":"bc"}`, "1:a,2:bc,"},
		{"a,b", `{"a":"ab","b":"c"}`, "2:ab,1:c,"},
		{"tenant_id,meta.click_id", `{"meta":{"click_id":"c-1"},"tenant_id":7}`, "1:7,3:c-1,"},
		{"a,b,c", `{"a":"` + strings.Repeat("x", 12) + `","b":"é","c":"1,2:"}`, "12:" + strings.Repeat("x", 12) + ",2:é,4:1,2:,"},
	} {
		m := kafka.Message{Value: []byte(tc.value), Time: ts}
		id, _, err := extractor(t, tc.idField, "").Extract(&m)
		if err != nil || string(id) != tc.id {
			t.Errorf("%s of %s: %q, %v; want %q", tc.idField, tc.value, id, err, tc.id)
		}
	}
	if got := string(AppendCompositeID(nil, []byte("a"), []byte("bc"))); got != "1:a,2:bc," {
		t.Errorf("AppendCompositeID(a, bc) = %q", got)
	}
	// The first is MurmurHash3 x64 128's published value for this string
	// (h1 e34bbc7bbc071b6c, h2 7a433ca9c49a9347); the others pin what this
	// version makes.
	for _, tc := range []struct{ value, id string }{
		{"The quick brown fox jumps over the lazy dog", "e34bbc7bbc071b6c7a433ca9c49a9347"},
		{"x", "6d16e801ba1afee7d7ed6d966bae788c"},
		{`{"click_id":"click-0001","ts":1}`, "d9698152bacfd57cbb22ff05702ea6bb"},
	} {
		if got := string(AppendValueID(nil, []byte(tc.value))); got != tc.id {
			t.Errorf("value ID of %q: %s, want %s", tc.value, got, tc.id)
		}
	}
}

// A composite never makes the ID of another split of the same bytes, nor
// an ID without a reason; it aliases nothing it was not given.
func FuzzCompositeID(f *testing.F) {
	f.Add("a", "bc", "ab", "c")
	f.Add("1:a", ",", "1", ":a,")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		x := AppendCompositeID(nil, []byte(a), []byte(b))
		y := AppendCompositeID(nil, []byte(c), []byte(d))
		if (a == c && b == d) != (string(x) == string(y)) {
			t.Fatalf("(%q, %q) -> %q and (%q, %q) -> %q", a, b, x, c, d, y)
		}
		if n := compositePartLen(len(a)) + compositePartLen(len(b)); n != len(x) {
			t.Fatalf("(%q, %q): encoded %d bytes, sized %d", a, b, len(x), n)
		}
	})
}

func BenchmarkExtractComposite(b *testing.B) {
	e := extractor(b, "user,click_id", "ts")
	ms := strconv.FormatInt(time.Now().UnixMilli(), 10)
	m := kafka.Message{Value: []byte(`{"click_id":"c-000000123456-9f3a2b1c","ts":` + ms + `,"user":"u-0012345","page":"/products/04242","ref":"campaign-042","ua":"Mozilla/5.0"}`)}
	var hb headerBuf
	b.ReportAllocs()
	for b.Loop() {
		hb.reset()
		if _, _, err := e.extract(&m, &hb); err != nil {
			b.Fatal(err)
		}
	}
}

// Extract is extract with IDs in new memory, as the tests read them.
func (e *Extractor) Extract(m *kafka.Message) ([]byte, time.Time, error) {
	return e.extract(m, nil)
}

package consumer

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

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
		{"no key", "key", "", kafka.Message{Value: []byte(`{}`), Time: ts}, "", time.Time{}, ErrNoID},
		{"no header", "header:x-id", "", kafka.Message{Time: ts}, "", time.Time{}, ErrNoID},
		{"no timestamp", "id", "", kafka.Message{Value: []byte(`{"id":"a"}`)}, "", time.Time{}, ErrNoTime},
		{"missing time field", "id", "ts", kafka.Message{Value: []byte(`{"id":"a"}`)}, "", time.Time{}, ErrNoTime},
		{"bad time", "id", "ts", kafka.Message{Value: []byte(`{"id":"a","ts":"yesterday"}`)}, "", time.Time{}, ErrBadTime},
		{"negative time", "id", "ts", kafka.Message{Value: []byte(`{"id":"a","ts":-5}`)}, "", time.Time{}, ErrBadTime},
		{"too deep", "id", "", kafka.Message{Value: []byte(strings.Repeat("[", 100000)), Time: ts}, "", time.Time{}, ErrTooDeep},
		{"invalid utf-8 id", "id", "", kafka.Message{Value: []byte("{\"id\":\"\xff\xfe\"}"), Time: ts}, "", time.Time{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewExtractor(tc.idField, tc.timeField)
			if err != nil {
				t.Fatal(err)
			}
			id, at, err := e.Extract(&tc.msg)
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
	e, _ := NewExtractor("click_id", "ts")
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := kafka.Message{Value: payload}
		id, at, err := e.Extract(&m)
		if err == nil && (len(id) == 0 || at.IsZero()) {
			t.Fatalf("no error but id %q time %v", id, at)
		}
	})
}

func BenchmarkExtract(b *testing.B) {
	e, _ := NewExtractor("click_id", "ts")
	ms := strconv.FormatInt(time.Now().UnixMilli(), 10)
	m := kafka.Message{Value: []byte(`{"click_id":"c-000000123456-9f3a2b1c","ts":` + ms + `,"user":"u-0012345","page":"/products/04242","ref":"campaign-042","ua":"Mozilla/5.0"}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := e.Extract(&m); err != nil {
			b.Fatal(err)
		}
	}
}

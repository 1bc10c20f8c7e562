package consumer

import (
	"math/rand/v2"
	"testing"

	"github.com/tidwall/gjson"
)

// fieldNames are top-level field names the one-pass read is checked with:
// plain ones, ones gjson's paths escape, and ones that are also numbers.
// Names are never empty (ParsePath).
var fieldNames = []string{"id", "ts", "a*b", "a.b", "0", "é", "x y", "@this", "#", "k\""}

// sameAsGjson fails t unless scanObject, when it reads v (true), finds v
// valid as gjson.Valid does and reads every name of names as gjson.Get
// does. It reports whether scanObject read v.
func sameAsGjson(t *testing.T, v string, names []string) bool {
	t.Helper()
	out := make([]gjson.Result, len(names))
	if !scanObject(v, names, out) {
		return false
	}
	if !gjson.Valid(v) {
		t.Fatalf("%q: read as valid JSON; gjson.Valid says it is not", v)
	}
	for k, name := range names {
		want := gjson.Get(v, gjson.Escape(name))
		got := out[k]
		if got.Type != want.Type || got.Raw != want.Raw || got.Str != want.Str || got.Exists() != want.Exists() ||
			(want.Exists() && got.Index != want.Index) {
			t.Fatalf("%q, field %q: read %+v, gjson.Get reads %+v", v, name, got, want)
		}
	}
	return true
}

func TestScanObjectReadsAsGjson(t *testing.T) {
	for _, tc := range []struct {
		v string
		// read: scanObject reads it, rather than leave it to gjson.
		read bool
	}{
		{`{"id":"c1","ts":1700000000}`, true},
		{` { "ts" : -1.5e3 , "id" : "x" } `, true},
		{"{\n\t\"id\":\r\n\"a\"}\n", true},
		{`{"id":"first","id":"second","ts":1,"ts":2}`, true},
		{`{"a*b":"x","axb":"y","a.b":1,"0":[0],"é":"e","x y":true,"@this":null,"#":false,"":"empty"}`, true},
		{`{"n":{"id":"nested","ts":[1,{"id":2}]},"s":"{\"id\":3}","id":{"ts":"deep"},"ts":[]}`, true},
		{`{"id":"q\"u\\o\/\b\f\n\r\t\u00e9\uD800","ts":"2024-01-02T03:04:05Z"}`, true},
		{`{"arr":["]","}",{"x":"\"}"}],"id":"after brackets in strings"}`, true},
		{`{"id":0,"ts":-0,"a":0.5,"b":1E+2,"c":-3e-4,"d":12.25e7}`, true},
		{`{}`, true},
		{` {} `, true},
		{`{"other":1}`, true},
		{`{"id":1,"ts":2,"k\"":3}`, true}, // the escaped key comes after the fields: checked, not compared
		{`{"k\"":1,"id":2}`, false},       // an escaped key before them: left to gjson
		{`[{"id":1}]`, false},             // not an object
		{`"id"`, false},
		{`12`, false},
		{``, false},
		// Not valid JSON: never read.
		{`{"id":"a"`, false},
		{`{"id":"a"}}`, false},
		{`{"id":"a"} x`, false},
		{`{"id":01}`, false},
		{`{"id":-01}`, false},
		{`{"id":1.}`, false},
		{`{"id":-}`, false},
		{`{"id":1e}`, false},
		{`{"id":1e+}`, false},
		{`{"id":.5}`, false},
		{`{"id":+1}`, false},
		{`{"id":"\x"}`, false},
		{`{"id":"\u00g0"}`, false},
		{`{"id":"\u00e"}`, false},
		{"{\"id\":\"a\tb\"}", false},
		{`{id:1}`, false},
		{`{"id" 1}`, false},
		{`{"id":1,}`, false},
		{`{"id":1 "ts":2}`, false},
		{`{"id":tru}`, false},
		{`{"id":nul}`, false},
		{`{"id":truex}`, false},
		{`{"id":[1,}`, false},
		{`{"id":{"a":1}`, false},
		{`{"id":{"a":1]}`, false},
		{`{"id":"a}`, false},
		{`{"id":"a","ts":"\`, false},
		{`{,}`, false},
		{`{"id":1}{}`, false},
	} {
		if read := sameAsGjson(t, tc.v, []string{"id", "ts"}); read != tc.read {
			t.Errorf("%q: read %v, want %v (gjson.Valid: %v)", tc.v, read, tc.read, gjson.Valid(tc.v))
		}
		sameAsGjson(t, tc.v, fieldNames)
	}
	// The same field twice (the ID and the time) is read into both.
	if !sameAsGjson(t, `{"ts":1}`, []string{"ts", "ts"}) {
		t.Error("declined a field named twice")
	}
}

// Objects near valid ones, made by changing, adding or removing a few
// bytes of JSON's own alphabet: scanObject reads only those gjson finds
// valid, reads them as gjson does, and reads most of the valid ones.
func TestScanObjectOnNearObjects(t *testing.T) {
	seeds := []string{
		`{"click_id":"c-000000123456-9f3a2b1c","ts":1700000000123,"user":"u-0012345","ref":null,"ok":true}`,
		`{"id":-12.5e-3,"ts":"2024-01-02T03:04:05Z","tags":["a","b\"c"],"m":{"x":[1,{"y":false}]}}`,
		`{ "ts" : 0 , "id" : "\u00e9\n" , "e" : {} , "a" : [ ] }`,
	}
	const alphabet = `{}[]:,"\ 0123456789.-+eEtrufalsn/bu` + "\t\n\x01\xc3\xa9"
	rng := rand.New(rand.NewPCG(5, 6))
	valid, read := 0, 0
	for range 100_000 {
		b := []byte(seeds[rng.IntN(len(seeds))])
		for range 1 + rng.IntN(3) {
			i := rng.IntN(len(b))
			c := alphabet[rng.IntN(len(alphabet))]
			switch rng.IntN(3) {
			case 0:
				b[i] = c
			case 1:
				b = append(b[:i], append([]byte{c}, b[i:]...)...)
			default:
				b = append(b[:i], b[i+1:]...)
			}
			if len(b) == 0 {
				b = append(b, '{')
			}
		}
		v := string(b)
		if gjson.Valid(v) {
			valid++
		}
		if sameAsGjson(t, v, []string{"id", "ts"}) {
			read++
		}
	}
	t.Logf("%d near objects: %d valid, %d of them read in one pass", 100_000, valid, read)
	if valid < 1000 || read < valid/2 {
		t.Fatalf("%d valid, %d read: the test tests little", valid, read)
	}
}

// FuzzScanObject: on any input, scanObject reads only valid JSON, and
// reads it as gjson does; it never panics.
func FuzzScanObject(f *testing.F) {
	for _, s := range []string{`{"id":"c1","ts":1}`, `{"a*b":[1,{"id":"x"}],"id":"\u00e9"}`, `{"id":"a","id":"b"}`, `[]`, `{"k\"":1}`,
		`{"id":tru`, `{"id`, `{"id":-1.5e+3,"ts":"x\"y"}`, `{"a":{"b":[1,2,{"c":"}"}]},"id":null}`} {
		f.Add([]byte(s), "id", "ts")
	}
	f.Fuzz(func(t *testing.T, v []byte, a, b string) {
		if a == "" || b == "" {
			t.Skip("field names are never empty (ParsePath)")
		}
		sameAsGjson(t, string(v), []string{a, b})
	})
}

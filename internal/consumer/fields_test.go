package consumer

import (
	"testing"

	"github.com/tidwall/gjson"
)

// fieldNames are top-level field names the one-pass read is checked with:
// plain ones, ones gjson's paths escape, and ones that are also numbers.
// Names are never empty (ParsePath).
var fieldNames = []string{"id", "ts", "a*b", "a.b", "0", "é", "x y", "@this", "#", "k\""}

// sameAsGet fails t unless topLevel reads every name of names from v as
// gjson.Get reads it, or declines (false) for a reason it states.
func sameAsGet(t *testing.T, v string, names []string) bool {
	t.Helper()
	if !gjson.Valid(v) {
		return false
	}
	out := make([]gjson.Result, len(names))
	if !topLevel(v, names, out) {
		return false
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

func TestTopLevelReadsAsGjsonGet(t *testing.T) {
	for _, tc := range []struct {
		v string
		// declined: topLevel leaves the value to gjson.Get.
		declined bool
	}{
		{v: `{"id":"c1","ts":1700000000}`},
		{v: ` { "ts" : -1.5e3 , "id" : "x" } `},
		{v: "{\n\t\"id\":\r\n\"a\"}"},
		{v: `{"id":"first","id":"second","ts":1,"ts":2}`},
		{v: `{"a*b":"x","axb":"y","a.b":1,"0":[0],"é":"e","x y":true,"@this":null,"#":false,"":"empty"}`},
		{v: `{"n":{"id":"nested","ts":[1,{"id":2}]},"s":"{\"id\":3}","id":{"ts":"deep"},"ts":[]}`},
		{v: `{"id":"q\"u\\o\u00e9","ts":"2024-01-02T03:04:05Z"}`},
		{v: `{"arr":["]","}",{"x":"\"}"}],"id":"after brackets in strings"}`},
		{v: `{"id":0,"ts":-0}`},
		{v: `{}`},
		{v: `{"other":1}`},
		{v: `{"k\"":1,"id":2}`, declined: true}, // an escaped key
		{v: `{"id":1,"k\"":2,"ts":3}`, declined: true},
		{v: `[{"id":1}]`, declined: true}, // not an object
		{v: `"id"`, declined: true},
		{v: `12`, declined: true},
	} {
		if read := sameAsGet(t, tc.v, []string{"id", "ts"}); read == tc.declined {
			t.Errorf("%q: read %v, want declined %v", tc.v, read, tc.declined)
		}
		sameAsGet(t, tc.v, fieldNames)
	}
	// A found key ends the pass: the escaped key after it is not reached.
	if !sameAsGet(t, `{"id":1,"ts":2,"k\"":3}`, []string{"id", "ts"}) {
		t.Error("declined a value whose escaped key comes after the fields")
	}
	// The same field twice (the ID and the time) is read into both.
	if !sameAsGet(t, `{"ts":1}`, []string{"ts", "ts"}) {
		t.Error("declined a field named twice")
	}
}

// FuzzTopLevel: on any valid JSON, the one-pass read gives what gjson.Get
// gives, or declines; on any input, it does not panic.
func FuzzTopLevel(f *testing.F) {
	for _, s := range []string{`{"id":"c1","ts":1}`, `{"a*b":[1,{"id":"x"}],"id":"\u00e9"}`, `{"id":"a","id":"b"}`, `[]`, `{"k\"":1}`,
		`{"id":tru`, `{"id`} {
		f.Add([]byte(s), "id", "ts")
	}
	f.Fuzz(func(t *testing.T, v []byte, a, b string) {
		if a == "" || b == "" {
			t.Skip("field names are never empty (ParsePath)")
		}
		out := make([]gjson.Result, 2)
		topLevel(string(v), []string{a, b}, out) // any input: no panic
		sameAsGet(t, string(v), []string{a, b})
	})
}

package record

import (
	"testing"
)

func TestSourceRoundTrip(t *testing.T) {
	for _, s := range []Source{{"click-log", 0, 0}, {"a.b_c-d", 17, 1<<52 - 1}, {"t", 3, 42}} {
		v := AppendSource(nil, s.Topic, s.Partition, s.Offset)
		got, ok := ParseSource(v)
		if !ok || got != s {
			t.Errorf("%q: %+v %v, want %+v", v, got, ok, s)
		}
	}
	for _, bad := range []string{"", "t", "t/1", "/1/2", "t/x/2", "t/1/y", "t/-1/2", "t/1/-2"} {
		if s, ok := ParseSource([]byte(bad)); ok {
			t.Errorf("%q parsed as %+v", bad, s)
		}
	}
}

func TestReasonLabels(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Reasons() {
		l := r.String()
		if l == "" || seen[l] {
			t.Errorf("reason %d: label %q empty or repeated", r, l)
		}
		seen[l] = true
		if ParseReason(l) != r {
			t.Errorf("%q parses as %v, want %v", l, ParseReason(l), r)
		}
	}
	if ParseReason("no such reason") != Other || Reason(200).String() != "other" {
		t.Error("unknown reasons are not other")
	}
}

// The verdict labels are the header values, and read back.
func TestVerdictLabels(t *testing.T) {
	want := map[Verdict]string{First: "first", Duplicate: "duplicate"}
	if len(Verdicts()) != len(want) {
		t.Fatalf("%d verdicts, want %d", len(Verdicts()), len(want))
	}
	for _, v := range Verdicts() {
		if v.String() != want[v] || string(v.Value()) != want[v] {
			t.Errorf("verdict %d: label %q, value %q; want %q", v, v.String(), v.Value(), want[v])
		}
		if got, ok := ParseVerdict(v.Value()); !ok || got != v {
			t.Errorf("%q parses as %v, %v", v.Value(), got, ok)
		}
	}
	if _, ok := ParseVerdict([]byte("first_seen")); ok {
		t.Error("an unknown verdict parses")
	}
}

package event

import (
	"errors"
	"fmt"
	"regexp"
	"testing"
)

func TestSourceRoundTrip(t *testing.T) {
	for _, s := range []Source{{"click-log", 0, 0}, {"a.b_c-d", 17, 1<<52 - 1}, {"t", 3, 42}} {
		v := s.Append(nil)
		if s.String() != string(v) {
			t.Errorf("%+v: String %q, Append %q", s, s.String(), v)
		}
		got, ok := ParseSource(v)
		if !ok || got != s {
			t.Errorf("%q: %+v %v, want %+v", v, got, ok, s)
		}
		if p, ok := SourcePartition(v); !ok || p != int(s.Partition) {
			t.Errorf("%q: partition %d %v, want %d", v, p, ok, s.Partition)
		}
	}
	for _, bad := range []string{"", "t", "t/1", "/1/2", "t/x/2", "t/1/y", "t/-1/2", "t/1/-2", "t/2147483648/0"} {
		if s, ok := ParseSource([]byte(bad)); ok {
			t.Errorf("%q parsed as %+v", bad, s)
		}
		if p, ok := SourcePartition([]byte(bad)); ok {
			t.Errorf("%q: partition %d read from it", bad, p)
		}
	}
}

// labelPattern is a Prometheus label value as the house writes them:
// short snake_case.
var labelPattern = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

func TestReasonLabels(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Reasons() {
		l := r.String()
		if !labelPattern.MatchString(l) || seen[l] {
			t.Errorf("reason %d: label %q not snake_case, or repeated", r, l)
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

// An error says its reason however deeply it is wrapped; an error that
// carries none is Other.
func TestReasonOf(t *testing.T) {
	errNoKey := NoKey.Err("element ID is the message key, and the message has none")
	for _, tc := range []struct {
		err  error
		want Reason
	}{
		{errNoKey, NoKey},
		{fmt.Errorf("partition 3: %w", fmt.Errorf("offset 7: %w", errNoKey)), NoKey},
		{errors.Join(errors.New("first"), TooDeep.Err("deep")), TooDeep},
		{carrier{Refused}, Refused},
		{errors.New("no reason"), Other},
		{nil, Other},
	} {
		if got := ReasonOf(tc.err); got != tc.want {
			t.Errorf("ReasonOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if !errors.Is(fmt.Errorf("x: %w", errNoKey), errNoKey) || errors.Is(errNoKey, NoKey.Err(errNoKey.Error())) {
		t.Error("the errors of Reason.Err are not distinct sentinels")
	}
	if errNoKey.Error() != "element ID is the message key, and the message has none" {
		t.Errorf("text %q", errNoKey)
	}
}

// carrier is an error of another package that says its reason.
type carrier struct{ r Reason }

func (c carrier) Error() string            { return "refused" }
func (c carrier) DeadLetterReason() Reason { return c.r }

// The verdict labels are the header values, and read back.
func TestVerdictLabels(t *testing.T) {
	want := map[Verdict]string{First: "first", Duplicate: "duplicate"}
	if len(Verdicts()) != len(want) {
		t.Fatalf("%d verdicts, want %d", len(Verdicts()), len(want))
	}
	for _, v := range Verdicts() {
		if v.String() != want[v] || string(v.Value()) != want[v] || !labelPattern.MatchString(v.String()) {
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

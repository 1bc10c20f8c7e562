package bloom

import (
	"slices"
	"testing"
)

func TestVerdictsListsEveryNamedVerdict(t *testing.T) {
	vs := Verdicts()
	if !slices.Contains(vs, FirstSeen) || !slices.Contains(vs, Future) || !slices.Contains(vs, ReplayUnknown) {
		t.Fatalf("Verdicts() = %v, missing a named verdict", vs)
	}
	seen := map[string]bool{}
	for _, v := range vs {
		name := v.String()
		if name == Verdict(0).String() || seen[name] {
			t.Errorf("verdict %d is named %q: invalid or named twice", v, name)
		}
		seen[name] = true
	}
	if next := Verdict(len(vs) + 1); next.String() != Verdict(0).String() {
		t.Errorf("verdict %d is named %q but Verdicts() leaves it out", next, next)
	}
}

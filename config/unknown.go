package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/agnivade/levenshtein"
)

// Names are the variables the worker reads, sorted: DEDUPE_ and each
// field's envconfig name.
func Names() []string {
	typ := reflect.TypeFor[Config]()
	var names []string
	for i := range typ.NumField() {
		if tag := typ.Field(i).Tag.Get("envconfig"); tag != "" {
			names = append(names, Prefix+"_"+tag)
		}
	}
	slices.Sort(names)
	return names
}

// notSettings are DEDUPE_ variables that are not the worker's settings and
// may be in its environment: the tests' (DEDUPE_TEST_*) and the scripts'.
// DEDUPE_WINDOW_GRACE, a setting that was renamed, has a message of its
// own in Load.
var notSettings = []string{Prefix + "_TEST_", Prefix + "_DEBIAN_MIRROR", Prefix + "_WINDOW_GRACE"}

// CheckUnknown returns an error for the first variable of environ (as
// os.Environ gives it) that starts with DEDUPE_ and names no setting: a
// misspelt setting would otherwise leave its default in force without a
// word. The error names the variable and the known name nearest to it.
func CheckUnknown(environ []string) error {
	known := Names()
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, Prefix+"_") || slices.Contains(known, name) ||
			slices.ContainsFunc(notSettings, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		unknown = append(unknown, name)
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	name := unknown[0]
	nearest, best := "", -1
	for _, k := range known {
		if d := levenshtein.ComputeDistance(name, k); best < 0 || d < best {
			nearest, best = k, d
		}
	}
	more := ""
	if len(unknown) > 1 {
		more = fmt.Sprintf(" (and %d more: %s)", len(unknown)-1, strings.Join(unknown[1:], ", "))
	}
	// A guess that is further from the name than half its length is no
	// guess: the variable list is the better hint then.
	hint := fmt.Sprintf("did you mean %s?", nearest)
	if best > len(strings.TrimPrefix(name, Prefix+"_"))/2 {
		hint = "the variables are listed in docs/configuration.md"
	}
	return fmt.Errorf("%w: %s is not a setting%s; %s", ErrInvalid, name, more, hint)
}

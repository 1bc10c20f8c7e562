package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"dedupe-worker/config"
)

// root is the repository root, seen from this package's directory (go
// test runs a package's tests in its own directory).
const root = ".."

func repoPath(parts ...string) string {
	return filepath.Join(append([]string{root}, parts...)...)
}

func readRepoFile(t *testing.T, parts ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(repoPath(parts...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// configVar describes one DEDUPE_* variable of config.Config.
type configVar struct {
	Field    string
	Default  string
	Required bool
}

// knownVars are the variables config.Config reads, from its envconfig
// tags: DEDUPE_ and the tag. A field without a tag fails the test, since
// envconfig would then derive a name docs/configuration.md and these
// checks do not know.
func knownVars(t *testing.T) map[string]configVar {
	t.Helper()
	vars := map[string]configVar{}
	typ := reflect.TypeFor[config.Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("envconfig")
		if tag == "" {
			t.Fatalf("config.Config.%s has no envconfig tag", f.Name)
		}
		vars[config.Prefix+"_"+tag] = configVar{Field: f.Name, Default: f.Tag.Get("default"), Required: f.Tag.Get("required") == "true"}
	}
	if len(vars) < 10 {
		t.Fatalf("only %d variables found in config.Config", len(vars))
	}
	return vars
}

// checkKnownKeys reports every key of env that is not a DEDUPE_* variable
// config.Config reads.
func checkKnownKeys(t *testing.T, where string, env map[string]string) {
	t.Helper()
	known := knownVars(t)
	for _, k := range sortedKeys(env) {
		if _, ok := known[k]; !ok {
			t.Errorf("%s: %s is not a variable of config.Config (known: DEDUPE_ and the envconfig tags)", where, k)
		}
	}
}

// loadConfig runs config.Load with exactly env as the DEDUPE_* variables:
// every other DEDUPE_* variable of the test's environment is unset for the
// call and restored after the test.
func loadConfig(t *testing.T, env map[string]string) (config.Config, error) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, config.Prefix+"_") {
			t.Setenv(k, "") // restores the old value after the test
			os.Unsetenv(k)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	defer func() {
		for k := range env {
			os.Unsetenv(k)
		}
	}()
	return config.Load()
}

// parseEnvFile reads a docker/compose env file: KEY=VALUE lines, # comments
// and blank lines. Quotes are not special (compose keeps them too in the
// forms this repository uses), so none are allowed.
func parseEnvFile(data []byte) (map[string]string, error) {
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, fmt.Errorf("line %d: want KEY=VALUE, got %q", n, line)
		}
		if strings.ContainsAny(v, `"'`) {
			return nil, fmt.Errorf("line %d: %s: quotes are kept literally by env files", n, k)
		}
		if _, dup := env[k]; dup {
			return nil, fmt.Errorf("line %d: %s set twice", n, k)
		}
		env[k] = v
	}
	return env, sc.Err()
}

// yamlDocs splits a YAML stream on its "---" lines and drops documents
// that hold only comments and blank lines.
func yamlDocs(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		content := false
		for _, l := range strings.Split(cur.String(), "\n") {
			if s := strings.TrimSpace(l); s != "" && !strings.HasPrefix(s, "#") {
				content = true
				break
			}
		}
		if content {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	for _, l := range strings.SplitAfter(string(data), "\n") {
		if strings.TrimRight(l, " \t\r\n") == "---" {
			flush()
			continue
		}
		cur.WriteString(l)
	}
	flush()
	return docs
}

// decodeStrict decodes one YAML document into v and fails on a duplicate
// key, on a field v's type does not have and on a field whose case differs
// from its JSON name (encoding/json alone matches names case-insensitively
// and drops unknown ones, so a typo would pass unnoticed).
func decodeStrict(doc []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("%s", strings.Join(msgs, "; "))
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

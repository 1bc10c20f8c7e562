package config

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
)

// setEnvFile sets every VAR=value line of path for the test.
func setEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: bad line %q", path, line)
		}
		vars[k] = v
		t.Setenv(k, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(vars) == 0 {
		t.Fatalf("%s: no VAR=value line", path)
	}
	return vars
}

// setValidEnvFile is setEnvFile of a file that loads as it is, so an
// error after one change is that change's.
func setValidEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	vars := setEnvFile(t, path)
	if _, err := Load(); err != nil {
		t.Fatalf("%s as it is: %v", path, err)
	}
	return vars
}

func TestExampleFilesLoad(t *testing.T) {
	for _, tc := range []struct {
		file string
		want func(Config) bool
	}{
		{"clicks.env", func(c Config) bool {
			return c.Window == 10*time.Minute && c.WindowMode == "rolling" && c.IDField == "click_id" && c.GroupID == "dedupe-clicks"
		}},
		{"conversions.env", func(c Config) bool {
			return c.Window == 24*time.Hour && c.WindowMode == "fixed" && c.IDFrom == "key" && c.IDField == "" && c.TimeField == ""
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			setEnvFile(t, tc.file)
			c, err := Load()
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(c) {
				t.Errorf("loaded %+v", c)
			}
		})
	}
}

// Every bad value stops the start with one line naming its variable.
func TestBadValuesNameTheVariable(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"DEDUPE_PIPELINE", ""},
		{"DEDUPE_PIPELINE", "has space"},
		{"DEDUPE_KAFKA_BROKERS", ""},
		{"DEDUPE_INPUT_TOPIC", "bad/topic"},
		{"DEDUPE_OUTPUT_TOPIC", "click-log"},
		{"DEDUPE_REDIS_ADDRS", ""},
		{"DEDUPE_ID_FIELD", ""},
		{"DEDUPE_ID_FIELD", "meta..id"},
		{"DEDUPE_ID_FIELD", "header:"},
		{"DEDUPE_ID_FIELD", "a, "},
		{"DEDUPE_ID_FROM", "Key"},
		{"DEDUPE_MODE", "dry-run"},
		{"DEDUPE_TIME_HEADER", " ts"},
		{"DEDUPE_TIME_FIELD", "a."},
		{"DEDUPE_WINDOW", "ten minutes"},
		{"DEDUPE_WINDOW", "1500ms"},
		{"DEDUPE_WINDOW_MODE", "sliding"},
		{"DEDUPE_EXPECTED_PER_WINDOW", "0"},
		{"DEDUPE_EXPECTED_PER_WINDOW", "many"},
		{"DEDUPE_FALSE_POSITIVE_RATE", "1"},
		{"DEDUPE_FALSE_POSITIVE_RATE", "0"},
		{"DEDUPE_BATCH_SIZE", "0"},
		{"DEDUPE_BATCH_LINGER", "0s"},
		{"DEDUPE_LOG_LEVEL", "loud"},
		{"DEDUPE_SHARDS", "-2"},
		{"DEDUPE_MAX_GROWTH", "0.5"},
		{"DEDUPE_MAX_GROWTH", "huge"},
		{"DEDUPE_MEMORY_FACTOR", "0.9"},
		{"DEDUPE_LAYOUT", "4x"},
		{"DEDUPE_LAYOUT", "9x4"},
		{"DEDUPE_MAX_LAG", "-1h"},
		{"DEDUPE_MAX_LAG", "1500ms"},
		{"DEDUPE_MAX_LAG", "745h"},
		{"DEDUPE_LATE_POLICY", "drop"},
		{"DEDUPE_START_OFFSET", "yesterday"},
		{"DEDUPE_START_OFFSET", "-1h"},
		{"DEDUPE_WINDOW_GRACE", "1m"},
		{"DEDUPE_DUPLICATES_TOPIC", "bad/topic"},
		{"DEDUPE_DUPLICATES_TOPIC", "click-log-dlq"},
		{"DEDUPE_FAIL_OPEN_AFTER", "500ms"},
		{"DEDUPE_FAIL_OPEN_AFTER", "-1s"},
		{"DEDUPE_HANDOFF_WAIT", "-1s"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			setValidEnvFile(t, "clicks.env")
			t.Setenv(tc.name, tc.value)
			_, err := Load()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.name) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%s=%q: %v; want one line naming %s", tc.name, tc.value, err, tc.name)
			}
		})
	}
}

// The lag bound takes up to 744h (a week is the case operators ask for);
// the start offset takes its four forms.
func TestLagAndStartValues(t *testing.T) {
	setValidEnvFile(t, "clicks.env")
	t.Setenv("DEDUPE_MAX_LAG", "168h")
	t.Setenv("DEDUPE_LATE_POLICY", "dead-letter")
	t.Setenv("DEDUPE_START_OFFSET", "latest")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxLag != 7*24*time.Hour || c.LatePolicy != LateDeadLetter {
		t.Errorf("max lag %v, late policy %q", c.MaxLag, c.LatePolicy)
	}
	now := time.Now()
	at := now.Add(-3 * time.Hour).UTC().Truncate(time.Second)
	for _, tc := range []struct {
		in     string
		latest bool
		want   time.Time
	}{
		{"earliest", false, time.Time{}}, {"latest", true, time.Time{}},
		{at.Format(time.RFC3339), false, at}, {"90m", false, now.Add(-90 * time.Minute)},
	} {
		s, err := ParseStartOffset(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if s.Latest != tc.latest || !s.Time(now).Equal(tc.want) {
			t.Errorf("%s: latest %v, time %v; want %v, %v", tc.in, s.Latest, s.Time(now), tc.latest, tc.want)
		}
	}
}

func TestRequiredVariables(t *testing.T) {
	for _, name := range []string{"DEDUPE_PIPELINE", "DEDUPE_KAFKA_BROKERS", "DEDUPE_INPUT_TOPIC", "DEDUPE_OUTPUT_TOPIC", "DEDUPE_DLQ_TOPIC", "DEDUPE_REDIS_ADDRS", "DEDUPE_ID_FIELD"} {
		t.Run(name, func(t *testing.T) {
			// Unsetting what the file does not set would test nothing.
			if _, ok := setValidEnvFile(t, "clicks.env")[name]; !ok {
				t.Fatalf("clicks.env does not set %s", name)
			}
			os.Unsetenv(name)
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("without %s: %v", name, err)
			}
		})
	}
}

func TestParseIDSource(t *testing.T) {
	for _, tc := range []struct {
		from, field, header string
		want                consumer.IDSource
		says                string
	}{
		{"json", "click_id", "", consumer.IDSource{Kind: consumer.JSONID, Paths: [][]string{{"click_id"}}}, "JSON field click_id"},
		{"", "meta.id", "", consumer.IDSource{Kind: consumer.JSONID, Paths: [][]string{{"meta", "id"}}}, "JSON field meta.id"},
		{"json", "tenant_id, meta.click_id", "", consumer.IDSource{Kind: consumer.JSONID, Paths: [][]string{{"tenant_id"}, {"meta", "click_id"}}},
			"composite of JSON fields tenant_id, meta.click_id"},
		{"key", "", "", consumer.IDSource{Kind: consumer.KeyID}, "the message key"},
		{"header", "", "x-id", consumer.IDSource{Kind: consumer.HeaderID, Header: "x-id"}, `header "x-id"`},
		{"value", "", "", consumer.IDSource{Kind: consumer.ValueID}, "a 128-bit hash of the value"},
		// The forms DEDUPE_ID_FIELD had before DEDUPE_ID_FROM.
		{"json", "key", "", consumer.IDSource{Kind: consumer.KeyID}, "the message key"},
		{"", "header:x-id", "", consumer.IDSource{Kind: consumer.HeaderID, Header: "x-id"}, `header "x-id"`},
	} {
		got, err := ParseIDSource(tc.from, tc.field, tc.header)
		if err != nil || !reflect.DeepEqual(got, tc.want) || got.String() != tc.says {
			t.Errorf("ParseIDSource(%q, %q, %q) = %+v (%s), %v; want %+v (%s)", tc.from, tc.field, tc.header, got, got, err, tc.want, tc.says)
		}
		if got.Composite() != (len(tc.want.Paths) > 1) {
			t.Errorf("%q: composite %v", tc.field, got.Composite())
		}
	}
}

// Each source with a variable it does not read, or without one it needs,
// is refused naming that variable.
func TestIDSourceConflicts(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		name string
	}{
		{map[string]string{"DEDUPE_ID_FROM": "bytes"}, "DEDUPE_ID_FROM"},
		{map[string]string{"DEDUPE_ID_FROM": "key"}, "DEDUPE_ID_FIELD"}, // clicks.env sets click_id
		{map[string]string{"DEDUPE_ID_FROM": "value"}, "DEDUPE_ID_FIELD"},
		{map[string]string{"DEDUPE_ID_FROM": "header", "DEDUPE_ID_FIELD": "", "DEDUPE_TIME_FIELD": ""}, "DEDUPE_ID_HEADER"},
		{map[string]string{"DEDUPE_ID_HEADER": "x-id"}, "DEDUPE_ID_HEADER"},
		{map[string]string{"DEDUPE_ID_FROM": "key", "DEDUPE_ID_FIELD": ""}, "DEDUPE_TIME_FIELD"}, // the value is not parsed
		{map[string]string{"DEDUPE_TIME_HEADER": "ts"}, "DEDUPE_TIME_FIELD"},
		{map[string]string{"DEDUPE_ID_FIELD": "a,b,a"}, "DEDUPE_ID_FIELD"},
		{map[string]string{"DEDUPE_ID_FIELD": "a,,b"}, "DEDUPE_ID_FIELD"},
		{map[string]string{"DEDUPE_ID_FIELD": "a,b,c,d,e,f,g,h,i"}, "DEDUPE_ID_FIELD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setValidEnvFile(t, "clicks.env")
			for k, v := range tc.vars {
				t.Setenv(k, v)
			}
			_, err := Load()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.name) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%v: %v; want one line naming %s", tc.vars, err, tc.name)
			}
		})
	}
	// And the combinations that are right load.
	for _, vars := range []map[string]string{
		{"DEDUPE_ID_FROM": "key", "DEDUPE_ID_FIELD": "", "DEDUPE_TIME_FIELD": ""},
		{"DEDUPE_ID_FROM": "value", "DEDUPE_ID_FIELD": "", "DEDUPE_TIME_FIELD": "", "DEDUPE_TIME_HEADER": "event-time"},
		{"DEDUPE_ID_FROM": "header", "DEDUPE_ID_HEADER": "x-id", "DEDUPE_ID_FIELD": "", "DEDUPE_TIME_FIELD": "", "DEDUPE_MODE": "shadow"},
		{"DEDUPE_ID_FIELD": "tenant_id,meta.click_id"},
	} {
		t.Run(fmt.Sprint(vars), func(t *testing.T) {
			setValidEnvFile(t, "clicks.env")
			for k, v := range vars {
				t.Setenv(k, v)
			}
			if _, err := Load(); err != nil {
				t.Errorf("%v: %v", vars, err)
			}
		})
	}
}

// The configuration reference (docs/configuration.md) lists every
// variable with the default of the struct; a field added or a default
// changed without the reference fails here.
func TestConfigurationTableMatchesStruct(t *testing.T) {
	const page = "docs/configuration.md"
	table, err := os.ReadFile("../" + page)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // variable -> default cell
	for _, line := range strings.Split(string(table), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`DEDUPE_") {
			continue
		}
		rows[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.TrimSpace(cells[2])
	}
	if len(rows) == 0 {
		t.Fatal(page + ": no configuration table row (| `DEDUPE_...` | default | ...) found")
	}
	typ := reflect.TypeOf(Config{})
	d := Defaults()
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name := Prefix + "_" + f.Tag.Get("envconfig")
		cell, ok := rows[name]
		if !ok {
			t.Errorf("%s has no row for %s", page, name)
			continue
		}
		delete(rows, name)
		switch {
		case f.Tag.Get("required") == "true":
			if cell != "required" {
				t.Errorf("%s is required; %s says %q", name, page, cell)
			}
		case f.Tag.Get("default") != "":
			if want := "`" + f.Tag.Get("default") + "`"; cell != want {
				t.Errorf("%s defaults to %s; %s says %q", name, want, page, cell)
			}
		case libraryOwned[f.Name]:
			if want := "`" + defaultText(reflect.ValueOf(d).Field(i)) + "`"; cell != want {
				t.Errorf("%s defaults to the library's %s; %s says %q", name, want, page, cell)
			}
		case cell == "":
			t.Errorf("%s: %s gives no default", name, page)
		}
	}
	for name := range rows {
		t.Errorf("%s lists %s, which the configuration does not have", page, name)
	}
}

// libraryOwned are the fields whose default a library owns: they have no
// default tag, and Defaults takes the library's constant.
var libraryOwned = map[string]bool{"BatchSize": true, "BatchLinger": true, "KafkaTimeout": true, "KafkaSessionTimeout": true, "RedisTimeout": true,
	"MemoryFactor": true}

// defaultText is a default as the configuration reference and the
// variables write it.
func defaultText(v reflect.Value) string {
	if d, ok := v.Interface().(time.Duration); ok {
		return shortDuration(d)
	}
	return fmt.Sprint(v.Interface())
}

// The settings a library owns take its defaults, written once there;
// envconfig leaves a field with neither a variable nor a default tag as it
// was, so Load keeps them unless a variable is set.
func TestLibraryDefaults(t *testing.T) {
	d := Defaults()
	if d.BatchSize != consumer.DefaultBatchSize || d.BatchLinger != consumer.DefaultBatchLinger ||
		d.KafkaTimeout != consumer.DefaultKafkaTimeout || d.KafkaSessionTimeout != consumer.DefaultSessionTimeout ||
		d.RedisTimeout != bloom.DefaultCallTimeout || d.MemoryFactor != bloom.DefaultMemoryFactor {
		t.Errorf("Defaults: batch %d, linger %v, Kafka timeout %v, session %v, Redis timeout %v; want the libraries'", d.BatchSize, d.BatchLinger,
			d.KafkaTimeout, d.KafkaSessionTimeout, d.RedisTimeout)
	}
	typ := reflect.TypeOf(Config{})
	for name := range libraryOwned {
		f, ok := typ.FieldByName(name)
		if !ok {
			t.Fatalf("Config has no field %s", name)
		}
		if _, tagged := f.Tag.Lookup("default"); tagged {
			t.Errorf("%s has a default tag; its library owns its default", name)
		}
	}

	// envconfig itself: a field without variable and tag keeps its value,
	// a variable replaces it.
	var x struct {
		Kept    int           `envconfig:"KEPT"`
		Set     time.Duration `envconfig:"SET"`
		Tagged  string        `envconfig:"TAGGED" default:"tag"`
		Emptied string        `envconfig:"EMPTIED"`
	}
	x.Kept, x.Set, x.Tagged, x.Emptied = 7, time.Second, "before", "before"
	t.Setenv("DEDUPETEST_SET", "3s")
	t.Setenv("DEDUPETEST_EMPTIED", "")
	if err := envconfig.Process("DEDUPETEST", &x); err != nil {
		t.Fatal(err)
	}
	if x.Kept != 7 || x.Set != 3*time.Second || x.Tagged != "tag" || x.Emptied != "" {
		t.Fatalf("envconfig gave %+v; want 7 kept, 3s set, the tag, and empty from the variable", x)
	}

	// And through Load: unset, the worker's default; set, the variable.
	setValidEnvFile(t, "clicks.env")
	os.Unsetenv(Prefix + "_BATCH_SIZE")
	t.Setenv(Prefix+"_BATCH_LINGER", "250ms")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.BatchSize != consumer.DefaultBatchSize || c.BatchLinger != 250*time.Millisecond {
		t.Errorf("Load: batch size %d, linger %v; want %d and 250ms", c.BatchSize, c.BatchLinger, consumer.DefaultBatchSize)
	}
}

// A library's limits are the variable's: its bounds load, one past them
// is refused, naming the variable and the bounds as the library has them.
func TestLibraryLimits(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ok, bad   string
		saysRange string
	}{
		{"BATCH_SIZE", fmt.Sprint(consumer.MaxBatchSize), fmt.Sprint(consumer.MaxBatchSize + 1), fmt.Sprintf("want 1 to %d", consumer.MaxBatchSize)},
		{"BATCH_LINGER", consumer.MaxBatchLinger.String(), (consumer.MaxBatchLinger + time.Millisecond).String(), "want 1ms to 1m"},
		{"KAFKA_TIMEOUT", consumer.MinKafkaTimeout.String(), (consumer.MinKafkaTimeout - time.Millisecond).String(), "want 100ms to 5m"},
		{"KAFKA_SESSION_TIMEOUT", consumer.MaxSessionTimeout.String(), (consumer.MaxSessionTimeout + time.Second).String(), "want 500ms to 5m"},
		{"WINDOW", bloom.MaxWindowLength.String(), (bloom.MaxWindowLength + time.Second).String(), "from 1s to 744h"},
		{"MAX_LAG", bloom.MaxLagBound.String(), (bloom.MaxLagBound + time.Second).String(), "from 0 to 744h"},
		{"EXPECTED_PER_WINDOW", fmt.Sprint(int64(bloom.MaxElements)), fmt.Sprint(int64(bloom.MaxElements) + 1), "want 1 to 1e+12"},
		{"FALSE_POSITIVE_RATE", fmt.Sprint(bloom.MinFPR), fmt.Sprint(bloom.MinFPR * 0.9), "at least 1e-12"},
		{"MAX_GROWTH", fmt.Sprint(bloom.MaxGrowthFactor), fmt.Sprint(bloom.MaxGrowthFactor + 1), fmt.Sprintf("to %d", bloom.MaxGrowthFactor)},
		{"MEMORY_FACTOR", fmt.Sprint(bloom.MaxMemoryFactor), fmt.Sprint(bloom.MaxMemoryFactor + 0.5), fmt.Sprintf("to %d", bloom.MaxMemoryFactor)},
		{"SHARDS", fmt.Sprint(bloom.MaxShards), fmt.Sprint(bloom.MaxShards + 1), fmt.Sprintf("want 1 to %d", bloom.MaxShards)},
		{"HANDOFF_WAIT", consumer.MaxHandoffWait.String(), (consumer.MaxHandoffWait + time.Second).String(), "want 0 (no wait) to 1m"},
		{"FAIL_OPEN_AFTER", consumer.MaxFailOpenAfter.String(), (consumer.MaxFailOpenAfter + time.Second).String(), "want 0 (off) or 1s to 24h"},
		{"SHUTDOWN_TIMEOUT", consumer.MaxShutdownTimeout.String(), (consumer.MaxShutdownTimeout + time.Second).String(), "want 1s to 10m"},
		{"REDIS_TIMEOUT", bloom.MinCallTimeout.String(), (bloom.MinCallTimeout - time.Millisecond).String(), "want 10ms to 5m"},
		{"REDIS_MIN_REPLICAS", fmt.Sprint(bloom.MaxMinReplicas), fmt.Sprint(bloom.MaxMinReplicas + 1), "want 0 (no WAIT) to 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setValidEnvFile(t, "clicks.env")
			t.Setenv(Prefix+"_"+tc.name, tc.ok)
			if _, err := Load(); err != nil {
				t.Fatalf("%s=%s: %v", tc.name, tc.ok, err)
			}
			t.Setenv(Prefix+"_"+tc.name, tc.bad)
			_, err := Load()
			if ve, ok := errors.AsType[*VarError](err); !ok || ve.Var != tc.name || !strings.Contains(ve.Msg, tc.saysRange) {
				t.Fatalf("%s=%s: %v; want %s_%s: ...: %s", tc.name, tc.bad, err, Prefix, tc.name, tc.saysRange)
			}
		})
	}
}

// Each wrong ID input is named by its variable, and says what to set,
// from what the worker's ParseIDSource reports.
func TestIDSourceMessages(t *testing.T) {
	for _, tc := range []struct {
		from, field, header string
		want                string
	}{
		{"Key", "", "", `DEDUPE_ID_FROM: "Key": want json, key, header or value`},
		{"key", "click_id", "", "DEDUPE_ID_FIELD: set, but DEDUPE_ID_FROM=key does not read JSON fields; unset it or set DEDUPE_ID_FROM=json"},
		{"json", "click_id", "x-id", "DEDUPE_ID_HEADER: set, but DEDUPE_ID_FROM=json does not read a header; unset it or set DEDUPE_ID_FROM=header"},
		{"json", "", "", "DEDUPE_ID_FIELD: required with DEDUPE_ID_FROM=json: a JSON field path such as click_id or meta.id, or several separated by commas"},
		{"header", "", "", "DEDUPE_ID_HEADER: empty; want a header name (required with DEDUPE_ID_FROM=header)"},
		{"json", "header:", "", "DEDUPE_ID_FIELD: header:NAME: empty; want a header name"},
		{"json", "a,b,a", "", `DEDUPE_ID_FIELD: "a" is listed twice`},
		{"json", "meta..id", "", `DEDUPE_ID_FIELD: "meta..id" has an empty path element`},
	} {
		_, err := ParseIDSource(tc.from, tc.field, tc.header)
		if want := ErrInvalid.Error() + ": " + tc.want; err == nil || err.Error() != want {
			t.Errorf("ParseIDSource(%q, %q, %q): %v\nwant %s", tc.from, tc.field, tc.header, err, want)
		}
	}
}

// Defaults are what Load gives for every variable not set: the same
// values, read from the same tags and the same library constants.
func TestDefaultsAreLoadsDefaults(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, Prefix+"_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	required := map[string]string{"PIPELINE": "p", "KAFKA_BROKERS": "k:9092", "INPUT_TOPIC": "in", "OUTPUT_TOPIC": "out",
		"DLQ_TOPIC": "dlq", "REDIS_ADDRS": "r:6379", "ID_FIELD": "id"}
	for k, v := range required {
		t.Setenv(Prefix+"_"+k, v)
	}
	loaded, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	d := Defaults()
	d.Pipeline, d.KafkaBrokers, d.InputTopic, d.OutputTopic, d.DLQTopic = "p", []string{"k:9092"}, "in", "out", "dlq"
	d.RedisAddrs, d.IDField, d.GroupID = []string{"r:6379"}, "id", "dedupe-p"
	if !reflect.DeepEqual(d, loaded) {
		t.Errorf("Defaults with the required fields set:\n%+v\nLoad:\n%+v", d, loaded)
	}
	// Every default tag was read: a field with a tag is not at its zero
	// value unless the tag says so.
	typ := reflect.TypeOf(Config{})
	v := reflect.ValueOf(Defaults())
	n := 0
	for i := range typ.NumField() {
		def, ok := typ.Field(i).Tag.Lookup("default")
		if !ok {
			continue
		}
		n++
		if v.Field(i).IsZero() && def != "0" && def != "false" {
			t.Errorf("%s: zero, tag default %q", typ.Field(i).Name, def)
		}
	}
	if n < 15 {
		t.Fatalf("%d fields with a default tag; the struct has more", n)
	}
}

// A DEDUPE_ variable that names no setting stops Load with one line that
// names it and the nearest setting; the tests' and the scripts' own
// variables pass, and a name far from every setting gets the list instead
// of a guess.
func TestUnknownVariable(t *testing.T) {
	for _, tc := range []struct {
		name, want string
	}{
		{"DEDUPE_WINDOWZ", "DEDUPE_WINDOWZ is not a setting; did you mean DEDUPE_WINDOW?"},
		{"DEDUPE_REDIS_ADDR", "did you mean DEDUPE_REDIS_ADDRS?"},
		{"DEDUPE_BATCHSIZE", "did you mean DEDUPE_BATCH_SIZE?"},
		{"DEDUPE_XYZZY_PLUGH_FROB", "not a setting; the variables are listed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setValidEnvFile(t, "clicks.env")
			t.Setenv(tc.name, "24h")
			_, err := Load()
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Load with %s set: %v; want one line with %q", tc.name, err, tc.want)
			}
		})
	}
	t.Run("several", func(t *testing.T) {
		setValidEnvFile(t, "clicks.env")
		t.Setenv("DEDUPE_WINDOWZ", "24h")
		t.Setenv("DEDUPE_MAXLAG", "2h")
		if _, err := Load(); err == nil || !strings.Contains(err.Error(), "DEDUPE_MAXLAG is not a setting (and 1 more: DEDUPE_WINDOWZ)") {
			t.Errorf("Load with two unknown variables: %v", err)
		}
	})
	t.Run("not settings", func(t *testing.T) {
		setValidEnvFile(t, "clicks.env")
		t.Setenv("DEDUPE_TEST_FILTER", "bloom")
		t.Setenv("DEDUPE_DEBIAN_MIRROR", "x")
		if _, err := Load(); err != nil {
			t.Errorf("Load with the tests' and the scripts' variables set: %v", err)
		}
	})
	// Every name Names gives is one Load reads: none is refused.
	for _, n := range Names() {
		if err := CheckUnknown([]string{n + "=x"}); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// shortDuration is d as the variables write it: 1m rather than 1m0s, 1h
// rather than 1h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

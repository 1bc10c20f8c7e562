package config

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"dedupe-worker/internal/bloom"
)

// The settings written as words load as the values the libraries take:
// the window as the engine's, the modes as the worker's.
func TestModesAreTyped(t *testing.T) {
	setValidEnvFile(t, "conversions.env")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	win, err := c.FilterWindow()
	if want := (bloom.Window{Length: 24 * time.Hour, Mode: bloom.Fixed, MaxLag: 6 * time.Hour}); err != nil || win != want {
		t.Errorf("FilterWindow: %+v, %v; want %+v", win, err, want)
	}
	if m, err := c.Modes(); err != nil || m != (Modes{}) {
		t.Errorf("Modes at their defaults: %+v, %v; want drop, forward, earliest", m, err)
	}
	t.Setenv(Prefix+"_MODE", ModeShadow)
	t.Setenv(Prefix+"_LATE_POLICY", LateDeadLetter)
	t.Setenv(Prefix+"_START_OFFSET", "latest")
	if c, err = Load(); err != nil {
		t.Fatal(err)
	}
	if m, err := c.Modes(); err != nil || m != (Modes{Shadow: true, DeadLetterLate: true, Start: StartOffset{Latest: true}}) {
		t.Errorf("Modes: %+v, %v; want shadow, dead-letter, latest", m, err)
	}
	start := StartOffset{Back: time.Hour}.ConsumerStart(time.Unix(7200, 0))
	if start.Latest || !start.At.Equal(time.Unix(3600, 0)) {
		t.Errorf("1h back from 02:00: %+v", start)
	}
}

// A Config built by hand, not loaded, is read the same way: a word out of
// range is an error naming its variable, never a default in silence.
func TestModesOfAConfigNotLoaded(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		read func(Config) error
	}{
		{"MODE", func(c *Config) { c.Mode = "dry-run" }, func(c Config) error { _, err := c.Modes(); return err }},
		{"LATE_POLICY", func(c *Config) { c.LatePolicy = "drop" }, func(c Config) error { _, err := c.Modes(); return err }},
		{"START_OFFSET", func(c *Config) { c.StartOffset = "-1h" }, func(c Config) error { _, err := c.Modes(); return err }},
		{"WINDOW_MODE", func(c *Config) { c.WindowMode = "sliding" }, func(c Config) error { _, err := c.FilterWindow(); return err }},
		{"WINDOW", func(c *Config) { c.Window = 1500 * time.Millisecond }, func(c Config) error { _, err := c.FilterWindow(); return err }},
		{"MAX_LAG", func(c *Config) { c.MaxLag = bloom.MaxLagBound + time.Second }, func(c Config) error { _, err := c.FilterWindow(); return err }},
	} {
		c := Defaults()
		tc.set(&c)
		if ve, ok := errors.AsType[*VarError](tc.read(c)); !ok || ve.Var != tc.name {
			t.Errorf("%s out of range: %v; want a *VarError naming it", tc.name, tc.read(c))
		}
	}
}

// The event time is checked by the worker's extractor; the variable named
// is the one at fault.
func TestExtractorNamesTheTimeVariable(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		name string
	}{
		{map[string]string{"DEDUPE_TIME_FIELD": "", "DEDUPE_TIME_HEADER": " ts"}, "TIME_HEADER"},
		{map[string]string{"DEDUPE_TIME_HEADER": " ts"}, "TIME_HEADER"},
		{map[string]string{"DEDUPE_TIME_FIELD": "a."}, "TIME_FIELD"},
		{map[string]string{"DEDUPE_TIME_HEADER": "ts"}, "TIME_FIELD"},
		{map[string]string{"DEDUPE_ID_FROM": "value", "DEDUPE_ID_FIELD": ""}, "TIME_FIELD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setValidEnvFile(t, "clicks.env")
			for k, v := range tc.vars {
				t.Setenv(k, v)
			}
			_, err := Load()
			if ve, ok := errors.AsType[*VarError](err); !ok || ve.Var != tc.name || strings.Contains(err.Error(), "\n") {
				t.Errorf("%v: %v; want one line naming %s_%s", tc.vars, err, Prefix, tc.name)
			}
		})
	}
	setValidEnvFile(t, "clicks.env")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if ex, err := c.Extractor(); ex == nil || err != nil {
		t.Errorf("Extractor of clicks.env: %v, %v", ex, err)
	}
}

// clearEnv unsets every DEDUPE_ variable for the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, Prefix+"_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"dedupe-worker/internal/bloom"
)

// LoadSizing reads the variables as Load does, with none required, and
// refuses a sizing setting out of range naming it; a setting the sizing
// does not read is not its to refuse.
func TestLoadSizing(t *testing.T) {
	clearEnv(t)
	t.Setenv(Prefix+"_WINDOW", "24h")
	t.Setenv(Prefix+"_BATCH_SIZE", "0")
	c, err := LoadSizing()
	if err != nil {
		t.Fatal(err)
	}
	if c.Window != 24*time.Hour || c.Pipeline != "" || c.ExpectedPerWindow != Defaults().ExpectedPerWindow {
		t.Errorf("LoadSizing: window %v, pipeline %q, expected %d", c.Window, c.Pipeline, c.ExpectedPerWindow)
	}
	for _, tc := range []struct{ name, value string }{
		{"WINDOW", "1500ms"}, {"WINDOW", "soon"}, {"WINDOW_MODE", "sliding"}, {"MAX_LAG", "-1h"}, {"SHARDS", "0"},
		{"EXPECTED_PER_WINDOW", "many"}, {"FALSE_POSITIVE_RATE", "1"}, {"MAX_GROWTH", "0.5"}, {"MEMORY_FACTOR", "9"},
		{"LAYOUT", "4x"}, {"FILTER", "cuckoo"}, {"REDIS_TIMEOUT", "1ms"}, {"WINDOW_GRACE", "1m"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(Prefix+"_"+tc.name, tc.value)
			_, err := LoadSizing()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), Prefix+"_"+tc.name+":") || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s=%q: %v; want one line naming it", tc.name, tc.value, err)
			}
		})
	}
	clearEnv(t)
	t.Setenv(Prefix+"_WINDOWZ", "24h")
	if _, err := LoadSizing(); err == nil || !strings.Contains(err.Error(), "did you mean DEDUPE_WINDOW?") {
		t.Errorf("LoadSizing with DEDUPE_WINDOWZ: %v", err)
	}
}

// The sizing counts the windows the lag bound keeps live, as the engine
// does, and a growing window's stages, memory and Redis work per load.
func TestSizing(t *testing.T) {
	c := Defaults()
	c.ExpectedPerWindow = 7_000_000
	for _, tc := range []struct {
		window, lag time.Duration
		mode        string
		live        int
	}{
		{10 * time.Minute, time.Hour, "rolling", 9}, {10 * time.Minute, 6 * time.Hour, "rolling", 39}, {24 * time.Hour, time.Hour, "fixed", 2},
	} {
		c.Window, c.MaxLag, c.WindowMode = tc.window, tc.lag, tc.mode
		s, err := c.Sizing()
		if err != nil {
			t.Fatal(err)
		}
		if s.Live != tc.live || s.LiveMemory() != s.Plan.Memory*uint64(tc.live) {
			t.Errorf("%s windows of %v, lag bound %v: %d live, %d bytes; want %d", tc.mode, tc.window, tc.lag, s.Live, s.LiveMemory(), tc.live)
		}
	}
	c.Window, c.MaxLag, c.WindowMode = 10*time.Minute, time.Hour, "rolling"
	s, err := c.Sizing()
	if err != nil {
		t.Fatal(err)
	}
	if !s.Plan.Growth() || s.GrowsTo() < 1 || s.GrowsTo() > c.MaxGrowth {
		t.Fatalf("default growth: stages %d, grows to %gx", len(s.Plan.Stages), s.GrowsTo())
	}
	one, most := s.Grown(1), s.Grown(64)
	if one.Stages != 1 || one.IDs != c.ExpectedPerWindow || one.Memory != s.Plan.Stages[0].Memory || one.LiveMemory != one.Memory*uint64(s.Live) {
		t.Errorf("at 1x: %+v", one)
	}
	if most.Stages <= one.Stages || most.Memory <= one.Memory || most.FPR < one.FPR {
		t.Errorf("at 64x: %+v; at 1x: %+v", most, one)
	}
	// Rolling: the newest stage read and written, each older stage and the
	// bucket before's tested by a word.
	if w := s.Plan.Layout.Words; one.Ops != 2*w+one.Stages-1+one.Stages {
		t.Errorf("at 1x, %d words: %d Redis operations per new ID", w, one.Ops)
	}
	if s.Shape() != s.Plan.Layout.String() {
		t.Errorf("shape %q, layout %v", s.Shape(), s.Plan.Layout)
	}
	c.Filter = bloom.KindFingerprint.String()
	if s, err := c.Sizing(); err != nil || !strings.HasPrefix(s.Shape(), "fp") || s.Grown(1).Ops != 1+1+1 {
		t.Errorf("fingerprint: shape %q, %d operations at 1x, %v", s.Shape(), s.Grown(1).Ops, err)
	}
	if _, err := c.SizingAt(1); err == nil {
		t.Error("a rate of 1 planned")
	}
}

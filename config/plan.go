package config

import (
	"fmt"
	"time"

	"dedupe-worker/internal/bloom"
)

// Sizing is the filter a configuration plans and the windows of keys it
// keeps live at once: what the worker builds, and what dedupe-worker plan
// prints.
type Sizing struct {
	Plan   bloom.Plan
	Window bloom.Window
	// Lead is how long before a window starts its keys are made
	// (bloom.PreallocateLead); an event stamped ahead of the clock is
	// deduplicated if its window starts within it.
	Lead time.Duration
	// Live is the most windows of keys live at once (bloom.Window.Live).
	Live int
}

// Sizing plans c's filter at its false-positive rate.
func (c Config) Sizing() (Sizing, error) { return c.SizingAt(c.FalsePositiveRate) }

// SizingAt plans c's filter at the false-positive rate p instead of
// DEDUPE_FALSE_POSITIVE_RATE. The error names the variable at fault.
func (c Config) SizingAt(p float64) (Sizing, error) {
	win, err := c.FilterWindow()
	if err != nil {
		return Sizing{}, err
	}
	opt, err := c.PlanOptions()
	if err != nil {
		return Sizing{}, err
	}
	if err := bloom.CheckFPR(p); err != nil {
		return Sizing{}, bad("FALSE_POSITIVE_RATE", "%v", err)
	}
	pl, err := bloom.NewPlan(c.ExpectedPerWindow, p, opt)
	if err != nil {
		return Sizing{}, bad("EXPECTED_PER_WINDOW", "%d at p = %g: %v", c.ExpectedPerWindow, p, err)
	}
	lead := bloom.PreallocateLead(pl, win, c.RedisTimeout)
	return Sizing{Plan: pl, Window: win, Lead: lead, Live: win.Live(lead)}, nil
}

// LiveMemory is the bytes of the windows live at once, each at its plan.
func (s Sizing) LiveMemory() uint64 { return s.Plan.Memory * uint64(s.Live) }

// Grown is a window of a growing plan at a load: what it holds, the
// stages it has made, and what a new ID costs Redis.
type Grown struct {
	// Load is the IDs as a multiple of the expected, IDs the count.
	Load float64
	IDs  int64
	// Stages are the stages made; Parts the keys per shard of the newest.
	Stages, Parts int
	// Memory is one window's bytes, LiveMemory the windows' live at once.
	Memory, LiveMemory uint64
	// FPR bounds the false-positive rate at the load.
	FPR float64
	// Ops are the Redis reads and writes per new ID: BITFIELD sub-ops, or
	// GETRANGE and SETRANGE calls.
	Ops int
}

// Grown is s's window at load times the expected IDs.
func (s Sizing) Grown(load float64) Grown {
	pl := s.Plan
	mem, k := pl.GrownMemory(load)
	rolling := s.Window.Mode == bloom.Rolling
	// The newest stage is read whole and written, each older stage tested
	// by one word (rarely more), and in rolling mode the previous bucket's
	// stages likewise.
	ops := 2*pl.Layout.Words + k - 1
	if pl.Kind == bloom.KindFingerprint {
		// A read of each stage, and a write.
		ops = k + 1
	}
	if rolling {
		ops += k
	}
	return Grown{Load: load, IDs: int64(load * float64(pl.Elements)), Stages: k, Parts: pl.Stages[k-1].Parts,
		Memory: mem, LiveMemory: mem * uint64(s.Live), FPR: pl.GrownFPR(load), Ops: ops}
}

// GrowsTo is how far s's window grows, as a multiple of the expected IDs:
// DEDUPE_MAX_GROWTH, or less where a further stage would take more than
// bloom.MaxShards keys.
func (s Sizing) GrowsTo() float64 { return float64(s.Plan.Capacity()) / float64(s.Plan.Elements) }

// Shape names the filter's shape: its layout (WxB, W words of B bits), or
// fpBxK for B-byte fingerprints in K keys per shard.
func (s Sizing) Shape() string {
	if s.Plan.Kind == bloom.KindFingerprint {
		return fmt.Sprintf("fp%dx%d", s.Plan.Stages[0].Bytes, s.Plan.Stages[0].Parts)
	}
	return s.Plan.Layout.String()
}

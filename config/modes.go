package config

import (
	"fmt"
	"time"

	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/consumer"
)

// The values of Mode.
const (
	ModeDrop   = "drop"
	ModeShadow = "shadow"
)

// The values of LatePolicy.
const (
	LateForward    = "forward"
	LateDeadLetter = "dead-letter"
)

// FilterWindow is the filter's window: DEDUPE_WINDOW, DEDUPE_WINDOW_MODE
// (bloom.ParseMode) and DEDUPE_MAX_LAG, checked by the engine's checks.
// The error is a *VarError naming the variable at fault; Load refuses a
// Config whose window fails, so a loaded Config's never does.
func (c Config) FilterWindow() (bloom.Window, error) {
	mode, err := bloom.ParseMode(c.WindowMode)
	if err != nil {
		return bloom.Window{}, bad("WINDOW_MODE", "%v", err)
	}
	return bloom.Window{Length: c.Window, Mode: mode, MaxLag: c.MaxLag},
		firstBad(check{"WINDOW", bloom.CheckWindowLength(c.Window)}, check{"MAX_LAG", bloom.CheckMaxLag(c.MaxLag)})
}

// Modes are DEDUPE_MODE, DEDUPE_LATE_POLICY and DEDUPE_START_OFFSET read
// into the values the worker (consumer.Config) takes.
type Modes struct {
	// Shadow is DEDUPE_MODE=shadow (consumer.Config.Shadow); drop
	// otherwise.
	Shadow bool
	// DeadLetterLate is DEDUPE_LATE_POLICY=dead-letter
	// (consumer.Config.DeadLetterLate); forward otherwise.
	DeadLetterLate bool
	// Start is DEDUPE_START_OFFSET (consumer.Config.Start, with
	// StartOffset.ConsumerStart).
	Start StartOffset
}

// Modes reads c's modes. The error is a *VarError naming the variable at
// fault; Load refuses a Config whose modes fail, so a loaded Config's
// never do.
func (c Config) Modes() (Modes, error) {
	var m Modes
	switch c.Mode {
	case ModeDrop:
	case ModeShadow:
		m.Shadow = true
	default:
		return Modes{}, bad("MODE", "%q: want %s or %s", c.Mode, ModeDrop, ModeShadow)
	}
	switch c.LatePolicy {
	case LateForward:
	case LateDeadLetter:
		m.DeadLetterLate = true
	default:
		return Modes{}, bad("LATE_POLICY", "%q: want %s or %s", c.LatePolicy, LateForward, LateDeadLetter)
	}
	start, err := ParseStartOffset(c.StartOffset)
	if err != nil {
		return Modes{}, bad("START_OFFSET", "%v", err)
	}
	m.Start = start
	return m, nil
}

// StartOffset is a parsed DEDUPE_START_OFFSET. The zero value is the
// earliest offset.
type StartOffset struct {
	Latest bool
	// At is a point in time, Back a duration before the worker starts.
	At   time.Time
	Back time.Duration
}

// ParseStartOffset reads earliest, latest, an RFC 3339 time or a positive
// duration.
func ParseStartOffset(s string) (StartOffset, error) {
	switch s {
	case "earliest":
		return StartOffset{}, nil
	case "latest":
		return StartOffset{Latest: true}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return StartOffset{At: t}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return StartOffset{Back: d}, nil
	}
	return StartOffset{}, fmt.Errorf("%q: want earliest, latest, an RFC 3339 time or a duration such as 1h", s)
}

// Time is the point in time to start from, given the worker's start now;
// zero for earliest and latest.
func (s StartOffset) Time(now time.Time) time.Time {
	if s.Back > 0 {
		return now.Add(-s.Back)
	}
	return s.At
}

// ConsumerStart is where a new group starts (consumer.Config.Start), given
// the worker's start now.
func (s StartOffset) ConsumerStart(now time.Time) consumer.Start {
	return consumer.Start{Latest: s.Latest, At: s.Time(now)}
}

package bloom

import (
	"fmt"
	"time"
)

// The limits of the values an application hands the engine, each checked
// by one function: NewPlan, New and Window apply them (after a zero field
// has taken its default), and an application checks a setting with the
// function of its field before it builds anything, naming the setting its
// own way. Each limit is written here once.

// Limits of Config.CallTimeout and Config.MinReplicas.
const (
	// MinCallTimeout and MaxCallTimeout bound Config.CallTimeout.
	MinCallTimeout = 10 * time.Millisecond
	MaxCallTimeout = 5 * time.Minute
	// MaxMinReplicas is the largest Config.MinReplicas.
	MaxMinReplicas = 5
)

// CheckWindowLength refuses a Window.Length that is not whole seconds from
// 1s to MaxWindowLength.
func CheckWindowLength(d time.Duration) error {
	if d < time.Second || d%time.Second != 0 || d > MaxWindowLength {
		return fmt.Errorf("window is %v, want whole seconds from 1s to %v", d, MaxWindowLength)
	}
	return nil
}

// CheckMaxLag refuses a Window.MaxLag that is not whole seconds from 0 to
// MaxLagBound.
func CheckMaxLag(d time.Duration) error {
	if d < 0 || d%time.Second != 0 || d > MaxLagBound {
		return fmt.Errorf("max lag is %v, want whole seconds from 0 to %v", d, MaxLagBound)
	}
	return nil
}

// CheckElements refuses NewPlan's n, the expected elements per window,
// out of 1 to MaxElements.
func CheckElements(n int64) error {
	if n <= 0 || n > MaxElements {
		return fmt.Errorf("expected elements per window is %d, want 1 to %g", n, float64(MaxElements))
	}
	return nil
}

// CheckFPR refuses NewPlan's p below MinFPR or from 1.
func CheckFPR(p float64) error {
	if !(p >= MinFPR && p < 1) {
		return fmt.Errorf("false-positive rate is %g, want at least %g and less than 1", p, MinFPR)
	}
	return nil
}

// CheckShards refuses a PlanOptions.MinShards out of 1 to MaxShards.
func CheckShards(n int) error {
	if n < 1 || n > MaxShards {
		return fmt.Errorf("shards is %d, want 1 to %d", n, MaxShards)
	}
	return nil
}

// CheckGrowth refuses a PlanOptions.MaxGrowth out of 1 (no growth) to
// MaxGrowthFactor.
func CheckGrowth(g float64) error {
	if !(g >= 1 && g <= MaxGrowthFactor) {
		return fmt.Errorf("growth is %g, want 1 (no growth) to %d", g, MaxGrowthFactor)
	}
	return nil
}

// CheckMemoryFactor refuses a PlanOptions.MemoryFactor out of 1 to
// MaxMemoryFactor.
func CheckMemoryFactor(f float64) error {
	if !(f >= 1 && f <= MaxMemoryFactor) {
		return fmt.Errorf("memory factor is %g, want 1 to %d", f, MaxMemoryFactor)
	}
	return nil
}

// CheckCallTimeout refuses a Config.CallTimeout out of MinCallTimeout to
// MaxCallTimeout.
func CheckCallTimeout(d time.Duration) error {
	if d < MinCallTimeout || d > MaxCallTimeout {
		return fmt.Errorf("call timeout is %v, want %v to %v", d, MinCallTimeout, MaxCallTimeout)
	}
	return nil
}

// CheckMinReplicas refuses a Config.MinReplicas out of 0 (no WAIT) to
// MaxMinReplicas.
func CheckMinReplicas(n int) error {
	if n < 0 || n > MaxMinReplicas {
		return fmt.Errorf("min replicas is %d, want 0 (no WAIT) to %d", n, MaxMinReplicas)
	}
	return nil
}

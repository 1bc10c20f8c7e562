package consumer

import (
	"fmt"
	"time"
)

// The limits of Config, each checked by one function: New applies them
// (after a zero field has taken its default), and an application checks a
// setting with the function of its field before it builds anything,
// naming the setting its own way. Each limit is written once: the
// constants here and in config.go, the checks here.

// Limits of Config.ShutdownTimeout and Config.FailOpenAfter.
const (
	// MinShutdownTimeout and MaxShutdownTimeout bound ShutdownTimeout.
	MinShutdownTimeout = time.Second
	MaxShutdownTimeout = 10 * time.Minute
	// MinFailOpenAfter and MaxFailOpenAfter bound FailOpenAfter when it is
	// not zero (off).
	MinFailOpenAfter = time.Second
	MaxFailOpenAfter = 24 * time.Hour
)

// CheckBatchSize refuses a BatchSize out of 1 to MaxBatchSize.
func CheckBatchSize(n int) error { return inRange("batch size", n, 1, MaxBatchSize) }

// CheckBatchLinger refuses a BatchLinger out of MinBatchLinger to
// MaxBatchLinger.
func CheckBatchLinger(d time.Duration) error {
	return inRange("batch linger", d, MinBatchLinger, MaxBatchLinger)
}

// CheckKafkaTimeout refuses a Kafka.Timeout out of MinKafkaTimeout to
// MaxKafkaTimeout.
func CheckKafkaTimeout(d time.Duration) error {
	return inRange("Kafka timeout", d, MinKafkaTimeout, MaxKafkaTimeout)
}

// CheckSessionTimeout refuses a SessionTimeout out of MinSessionTimeout
// to MaxSessionTimeout.
func CheckSessionTimeout(d time.Duration) error {
	return inRange("session timeout", d, MinSessionTimeout, MaxSessionTimeout)
}

// CheckShutdownTimeout refuses a ShutdownTimeout out of
// MinShutdownTimeout to MaxShutdownTimeout.
func CheckShutdownTimeout(d time.Duration) error {
	return inRange("shutdown timeout", d, MinShutdownTimeout, MaxShutdownTimeout)
}

// CheckFailOpenAfter refuses a FailOpenAfter other than 0 (off) or
// MinFailOpenAfter to MaxFailOpenAfter.
func CheckFailOpenAfter(d time.Duration) error {
	if d != 0 && (d < MinFailOpenAfter || d > MaxFailOpenAfter) {
		return fmt.Errorf("fail-open delay %v: want 0 (off) or %v to %v", d, MinFailOpenAfter, MaxFailOpenAfter)
	}
	return nil
}

// CheckHandoffWait refuses a HandoffWait out of 0 (no wait) to
// MaxHandoffWait.
func CheckHandoffWait(d time.Duration) error {
	if d < 0 || d > MaxHandoffWait {
		return fmt.Errorf("hand-off wait %v: want 0 (no wait) to %v", d, MaxHandoffWait)
	}
	return nil
}

// inRange refuses v out of lo to hi, naming it what.
func inRange[T int | time.Duration](what string, v, lo, hi T) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s %v: want %v to %v", what, v, lo, hi)
	}
	return nil
}

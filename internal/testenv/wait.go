package testenv

import (
	"testing"
	"time"
)

// Until polls cond until it returns true or limit passes, and reports
// whether it did. The first poll is immediate; the pause between polls
// grows from 5 ms to 200 ms.
func Until(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	pause := 5 * time.Millisecond
	for {
		if cond() {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		t := time.NewTimer(min(pause, time.Until(deadline)))
		<-t.C
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// Eventually waits until cond holds, and fails the test, naming what it
// waited for, if it does not within limit.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	if !Until(limit, cond) {
		t.Fatalf("after %v, still waiting for %s", time.Since(start).Round(time.Millisecond), what)
	}
}

// Throughout checks cond over the whole of d (polling as Until does) and
// fails the test, naming what should have held, the first time it does
// not. It observes a state that must last; it is not a way to wait.
func Throughout(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	if Until(d, func() bool { return !cond() }) {
		t.Fatalf("%s stopped holding after %v", what, time.Since(start).Round(time.Millisecond))
	}
}

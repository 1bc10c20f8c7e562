package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errFault = errors.New("fault")

// Do retries until f succeeds, with waits that double up to Max and stay
// within the upper half of each step.
func TestDoRetriesUntilSuccess(t *testing.T) {
	calls := 0
	var waits []time.Duration
	b := Backoff{First: time.Millisecond, Max: 4 * time.Millisecond}
	err := Do(context.Background(), b, func(context.Context) error {
		if calls++; calls < 5 {
			return errFault
		}
		return nil
	}, func(err error, wait time.Duration) error {
		if !errors.Is(err, errFault) {
			t.Errorf("failed got %v", err)
		}
		waits = append(waits, wait)
		return nil
	})
	if err != nil || calls != 5 || len(waits) != 4 {
		t.Fatalf("err %v after %d calls and %d waits; want nil after 5 and 4", err, calls, len(waits))
	}
	for i, step := range []time.Duration{1, 2, 4, 4} {
		step *= time.Millisecond
		if waits[i] < step/2 || waits[i] > step {
			t.Errorf("wait %d: %v, want %v to %v", i, waits[i], step/2, step)
		}
	}
}

// An error failed turns into a stop ends Do at once with it.
func TestDoStopsOnPermanent(t *testing.T) {
	stop := errors.New("refused for good")
	calls := 0
	err := Do(context.Background(), Calls, func(context.Context) error { calls++; return errFault },
		func(error, time.Duration) error { return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("err %v after %d calls; want the stop after 1", err, calls)
	}
}

// Cancelling ctx during the wait ends Do with f's last error, and a
// failure that comes with ctx ended is not reported as a fault.
func TestDoEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	reported := 0
	err := Do(ctx, Backoff{First: time.Hour, Max: time.Hour}, func(context.Context) error { return errFault },
		func(error, time.Duration) error { reported++; cancel(); return nil })
	if !errors.Is(err, errFault) || reported != 1 {
		t.Fatalf("err %v, %d reports; want the fault and 1", err, reported)
	}
	ctx, cancel = context.WithCancel(context.Background())
	err = Do(ctx, Calls, func(context.Context) error { cancel(); return context.Canceled },
		func(error, time.Duration) error { reported++; return nil })
	if !errors.Is(err, context.Canceled) || reported != 1 {
		t.Fatalf("err %v, %d reports; want context.Canceled and no new report", err, reported)
	}
	if err := Do(ctx, Calls, func(context.Context) error { t.Fatal("f called after ctx ended"); return nil }, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

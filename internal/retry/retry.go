// Package retry calls an operation until it succeeds, fails for good or
// its context ends, waiting between tries a back-off that doubles. The
// worker's Kafka and Redis calls, the start-up checks and the click
// generator retry with it, so they wait alike and log alike.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the wait between tries: First, doubled after each failure up
// to Max. Each wait is drawn from the upper half of its value (jitter), so
// replicas that failed together do not all try again at once.
type Backoff struct {
	First, Max time.Duration
}

// Calls is the back-off of the worker's Kafka and Redis calls and of its
// start-up checks: 100 ms doubling to 5 s.
var Calls = Backoff{First: 100 * time.Millisecond, Max: 5 * time.Second}

// Do calls f until it returns nil or ctx ends. After each failure it calls
// failed, if not nil, with the error and the wait before the next try;
// failed returns the error to stop with when retrying cannot help, nil to
// wait and try again. Do returns nil once f succeeds, the error failed
// returned, or, when ctx ends, f's last error (ctx's own if f never ran).
// A failure that comes with ctx ended is not passed to failed: it is the
// cancellation, not a fault.
func Do(ctx context.Context, b Backoff, f func(context.Context) error, failed func(err error, wait time.Duration) error) error {
	next := b.First
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		wait := next/2 + rand.N(next/2+1)
		if failed != nil {
			if stop := failed(err, wait); stop != nil {
				return stop
			}
		}
		next = min(2*next, b.Max)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

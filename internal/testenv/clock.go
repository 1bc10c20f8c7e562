package testenv

import "time"

// Now is the present for a test: the real clock in UTC, to the second.
// Event times and injected clocks are derived from it (Now().Add(...)),
// never from a calendar date: Redis applies EXPIREAT with its own real
// clock, so a key whose expiry is computed from a fixed date vanishes once
// that date is a few days past.
func Now() time.Time { return time.Now().UTC().Truncate(time.Second) }

package bloom

import (
	"fmt"
	"strings"
	"time"
)

// Mode says which windows an element is tested against.
type Mode int

const (
	// Rolling tests the element's bucket and the one before it and sets only
	// its own bucket: a copy whose event time is up to one window length
	// after the first copy's is caught wherever the bucket boundary falls.
	Rolling Mode = iota
	// Fixed tests and sets only the element's bucket: copies are caught when
	// their event times fall in the same aligned bucket.
	Fixed
)

func (m Mode) String() string {
	if m == Fixed {
		return "fixed"
	}
	return "rolling"
}

// ParseMode reads "rolling" or "fixed".
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(s) {
	case "rolling":
		return Rolling, nil
	case "fixed":
		return Fixed, nil
	}
	return 0, fmt.Errorf("window mode is %q, want rolling or fixed", s)
}

// Windows maps event times to buckets: bucket b covers the Unix seconds
// [b*L, (b+1)*L), so buckets are aligned to UTC (24h buckets start at
// midnight UTC).
type Windows struct {
	Length time.Duration
	Mode   Mode
	// MaxLag is how far behind the clock an event may be processed with its
	// deduplication intact: every bucket's keys live until MaxLag past the
	// end of the last bucket whose events test them (see Late). It is what a replica may fall
	// behind, or how long every replica may be down, without letting
	// duplicates through.
	MaxLag time.Duration
}

// MaxMaxLag is the largest lag bound: a month, as for the window. Memory
// usually binds earlier (Live counts the buckets the bound keeps).
const MaxMaxLag = 31 * 24 * time.Hour

func (w Windows) seconds() int64 { return int64(w.Length / time.Second) }

// Bucket is the bucket of event time t.
func (w Windows) Bucket(t time.Time) int64 {
	s, l := t.Unix(), w.seconds()
	b := s / l
	if s%l < 0 {
		b--
	}
	return b
}

// Start is the first instant of bucket b.
func (w Windows) Start(b int64) time.Time { return time.Unix(b*w.seconds(), 0).UTC() }

// ExpireAt is the Unix time at which bucket b's keys expire: MaxLag after
// the end of the last bucket whose events test them, this one, or in
// Rolling mode the next one (which tests it too).
func (w Windows) ExpireAt(b int64) int64 {
	end := (b + 1) * w.seconds()
	if w.Mode == Rolling {
		end += w.seconds()
	}
	return end + int64(w.MaxLag/time.Second)
}

// Deadline is the instant from which an event of time t is Late: MaxLag
// after the end of its bucket, when the oldest key it is tested against
// expires (in Rolling mode, the previous bucket's). So every event processed
// at most MaxLag after its event time is deduplicated, and one early in its
// bucket up to a window longer.
func (w Windows) Deadline(t time.Time) time.Time {
	return time.Unix((w.Bucket(t)+1)*w.seconds()+int64(w.MaxLag/time.Second), 0)
}

// Late reports whether an event of time t, processed at now, is beyond
// the lag bound: its keys may be gone, so it cannot be deduplicated.
func (w Windows) Late(t, now time.Time) bool { return !now.Before(w.Deadline(t)) }

// Live is how many buckets of keys exist at once at most: the current one,
// the next one once preallocated, in Rolling mode the previous one (still
// tested), and the ones MaxLag keeps for events processed late, one per
// window length of MaxLag, rounded up (a 10-minute window and a 1-hour
// bound keep six more).
func (w Windows) Live() int {
	n := 2
	if w.Mode == Rolling {
		n++
	}
	return n + int((w.MaxLag+w.Length-1)/w.Length)
}

// Retention is how long a bucket's keys live after the bucket starts.
func (w Windows) Retention() time.Duration {
	return time.Duration(w.ExpireAt(0)) * time.Second
}

func (w Windows) validate() error {
	if w.Length < time.Second || w.Length%time.Second != 0 || w.Length > 31*24*time.Hour {
		return fmt.Errorf("window is %v, want whole seconds from 1s to 744h", w.Length)
	}
	if w.Mode != Rolling && w.Mode != Fixed {
		return fmt.Errorf("window mode is %d, want rolling or fixed", w.Mode)
	}
	if w.MaxLag < 0 || w.MaxLag%time.Second != 0 || w.MaxLag > MaxMaxLag {
		return fmt.Errorf("max lag is %v, want whole seconds from 0 to %v", w.MaxLag, MaxMaxLag)
	}
	return nil
}

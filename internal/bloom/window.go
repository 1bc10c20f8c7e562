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
	// Grace keeps a bucket this long after it stops being tested, so events
	// that arrive late are still deduplicated.
	Grace time.Duration
}

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

// ExpireAt is the Unix time at which bucket b's keys expire: at its end, plus
// one window in rolling mode (the next bucket tests it), plus Grace.
func (w Windows) ExpireAt(b int64) int64 {
	end := (b + 1) * w.seconds()
	if w.Mode == Rolling {
		end += w.seconds()
	}
	return end + int64(w.Grace/time.Second)
}

// Live is how many buckets of keys exist at once in steady state: the
// current one, the next one once preallocated, in Rolling mode the previous
// one (still tested), and with Grace one more lingering.
func (w Windows) Live() int {
	n := 2
	if w.Mode == Rolling {
		n++
	}
	if w.Grace > 0 {
		n++
	}
	return n
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
	if w.Grace < 0 || w.Grace%time.Second != 0 || w.Grace > w.Length*10 {
		return fmt.Errorf("window grace is %v, want whole seconds from 0 to 10 windows", w.Grace)
	}
	return nil
}

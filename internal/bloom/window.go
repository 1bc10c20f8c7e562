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

// Window maps event times to buckets: bucket b covers the Unix seconds
// [b*L, (b+1)*L), so buckets are aligned to UTC (24h buckets start at
// midnight UTC).
type Window struct {
	Length time.Duration
	Mode   Mode
	// MaxLag is how far behind the clock an event may be processed with its
	// deduplication intact: every bucket's keys live until MaxLag past the
	// end of the last bucket whose events test them (see Late). It is what a replica may fall
	// behind, or how long every replica may be down, without letting
	// duplicates through.
	MaxLag time.Duration
}

// MaxWindowLength is the longest window: a month (31 days). A longer one
// would keep a bucket's keys past any retention a pipeline needs.
const MaxWindowLength = 31 * 24 * time.Hour

// MaxLagBound is the largest lag bound (Window.MaxLag): a month, as for
// the window. Memory usually binds earlier (Live counts the buckets the
// bound keeps).
const MaxLagBound = 31 * 24 * time.Hour

func (w Window) seconds() int64 { return int64(w.Length / time.Second) }

// Bucket is the bucket of event time t.
func (w Window) Bucket(t time.Time) int64 {
	s, l := t.Unix(), w.seconds()
	b := s / l
	if s%l < 0 {
		b--
	}
	return b
}

// Start is the first instant of bucket b.
func (w Window) Start(b int64) time.Time { return time.Unix(b*w.seconds(), 0).UTC() }

// deadline is the Unix second from which the events of bucket b are Late:
// MaxLag after the end of the bucket.
func (w Window) deadline(b int64) int64 { return (b+1)*w.seconds() + int64(w.MaxLag/time.Second) }

// ExpireAt is the Unix time at which bucket b's keys expire: MaxLag after
// the end of the last bucket whose events test them, this one, or in
// Rolling mode the next one (which tests it too). That is the deadline of
// that last bucket's events.
func (w Window) ExpireAt(b int64) int64 {
	if w.Mode == Rolling {
		return w.deadline(b + 1)
	}
	return w.deadline(b)
}

// Deadline is the instant from which an event of time t is Late: MaxLag
// after the end of its bucket, when the oldest key it is tested against
// expires (in Rolling mode, the previous bucket's). So every event processed
// at most MaxLag after its event time is deduplicated, and one early in its
// bucket up to a window longer.
func (w Window) Deadline(t time.Time) time.Time {
	return time.Unix(w.deadline(w.Bucket(t)), 0)
}

// placement is where an event stands against the windows when it is
// decided: its bucket, whether it is tested at all, and which buckets a
// test reads.
type placement struct {
	bucket int64
	// status is 0 for an event that is tested, else Late or Future.
	status Verdict
	// prev and next: the test reads bucket-1, and bucket+1, besides the
	// event's own.
	prev, next bool
}

// tested reports whether the event is tested against the filters.
func (p placement) tested() bool { return p.status == 0 }

// buckets lists the buckets a test reads, in time order: the previous
// one, the event's own, the next one.
func (p placement) buckets() []int64 {
	out := make([]int64, 0, 3)
	if p.prev {
		out = append(out, p.bucket-1)
	}
	out = append(out, p.bucket)
	if p.next {
		out = append(out, p.bucket+1)
	}
	return out
}

// place classifies an event of time t decided at now; every decision
// about an event time (the test-and-set, Late, Explain) goes through it.
//   - Future: its bucket is after the bucket of now plus maxFutureSkew.
//   - Late: now is at or past its Deadline (a whole second, so comparing
//     with now's second is exact).
//   - Otherwise it is tested, in its bucket and, in Rolling mode, in the
//     previous one and, once the next bucket may hold its copies, the next
//     one: from clockSkew plus maxFutureSkew before its bucket ends, the
//     time from which a replica whose clock is up to clockSkew ahead
//     tests (and inserts) events of the next bucket (see Windows and
//     Clocks in the package doc).
//
// The buckets are given for Late and Future events too (Explain shows
// them); the test-and-set does not read them.
func (w Window) place(t, now time.Time, maxFutureSkew, clockSkew time.Duration) placement {
	p := placement{bucket: w.Bucket(t)}
	switch {
	case p.bucket > w.Bucket(now.Add(maxFutureSkew)):
		p.status = Future
	case now.Unix() >= w.deadline(p.bucket):
		p.status = Late
	}
	if w.Mode == Rolling {
		p.prev = true
		p.next = p.bucket < w.Bucket(now.Add(maxFutureSkew+clockSkew))
	}
	return p
}

// Live is how many buckets of keys exist at once at most when each
// bucket's keys are made lead before it starts (PreallocateLead, or the
// future skew when longer: a future event's window is made when it is
// first tested): a
// bucket's keys live from then until they expire, MaxLag after the end of
// the last bucket whose events test them (ExpireAt), and the buckets alive
// at one instant are those whose lives cover it. A 10-minute rolling window
// with a 1-hour bound and a lead of 2 minutes keeps 9; a daily fixed window
// with a 1-hour bound keeps 2 around midnight and 1 for most of the day.
func (w Window) Live(lead time.Duration) int {
	life := max(lead, 0) + w.Length + w.MaxLag
	if w.Mode == Rolling {
		life += w.Length
	}
	return int((life + w.Length - 1) / w.Length)
}

// Retention is how long a bucket's keys live after the bucket starts.
func (w Window) Retention() time.Duration {
	return time.Duration(w.ExpireAt(0)) * time.Second
}

func (w Window) validate() error {
	if err := CheckWindowLength(w.Length); err != nil {
		return err
	}
	if w.Mode != Rolling && w.Mode != Fixed {
		return fmt.Errorf("window mode is %d, want rolling or fixed", w.Mode)
	}
	return CheckMaxLag(w.MaxLag)
}

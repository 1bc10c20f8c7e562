package clickstream

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Event is one click event of a Stream and what it is in the ground truth.
type Event struct {
	Key, Value []byte
	// ID is the click ID; empty when the event is malformed.
	ID string
	// Dup: the event repeats an earlier one exactly (its value, event time
	// included), under a new key.
	Dup bool
	// Time is the event time the value carries (or would, if malformed).
	Time time.Time
}

// Stream makes click events one at a time, without end: the streaming
// form of Generate for load generators and long runs. Each event is,
// independently, malformed with probability bad (the forms of Generate,
// in turn), an exact repeat of one of the last Recent valid events with
// probability dup, and otherwise a new click stamped with the clock.
// Click IDs carry a prefix drawn from the seed, so streams with different
// seeds share no ID. Not safe for concurrent use.
type Stream struct {
	rng      *rand.Rand
	dup, bad float64
	prefix   string
	now      func() time.Time
	recent   []Event
	next     int // where the next valid event goes in recent, once full
	n        int
	badN     int
}

// Recent is how many past valid events a Stream draws its repeats from.
const Recent = 100_000

// StreamIDs are the click IDs of the first n events of a stream, with
// repeats, sorted, and how many are distinct.
func StreamIDs(n int, dup, bad float64, seed uint64) ([]string, int) {
	s := NewStream(dup, bad, seed, nil)
	var ids []string
	distinct := map[string]bool{}
	for range n {
		if e := s.Next(); e.ID != "" {
			ids = append(ids, e.ID)
			distinct[e.ID] = true
		}
	}
	slices.Sort(ids)
	return ids, len(distinct)
}

// NewStream returns a stream with the given shares of duplicates and
// malformed events; now is the clock (time.Now if nil).
func NewStream(dup, bad float64, seed uint64, now func() time.Time) *Stream {
	if now == nil {
		now = time.Now
	}
	rng := rand.New(rand.NewPCG(seed, 3))
	return &Stream{rng: rng, dup: dup, bad: bad, prefix: fmt.Sprintf("%08x", rng.Uint32()), now: now}
}

// Next returns the next event.
func (s *Stream) Next() Event {
	i := s.n
	s.n++
	t := s.now()
	ms := t.UnixMilli()
	key := []byte(fmt.Sprintf("u%d", s.rng.IntN(10_000)))
	switch r := s.rng.Float64(); {
	case r < s.bad:
		v := malformedValue(s.badN, ms)
		s.badN++
		return Event{Key: key, Value: v, Time: time.UnixMilli(ms)}
	case r < s.bad+s.dup && len(s.recent) > 0:
		e := s.recent[s.rng.IntN(len(s.recent))]
		e.Key, e.Dup = key, true
		return e
	}
	id := fmt.Sprintf("click-%s-%d", s.prefix, i)
	e := Event{Key: key, ID: id, Time: time.UnixMilli(ms),
		Value: clickValue(id, ms, i%97, s.rng.IntN(100_000))}
	if len(s.recent) < Recent {
		s.recent = append(s.recent, e)
	} else {
		s.recent[s.next] = e
		s.next = (s.next + 1) % Recent
	}
	return e
}

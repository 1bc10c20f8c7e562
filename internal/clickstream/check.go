package clickstream

// The counting: what an input holds (Truth), and the check of what a
// pipeline wrote to the output and dead-letter topics against it.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/event"
)

// Truth is what an input stream holds.
type Truth struct {
	Valid     map[string]bool // distinct valid click IDs
	Malformed int
	// Bad are the distinct malformed payloads.
	Bad   map[string]bool
	Total int
}

func (t *Truth) bad(v []byte) {
	if t.Bad == nil {
		t.Bad = map[string]bool{}
	}
	t.Bad[string(v)] = true
	t.Malformed++
}

// Add counts e into t.
func (t *Truth) Add(e Event) {
	if t.Valid == nil {
		t.Valid = map[string]bool{}
	}
	t.Total++
	if e.ID == "" {
		t.bad(e.Value)
		return
	}
	t.Valid[e.ID] = true
}

// Report is what the output and dead-letter topics say about a run.
type Report struct {
	Distinct       int // distinct valid IDs in the input
	Lost           int // distinct valid IDs never forwarded
	DuplicatesPass int // IDs forwarded from more than one source
	Unknown        int // forwarded IDs not in the input
	Conflicts      int // a source forwarded with two different IDs
	OutRecords     int
	Replays        int // output records beyond one per source
	Malformed      int
	DeadMissing    int // malformed inputs never dead-lettered
	NoReason       int // dead letters without dedupe-error
	WrongDead      int // dead letters whose payload is not a malformed input
	OrderBreaks    int // first copies of one input partition out of order
}

// Check compares the topics with the truth.
func Check(tr Truth, out, dead []*kgo.Record) Report {
	rep := Report{Distinct: len(tr.Valid), OutRecords: len(out), Malformed: tr.Malformed}
	sources := map[string]string{}
	last := map[string]int64{}
	for _, r := range out {
		src, id := Header(r, SourceHeader), Header(r, IDHeader)
		if prev, ok := sources[src]; ok {
			if prev != id {
				rep.Conflicts++
			}
			rep.Replays++
			continue
		}
		sources[src] = id
		parts := strings.Split(src, "/")
		if len(parts) == 3 {
			off, _ := strconv.ParseInt(parts[2], 10, 64)
			key := fmt.Sprintf("%d<-%s", r.Partition, parts[1])
			if prev, ok := last[key]; ok && off < prev {
				rep.OrderBreaks++
			}
			last[key] = off
		}
	}
	perID := map[string]int{}
	for _, id := range sources {
		perID[id]++
	}
	for id := range tr.Valid {
		switch n := perID[id]; {
		case n == 0:
			rep.Lost++
		case n > 1:
			rep.DuplicatesPass++
		}
	}
	for id := range perID {
		if !tr.Valid[id] {
			rep.Unknown++
		}
	}
	deadSources := map[string]bool{}
	deadValues := map[string]bool{}
	for _, r := range dead {
		if Header(r, ErrorHeader) == "" || event.ParseReason(Header(r, ReasonHeader)) == event.Other {
			rep.NoReason++
		}
		if !tr.Bad[string(r.Value)] {
			rep.WrongDead++
		}
		deadSources[Header(r, SourceHeader)] = true
		deadValues[string(r.Value)] = true
	}
	missingValues := 0
	for v := range tr.Bad {
		if !deadValues[v] {
			missingValues++
		}
	}
	rep.DeadMissing = max(tr.Malformed-len(deadSources), missingValues, 0)
	return rep
}

// OK reports whether nothing was lost or mangled.
func (r Report) OK() bool {
	return r.Lost == 0 && r.DuplicatesPass == 0 && r.Unknown == 0 && r.Conflicts == 0 && r.DeadMissing == 0 && r.NoReason == 0 &&
		r.WrongDead == 0 && r.OrderBreaks == 0
}

func (r Report) String() string {
	return fmt.Sprintf("distinct %d, lost %d, duplicates passed %d, unknown %d, conflicts %d, output %d (replays %d), malformed %d, dead-letter missing %d, without reason %d, wrongly dead %d, order breaks %d",
		r.Distinct, r.Lost, r.DuplicatesPass, r.Unknown, r.Conflicts, r.OutRecords, r.Replays, r.Malformed, r.DeadMissing, r.NoReason, r.WrongDead, r.OrderBreaks)
}

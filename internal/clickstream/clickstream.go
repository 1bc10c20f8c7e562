// Package clickstream makes click-event streams with known duplicates and
// malformed records, and checks what a pipeline made of them: the ground
// truth for end-to-end and fault-injection tests.
package clickstream

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/event"
)

// The headers the worker adds.
const (
	SourceHeader = event.SourceHeader
	IDHeader     = event.IDHeader
	ErrorHeader  = event.ErrorHeader
	ReasonHeader = event.ReasonHeader
)

// Header returns the value of header key of r.
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// DistinctSources counts the distinct dedupe-source values of rs.
func DistinctSources(rs []*kgo.Record) int {
	seen := map[string]bool{}
	for _, r := range rs {
		seen[Header(r, SourceHeader)] = true
	}
	return len(seen)
}

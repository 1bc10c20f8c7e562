package bloom

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestCallgrindLoad(t *testing.T) {
	addr := os.Getenv("CGADDR")
	if addr == "" {
		t.Skip()
	}
	n, _ := strconv.Atoi(os.Getenv("CGN"))
	mode := Fixed
	if os.Getenv("CGMODE") == "rolling" {
		mode = Rolling
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: time.Minute})
	c.FlushAll(t.Context())
	plan, _ := NewPlan(2_000_000, 1e-6, PlanOptions{})
	now := time.Now()
	f, _ := New(c, Config{Pipeline: "p", Plan: plan, Windows: Windows{Length: time.Hour, Mode: mode}, Now: func() time.Time { return now }, CallTimeout: time.Minute})
	f.Preallocate(t.Context(), now)
	es := make([]Element, 1000)
	off := int64(0)
	for b := 0; b < n/1000; b++ {
		for i := range es {
			id := off * 7919
			if off%14 == 13 {
				id = (off / 2) * 7919
			}
			es[i] = Element{ID: []byte(fmt.Sprintf("%016x", id)), Time: now, Source: Source{"t", int32(off % 8), off}}
			off++
		}
		if _, err := f.TestAndSet(t.Context(), es); err != nil {
			t.Fatal(err)
		}
	}
}

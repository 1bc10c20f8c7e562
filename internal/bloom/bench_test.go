package bloom

import (
	"context"
	"fmt"
	"testing"
	"time"

	"dedupe-worker/internal/testenv"
)

// BenchmarkClientSide measures the work TestAndSet does in the client for
// a batch of 1000: validation, hashing, ordering and encoding the script's
// arguments. Redis's share is measured by cmd/bloom-bench.
func BenchmarkClientSide(b *testing.B) {
	plan, err := NewPlan(10_000_000, 1e-6, PlanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	// The filter needs a client to be made; the work measured makes no
	// call.
	f, err := New(testenv.RedisClient(b, testenv.Redis(b)), Config{Pipeline: "bench", Plan: plan, Window: Window{Length: 10 * time.Minute}})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	f.cfg.Now = func() time.Time { return now }
	es := make([]Element, 1000)
	for i := range es {
		es[i] = Element{ID: fmt.Appendf(nil, "c-%012d-%08x", i, i*7919), Time: now, Source: Source{Topic: "clicks", Partition: int32(i % 8), Offset: int64(i)}}
	}
	b.ReportAllocs()
	for b.Loop() {
		bt := getBatch()
		if err := f.prepare(context.Background(), bt, es, nil); err != nil {
			b.Fatal(err)
		}
		f.encode(bt, bt.order)
		putBatch(bt)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(es)), "ns/element")
}

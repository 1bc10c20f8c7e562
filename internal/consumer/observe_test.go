package consumer

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
)

// A partition's lag is exported while this replica reads it, and dropped
// a while after it stops (it has moved to another replica).
func TestLagOfPartitionsNoLongerRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := &Worker{m: NewMetrics(reg, "p")}
	t0 := time.Now()
	w.setLag([]kafka.Message{{Partition: 0, Offset: 5, HighWaterMark: 10}, {Partition: 1, Offset: 7, HighWaterMark: 8}}, t0)
	if n := testutil.CollectAndCount(w.m.lag); n != 2 {
		t.Fatalf("%d lag series, want 2", n)
	}
	if v := testutil.ToFloat64(w.m.lag.WithLabelValues("0")); v != 4 {
		t.Fatalf("lag of partition 0 is %v, want 4", v)
	}
	w.setLag([]kafka.Message{{Partition: 0, Offset: 9, HighWaterMark: 10}}, t0.Add(lagExpiry+time.Second))
	if n := testutil.CollectAndCount(w.m.lag); n != 1 {
		t.Fatalf("%d lag series after partition 1 went quiet, want 1", n)
	}
	if v := testutil.ToFloat64(w.m.lag.WithLabelValues("0")); v != 0 {
		t.Fatalf("lag of partition 0 is %v, want 0", v)
	}
}

// The commit of a batch is its highest offset per partition, also when
// kafka-go delivered an offset again after a lower one.
func TestHighestOffsetPerPartition(t *testing.T) {
	batch := []kafka.Message{{Partition: 1, Offset: 4}, {Partition: 0, Offset: 9}, {Partition: 1, Offset: 6}, {Partition: 1, Offset: 5}}
	got := highest(batch, nil)
	if len(got) != 2 || got[0].Partition != 1 || got[0].Offset != 6 || got[1].Partition != 0 || got[1].Offset != 9 {
		t.Fatalf("%+v: want partition 1 at 6 and partition 0 at 9", got)
	}
}

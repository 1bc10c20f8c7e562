package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// produce writes o.n click events of about 150 bytes; a share o.dup repeat
// an earlier event exactly.
func produce(ctx context.Context, brokers string, o options) (float64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(inTopic), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(7, 7))
	now := time.Now().UnixMilli()
	var values [][]byte
	var bytes int
	for done := 0; done < o.n; {
		k := min(10_000, o.n-done)
		recs := make([]*kgo.Record, 0, k)
		for i := 0; i < k; i++ {
			var v []byte
			if len(values) > 0 && rng.Float64() < o.dup {
				v = values[rng.IntN(len(values))]
			} else {
				j := done + i
				v = fmt.Appendf(nil, `{"click_id":"c-%012d-%08x","ts":%d,"user":"u-%07d","page":"/products/%05d","ref":"campaign-%03d","ua":"Mozilla/5.0"}`,
					j, rng.Uint32(), now, rng.IntN(1e6), rng.IntN(1e5), rng.IntN(1000))
				values = append(values, v)
			}
			bytes += len(v)
			recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "u%d", rng.IntN(1e5)), Value: v})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return 0, err
		}
		done += k
	}
	return float64(bytes) / float64(o.n), nil
}

package bloom_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/bloom"
)

// The click-log case: about 7 million distinct events per 10 minutes, or
// 1 billion a day, at one false positive in a million.
func ExampleNewPlan() {
	for _, n := range []int64{7_000_000, 1_000_000_000} {
		p, err := bloom.NewPlan(n, 1e-6, bloom.PlanOptions{})
		if err != nil {
			panic(err)
		}
		fmt.Printf("n=%d: %d words x %d bits, %d shard(s), %.1f bits/element (classic %.1f, k=%d), %d MiB, achieved p %.2g\n",
			n, p.Layout.Words, p.Layout.BitsPerWord, p.Shards, p.BitsPerElement(),
			float64(p.Standard.Bits)/float64(n), p.Standard.Hashes, p.Memory>>20, p.AchievedFPR)
	}
	// Output:
	// n=7000000: 3 words x 5 bits, 1 shard(s), 38.3 bits/element (classic 28.8, k=20), 32 MiB, achieved p 7.3e-07
	// n=1000000000: 3 words x 5 bits, 18 shard(s), 38.7 bits/element (classic 28.8, k=20), 4608 MiB, achieved p 6.7e-07
}

func ExampleFilter_TestAndSet() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	plan, _ := bloom.NewPlan(7_000_000, 1e-6, bloom.PlanOptions{})
	f, err := bloom.New(client, bloom.Config{
		Pipeline: "clicks",
		Plan:     plan,
		Window:   bloom.Window{Length: 10 * time.Minute, Mode: bloom.Rolling},
	})
	if err != nil {
		panic(err)
	}
	now := time.Now()
	verdicts, err := f.TestAndSet(context.Background(), []bloom.Element{
		{ID: []byte("click-1"), Time: now, Source: bloom.Source{Topic: "clicks", Partition: 0, Offset: 41}},
		{ID: []byte("click-1"), Time: now, Source: bloom.Source{Topic: "clicks", Partition: 0, Offset: 42}},
	})
	if err != nil {
		// Nothing is lost: send the same batch again later.
		return
	}
	for _, v := range verdicts {
		fmt.Println(v, v.Forward())
	}
}

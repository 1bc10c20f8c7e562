package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"text/tabwriter"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// result is what a child reports on its last line of output.
type result struct {
	Events    int     `json:"events"`
	Forwarded int     `json:"forwarded"`
	Seconds   float64 `json:"seconds"` // first fetch to last acknowledgement
	P50       float64 `json:"p50"`
	P99       float64 `json:"p99"`
	CPU       float64 `json:"cpu"` // filled in by the parent
	RedisCPU  float64 `json:"redis_cpu"`
}

func report(r result, err error) error {
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// printTable prints the copy's row and the worker's, the worker's CPU per
// event also as a ratio to the copy's.
func printTable(rows []result) error {
	tw := tabwriter.NewWriter(os.Stdout, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tevents\tforwarded\tevents/s\tCPU us/event\tvs copy\tRedis CPU us/event\tp50 fetch->produce\tp99\t")
	for i, r := range rows {
		name := []string{"bare kafka-go copy", "dedupe worker"}[i]
		cpu := r.CPU / float64(r.Events) * 1e6
		base := rows[0].CPU / float64(rows[0].Events) * 1e6
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.2fx\t%.2f\t%.1fms\t%.1fms\t\n", name, r.Events, r.Forwarded,
			float64(r.Events)/r.Seconds, cpu, cpu/base, r.RedisCPU/float64(r.Events)*1e6, r.P50*1e3, r.P99*1e3)
	}
	return tw.Flush()
}

// counter is the value of the counter name in reg (its first series), 0
// if it has none.
func counter(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// histogram is the histogram name in reg (its first series), nil if it
// has none.
func histogram(reg *prometheus.Registry, name string) *dto.Histogram {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	return nil
}

// quantiles are the p50 and p99 of h.
func quantiles(h prometheus.Histogram) (float64, float64) {
	var m dto.Metric
	h.Write(&m)
	return quantilesOf(m.GetHistogram())
}

// quantilesOf interpolates p50 and p99 inside the histogram's buckets, as
// Prometheus's histogram_quantile does.
func quantilesOf(h *dto.Histogram) (float64, float64) {
	q := func(p float64) float64 {
		rank := p * float64(h.GetSampleCount())
		var prevCount uint64
		prevBound := 0.0
		for _, b := range h.GetBucket() {
			if float64(b.GetCumulativeCount()) >= rank {
				in := float64(b.GetCumulativeCount() - prevCount)
				if in == 0 {
					return b.GetUpperBound()
				}
				return prevBound + (b.GetUpperBound()-prevBound)*(rank-float64(prevCount))/in
			}
			prevCount, prevBound = b.GetCumulativeCount(), b.GetUpperBound()
		}
		return math.Inf(1)
	}
	return q(0.5), q(0.99)
}

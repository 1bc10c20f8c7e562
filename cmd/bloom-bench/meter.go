package main

import (
	"context"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/redisproc"
)

// meter takes Redis CPU, client CPU, memory and wall time around a run.
type meter struct {
	c               *redis.Client
	redis0, client0 float64
	mem0            int64
	micros0         map[string]int64
	start           time.Time
}

// startMeter reads the meters before a run.
func startMeter(ctx context.Context, c *redis.Client) *meter {
	m := &meter{c: c}
	m.redis0, m.mem0 = redisCPU(ctx, c), usedMemory(ctx, c)
	m.micros0, _ = redisproc.CommandMicros(ctx, c)
	m.client0 = clientCPU()
	m.start = time.Now()
	return m
}

// stop fills in what r used since startMeter.
func (m *meter) stop(ctx context.Context, r *result) {
	r.wall = time.Since(m.start)
	r.clientCPU = clientCPU() - m.client0
	r.redisCPU = redisCPU(ctx, m.c) - m.redis0
	r.memory = usedMemory(ctx, m.c) - m.mem0
	if us, err := redisproc.CommandMicros(ctx, m.c); err == nil {
		r.micros = map[string]int64{}
		for k, v := range us {
			if d := v - m.micros0[k]; d > 0 {
				r.micros[k] = d
			}
		}
	}
}

// clientCPU is the CPU time this process has used, in seconds.
func clientCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// redisCPU is the CPU time the server has used, in seconds (0 if unread).
func redisCPU(ctx context.Context, c *redis.Client) float64 {
	s, _ := redisproc.CPUSeconds(ctx, c)
	return s
}

// usedMemory is the server's INFO used_memory (0 if unread).
func usedMemory(ctx context.Context, c *redis.Client) int64 {
	v, _ := redisproc.UsedMemory(ctx, c)
	return v
}

package demo

// The worker replicas of a run, each built by app.New as the
// dedupe-worker command builds it, and the log they share.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
)

// replicas are the running replicas of a run, one goroutine each.
type replicas struct {
	cfgs    []config.Config
	cancel  context.CancelFunc
	dones   []chan error // each replica's Run error, once it returns
	stopped bool
}

// startReplicas builds a replica of each configuration with app.New and
// runs it until stop. A configuration app.New refuses starts none.
func startReplicas(ctx context.Context, cfgs []config.Config, logger *zap.Logger) (*replicas, error) {
	workers := make([]*app.Worker, len(cfgs))
	for i, cfg := range cfgs {
		w, err := app.New(cfg, logger.With(zap.Int("replica", i+1)))
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", i+1, err)
		}
		workers[i] = w
	}
	wctx, cancel := context.WithCancel(ctx)
	r := &replicas{cfgs: cfgs, cancel: cancel, dones: make([]chan error, len(cfgs))}
	for i, w := range workers {
		r.dones[i] = make(chan error, 1)
		go func() { r.dones[i] <- w.Run(wctx) }()
	}
	return r, nil
}

// early is an error naming the first replica that has stopped by itself,
// nil while every one runs.
func (r *replicas) early() error {
	for i, d := range r.dones {
		select {
		case err := <-d:
			d <- err // for stop
			return fmt.Errorf("replica %d stopped early: %v", i+1, err)
		default:
		}
	}
	return nil
}

// stop stops the replicas and waits for each, up to its shutdown time-out
// and 10 s more. It returns what went wrong with each; called again, it
// does nothing.
func (r *replicas) stop() []error {
	if r.stopped {
		return nil
	}
	r.stopped = true
	r.cancel()
	var errs []error
	for i, d := range r.dones {
		limit := r.cfgs[i].ShutdownTimeout + 10*time.Second
		select {
		case err := <-d:
			if err != nil {
				errs = append(errs, fmt.Errorf("replica %d: %w", i+1, err))
			}
		case <-time.After(limit):
			errs = append(errs, fmt.Errorf("replica %d did not stop within %v", i+1, limit))
		}
	}
	return errs
}

// metricsURLs are the replicas' /metrics.
func (r *replicas) metricsURLs() []string {
	urls := make([]string, len(r.cfgs))
	for i, c := range r.cfgs {
		urls[i] = "http://" + c.HTTPAddr + "/metrics"
	}
	return urls
}

// newLogger is the replicas' logger: warnings and errors, in the console
// format, to logs.
func newLogger(logs *logBuffer) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(logs), zap.WarnLevel))
}

// logBuffer keeps the first 256 kB of the workers' log and counts its
// lines.
type logBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines int
	echo  io.Writer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines += bytes.Count(p, []byte{'\n'})
	if l.buf.Len() < 256<<10 {
		l.buf.Write(p)
	}
	if l.echo != nil {
		l.echo.Write(p)
	}
	return len(p), nil
}

func (l *logBuffer) snapshot() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String(), l.lines
}

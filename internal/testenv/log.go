package testenv

import (
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Logger writes entries at level and above to the test's log until the
// test's cleanup, and drops them after. A worker's background goroutines
// (go-redis dials, for one: its logger is process-wide) can log after the
// test has ended, which a plain test logger turns into a panic.
func Logger(t testing.TB, level zapcore.Level) *zap.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	return zap.New(zapcore.NewCore(enc, w, level))
}

type testWriter struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) Sync() error { return nil }

func (w *testWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

package testenv

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/time/rate"
)

// SlowLink forwards TCP connections from a loopback address to target,
// each connection's bytes towards target at most bytesPerSecond (its own
// limit, so one large write does not slow the others), the answers at
// full speed: a server that reads a large value slowly, as over a slow
// link or when loaded, while its small commands still answer at once. It
// returns the address to connect to; it closes with the test.
func SlowLink(t testing.TB, target string, bytesPerSecond int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		l.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { slowForward(ctx, c, target, bytesPerSecond) })
		}
	})
	return l.Addr().String()
}

// chunk is the most bytes SlowLink forwards at once: small enough that the
// limit is kept within a few milliseconds.
const chunk = 64 << 10

func slowForward(ctx context.Context, c net.Conn, target string, bytesPerSecond int) {
	defer c.Close()
	s, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer s.Close()
	go func() {
		<-ctx.Done()
		c.Close()
		s.Close()
	}()
	go func() {
		io.Copy(c, s)
		c.Close()
	}()
	lim := rate.NewLimiter(rate.Limit(bytesPerSecond), chunk)
	buf := make([]byte, chunk)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if werr := lim.WaitN(ctx, n); werr != nil {
				return
			}
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

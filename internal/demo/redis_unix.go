//go:build unix

package demo

import (
	"context"

	"dedupe-worker/internal/redisproc"
)

// startRedis runs redis-server on a free loopback port in a new temporary
// directory, without persistence; stop ends it and removes the directory.
func startRedis(ctx context.Context) (addr string, stop func() error, err error) {
	s, err := redisproc.StartTemp(ctx)
	if err != nil {
		return "", nil, err
	}
	return s.Addr, s.Stop, nil
}

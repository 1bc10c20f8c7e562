//go:build !unix

package demo

import (
	"context"
	"errors"
)

func startRedis(context.Context) (string, func() error, error) {
	return "", nil, errors.New("the demo runs redis-server as a child process, which it does on Linux and macOS only")
}

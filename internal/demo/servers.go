package demo

// The servers of a run: redis-server and the Kafka-protocol broker, each
// replica's configuration for them, and the demo's own view of the filter.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
	"dedupe-worker/internal/bloom"
	"dedupe-worker/internal/redisproc"
)

// servers are a run's redis-server and broker.
type servers struct {
	redisAddr string
	brokers   []string
	stopRedis func() error
	broker    *kfake.Cluster
}

// startServers starts redis-server (within 30 s) and a one-node broker
// holding the input and output topics, with partitions partitions, and the
// dead-letter topic.
func startServers(ctx context.Context, partitions int32) (*servers, error) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	redisAddr, stopRedis, err := startRedis(sctx)
	cancel()
	if err != nil {
		return nil, err
	}
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, InputTopic, OutputTopic),
		kfake.SeedTopics(1, DLQTopic), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		stopRedis()
		return nil, fmt.Errorf("starting the Kafka-protocol broker: %w", err)
	}
	return &servers{redisAddr: redisAddr, brokers: broker.ListenAddrs(), stopRedis: stopRedis, broker: broker}, nil
}

// stop closes the broker, then redis-server.
func (s *servers) stop() {
	s.broker.Close()
	s.stopRedis()
}

// replicaConfigs are the replicas' configurations, each with an HTTP
// address of its own, checked as any worker's are.
func replicaConfigs(o Options, brokers []string, redisAddr string) ([]config.Config, error) {
	cfgs := make([]config.Config, Replicas)
	for i := range cfgs {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		cfgs[i] = workerConfig(o, brokers, redisAddr, addr) // app.New checks it
	}
	return cfgs, nil
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr() (string, error) {
	port, err := redisproc.FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// store is the demo's own client of the replicas' Redis and filter, which
// the verifier reads, and the memory Redis used before the run.
type store struct {
	rc        redis.UniversalClient
	filter    *bloom.Filter
	memBefore int64
}

// openStore connects as cfg does, checks the server as a worker does, and
// reads its memory. The caller closes st.rc.
func openStore(ctx context.Context, cfg config.Config) (*store, error) {
	rc, err := app.NewRedis(cfg)
	if err != nil {
		return nil, err
	}
	filter, err := app.NewFilter(cfg, rc)
	if err == nil {
		err = filter.CheckServer(ctx)
	}
	var mem int64
	if err == nil {
		mem, err = usedMemory(ctx, rc)
	}
	if err != nil {
		rc.Close()
		return nil, err
	}
	st := &store{rc: rc, filter: filter, memBefore: mem}
	return st, nil
}

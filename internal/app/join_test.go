package app

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// A replica the coordinator never lets into its group is not ready, and
// says so once a join period has passed instead of waiting in silence.
func TestNotInTheGroupSaysSo(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
	var joins atomic.Int64
	k.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		joins.Add(1)
		resp := req.(*kmsg.JoinGroupRequest).ResponseKind().(*kmsg.JoinGroupResponse)
		resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
		return resp, nil, true
	})
	srv := testenv.Redis(t)
	core, logs := observer.New(zapcore.WarnLevel)
	cfg := replicas.Config("outside", k.Addrs(), srv.Addr)
	r := replicas.Start(t, cfg, runWorker, zap.New(zapcore.NewTee(core, testenv.Logger(t, zapcore.WarnLevel).Core())))
	const warning = "not in the consumer group yet"
	period := consumer.GroupTimingsFor(cfg.KafkaSessionTimeout).JoinPeriod()
	testenv.Eventually(t, period+30*time.Second, "the replica saying it is not in its group", func() bool {
		return logs.FilterMessageSnippet(warning).Len() > 0
	})
	if joins.Load() == 0 {
		t.Fatal("no JoinGroup reached the broker: the replica was kept out by something else")
	}
	if r.Ready() {
		t.Error("ready while outside its group")
	}
	e := logs.FilterMessageSnippet(warning).All()[0]
	fields := e.ContextMap()
	if fields["group"] != cfg.GroupID {
		t.Errorf("the warning names group %v, want %s", fields["group"], cfg.GroupID)
	}
	if waited, _ := fields["waited"].(time.Duration); waited < period {
		t.Errorf("warned after %v, before one join period (%v)", waited, period)
	}
}

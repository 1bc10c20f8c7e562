package app

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// A stage that fails for good stops the worker: the output topic refuses
// the worker's writes (TOPIC_AUTHORIZATION_FAILED, as when its Write ACL
// is taken away). Run returns a *consumer.StageError naming the missing
// right at once, and no test-and-set is sent after the failure is known:
// at most the three batches in hand (one being delivered, one queued, one
// being decided) were decided, not the whole input. A worker restarted
// once the output accepts writes again forwards every distinct click once.
func TestDeadStageStopsTheWorker(t *testing.T) {
	k := testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 1})
	srv := testenv.Redis(t)
	rc := testenv.RedisClient(t, srv)
	recs, tr := clickstream.Generate(3000, 0.07, 0.01, 7)
	k.Produce("in", recs...)

	refusal := k.RefuseProduce("out", kerr.TopicAuthorizationFailed)

	cfg := replicas.Config("stage", k.Addrs(), srv.Addr)
	cfg.IDField, cfg.TimeField = "click_id", "ts"
	cfg.BatchSize = 100
	// The window is made before the worker starts, as its maintenance
	// makes it ahead of time: the count of calls below is of decisions, with
	// no call refused for a window not made yet.
	f, err := NewFilter(cfg, rc)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Preallocate(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	r := replicas.Start(t, cfg, runWorker, nil)
	// The failure ends the run within the reader's close bound and the
	// clients' (the calls it cancels return at once).
	const limit = 30 * time.Second
	select {
	case <-r.Done():
	case <-time.After(limit):
		t.Fatalf("the worker did not stop within %v of its output refusing it (%d produces refused)", limit, refusal.Refused())
	}
	err = r.Err()
	var se *consumer.StageError
	if !errors.As(err, &se) || se.Step != consumer.StepProduce {
		t.Fatalf("Run returned %v; want a *consumer.StageError of step %q", err, consumer.StepProduce)
	}
	if !errors.Is(err, kerr.TopicAuthorizationFailed) && !strings.Contains(err.Error(), "Topic Authorization Failed") {
		t.Errorf("Run returned %v; want the broker's TOPIC_AUTHORIZATION_FAILED inside", err)
	}
	if want := "needs Write on topic out"; !strings.Contains(err.Error(), want) {
		t.Errorf("Run returned %q; want it to say %q", err, want)
	}
	if refusal.Refused() == 0 {
		t.Fatal("no produce was refused: the fault did not happen")
	}
	// The calls less the failed ones: an EVALSHA answered NOSCRIPT, which
	// go-redis follows with an EVAL.
	calls := testenv.ScriptStat(t, rc, "calls") - testenv.ScriptStat(t, rc, "failed_calls")
	if calls == 0 || calls > 3 {
		t.Errorf("%d test-and-set calls for %d input batches; want 1 to 3 (the batches in hand when the output refused)", calls, len(recs)/cfg.BatchSize)
	}
	t.Logf("stopped with %q after %d refused produces and %d test-and-sets", err, refusal.Refused(), calls)

	// Write given back: a new worker reads the same offsets (nothing was
	// committed), replays the recorded decisions and forwards the rest.
	refusal.Stop()
	cfg.HTTPAddr = replicas.Config("stage", k.Addrs(), srv.Addr).HTTPAddr
	r2 := replicas.Start(t, cfg, runWorker, nil)
	decided := testenv.Until(60*time.Second, func() bool {
		return clickstream.DistinctSources(k.Read("out")) >= len(tr.Valid) && clickstream.DistinctSources(k.Read("dlq")) >= tr.Malformed
	})
	if err := r2.Stop(); err != nil {
		t.Fatalf("the restarted worker: %v", err)
	}
	rep := clickstream.Check(tr, k.Read("out"), k.Read("dlq"))
	if !decided || !rep.OK() {
		t.Errorf("decided everything: %v; %v", decided, rep)
	}
	t.Logf("after the restart: %v", rep)
}

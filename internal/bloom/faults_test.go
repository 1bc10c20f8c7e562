package bloom

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"dedupe-worker/internal/testenv"
)

// Each fault must give a wrapped error and never a partial answer, and the
// same batch sent again afterwards must give the decisions a fault-free run
// gives.
func TestFaultsThenRetry(t *testing.T) {
	t0 := testenv.Now()
	es := stream(3000, 3, 5, t0)
	// The reference: a fault-free run.
	ref := func() []Verdict {
		c := testenv.RedisClient(t, testenv.Redis(t))
		f := newFilter(t, c, t0, 10_000, 1e-6, func(cfg *Config) { cfg.Window.Mode = Fixed })
		return runBatches(t, f, es, 500)
	}()

	srv := testenv.Redis(t, "--appendonly", "yes", "--appendfsync", "always")
	c := testenv.RedisClient(t, srv)
	// Fixed windows: the batches read no neighbour, whose plan a call may
	// look up first, so the call the stall meets is the script.
	f := newFilter(t, c, t0, 10_000, 1e-6, func(cfg *Config) { cfg.CallTimeout, cfg.Window.Mode = 300*time.Millisecond, Fixed })
	ctx := context.Background()
	var got []Verdict
	batch := func(i int) []Element { return es[i*500 : (i+1)*500] }
	mustFail := func(what string, i int) {
		t.Helper()
		v, err := f.TestAndSet(ctx, batch(i))
		if err == nil || !errors.Is(err, ErrRedis) || v != nil {
			t.Fatalf("%s: verdicts %v, error %v; want ErrRedis and no verdicts", what, v, err)
		}
		t.Logf("%s: %v", what, err)
	}
	// retry sends batch i again, checks that it gives fresh decisions, or
	// replays of the ones a failed call recorded (as want says), and keeps
	// them as decisions.
	const (
		fresh = iota
		replayed
	)
	retry := func(i int, want int) {
		t.Helper()
		v, err := f.TestAndSet(ctx, batch(i))
		if err != nil {
			t.Fatalf("retry of batch %d: %v", i, err)
		}
		for k := range v {
			isReplay := v[k] == ReplayedFirstSeen || v[k] == ReplayedDuplicate
			if isReplay != (want == replayed) {
				t.Fatalf("retry of batch %d, element %d: %v; want %s", i, k, v[k], map[int]string{
					fresh: "a fresh decision: no call applied the batch before", replayed: "a replay of the failed call's decision"}[want])
			}
			// A retry of a batch the failed call applied sees replays.
			if v[k] == ReplayedFirstSeen {
				v[k] = FirstSeen
			} else if v[k] == ReplayedDuplicate {
				v[k] = Duplicate
			}
		}
		got = append(got, v...)
	}

	// 0: nothing wrong.
	retry(0, fresh)

	// 1: the script cache is gone (as after a restart): EVALSHA gets NOSCRIPT
	// and falls back to EVAL without an error.
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	evals := testenv.CommandStat(t, c, "eval", "calls")
	retry(1, fresh)
	if n := testenv.CommandStat(t, c, "eval", "calls"); n != evals+1 {
		t.Fatalf("EVAL ran %d times for the batch after SCRIPT FLUSH, want once (the fallback from NOSCRIPT)", n-evals)
	}

	// 2: Redis stalls (SIGSTOP): the call times out. It had reached the
	// server, which runs it after SIGCONT; the retry is sent once it has,
	// and must replay its decisions. (Had the retry come first, it would
	// decide afresh, and the stalled call would replay those: the retry
	// agrees with a fault-free run either way.)
	scripts := testenv.CommandStat(t, c, "evalsha", "calls") + testenv.CommandStat(t, c, "eval", "calls")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	mustFail("stalled server", 2)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stalled call returned after %v, call timeout is 300ms", d)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the stalled call to run after SIGCONT", func() bool {
		return testenv.CommandStat(t, c, "evalsha", "calls")+testenv.CommandStat(t, c, "eval", "calls") > scripts
	})
	retry(2, replayed)

	// 3: out of memory: refused before anything is written, so the retry
	// decides afresh.
	configSet(t, c, "maxmemory", "1")
	v, err := f.TestAndSet(ctx, batch(3))
	if err == nil || !strings.Contains(err.Error(), "OOM") || v != nil {
		t.Fatalf("over maxmemory: %v, %v", v, err)
	}
	configSet(t, c, "maxmemory", "0")
	retry(3, fresh)

	// 4: the server is down, then restarts from its append-only file.
	srv.Stop()
	mustFail("server down", 4)
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	retry(4, fresh)

	// 5: the server is killed right after a batch: the append-only file with
	// fsync always has it, so replaying it gives its decisions back.
	retry(5, fresh)
	srv.Kill()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	v, err = f.TestAndSet(ctx, batch(5))
	if err != nil {
		t.Fatal(err)
	}
	for k, x := range v {
		if x != replayOf(got[5*500+k]) {
			t.Fatalf("after a restart, element %d of batch 5: %v, first decided %v", k, x, got[5*500+k])
		}
	}

	if !same(got, ref) {
		for i := range got {
			if got[i] != ref[i] {
				t.Fatalf("element %d (%v): %v after faults, %v without", i, es[i].Source, got[i], ref[i])
			}
		}
	}
	assertAllKeysExpire(t, c)
}

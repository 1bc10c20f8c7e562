package faults

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"dedupe-worker/internal/consumer"
	"dedupe-worker/internal/testenv"
)

// A crash loop, as an OOM-killed pod or a lost node makes one: while the
// input is produced over 35 s, a random replica is killed with SIGKILL
// twelve times in 30 s, 1 to 4 s apart, and restarted 0.5 to 2 s after
// each kill, with the production session timeout of 10 s. Replicas die
// at every step of the group protocol: reading, with a JoinGroup waiting
// at the coordinator, between join and sync, before their first join.
// In a stable group the rig expires the members of killed processes that
// the broker never timed, as a Kafka coordinator would (see
// expireKilled); rebalances, and the joins that live replicas give up,
// are left to the broker.
// The group must be stable again, with exactly the live replicas, and
// all the input committed, within the bounds of crashBurstBounds after
// the last kill. On the test broker, whose rebalance timer every
// JoinGroup restarts, the timings before consumer.GroupTimingsFor let
// the joins of the live replicas keep dead members in the group for
// minutes.
func TestCrashBurst(t *testing.T) {
	// Each run of the test (go test -count) draws other kills.
	crashBurstRuns++
	for _, replicas := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d replicas", replicas), func(t *testing.T) {
			r := newRig(t)
			r.extraEnv = append(r.extraEnv, "DEDUPE_KAFKA_SESSION_TIMEOUT="+crashBurstSession.String())
			chunk := events / 70 // every 0.5 s for 35 s
			run(t, fmt.Sprintf("crash burst, %d workers", replicas), r, replicas, chunk, func(r *rig) (int, time.Duration) {
				return r.crashBurst(replicas, chunk, crashBurstRuns)
			})
		})
	}
}

// crashBurstRuns counts the runs of TestCrashBurst in this process.
var crashBurstRuns uint64

const (
	// crashBurstSession is the session timeout of the scenario: the
	// default of DEDUPE_KAFKA_SESSION_TIMEOUT.
	crashBurstSession = 10 * time.Second
	// crashBurstKills is how many kills the burst makes.
	crashBurstKills = 12
)

// crashBurstBounds are the bounds of the time from the last kill until
// the group is stable with the live replicas, and until all the input is
// committed, from the group timings at the scenario's session timeout S
// (rebalance timeout R, join period P: see consumer.GroupTimingsFor):
//   - the killed replica restarts within 2 s;
//   - the members of killed processes are removed within S: by the
//     broker's session timer, its rebalance timer (within one P once the
//     live members only re-send their joins), or, for those it never
//     answered and so never timed, by the rig once the group is stable
//     (expireKilled);
//   - a dead member made leader holds the sync barrier for R, and a live
//     member that was between joins when the timer fired joins again,
//     within another P and R;
//   - then 30 s to decide what is left of the input (the replicas decide
//     the whole input of 200,000 events in less than 20 s in the other
//     scenarios).
//
// At S = 10 s: stable within 34 s, committed within 64 s.
func crashBurstBounds() (stable, committed time.Duration) {
	g := consumer.GroupTimingsFor(crashBurstSession)
	stable = 2*time.Second + g.Session + 2*g.JoinPeriod() + 2*g.Rebalance
	return stable, stable + 30*time.Second
}

// crashBurst runs the burst on replicas workers, feeding the input in
// chunks, and returns the number of kills and the time from the last
// kill until all the input is committed. The kills are drawn from the
// replica count and seed.
func (r *rig) crashBurst(replicas, chunk int, seed uint64) (int, time.Duration) {
	t := r.t
	t.Helper()
	for i := range replicas {
		r.waitReady(i)
	}
	rng := rand.New(rand.NewPCG(uint64(replicas), seed))
	watch := r.watchGroup()
	defer watch.stop()
	expired := r.expireKilled(crashBurstSession)
	defer expired()

	const (
		feedEvery = 500 * time.Millisecond
		feedFor   = 35 * time.Second
		// The kills fall at 2 s + 2.5 s·k, moved by up to 0.75 s either
		// way: 1 to 4 s apart, all within 30 s.
		killFrom  = 2 * time.Second
		killEvery = 2500 * time.Millisecond
		killMove  = 750 * time.Millisecond
	)
	start := time.Now()
	killAt := func(k int) time.Duration {
		return killFrom + time.Duration(k)*killEvery + time.Duration(rng.Int64N(int64(2*killMove))) - killMove
	}
	nextFeed, nextKill := time.Duration(0), killAt(0)
	type restart struct {
		at time.Duration
		i  int
	}
	var restarts []restart
	kills, fed := 0, 0
	var firstKill, lastKill time.Time
	for len(r.pending) > 0 || kills < crashBurstKills || len(restarts) > 0 {
		// The next of the three: a chunk, a kill, a restart.
		next := time.Duration(1 << 62)
		if len(r.pending) > 0 {
			next = nextFeed
		}
		if kills < crashBurstKills {
			next = min(next, nextKill)
		}
		for _, rs := range restarts {
			next = min(next, rs.at)
		}
		hold(next - time.Since(start))
		switch {
		case len(r.pending) > 0 && next == nextFeed:
			n := chunk
			if time.Since(start) >= feedFor {
				n = len(r.pending)
			}
			r.feed(n)
			fed++
			nextFeed += feedEvery
		case kills < crashBurstKills && next == nextKill:
			live := r.live()
			if len(live) == 0 {
				// Every replica is down: the kill waits for a restart.
				nextKill = restarts[0].at
				for _, rs := range restarts {
					nextKill = min(nextKill, rs.at)
				}
				continue
			}
			i := live[rng.IntN(len(live))]
			r.kill(i)
			lastKill = time.Now()
			if kills == 0 {
				firstKill = lastKill
			}
			kills++
			restarts = append(restarts, restart{at: time.Since(start) + 500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond))), i: i})
			if kills < crashBurstKills {
				nextKill = max(killAt(kills), time.Since(start)+time.Second)
			}
		default:
			for k, rs := range restarts {
				if rs.at == next {
					r.start(rs.i)
					restarts = append(restarts[:k], restarts[k+1:]...)
					break
				}
			}
		}
	}
	burst := lastKill.Sub(firstKill)
	t.Logf("seed %d: %d kills in %v, the last %v after the start; the input produced in %d chunks over %v", seed, kills, burst.Round(time.Millisecond),
		lastKill.Sub(start).Round(time.Millisecond), fed, time.Since(start).Round(time.Millisecond))
	if kills < 10 || burst > 30*time.Second {
		t.Errorf("%d kills in %v: the burst is 10 or more kills in 30 s", kills, burst.Round(time.Millisecond))
	}

	// The end: the group stable with every replica, all input committed.
	stableBound, bound := crashBurstBounds()
	var stableAfter, committedAfter time.Duration
	testenv.Until(bound-time.Since(lastKill), func() bool {
		if stableAfter == 0 && watch.isStable() {
			stableAfter = time.Since(lastKill)
		}
		if stableAfter > 0 && committedAfter == 0 {
			if n, err := r.uncommitted(); err == nil && n == 0 {
				committedAfter = time.Since(lastKill)
			}
		}
		return committedAfter > 0
	})
	most, states := watch.seen()
	t.Logf("after the last kill: stable with the %d replicas after %v, all input committed after %v (bounds %v and %v); most members listed %d; descriptions by state %v; members of killed processes the rig expired %d",
		replicas, stableAfter.Round(time.Millisecond), committedAfter.Round(time.Millisecond), stableBound, bound, most, states, expired())
	switch {
	case stableAfter == 0:
		state, pids, err := r.groupState()
		t.Errorf("the group was not stable with the %d replicas within %v of the last kill: %s, members of processes %v, replicas %v (%v)",
			replicas, bound, state, pids, r.livePids(), err)
	case stableAfter > stableBound:
		t.Errorf("the group was stable %v after the last kill, beyond the bound of %v", stableAfter.Round(time.Millisecond), stableBound)
	case committedAfter == 0:
		n, err := r.uncommitted()
		t.Errorf("%d input records not committed %v after the last kill (%v)", n, bound, err)
	}
	if committedAfter == 0 {
		return kills, bound
	}
	r.noteRecovery(committedAfter)
	return kills, committedAfter
}

// live lists the replicas running now, in order.
func (r *rig) live() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.workers))
}

// groupWatch describes the workers' group every 200 ms until stopped. It
// keeps the most members listed, how many descriptions saw each state,
// and whether the last one was a stable group of exactly the workers
// running.
type groupWatch struct {
	mu     sync.Mutex
	most   int
	states map[string]int
	stable bool
	done   chan struct{}
	ended  chan struct{}
}

func (r *rig) watchGroup() *groupWatch {
	w := &groupWatch{states: map[string]int{}, done: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(w.ended)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			state, pids, err := r.groupState()
			if err == nil {
				stable := state == "Stable" && slices.Equal(pids, r.livePids())
				w.mu.Lock()
				w.most = max(w.most, len(pids))
				w.states[state]++
				w.stable = stable
				w.mu.Unlock()
			}
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// isStable reports whether the last description was a stable group of
// exactly the workers running.
func (w *groupWatch) isStable() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stable
}

// seen is the most members listed, and how many descriptions saw each
// state.
func (w *groupWatch) seen() (int, map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.most, maps.Clone(w.states)
}

func (w *groupWatch) stop() {
	close(w.done)
	<-w.ended
}

package consumer

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"dedupe-worker/internal/logs"
)

// newReader is the group member that reads the input. Offsets are
// committed by deliver, synchronously, once per batch; kafkaLog logs what
// kafka-go reports.
func (w *Worker) newReader(kafkaLog *zap.Logger) *kafka.Reader {
	return kafka.NewReader(readerConfig(w.cfg, GroupTimingsFor(w.cfg.SessionTimeout), kafkaLog))
}

// readerConfig is the configuration of the reader of cfg's topic, in
// cfg's group, with the group timings g.
func readerConfig(cfg Config, g GroupTimings, kafkaLog *zap.Logger) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers:  cfg.Kafka.Brokers,
		GroupID:  cfg.GroupID,
		Topic:    cfg.Topic,
		MinBytes: 1,
		MaxBytes: 16 << 20,
		// kafka-go also uses MaxWait as the deadline for the start of a
		// fetch response, so it leaves a loaded broker time to answer and
		// is not tied to the linger (fetch keeps that): a deadline a busy
		// broker misses makes every retry time out and reconnect. The
		// broker answers as soon as it has a byte (MinBytes 1), so a long
		// wait costs nothing when data flows.
		MaxWait:           min(500*time.Millisecond, g.Session/2),
		StartOffset:       kafka.FirstOffset,
		CommitInterval:    0, // commits are synchronous, per batch
		QueueCapacity:     cfg.BatchSize,
		SessionTimeout:    g.Session,
		RebalanceTimeout:  g.Rebalance,
		HeartbeatInterval: g.Heartbeat,
		JoinGroupBackoff:  g.JoinBackoff,
		ReadBackoffMin:    50 * time.Millisecond,
		ReadBackoffMax:    time.Second,
		MaxAttempts:       3,
		Dialer:            cfg.Kafka.Dialer(),
		Logger:            logs.Kafka(kafkaLog, zap.DebugLevel),
		ErrorLogger:       logs.Kafka(kafkaLog, zap.WarnLevel),
	}
}

// GroupTimings are the reader's consumer-group timings (see
// GroupTimingsFor).
type GroupTimings struct {
	// Session is how long the coordinator keeps a member that sends
	// nothing: how long a replica that died holds its partitions.
	Session time.Duration
	// Heartbeat is how often a member heartbeats, and so how soon it
	// learns that a rebalance has begun.
	Heartbeat time.Duration
	// Rebalance is how long the coordinator waits for every member to
	// rejoin once a rebalance has begun.
	Rebalance time.Duration
	// JoinBackoff is how long kafka-go waits before it joins again after
	// a JoinGroup or SyncGroup that failed (other than for a rebalance
	// in progress).
	JoinBackoff time.Duration
}

// JoinPeriod is how often, at least, a member re-sends its JoinGroup while
// the coordinator holds it: kafka-go's deadline for it, then the back-off.
func (g GroupTimings) JoinPeriod() time.Duration { return kafkaGoTimeout + g.Rebalance + g.JoinBackoff }

const (
	// kafkaGoTimeout is kafka-go's own deadline for a group request
	// (ConsumerGroupConfig.Timeout's default, which ReaderConfig cannot
	// set). A JoinGroup's deadline is kafkaGoTimeout plus the rebalance
	// timeout.
	kafkaGoTimeout = 5 * time.Second
	// minRebalanceTimeout is the least rebalance timeout, for session
	// timeouts below 4 s (the tests' 1 and 2 s, the demo's 3 s): a member
	// on a loaded machine needs time to stop its partition readers, find
	// the coordinator and rejoin, also at the fault suite's S = 1 s.
	minRebalanceTimeout = time.Second
	// joinBackoff is GroupTimings.JoinBackoff.
	joinBackoff = time.Second
)

// GroupTimingsFor derives the group timings from the session timeout S
// (Config.SessionTimeout, 10 s by default), which it leaves as it
// is:
//
//	heartbeat      S/10             1 s at S = 10 s
//	rebalance      max(S/4, 1 s)    2.5 s
//	join back-off  1 s
//
// On a Kafka coordinator. A rebalance begins when a member joins, leaves
// or is expired; the coordinator then waits up to the rebalance timeout
// for every member to rejoin, and removes those that did not. A kafka-go
// member learns of the rebalance at its next heartbeat (within S/10),
// ends its generation (its partition readers stop; commits already
// queued are sent) and rejoins at once: it does not wait for the batch
// in hand, whose commit comes later or is refused (the batch is then read
// again by the partition's new owner: replays, nothing lost). So S/4
// leaves 1.5 s at S = 10 s for that rejoin after the heartbeat that
// reports it. A member that misses it is removed, gets UNKNOWN_MEMBER_ID
// and joins again as a new member after the back-off: one more
// rebalance, no loss. A member that dies while a rebalance waits holds
// it up to the rebalance timeout, not the session timeout. The JoinGroup
// deadline, 5 s + 2.5 s, still covers the 3 s Kafka waits before it
// answers the first join of an empty group. The back-off delays each
// rejoin after a failed join (the coordinator moved, or the member was
// removed) by 1 s.
//
// On the test broker (kfake, which the tests, the demo and the fault
// suite run on). Its coordinator restarts the rebalance timer at every
// JoinGroup, and removes a member that did not rejoin only when the timer
// fires; a member that died before its JoinGroup was answered has no
// session timer at all. A kafka-go member whose JoinGroup is held past
// its deadline (kafkaGoTimeout plus the rebalance timeout R) gives up,
// forgets its member ID, waits the back-off B and joins again as a new
// member: each live member sends a JoinGroup every P = 5 s + R + B at
// least. N live members whose joins are spread over P restart the timer
// before it fires if every gap between them is shorter than R, and the
// dead members stay for as long as that lasts (minutes, in the crash
// burst of the fault suite). The largest gap is at least P/N, so the
// timer fires within one period if P > N·R, that is R < (5 s + B)/(N-1):
// at S = 10 s, P = 8.5 s against 2·R = 5 s for two replicas and 3·R =
// 7.5 s for three; four would need S below 8 s. R = S with B = 0.5 s
// (P = 15.5 s against 2·R = 20 s) would let two replicas stall, and R =
// 4 s (P = 9.5 s) holds for two replicas but not for three.
func GroupTimingsFor(session time.Duration) GroupTimings {
	return GroupTimings{
		Session:     session,
		Heartbeat:   session / 10,
		Rebalance:   max(session/4, minRebalanceTimeout),
		JoinBackoff: joinBackoff,
	}
}

// watchReader reads r's statistics until ctx ends: every joinPoll until
// r has joined its group (its first generation), then every statsPoll. A
// message fetched sets joined at once (fetch). Until then the worker is not
// ready: a refused group or topic right shows only after kafka-go's own
// attempts at joining, seconds later. Reader.Stats resets its counters, so
// nothing else reads them; the rebalances it counts go to
// dedupe_rebalances_total.
//
// A replica that has not joined after a join period (JoinPeriod: the time
// a member takes to send its JoinGroup again) says so, once per period:
// it is not ready, and would otherwise be silent about why.
func (w *Worker) watchReader(ctx context.Context, r *kafka.Reader) {
	t := time.NewTicker(joinPoll)
	defer t.Stop()
	slow := false
	start, period := time.Now(), GroupTimingsFor(w.cfg.SessionTimeout).JoinPeriod()
	warnAt := start.Add(period)
	for {
		if n := r.Stats().Rebalances; n > 0 {
			w.m.rebalances.Add(float64(n))
			w.joined.Store(true)
		}
		if !slow && w.joined.Load() {
			slow = true
			t.Reset(statsPoll)
		}
		if now := time.Now(); !w.joined.Load() && now.After(warnAt) {
			warnAt = now.Add(period)
			w.log.Warn("not in the consumer group yet: not ready; the coordinator may be waiting for members that died, or the group or topic may be refused (see the errors above)",
				zap.String("group", w.cfg.GroupID), zap.Duration("waited", now.Sub(start).Round(time.Millisecond)))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

const (
	// joinPoll is how often watchReader looks until the reader has joined.
	joinPoll = 50 * time.Millisecond
	// statsPoll is how often it looks then.
	statsPoll = time.Second
)

package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/event"
)

// exited waits up to limit for worker i to exit by itself, and returns its
// exit code and its log; it fails the test if the worker is still running
// then (it is killed).
func (r *rig) exited(i int, limit time.Duration) (int, string) {
	r.t.Helper()
	r.mu.Lock()
	w := r.workers[i]
	r.mu.Unlock()
	select {
	case <-w.done:
	case <-time.After(limit):
		r.kill(i)
		r.t.Fatalf("worker %d still running %v after its stage failed for good", i, limit)
	}
	r.mu.Lock()
	delete(r.workers, i)
	r.mu.Unlock()
	return w.cmd.ProcessState.ExitCode(), w.stderr.String()
}

// errorLines are the error-level lines of a worker's log.
func errorLines(log string) []string {
	var out []string
	for l := range strings.SplitSeq(log, "\n") {
		if strings.Contains(l, `"level":"error"`) {
			out = append(out, l)
		}
	}
	return out
}

// A stage dies for good: the output topic refuses the workers' writes
// (TOPIC_AUTHORIZATION_FAILED, as after its Write ACL is removed) while
// input flows. Each worker exits 1 with one error line that names the
// right it lacks; none goes on reading and marking IDs seen. Once the
// right is back, restarted workers forward everything: the batches that
// were decided and not delivered get their recorded decisions.
func TestDeadStage(t *testing.T) {
	r := newRig(t)
	run(t, "dead stage (output)", r, 2, events/4, func(r *rig) (int, time.Duration) {
		r.waitRead(events / 8)
		refusal := r.k.RefuseProduce(outTopic, kerr.TopicAuthorizationFailed)
		r.feed(events / 4)
		for i := range 2 {
			code, log := r.exited(i, 60*time.Second)
			lines := errorLines(log)
			if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], "needs Write on topic "+outTopic) {
				t.Errorf("worker %d exited %d with error lines %q; want 1 and one line naming Write on %s", i, code, lines, outTopic)
			}
		}
		if refusal.Refused() == 0 {
			t.Fatal("no produce was refused: the fault did not happen")
		}
		refusal.Stop()
		r.start(0)
		r.start(1)
		return 1, r.recoveredAfter(func() { r.feed(events / 8) }, 60*time.Second)
	})
}

// The output topic refuses records for their size: its max.message.bytes
// is 300,000, and the input holds two valid 600 kB events with one ID.
// The first is dead-lettered (too_large, without its value), its copy is
// a duplicate, and every other event is forwarded: the partitions move on.
func TestRefusedRecord(t *testing.T) {
	r := newRig(t)
	r.k.SetTopicConfig(outTopic, "max.message.bytes", "300000")
	r.mutate = func(recs []*kgo.Record, tr *clickstream.Truth) []*kgo.Record {
		// "big" is the generator's 600 kB event: a dead letter without its
		// value, not an output.
		delete(tr.Valid, "big")
		tr.Bad[""] = true
		tr.Malformed++
		return recs
	}
	run(t, "refused record", r, 2, everything, func(r *rig) (int, time.Duration) {
		return 1, r.recovered(30 * time.Second)
	})
	tooLarge := 0
	for _, rec := range r.k.Read(dlqTopic) {
		if event.ParseReason(clickstream.Header(rec, event.ReasonHeader)) == event.TooLarge {
			tooLarge++
		}
	}
	if tooLarge != 1 {
		t.Errorf("%d too_large dead letters, want 1 (the first 600 kB event)", tooLarge)
	}
}

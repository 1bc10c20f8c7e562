package consumer

import (
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"

	"dedupe-worker/internal/bloom"
)

// StageError is a failure that retrying cannot mend: a refused
// authorization, input the filter refuses whatever the retries. It stops
// both stages at once (no test-and-set is sent after it is known), and Run
// returns it, so the process exits non-zero and the orchestrator restarts
// it and shows it. What was decided and not delivered is not committed: it
// is read again and gets its recorded decisions.
type StageError struct {
	// Step is the call that failed, a label of dedupe_errors_total's step
	// (Steps).
	Step string
	// Check says what an operator should look at, e.g. "the worker's Kafka
	// user needs Write on topic clicks-out"; empty when there is nothing
	// more to say than the error.
	Check string
	Err   error
}

func (e *StageError) Error() string {
	if e.Check == "" {
		return fmt.Sprintf("%s failed for good: %v", stepPhrase(e.Step), e.Err)
	}
	return fmt.Sprintf("%s failed for good: %v: %s", stepPhrase(e.Step), e.Err, e.Check)
}

func (e *StageError) Unwrap() error { return e.Err }

// Permanent reports true: retrying cannot help.
func (e *StageError) Permanent() bool { return true }

// permanent reports whether retrying err cannot help: an invalid element
// is a bug, a refused authorization stays refused until an operator
// changes the ACLs, and an error that says so (a Permanent method that
// reports true: a Producer's, a *StageError) is taken at its word.
func permanent(err error) bool {
	if p, ok := errors.AsType[interface {
		error
		Permanent() bool
	}](err); ok && p.Permanent() {
		return true
	}
	return errors.Is(err, bloom.ErrInvalidElement) || errors.Is(err, kafka.TopicAuthorizationFailed) ||
		errors.Is(err, kafka.GroupAuthorizationFailed) || errors.Is(err, kafka.ClusterAuthorizationFailed)
}

// stageError is err, permanent, as a *StageError of step with what to
// check: for a refused authorization, the right the worker's Kafka user
// lacks (the least-privilege ACLs of docs/security.md); topic is the step's
// topic.
func (w *Worker) stageError(step, topic string, err error) *StageError {
	if se, ok := errors.AsType[*StageError](err); ok {
		return se
	}
	se := &StageError{Step: step, Err: err}
	switch {
	case errors.Is(err, kafka.GroupAuthorizationFailed):
		se.Check = "the worker's Kafka user needs Read on group " + w.cfg.GroupID
	case errors.Is(err, kafka.TopicAuthorizationFailed) && (step == StepProduce || step == StepDuplicates || step == StepDeadLetter):
		se.Check = "the worker's Kafka user needs Write on topic " + topic
	case errors.Is(err, kafka.TopicAuthorizationFailed):
		se.Check = "the worker's Kafka user needs Read on topic " + topic
	case errors.Is(err, kafka.ClusterAuthorizationFailed):
		se.Check = "the broker refused a cluster-level request; the worker needs no right on the cluster, so check which request (the error) and the broker's authorizer"
	case errors.Is(err, ErrDeadLetterRefused):
		se.Check = "the dead-letter topic must take any dead letter: cleanup.policy delete (not compact), no message.timestamp bounds, max.message.bytes no smaller than the input topic's"
	case errors.Is(err, bloom.ErrInvalidElement):
		se.Check = "the filter refused an element the worker built: a bug, please report it with this line"
	}
	return se
}

// topicOf is the topic p writes, when it says (sink.Writer does).
func topicOf(p Producer) string {
	if t, ok := p.(interface{ Topic() string }); ok {
		return t.Topic()
	}
	return "(the producer's topic)"
}

package sink

// What a topic can refuse and what Write does about it. The broker answers
// each produce request, one record batch of one partition, with one error
// code for the whole batch; Kafka's error table and kafka-go's Error values
// sort the codes a produce can get into three kinds:
//
//   - refused for the content of the batch: retrying the same batch gets the
//     same answer, but a smaller batch may pass, so Write splits it until one
//     message alone is refused;
//   - permanent: retrying cannot help until an operator changes the cluster
//     (rights, topic configuration), so Write returns at once;
//   - anything else: the broker or the network may do better on the next
//     try (a leader move, a time-out, too few in-sync replicas, a lost
//     connection), so Write retries until its deadline.

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"

	"github.com/segmentio/kafka-go"

	"dedupe-worker/internal/event"
)

// Rejection is a message the topic refused for its content. It is an
// error too: the broker's answer, which says the dead-letter reason of the
// message (event.ReasonOf).
type Rejection struct {
	// Index is the message's position in the slice given to Write.
	Index int
	// Reason is the message's dead-letter reason: event.TooLarge when
	// the message alone is larger than the topic accepts
	// (MESSAGE_TOO_LARGE: its max.message.bytes; RECORD_LIST_TOO_LARGE: its
	// segment.bytes) or than MaxBatchBytes, in which case it is not sent;
	// event.Refused when the broker finds the message alone invalid:
	// INVALID_RECORD (for example no key on a compacted topic),
	// INVALID_TIMESTAMP (a timestamp outside the topic's
	// message.timestamp bounds), or CORRUPT_MESSAGE three times in a row.
	Reason event.Reason
	// Err is the broker's answer to the message sent alone (a kafka.Error
	// inside, e.g. kafka.MessageSizeTooLarge), or, for a message larger
	// than MaxBatchBytes, kafka.MessageSizeTooLarge with its size.
	Err error
}

// Error is the broker's answer, Err.
func (r Rejection) Error() string { return r.Err.Error() }

// Unwrap is Err.
func (r Rejection) Unwrap() error { return r.Err }

// DeadLetterReason is Reason: event.ReasonOf finds it in an error.
func (r Rejection) DeadLetterReason() event.Reason { return r.Reason }

// ErrRejected is inside the error of a Write that had messages rejected
// (WriteError.Rejected).
var ErrRejected = errors.New("refused by the topic for their content")

// ErrPermanent is inside the error of a Write that stopped on a failure
// retrying cannot mend: a refused authorization (TOPIC_AUTHORIZATION_FAILED,
// CLUSTER_AUTHORIZATION_FAILED, a refused SASL login) or a topic the writer
// cannot write as configured (UNSUPPORTED_FOR_MESSAGE_FORMAT,
// UNSUPPORTED_COMPRESSION_TYPE, INVALID_REQUIRED_ACKS, INVALID_TOPIC_EXCEPTION,
// UNSUPPORTED_VERSION), or a closed Writer. A caller that does not know
// this package finds it by its method Permanent, which reports true.
var ErrPermanent error = permanentError("retrying cannot help")

// permanentError is the type of ErrPermanent.
type permanentError string

func (e permanentError) Error() string { return string(e) }

// Permanent reports true: retrying cannot help.
func (permanentError) Permanent() bool { return true }

// WriteError is the error of a Write that did not end with every message
// acknowledged. Write returns no other type of error.
type WriteError struct {
	// Topic is the topic written.
	Topic string
	// Total is the number of messages given to Write.
	Total int
	// Rejected are the messages the topic refused for their content, in
	// ascending Index. Write did not and will not write them.
	Rejected []Rejection
	// Unacked are the indexes, ascending, of the messages neither
	// acknowledged nor rejected. Some of them may have been written all the
	// same (see Write); writing them again is safe for a reader that drops
	// copies by their dedupe-source.
	Unacked []int
	// Err is why Unacked is not empty: the last failure when Write's
	// deadline passed (inside, with context.DeadlineExceeded), ctx's error
	// when it was cancelled, or a failure that retrying cannot mend (with
	// ErrPermanent inside, and the broker's kafka.Error). Err is nil exactly
	// when Unacked is empty: every message was acknowledged but the
	// Rejected ones.
	Err error
}

func (e *WriteError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "writing %d messages to %s:", e.Total, e.Topic)
	if len(e.Rejected) > 0 {
		fmt.Fprintf(&b, " %d rejected (first: message %d, %s: %v)", len(e.Rejected), e.Rejected[0].Index, e.Rejected[0].Reason, e.Rejected[0].Err)
		if e.Err != nil {
			b.WriteString(";")
		}
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " %d not acknowledged: %v", len(e.Unacked), e.Err)
	}
	return b.String()
}

// Unwrap is Err, and ErrRejected when messages were rejected.
func (e *WriteError) Unwrap() []error {
	var errs []error
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if len(e.Rejected) > 0 {
		errs = append(errs, ErrRejected)
	}
	return errs
}

// Refused yields each message of Rejected, in ascending Index: its index
// and the Rejection, an error that says its dead-letter reason.
func (e *WriteError) Refused() iter.Seq2[int, error] {
	return func(yield func(int, error) bool) {
		for _, r := range e.Rejected {
			if !yield(r.Index, r) {
				return
			}
		}
	}
}

// Unacknowledged returns, in a new slice, the messages of msgs (the slice
// given to the Write that returned e) at Unacked, the ones to write again,
// and Err, why they were not acknowledged: none and nil when every message
// but the rejected ones was acknowledged.
func (e *WriteError) Unacknowledged(msgs []kafka.Message) ([]kafka.Message, error) {
	out := make([]kafka.Message, len(e.Unacked))
	for k, i := range e.Unacked {
		out[k] = msgs[i]
	}
	return out, e.Err
}

// outcome is what Write makes of one message's answer.
type outcome uint8

const (
	acked     outcome = iota
	retryable         // try again until the deadline
	tooLarge          // refused for its content: split, or reject as event.TooLarge
	invalid           // refused for its content: split, or reject as event.Refused
	corrupt           // CORRUPT_MESSAGE: split, or reject as event.Refused after corruptTries
	permanent         // stop at once
)

// corruptTries is how many times a message sent alone must be refused with
// CORRUPT_MESSAGE before it is rejected. Kafka lists the code as retriable
// (a batch damaged on its way fails its checksum), but brokers before 2.4
// also answer it for a record they refuse, such as one without a key on a
// compacted topic.
const corruptTries = 3

// classify sorts an answer from kafka-go into an outcome.
func classify(err error) outcome {
	switch {
	case err == nil:
		return acked
	case errors.Is(err, io.ErrClosedPipe): // the Writer is closed
		return permanent
	}
	code, ok := errors.AsType[kafka.Error](err)
	if !ok {
		// A lost connection, a time-out, a context ended: the network's.
		return retryable
	}
	switch code {
	case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge:
		return tooLarge
	case kafka.InvalidRecord, kafka.InvalidTimestamp:
		return invalid
	case kafka.InvalidMessage: // CORRUPT_MESSAGE
		return corrupt
	case kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed, kafka.TransactionalIDAuthorizationFailed,
		kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState, kafka.SecurityDisabled,
		kafka.UnsupportedForMessageFormat, kafka.UnsupportedCompressionType, kafka.InvalidRequiredAcks,
		kafka.InvalidTopic, kafka.UnsupportedVersion:
		return permanent
	}
	// The rest, retriable or not in Kafka's table, is retried: a broker
	// that answers UNKNOWN_SERVER_ERROR, for one, often does better later,
	// and the caller reports the failure while it lasts.
	return retryable
}

// recordSize is a message's size as kafka-go measures it (its
// Message.totalSize): what batches are cut by, and what Write holds
// against MaxBatchBytes before sending a message.
func recordSize(m *kafka.Message) int {
	n := 4 + 1 + 1 + 8 + 4 + len(m.Key) + 4 + len(m.Value) // crc, magic, attributes, timestamp, key, value
	n += varintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += varintLen(len(h.Key)) + len(h.Key) + varintLen(len(h.Value)) + len(h.Value)
	}
	return n
}

// varintLen is the length of n as a zig-zag varint.
func varintLen(n int) int {
	u := uint64(n) << 1
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

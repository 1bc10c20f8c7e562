package consumer

import (
	"context"
	"iter"

	"github.com/segmentio/kafka-go"
)

// Producer writes messages. The worker depends on this contract
// (sink.Writer keeps it):
//   - Write returns nil only once every message is acknowledged by the
//     broker (all in-sync replicas): the worker commits the input offsets
//     after it.
//   - Otherwise its error may be, or wrap, a WriteFailure, which says
//     what became of each message: the worker dead-letters the rejected
//     ones and writes again the unacknowledged ones, and only those. A
//     message not acknowledged may have been written all the same, so
//     copies are possible and carry the same dedupe-source (downstream
//     counts by it). Without a WriteFailure every message counts as not
//     acknowledged.
//   - An error with a method Permanent() bool that reports true inside
//     (sink.ErrPermanent is one): retrying cannot help (a refused
//     authorization, a topic configured so that no write can succeed);
//     the worker stops.
//   - Cancelling ctx makes Write return promptly with an error; it may
//     still hold the messages in a request it abandoned, so the caller
//     does not reuse their buffers.
//   - MaxMessageBytes is the largest message Write takes, key, value and
//     headers; the worker dead-letters larger input without its value
//     rather than forward it.
//   - The worker calls Write from one goroutine at a time.
type Producer interface {
	Write(ctx context.Context, msgs []kafka.Message) error
	MaxMessageBytes() int
}

// WriteFailure is the error of a Write that did not end with every
// message acknowledged, told message by message (*sink.WriteError is
// one).
type WriteFailure interface {
	error
	// Refused yields, in ascending order, the index in the slice given to
	// Write of each message the topic refused for its content, and an
	// error that says why and carries the dead letter's reason
	// (event.ReasonOf: event.TooLarge, whose dead letter leaves the
	// value out, or event.Refused). Those messages are not written.
	Refused() iter.Seq2[int, error]
	// Unacknowledged returns, in a new slice, the messages of msgs (the
	// slice given to Write) neither acknowledged nor refused, and why: none
	// and nil when all the others were acknowledged.
	Unacknowledged(msgs []kafka.Message) ([]kafka.Message, error)
}

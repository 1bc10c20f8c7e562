package consumer

import (
	"github.com/segmentio/kafka-go"

	"dedupe-worker/internal/event"
)

// headerBuf hands out the headers of forwarded messages from a few large
// blocks instead of several small allocations per message: the input's
// headers, then dedupe-source, then the extra ones. The ID aliases the input
// message, which lives as long as the batch. A block that fills up is
// left to the messages that use it and replaced by one twice as large, so
// after a few batches one block holds a whole batch and reset reuses it.
type headerBuf struct {
	headers []kafka.Header
	bytes   []byte
}

// reset makes the current blocks reusable; call it only once no message
// refers to the headers handed out before.
func (b *headerBuf) reset() {
	b.headers, b.bytes = b.headers[:0], b.bytes[:0]
}

// take hands out n bytes that live as long as the messages of the batch:
// the ID of a composite or a value.
func (b *headerBuf) take(n int) []byte {
	if b == nil {
		return make([]byte, n)
	}
	if cap(b.bytes)-len(b.bytes) < n {
		b.bytes = make([]byte, 0, max(n, 2*cap(b.bytes), 8<<10))
	}
	start := len(b.bytes)
	b.bytes = b.bytes[:start+n]
	return b.bytes[start : start+n : start+n]
}

// with is the headers of the message forwarded for m: m's own, its
// dedupe-source, then extra.
func (b *headerBuf) with(m *kafka.Message, extra ...kafka.Header) []kafka.Header {
	n := len(m.Headers) + 1 + len(extra)
	if cap(b.headers)-len(b.headers) < n {
		b.headers = make([]kafka.Header, 0, max(n, 2*cap(b.headers), 256))
	}
	if need := len(m.Topic) + 42; cap(b.bytes)-len(b.bytes) < need {
		b.bytes = make([]byte, 0, max(need, 2*cap(b.bytes), 8<<10))
	}
	start := len(b.bytes)
	b.bytes = sourceOf(m).Append(b.bytes)
	src := b.bytes[start:len(b.bytes):len(b.bytes)]
	first := len(b.headers)
	b.headers = append(b.headers, m.Headers...)
	b.headers = append(b.headers, kafka.Header{Key: event.SourceHeader, Value: src})
	b.headers = append(b.headers, extra...)
	return b.headers[first:len(b.headers):len(b.headers)]
}

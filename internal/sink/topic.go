package sink

// Topic is the topic w writes: the worker names it when the broker
// refuses the writes for good (the right its Kafka user lacks).
func (w *Writer) Topic() string { return w.w.Topic }

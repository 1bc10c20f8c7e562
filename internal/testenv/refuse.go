package testenv

import (
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Refusal makes the broker answer produce requests to one topic with an
// error code for every partition, as a broker does that refuses them (a
// removed Write ACL: TOPIC_AUTHORIZATION_FAILED), while it is on.
type Refusal struct {
	on      atomic.Bool
	refused atomic.Int64
}

// RefuseProduce starts refusing produce requests to topic with err, and
// returns the Refusal, on. The broker runs one control function per
// request kind: a test that refuses produces does not add its own.
func (k *Kafka) RefuseProduce(topic string, err *kerr.Error) *Refusal {
	r := &Refusal{}
	r.on.Store(true)
	k.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		if !r.on.Load() || len(pr.Topics) == 0 || pr.Topics[0].Topic != topic {
			return nil, nil, false
		}
		r.refused.Add(1)
		resp := pr.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range pr.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, err.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return r
}

// Stop lets produce requests through again.
func (r *Refusal) Stop() { r.on.Store(false) }

// Refused is how many produce requests were refused so far.
func (r *Refusal) Refused() int64 { return r.refused.Load() }

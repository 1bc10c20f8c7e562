package testenv

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CreateTopic creates topic with partitions and topic configs (for
// example max.message.bytes, which the broker then enforces on every
// batch), and fails the test if the broker does not within 30 s.
func (k *Kafka) CreateTopic(topic string, partitions int32, configs map[string]string) {
	k.t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, 1
	for name, v := range configs {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = name, kmsg.StringPtr(v)
		rt.Configs = append(rt.Configs, c)
	}
	req.Topics = append(req.Topics, rt)
	resp := k.request("creating "+topic, req).(*kmsg.CreateTopicsResponse)
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		k.t.Fatalf("creating %s: %v", topic, err)
	}
}

// SetTopicConfig sets one config of topic (IncrementalAlterConfigs), for
// example a smaller max.message.bytes, and fails the test if the broker
// does not within 30 s.
func (k *Kafka) SetTopicConfig(topic, name, value string) {
	k.t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Op, c.Value = name, kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(value)
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp := k.request("setting "+name+" of "+topic, req).(*kmsg.IncrementalAlterConfigsResponse)
	if err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); err != nil {
		k.t.Fatalf("setting %s of %s: %v", name, topic, err)
	}
}

// request sends req, one request of the test's own, with a client of the
// test's (the options of ClientOptions) and a deadline of 30 s, and fails
// the test, saying what was being done, if it gets no answer.
func (k *Kafka) request(what string, req kmsg.Request) kmsg.Response {
	k.t.Helper()
	cl, err := kgo.NewClient(k.ClientOptions()...)
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cl.Request(ctx, req)
	if err != nil {
		k.t.Fatalf("%s: %v", what, err)
	}
	return resp
}

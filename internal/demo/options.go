package demo

// The demo's options: their defaults and checks, and how they become each
// replica's configuration and the input records.

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/config"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/consumer"
)

// Options configure a demo run.
type Options struct {
	N        int           // events to produce
	Dup, Bad float64       // shares of repeated and malformed events
	Window   time.Duration // deduplication window
	// Behind stamps the events this long before the clock, as a backlog
	// read after an outage; MaxLag is the workers' lag bound (default 1h).
	Behind, MaxLag time.Duration
	// MaxGrowth is how far a window may grow past Expected (default 64).
	MaxGrowth float64
	P         float64 // target false-positive rate
	// Expected is the filter's capacity: distinct IDs per window. 0 sizes
	// it for the distinct IDs the run is expected to have, so the filter
	// ends the run at its planned load and rate.
	Expected int64
	Seed     uint64
	// IDFrom is where the workers read the ID (DEDUPE_ID_FROM): json (the
	// default: the click_id field, the time in ts), key, header or value.
	// With the last three the event time is in the header TimeHeader, the
	// ID in the key or the header IDHeader, and a malformed event is one
	// without them (for value: with an empty value).
	IDFrom string
	// Mode is the workers' DEDUPE_MODE: drop (the default) or shadow.
	Mode string
	// Progress receives the live progress line (nil: none) and, with
	// Verbose, the workers' log.
	Progress io.Writer
	// Terminal rewrites the progress line in place instead of adding one
	// every two seconds.
	Terminal bool
	Verbose  bool
}

// setDefaults fills the options left zero: the workers' from their own
// defaults, the filter's capacity from the events to produce.
func (o *Options) setDefaults() {
	d := config.Defaults()
	if o.Expected == 0 {
		o.Expected = max(1, int64(math.Ceil(float64(o.N)*(1-o.Dup-o.Bad))))
	}
	o.Seed = cmp.Or(o.Seed, 1)
	o.Window = cmp.Or(o.Window, d.Window)
	o.P = cmp.Or(o.P, d.FalsePositiveRate)
	o.MaxLag = cmp.Or(o.MaxLag, d.MaxLag)
	o.MaxGrowth = cmp.Or(o.MaxGrowth, d.MaxGrowth)
	o.IDFrom = cmp.Or(o.IDFrom, d.IDFrom)
	o.Mode = cmp.Or(o.Mode, d.Mode)
}

// validate checks the options of the demo itself; those it hands to the
// workers are checked by config.Validate, as any worker's are, and named
// by their flags (flagOf).
func (o Options) validate() error {
	switch {
	case o.N < 1 || o.N > 10_000_000:
		return fmt.Errorf("-n %d: want 1 to 10000000 events", o.N)
	case !(o.Dup >= 0 && o.Dup < 1), !(o.Bad >= 0 && o.Bad < 1), o.Dup+o.Bad >= 1:
		return fmt.Errorf("-dup %g, -bad %g: want shares from 0 to below 1, together below 1", o.Dup, o.Bad)
	case o.Behind < 0 || o.Behind > 744*time.Hour:
		return fmt.Errorf("-behind %v: want 0 to 744h", o.Behind)
	}
	err := workerConfig(o, []string{"127.0.0.1:9092"}, "127.0.0.1:6379", ":0").Validate()
	if ve := (*config.VarError)(nil); errors.As(err, &ve) && flagOf[ve.Var] != "" {
		return fmt.Errorf("%s: %s", flagOf[ve.Var], ve.Msg)
	}
	return err
}

// flagOf names the demo flag that sets each worker variable.
var flagOf = map[string]string{"WINDOW": "-window", "MAX_LAG": "-max-lag", "FALSE_POSITIVE_RATE": "-p",
	"EXPECTED_PER_WINDOW": "-expected", "MAX_GROWTH": "-max-growth", "ID_FROM": "-id-from", "MODE": "-mode"}

// partitionsFor is the input's partition count: 8, or more so that no
// partition holds more events than the decision records the verifier
// reads reach back (65,536 offsets), with room for an uneven spread.
func partitionsFor(n int) int32 {
	return int32(max(8, (n+49_999)/50_000))
}

// workerConfig is one replica's configuration, as DEDUPE_* variables would
// give it.
func workerConfig(o Options, brokers []string, redisAddr, httpAddr string) config.Config {
	c := config.Defaults()
	c.Pipeline, c.KafkaBrokers, c.InputTopic, c.OutputTopic, c.DLQTopic = "demo", brokers, InputTopic, OutputTopic, DLQTopic
	c.GroupID, c.RedisAddrs = Group, []string{redisAddr}
	c.IDFrom, c.Mode = o.IDFrom, o.Mode
	switch o.IDFrom {
	case "json":
		c.IDField, c.TimeField = "click_id", "ts"
	case "header":
		c.IDHeader, c.TimeHeader = IDHeader, TimeHeader
	default:
		c.TimeHeader = TimeHeader
	}
	c.Window, c.MaxLag, c.MaxGrowth, c.ExpectedPerWindow, c.FalsePositiveRate = o.Window, o.MaxLag, o.MaxGrowth, o.Expected, o.P
	c.HTTPAddr, c.LogLevel = httpAddr, "warn"
	// A replica stopped by the demo hands its partitions over sooner.
	c.KafkaSessionTimeout, c.ShutdownTimeout = 3*time.Second, 10*time.Second
	return c
}

// record is the input record of click event e for the run's ID source,
// and e as the ground truth knows it: its ID is the one the workers make,
// and a malformed event's value the one its dead letter carries.
func (o Options) record(e clickstream.Event) (*kgo.Record, clickstream.Event) {
	if o.IDFrom == "json" {
		return &kgo.Record{Key: e.Key, Value: e.Value}, e
	}
	r := &kgo.Record{Key: e.Key, Value: e.Value,
		Headers: []kgo.RecordHeader{{Key: TimeHeader, Value: strconv.AppendInt(nil, e.Time.UnixMilli(), 10)}}}
	valid := e.ID != ""
	switch o.IDFrom {
	case "key":
		// A malformed event has no key.
		r.Key = nil
		if valid {
			r.Key = []byte(e.ID)
		}
	case "header":
		if valid {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: IDHeader, Value: []byte(e.ID)})
		}
	case "value":
		// A malformed event has an empty value; any other value is valid,
		// and its ID is its hash.
		if valid {
			e.ID = string(consumer.AppendValueID(nil, e.Value))
		} else {
			r.Value, e.Value = nil, nil
		}
	}
	return r, e
}

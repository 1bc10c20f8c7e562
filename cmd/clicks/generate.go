package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/retry"
)

// kafkaEnv reads the broker list and one topic variable, the only
// settings generate and count need.
func kafkaEnv(topicVar string) ([]string, string, error) {
	var brokers []string
	for _, b := range strings.Split(os.Getenv("DEDUPE_KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return nil, "", fmt.Errorf("DEDUPE_KAFKA_BROKERS: required, not set (host:port[,host:port...])")
	}
	topic := strings.TrimSpace(os.Getenv(topicVar))
	if topic == "" {
		return nil, "", fmt.Errorf("%s: required, not set", topicVar)
	}
	return brokers, topic, nil
}

// retryBackoff is the client's wait before trying a broker again, at
// most a second, so that a broker that comes up is found soon (with
// metadata refreshed every half second at most, not every 5 s).
func retryBackoff(tries int) time.Duration {
	return min(100*time.Millisecond<<min(tries, 4), time.Second)
}

// produceBackoff spaces the tries of a produce that failed.
var produceBackoff = retry.Backoff{First: 500 * time.Millisecond, Max: 5 * time.Second}

// GenerateOptions configure Generate.
type GenerateOptions struct {
	Brokers []string
	Topic   string
	N       int     // events; 0 for no end
	Rate    float64 // events per second at most
	Dup     float64 // share of exact repeats of recent events
	Bad     float64 // share of malformed events
	Seed    uint64  // click IDs differ between seeds
	// Every is the interval of the progress lines written to Log.
	Every time.Duration
	Log   io.Writer
}

// GenerateStats count what Generate produced.
type GenerateStats struct {
	Events, Repeats, Malformed int
}

// Generate produces click events (clickstream.Stream) to the topic at the
// rate asked, until N are acknowledged or ctx ends. A produce that fails
// (Kafka not up yet, the topic not created yet) is logged and tried again
// with backoff; events a failed produce did write are written again, so a
// retry can add a few repeats. After an outage it resumes at the rate
// asked, without catching up.
func Generate(ctx context.Context, o GenerateOptions) (GenerateStats, error) {
	var st GenerateStats
	if o.Rate <= 0 {
		return st, fmt.Errorf("rate %g: want above 0", o.Rate)
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Every <= 0 {
		o.Every = 5 * time.Second
	}
	cl, err := newProducer(o)
	if err != nil {
		return st, err
	}
	defer cl.Close()
	p := &producer{o: o, cl: cl}
	s := clickstream.NewStream(o.Dup, o.Bad, o.Seed, nil)
	start, lastLog := time.Now(), time.Now()
	logged := 0
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for o.N == 0 || st.Events < o.N {
		due := int(o.Rate*time.Since(start).Seconds()) - st.Events
		if due > int(o.Rate)+1 {
			// More than a second behind, after an outage: go on from now.
			start = time.Now().Add(-time.Duration(float64(st.Events) / o.Rate * float64(time.Second)))
			due = 1
		}
		if due <= 0 {
			select {
			case <-ctx.Done():
				return st, nil
			case <-tick.C:
				continue
			}
		}
		k := min(due, 5000)
		if o.N > 0 {
			k = min(k, o.N-st.Events)
		}
		evs := make([]clickstream.Event, k)
		for i := range evs {
			evs[i] = s.Next()
		}
		if err := p.produce(ctx, evs); err != nil { // only when ctx ended
			return st, nil
		}
		st.add(evs)
		if time.Since(lastLog) >= o.Every {
			fmt.Fprintf(o.Log, "generate: %d events (%d repeats, %d malformed), %.0f/s\n", st.Events, st.Repeats, st.Malformed,
				float64(st.Events-logged)/time.Since(lastLog).Seconds())
			lastLog, logged = time.Now(), st.Events
		}
	}
	return st, nil
}

// newProducer is the generator's client: acks from every in-sync
// replica, the topic created if the brokers allow it, and a broker that
// comes up found soon.
func newProducer(o GenerateOptions) (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(o.Brokers...), kgo.DefaultProduceTopic(o.Topic), kgo.AllowAutoTopicCreation(),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(5*time.Millisecond), kgo.ProducerBatchMaxBytes(1_000_000),
		kgo.RetryBackoffFn(retryBackoff), kgo.MetadataMinAge(500*time.Millisecond))
}

// producer writes the generator's events, retrying until they are
// acknowledged, with a warning every 5 s at most while they are not.
type producer struct {
	o        GenerateOptions
	cl       *kgo.Client
	lastWarn time.Time
}

// produce writes evs, trying again with backoff until they are
// acknowledged; it fails only when ctx ends.
func (p *producer) produce(ctx context.Context, evs []clickstream.Event) error {
	return retry.Do(ctx, produceBackoff, func(ctx context.Context) error {
		recs := make([]*kgo.Record, len(evs))
		for i, e := range evs {
			recs[i] = &kgo.Record{Key: e.Key, Value: e.Value}
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return p.cl.ProduceSync(pctx, recs...).FirstErr()
	}, func(err error, _ time.Duration) error {
		if time.Since(p.lastWarn) >= 5*time.Second {
			fmt.Fprintf(p.o.Log, "generate: cannot produce to %s on %s yet, retrying: %v\n", p.o.Topic, strings.Join(p.o.Brokers, ","), why(ctx, p.cl, err))
			p.lastWarn = time.Now()
		}
		return nil
	})
}

// add counts evs, produced.
func (st *GenerateStats) add(evs []clickstream.Event) {
	for _, e := range evs {
		st.Events++
		switch {
		case e.ID == "":
			st.Malformed++
		case e.Dup:
			st.Repeats++
		}
	}
}

// RunGenerate is the generate command.
func RunGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("generate", "Produces click events to DEDUPE_INPUT_TOPIC on DEDUPE_KAFKA_BROKERS, retrying until Kafka is up.", stderr)
	o := GenerateOptions{Log: stderr}
	fs.IntVar(&o.N, "n", 0, "events to produce; 0 for no end (until SIGTERM)")
	fs.Float64Var(&o.Rate, "rate", 1000, "events per second")
	fs.Float64Var(&o.Dup, "dup", 0.07, "share of events that repeat a recent click exactly")
	fs.Float64Var(&o.Bad, "bad", 0.01, "share of malformed events")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of the click IDs (0: from the clock, so restarts make new IDs)")
	fs.DurationVar(&o.Every, "every", 5*time.Second, "interval of the progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "clicks generate: unexpected argument %q\n", fs.Arg(0))
		return 2
	case o.N < 0:
		fmt.Fprintf(stderr, "clicks generate: -n %d: want 0 or more\n", o.N)
		return 2
	case !(o.Rate > 0):
		fmt.Fprintf(stderr, "clicks generate: -rate %g: want above 0\n", o.Rate)
		return 2
	case !(o.Dup >= 0 && o.Bad >= 0 && o.Dup+o.Bad < 1):
		fmt.Fprintf(stderr, "clicks generate: -dup %g, -bad %g: want shares from 0, together below 1\n", o.Dup, o.Bad)
		return 2
	}
	var err error
	if o.Brokers, o.Topic, err = kafkaEnv("DEDUPE_INPUT_TOPIC"); err != nil {
		fmt.Fprintln(stderr, "clicks generate:", err)
		return 2
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	st, err := Generate(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "clicks generate:", err)
		return 1
	}
	fmt.Fprintf(stdout, "generate: produced %d events to %s (%d repeats, %d malformed)\n", st.Events, o.Topic, st.Repeats, st.Malformed)
	return 0
}

// why explains a failed Kafka call: a timeout says little, so it asks the
// brokers whether they can be reached at all.
func why(ctx context.Context, cl *kgo.Client, err error) error {
	if !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if perr := cl.Ping(pctx); perr != nil {
		return perr
	}
	return err
}

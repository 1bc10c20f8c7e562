package app

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	kgoscram "github.com/twmb/franz-go/pkg/sasl/scram"

	"dedupe-worker/config"
	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/event"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testenv"
	"dedupe-worker/internal/testenv/replicas"
)

// kafkaRight is one right of the Kafka ACLs in docs/security.md: an
// operation the worker's principal is allowed on one resource, by literal
// name.
type kafkaRight struct {
	Op       string // as the ACL tool spells it: Read, Write, ...
	Resource string // topic, group or cluster
	Name     string
}

// String is the right as the worker names a missing one: "Write on topic
// out".
func (r kafkaRight) String() string { return r.Op + " on " + r.Resource + " " + r.Name }

// acl is r allowed to principal, as kfake takes it.
func (r kafkaRight) acl(principal string) kfake.ACL {
	op, err := kmsg.ParseACLOperation(r.Op)
	if err != nil {
		panic(err) // parseKafkaACL accepts only operations kmsg knows
	}
	rt := map[string]kmsg.ACLResourceType{"topic": kmsg.ACLResourceTypeTopic, "group": kmsg.ACLResourceTypeGroup,
		"cluster": kmsg.ACLResourceTypeCluster}[r.Resource]
	return kfake.ACL{Principal: principal, Resource: rt, Name: r.Name, Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Operation: op, Allow: true}
}

// docsPrincipal is the principal the documented Kafka ACLs are written for.
const docsPrincipal = "User:dedupe-clicks"

// parseKafkaACL reads one line of the documented Kafka ACLs: a kafka-acls.sh
// command that adds rights for docsPrincipal. It accepts only what
// grants exactly the rights it returns (allow, literal names, any host):
// a line it cannot read in full is an error, never a right skipped.
func parseKafkaACL(line string) ([]kafkaRight, error) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "kafka-acls.sh" {
		return nil, fmt.Errorf("%q: not a kafka-acls.sh command", line)
	}
	var add bool
	var principal, op string
	var res []kafkaRight
	for i := 1; i < len(f); i++ {
		arg := func() (string, error) {
			if i+1 == len(f) || strings.HasPrefix(f[i+1], "--") {
				return "", fmt.Errorf("%q: %s without its value", line, f[i])
			}
			i++
			return f[i], nil
		}
		var v string
		var err error
		switch f[i] {
		case "--add":
			add = true
			continue
		case "--cluster":
			res = append(res, kafkaRight{Resource: "cluster", Name: "kafka-cluster"})
			continue
		case "--bootstrap-server", "--allow-principal", "--operation", "--topic", "--group", "--resource-pattern-type":
			if v, err = arg(); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%q: %s is not read by this test", line, f[i])
		}
		switch f[i-1] {
		case "--allow-principal":
			if principal != "" {
				return nil, fmt.Errorf("%q: more than one principal", line)
			}
			principal = v
		case "--operation":
			if op != "" {
				return nil, fmt.Errorf("%q: more than one operation", line)
			}
			if _, err := kmsg.ParseACLOperation(v); err != nil {
				return nil, fmt.Errorf("%q: %w", line, err)
			}
			op = v
		case "--topic", "--group":
			if strings.ContainsAny(v, "*") {
				return nil, fmt.Errorf("%q: a wildcard in %s", line, v)
			}
			res = append(res, kafkaRight{Resource: strings.TrimPrefix(f[i-1], "--"), Name: v})
		case "--resource-pattern-type":
			if v != "literal" {
				return nil, fmt.Errorf("%q: pattern type %s; only literal names are read", line, v)
			}
		}
	}
	switch {
	case !add:
		return nil, fmt.Errorf("%q: no --add", line)
	case principal != docsPrincipal:
		return nil, fmt.Errorf("%q: principal %q, want %q", line, principal, docsPrincipal)
	case op == "":
		return nil, fmt.Errorf("%q: no --operation", line)
	case len(res) == 0:
		return nil, fmt.Errorf("%q: no resource", line)
	}
	for i := range res {
		res[i].Op = op
	}
	return res, nil
}

// docsKafkaACLs are the rights of the Kafka ACLs in docs/security.md
// (the lines of the fenced block after "<!-- kafka-acl -->", and of the
// one after "<!-- kafka-acl-duplicates -->" for DEDUPE_DUPLICATES_TOPIC,
// written for the pipeline clicks), with the pipeline's names replaced by
// names[resource+" "+name]. It fails the test on a line it cannot read or
// a name it cannot replace.
func docsKafkaACLs(t *testing.T, names map[string]string) []kafkaRight {
	t.Helper()
	return append(readmeKafkaBlock(t, "<!-- kafka-acl -->", names), readmeKafkaBlock(t, "<!-- kafka-acl-duplicates -->", names)...)
}

// readmeKafkaBlock is docsKafkaACLs for the block after marker.
func readmeKafkaBlock(t *testing.T, marker string, names map[string]string) []kafkaRight {
	t.Helper()
	f, err := os.Open("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rights []kafkaRight
	sc := bufio.NewScanner(f)
	found, fence := false, false
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == marker:
			found = true
			continue
		case !found:
			continue
		case strings.HasPrefix(l, "```") && !fence:
			fence = true
			continue
		case !fence:
			t.Fatalf("docs/security.md: %q between %s and its block", l, marker)
		}
		if strings.HasPrefix(l, "```") {
			break
		}
		rs, err := parseKafkaACL(l)
		if err != nil {
			t.Fatalf("docs/security.md's Kafka ACLs: %v", err)
		}
		for _, r := range rs {
			n, ok := names[r.Resource+" "+r.Name]
			if !ok {
				t.Fatalf("docs/security.md's Kafka ACLs: %v: not a resource of the pipeline clicks", r)
			}
			r.Name = n
			rights = append(rights, r)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rights) == 0 {
		t.Fatalf("docs/security.md: no Kafka ACLs after %s", marker)
	}
	return rights
}

// aclWorkerUser is the Kafka user the worker logs in as in these tests.
const aclWorkerUser = "dedupe-sec"

// workerKafkaACLs are the documented Kafka ACLs for the secured tests'
// worker (secureConfig's topics and group).
func workerKafkaACLs(t *testing.T) []kafkaRight {
	t.Helper()
	cfg := secureConfig(nil, nil)
	rights := docsKafkaACLs(t, map[string]string{
		"topic click-log": cfg.InputTopic, "topic click-log-deduped": cfg.OutputTopic, "topic click-log-dlq": cfg.DLQTopic,
		"topic click-log-duplicates": aclDuplicatesTopic, "group dedupe-clicks": cfg.GroupID,
	})
	// The scenarios below take away each right the page gives; these
	// five must be among them.
	for _, want := range []kafkaRight{{"Read", "topic", cfg.InputTopic}, {"Read", "group", cfg.GroupID},
		{"Write", "topic", cfg.OutputTopic}, {"Write", "topic", cfg.DLQTopic}, {"Write", "topic", aclDuplicatesTopic}} {
		if !slices.Contains(rights, want) {
			t.Fatalf("docs/security.md's Kafka ACLs, for the test's names: %v; want %v among them", rights, want)
		}
	}
	return rights
}

// startACLKafka is a kfake broker that checks ACLs: the test's clients log
// in as a superuser, the worker as aclWorkerUser with password pass and
// exactly rights.
func startACLKafka(t *testing.T, pass string, rights []kafkaRight) *testenv.Kafka {
	t.Helper()
	adminPass := password(t, "admin")
	var acls []kfake.ACL
	for _, r := range rights {
		acls = append(acls, r.acl("User:"+aclWorkerUser))
	}
	return testenv.StartKafka(t, testenv.Topics{"in": 2, "out": 2, "dlq": 2, aclDuplicatesTopic: 2}, kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(config.SASLScramSHA256, "admin", adminPass),
		kfake.User(config.SASLScramSHA256, aclWorkerUser, pass, acls...),
	).WithClientOptions(kgo.RequestRetries(3), kgo.SASL(kgoscram.Auth{User: "admin", Pass: adminPass}.AsSha256Mechanism()))
}

// aclConfig is the secured tests' worker on k as aclWorkerUser, with a
// Redis without users, writing the copies it drops to aclDuplicatesTopic.
func aclConfig(k *testenv.Kafka, redisAddr, pass string) config.Config {
	cfg := secureConfig(k.Addrs(), []string{redisAddr})
	cfg.KafkaSASLMechanism, cfg.KafkaSASLUsername, cfg.KafkaSASLPassword = config.SASLScramSHA256, aclWorkerUser, config.Secret(pass)
	cfg.DuplicatesTopic = aclDuplicatesTopic
	return cfg
}

// aclDuplicatesTopic is the ACL tests' DEDUPE_DUPLICATES_TOPIC.
const aclDuplicatesTopic = "dups"

func TestParseKafkaACL(t *testing.T) {
	const head = "kafka-acls.sh --bootstrap-server B --add --allow-principal User:dedupe-clicks "
	for _, tc := range []struct {
		line string
		want []kafkaRight // nil: refused
	}{
		{head + "--operation Read --topic a --group g", []kafkaRight{{"Read", "topic", "a"}, {"Read", "group", "g"}}},
		{head + "--operation Write --topic a --topic b --resource-pattern-type literal", []kafkaRight{{"Write", "topic", "a"}, {"Write", "topic", "b"}}},
		{head + "--operation IdempotentWrite --cluster", []kafkaRight{{"IdempotentWrite", "cluster", "kafka-cluster"}}},
		{head + "--operation Read --topic a --resource-pattern-type prefixed", nil},
		{head + "--operation Read --topic *", nil},
		{head + "--operation Read --topic a --allow-host 10.0.0.1", nil},
		{head + "--operation Read --topic a --deny-principal User:x", nil},
		{head + "--operation Read --operation Write --topic a", nil},
		{head + "--operation Fly --topic a", nil},
		{head + "--operation Read", nil},
		{head + "--operation Read --topic", nil},
		{"kafka-acls.sh --add --allow-principal User:other --operation Read --topic a", nil},
		{"kafka-acls.sh --remove --allow-principal User:dedupe-clicks --operation Read --topic a", nil},
		{"kafka-acls.sh --allow-principal User:dedupe-clicks --operation Read --topic a", nil},
	} {
		got, err := parseKafkaACL(tc.line)
		if tc.want == nil {
			if err == nil {
				t.Errorf("%q: read as %v; want it refused", tc.line, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.line, got, err, tc.want)
		}
	}
}

// The worker logs in to a broker that checks ACLs, with exactly the
// documented Kafka ACLs, and goes end to end: each first-seen event
// forwarded once, the malformed one dead-lettered. No request of its was
// refused (its log at debug level, kafka-go's own messages included, has
// no authorization failure), and the rules bite: the same user may not
// write the input or read the output.
func TestRunUnderTheDocumentedKafkaACLs(t *testing.T) {
	rights := workerKafkaACLs(t)
	pass := password(t, "kafka")
	k := startACLKafka(t, pass, rights)
	srv := testenv.Redis(t)
	cfg := aclConfig(k, srv.Addr, pass)
	logs, logger := newCapture(t)
	start := time.Now()
	r := replicas.Start(t, cfg, runWorker, logger)
	endToEnd(t, k, r)
	// The 10 copies dropped, each once, unchanged, marked.
	dups := k.Read(aclDuplicatesTopic)
	sources := map[string]bool{}
	for _, rec := range dups {
		sources[clickstream.Header(rec, event.SourceHeader)] = true
		if v := clickstream.Header(rec, event.VerdictHeader); v != "duplicate" {
			t.Errorf("a copy in %s has dedupe-verdict %q", aclDuplicatesTopic, v)
		}
	}
	if len(dups) != 10 || len(sources) != 10 {
		t.Errorf("%s holds %d records of %d sources; want the 10 copies dropped", aclDuplicatesTopic, len(dups), len(sources))
	}
	m := r.Metrics()
	if err := r.Stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !m.Has("dedupe_events_forwarded_total") {
		t.Fatal("no metrics scraped after the events went through")
	}
	t.Logf("end to end under %v in %v", rights, time.Since(start).Round(time.Millisecond))
	if got := m.Value("dedupe_errors_total"); got != 0 {
		t.Errorf("%g errors counted:\n%s", got, m.Show("dedupe_errors_total"))
	}
	text := logs.String()
	if !strings.Contains(text, `"kafka_sasl_username":"`+aclWorkerUser+`"`) {
		t.Fatalf("the captured log does not show the run (no kafka_sasl_username %s)", aclWorkerUser)
	}
	for _, refusal := range []string{"Authorization Failed", "AUTHORIZATION_FAILED"} {
		if strings.Contains(text, refusal) {
			t.Errorf("the worker's log shows %q:\n%s", refusal, text)
		}
	}
	kafkaRulesBite(t, k, pass, cfg)
}

// kafkaRulesBite checks, as the worker's user, that the broker holds it
// to its rights: it may not write its input topic nor read its output.
func kafkaRulesBite(t *testing.T, k *testenv.Kafka, pass string, cfg config.Config) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addrs()...), kgo.RequestRetries(0),
		kgo.SASL(kgoscram.Auth{User: aclWorkerUser, Pass: pass}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md := kmsg.NewPtrMetadataRequest()
	for _, topic := range []string{cfg.InputTopic, cfg.OutputTopic} {
		mt := kmsg.NewMetadataRequestTopic()
		mt.Topic = kmsg.StringPtr(topic)
		md.Topics = append(md.Topics, mt)
	}
	resp, err := md.RequestWith(ctx, cl)
	if err != nil || len(resp.Topics) != 2 {
		t.Fatalf("metadata as the worker's user: %v", err)
	}
	// The output is described (Write implies Describe) but not readable;
	// the input is readable but not writable.
	ids := map[string][16]byte{}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
			t.Fatalf("metadata of %s as the worker's user: %v", *rt.Topic, err)
		}
		ids[*rt.Topic] = rt.TopicID
	}
	pr := kmsg.NewPtrProduceRequest()
	pr.Acks, pr.TimeoutMillis = -1, 5000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic, pt.TopicID = cfg.InputTopic, ids[cfg.InputTopic]
	pp := kmsg.NewProduceRequestTopicPartition()
	pt.Partitions = append(pt.Partitions, pp)
	pr.Topics = append(pr.Topics, pt)
	presp, err := pr.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("producing to %s as the worker's user: %v", cfg.InputTopic, err)
	}
	if got := kerr.ErrorForCode(presp.Topics[0].Partitions[0].ErrorCode); !errors.Is(got, kerr.TopicAuthorizationFailed) {
		t.Errorf("producing to %s as the worker's user: %v; want TOPIC_AUTHORIZATION_FAILED", cfg.InputTopic, got)
	}
	fr := kmsg.NewPtrFetchRequest()
	fr.MaxWaitMillis, fr.MaxBytes = 100, 1<<20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic, ft.TopicID = cfg.OutputTopic, ids[cfg.OutputTopic]
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.PartitionMaxBytes = 1 << 20
	ft.Partitions = append(ft.Partitions, fp)
	fr.Topics = append(fr.Topics, ft)
	fresp, err := fr.RequestWith(ctx, cl)
	if err != nil || len(fresp.Topics) != 1 || len(fresp.Topics[0].Partitions) != 1 {
		t.Fatalf("fetching %s as the worker's user: %v", cfg.OutputTopic, err)
	}
	if got := kerr.ErrorForCode(fresp.Topics[0].Partitions[0].ErrorCode); !errors.Is(got, kerr.TopicAuthorizationFailed) {
		t.Errorf("fetching %s as the worker's user: %v; want TOPIC_AUTHORIZATION_FAILED", cfg.OutputTopic, got)
	}
}

// aclInput is 30 events with 20 distinct IDs and a malformed one, spread
// over the input's partitions, and what they hold.
func aclInput() ([]*kgo.Record, clickstream.Truth) {
	const bad = `{"id": oops`
	tr := clickstream.Truth{Valid: map[string]bool{}, Bad: map[string]bool{bad: true}, Malformed: 1, Total: 31}
	var recs []*kgo.Record
	for i := 0; i < 30; i++ {
		id := fmt.Sprintf("e%d", i%20)
		tr.Valid[id] = true
		recs = append(recs, &kgo.Record{Key: []byte(strconv.Itoa(i % 4)), Value: []byte(`{"id":"` + id + `"}`)})
		if i == 10 {
			recs = append(recs, &kgo.Record{Key: []byte("bad"), Value: []byte(bad)})
		}
	}
	return recs, tr
}

// failBound is how long a worker lacking a right may take to stop: the
// start (Kafka and Redis checks), kafka-go's three attempts at joining
// the group with a back-off between them, a first batch, leaving the
// group. It stops in about 2 s on an idle machine.
const failBound = 20 * time.Second

// Each right of the documented Kafka ACLs is needed: without it the worker
// stops by itself, Run returning an error that names the missing right
// in the form "needs Write on topic out", and nothing reaches the topic it
// could not write (nor any output, for a missing Read). Given the right
// back (an administrator's CreateACLs, while the broker runs), a restarted
// worker forwards every first-seen event once and dead-letters the
// malformed one: nothing lost.
//
// Readiness is logged, not asserted: the worker may be ready before it
// meets the refusal (it has not joined the group yet, or has not written
// its first batch), and after the refusal Run returns without retrying,
// so /readyz could answer "unready" only while the worker leaves the
// group: too short a time for a poll to be sure to see it.
func TestRunWithoutEachKafkaRight(t *testing.T) {
	rights := workerKafkaACLs(t)
	for _, missing := range rights {
		t.Run("without "+missing.String(), func(t *testing.T) {
			var others []kafkaRight
			for _, r := range rights {
				if r != missing {
					others = append(others, r)
				}
			}
			pass := password(t, "kafka")
			k := startACLKafka(t, pass, others)
			srv := testenv.Redis(t)
			recs, tr := aclInput()
			k.Produce("in", recs...)
			cfg := aclConfig(k, srv.Addr, pass)
			logs, logger := newCapture(t)

			start := time.Now()
			r := replicas.Start(t, cfg, runWorker, logger)
			wasReady := false
			if !testenv.Until(failBound, func() bool {
				select {
				case <-r.Done():
					return true
				default:
					wasReady = wasReady || r.Ready()
					return false
				}
			}) {
				t.Fatalf("without %v the worker still runs after %v (ready now: %v); its log:\n%s", missing, failBound, r.Ready(), logs.String())
			}
			took := time.Since(start)
			err := r.Err()
			if err == nil {
				t.Fatalf("without %v Run returned nil by itself; want an error", missing)
			}
			t.Logf("without %v: Run returned after %v (seen ready before: %v): %v", missing, took.Round(time.Millisecond), wasReady, err)
			if want := "needs " + missing.String(); !strings.Contains(err.Error(), want) {
				t.Errorf("Run returned %q; want it to say %q", err, want)
			}
			// Without a Read right the reader never joins the group: the
			// worker must never have answered ready.
			if missing.Op == "Read" && wasReady {
				t.Errorf("without %v the worker answered ready before it stopped", missing)
			}
			// What the missing right guards got nothing.
			guarded := []string{cfg.OutputTopic, cfg.DLQTopic, aclDuplicatesTopic}
			if missing.Op == "Write" {
				guarded = []string{missing.Name}
			}
			for _, topic := range guarded {
				if got := k.Read(topic); len(got) != 0 {
					t.Errorf("without %v, %d records reached %s", missing, len(got), topic)
				}
			}

			// The right given back, a new worker finishes the job.
			k.AddACL(missing.acl("User:" + aclWorkerUser))
			cfg.HTTPAddr = redisproc.FreeAddr()
			r2 := replicas.Start(t, cfg, runWorker, logger)
			decided := testenv.Until(30*time.Second, func() bool {
				return clickstream.DistinctSources(k.Read(cfg.OutputTopic)) >= len(tr.Valid) &&
					clickstream.DistinctSources(k.Read(cfg.DLQTopic)) >= tr.Malformed
			})
			if err := r2.Stop(); err != nil {
				t.Fatalf("the restarted worker: %v", err)
			}
			rep := clickstream.Check(tr, k.Read(cfg.OutputTopic), k.Read(cfg.DLQTopic))
			if !decided || !rep.OK() || rep.Lost != 0 {
				t.Fatalf("with %v given back, within 30 s: %v", missing, rep)
			}
			t.Logf("with %v given back: %v", missing, rep)
		})
	}
}

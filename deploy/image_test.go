package deploy

// The images built and run for real. scripts/image-test builds them and
// runs these tests with the variables below set; without them the tests
// are skipped (go test ./... on a machine without Docker).
//
//	DEDUPE_TEST_DOCKER         the docker CLI to use (default: docker)
//	DEDUPE_TEST_IMAGE          the worker's image (the Dockerfile's default target)
//	DEDUPE_TEST_CLICKS_IMAGE   the clicks image (--target clicks)

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"dedupe-worker/internal/clickstream"
	"dedupe-worker/internal/redisproc"
	"dedupe-worker/internal/testenv"
)

// docker runs the docker CLI and returns what it printed, stdout and
// stderr together; it is given limit to finish.
func docker(limit time.Duration, args ...string) (string, error) {
	cli := os.Getenv("DEDUPE_TEST_DOCKER")
	if cli == "" {
		cli = "docker"
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", cli, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// imageUnderTest is the image a variable names, or skips the test.
func imageUnderTest(t *testing.T, variable string) string {
	t.Helper()
	img := os.Getenv(variable)
	if img == "" {
		t.Skipf("%s is not set: scripts/image-test builds the images and runs this test", variable)
	}
	if _, err := docker(30*time.Second, "image", "inspect", img); err != nil {
		t.Fatalf("%s=%s: %v", variable, img, err)
	}
	return img
}

// container runs img detached under name with the README's hardening, the
// settings of config/clicks.env and env on top (loopback addresses: the
// container shares the host's network), and removes it when the test
// ends, printing its log if the test failed.
func container(t *testing.T, img, name string, env map[string]string, args ...string) {
	t.Helper()
	run := []string{"run", "-d", "--name", name, "--network", "host",
		"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--user", "65532:65532",
		"--env-file", repoPath("config", "clicks.env")}
	for _, k := range sortedKeys(env) {
		run = append(run, "-e", k+"="+env[k])
	}
	run = append(run, img)
	docker(30*time.Second, "rm", "-f", name) // one left by a run that was killed
	if _, err := docker(time.Minute, append(run, args...)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := docker(30*time.Second, "logs", name)
			t.Logf("%s's log:\n%s", name, log)
		}
		docker(time.Minute, "rm", "-f", name)
	})
}

// clicksTopics are the topics config/clicks.env names.
func clicksTopics(t *testing.T) (in, out, dlq string) {
	t.Helper()
	env, err := parseEnvFile(readRepoFile(t, "config", "clicks.env"))
	if err != nil {
		t.Fatal(err)
	}
	return env["DEDUPE_INPUT_TOPIC"], env["DEDUPE_OUTPUT_TOPIC"], env["DEDUPE_DLQ_TOPIC"]
}

// stopGrace is the grace period docker stop gives the worker: the
// compose file's stop_grace_period, longer than the worker's shutdown
// bound (docs/operations.md, Replicas).
const stopGrace = 70 * time.Second

// The worker's image, run as the README runs it (read-only, no
// capabilities, no new privileges, user 65532, config/clicks.env) against
// the test broker and a redis-server on loopback: it turns ready,
// deduplicates a stream with nothing lost and no duplicate passed, answers
// /metrics, and stops on docker stop with exit 0 well within the grace
// period. The image's size and the time to ready are logged.
func TestWorkerImage(t *testing.T) {
	img := imageUnderTest(t, "DEDUPE_TEST_IMAGE")
	in, out, dlq := clicksTopics(t)
	k := testenv.StartKafka(t, testenv.Topics{in: 6, out: 6, dlq: 1})
	srv := testenv.Redis(t)
	addr := redisproc.FreeAddr()
	name := fmt.Sprintf("dedupe-image-test-%d", os.Getpid())
	started := time.Now()
	container(t, img, name, map[string]string{"DEDUPE_KAFKA_BROKERS": strings.Join(k.Addrs(), ","),
		"DEDUPE_REDIS_ADDRS": srv.Addr, "DEDUPE_HTTP_ADDR": addr})
	testenv.Eventually(t, time.Minute, "the container to answer /readyz with 200", func() bool { return testenv.Status("http://"+addr+"/readyz") == 200 })
	ready := time.Since(started)

	recs, tr := clickstream.Generate(20_000, 0.07, 0.01, 33)
	k.Produce(in, recs...)
	testenv.Eventually(t, 2*time.Minute, "every valid event forwarded and every malformed one dead-lettered", func() bool {
		return clickstream.DistinctSources(k.Read(out)) >= len(tr.Valid) && clickstream.DistinctSources(k.Read(dlq)) >= tr.Malformed
	})
	rep := clickstream.Check(tr, k.Read(out), k.Read(dlq))
	if !rep.OK() || rep.Lost != 0 || rep.DuplicatesPass != 0 || rep.Replays != 0 {
		t.Errorf("the container's output: %v", rep)
	}
	m, err := testenv.Scrape(context.Background(), "http://"+addr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Value("dedupe_events_in_total"); got != float64(len(recs)) {
		t.Errorf("dedupe_events_in_total is %g, want %d", got, len(recs))
	}

	stopAt := time.Now()
	if _, err := docker(stopGrace+30*time.Second, "stop", "-t", strconv.Itoa(int(stopGrace.Seconds())), name); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(stopAt)
	state, err := docker(30*time.Second, "inspect", "-f", "{{.State.ExitCode}} {{.State.OOMKilled}}", name)
	if err != nil {
		t.Fatal(err)
	}
	if state != "0 false" {
		t.Errorf("after docker stop: exit code and OOM-killed %q, want \"0 false\"", state)
	}
	// A stop that took the whole grace period ended in SIGKILL (exit 137);
	// a clean one takes seconds.
	if stopped >= stopGrace/2 {
		t.Errorf("docker stop took %v, half the grace period of %v or more", stopped.Round(time.Millisecond), stopGrace)
	}
	log, err := docker(30*time.Second, "logs", name)
	if err != nil {
		t.Fatal(err)
	}
	if lines := regexp.MustCompile(`(?m)^.*"level":"(error|fatal|panic)".*$`).FindAllString(log, -1); len(lines) > 0 {
		t.Errorf("the worker logged %d errors, the first: %s", len(lines), lines[0])
	}
	size, err := docker(30*time.Second, "image", "inspect", "-f", "{{.Size}}", img)
	if err != nil {
		t.Fatal(err)
	}
	bytes, _ := strconv.ParseFloat(size, 64)
	t.Logf("image %s: %.1f MB; /readyz 200 %v after docker run; %d events deduplicated (%v); docker stop took %v, exit 0",
		img, bytes/1e6, ready.Round(time.Millisecond), len(recs), rep, stopped.Round(time.Millisecond))
}

// The clicks image generates click events into the input topic and counts
// an output topic by dedupe-source, as the compose demo runs it.
func TestClicksImage(t *testing.T) {
	img := imageUnderTest(t, "DEDUPE_TEST_CLICKS_IMAGE")
	in, out, _ := clicksTopics(t)
	k := testenv.StartKafka(t, testenv.Topics{in: 6, out: 6})
	brokers := map[string]string{"DEDUPE_KAFKA_BROKERS": strings.Join(k.Addrs(), ",")}

	// generate: -n events, then exit 0 with a line of what it produced.
	name := fmt.Sprintf("dedupe-clicks-test-%d", os.Getpid())
	const n = 3000
	container(t, img, name+"-generate", brokers, "generate", "-n", strconv.Itoa(n), "-rate", "10000")
	if code, err := docker(time.Minute, "wait", name+"-generate"); err != nil || code != "0" {
		t.Fatalf("clicks generate: exit %q, %v", code, err)
	}
	log, err := docker(30*time.Second, "logs", name+"-generate")
	if err != nil {
		t.Fatal(err)
	}
	var events, repeats, malformed int
	if _, err := fmt.Sscanf(log[strings.LastIndex(log, "generate: produced"):], "generate: produced %d events to "+in+" (%d repeats, %d malformed)",
		&events, &repeats, &malformed); err != nil || events != n {
		t.Fatalf("clicks generate's last line does not say %d events produced: %v\n%s", n, err, log)
	}
	// A repeat is an exact copy; every other event, malformed or not, is
	// a payload of its own.
	recs := k.Read(in)
	payloads := map[string]bool{}
	for _, r := range recs {
		payloads[string(r.Value)] = true
	}
	if len(recs) != n || len(payloads) != n-repeats || malformed == 0 {
		t.Errorf("the input holds %d records, %d distinct; generate said %d events, %d repeats, %d malformed",
			len(recs), len(payloads), n, repeats, malformed)
	}

	// count: the output as the worker writes it, one event written twice.
	var written []*kgo.Record
	for i, r := range recs[:100] {
		rec := &kgo.Record{Value: r.Value, Headers: []kgo.RecordHeader{
			{Key: clickstream.SourceHeader, Value: fmt.Appendf(nil, "%s/%d/%d", in, r.Partition, r.Offset)},
			{Key: clickstream.IDHeader, Value: fmt.Appendf(nil, "id-%d", i)}}}
		written = append(written, rec)
	}
	again := *written[0]
	written = append(written, &again)
	k.Produce(out, written...)
	container(t, img, name+"-count", brokers, "count")
	const want = "records 101, distinct sources 100, replays 1, distinct dedupe-id 100"
	testenv.Eventually(t, time.Minute, "clicks count to print "+want, func() bool {
		log, _ := docker(30*time.Second, "logs", name+"-count")
		return strings.Contains(log, want)
	})
	if _, err := docker(time.Minute, "stop", name+"-count"); err != nil {
		t.Fatal(err)
	}
	log, err = docker(30*time.Second, "logs", name+"-count")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log, want+" (final)") {
		t.Errorf("clicks count's final line is not %q:\n%s", want+" (final)", log)
	}
}

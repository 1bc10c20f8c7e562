package deploy

// The compose demo brought up for real (scripts/image-test runs this):
//
//	DEDUPE_TEST_COMPOSE        Compose v2, run as a program (docker-compose)
//	DEDUPE_TEST_BROKER_IMAGE   the test broker's image (cmd/test-broker), Kafka's stand-in
//	DEDUPE_TEST_REDIS_IMAGE    an image of Debian's redis-server, Redis's stand-in
//	DEDUPE_TEST_GOPROXY        the module proxy the image builds use (optional)

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// composeOverride replaces what cannot be pulled here and nothing else:
// Kafka and its topic step by the test broker, Redis by Debian's
// redis-server. The daemon these tests run on has no bridge network, so
// every service shares the host's: the addresses move to free loopback
// ports, the published ports go, and the builds use the host's network
// (and the machine's module proxy) as well. Env files, depends_on and
// health checks, read-only root file systems, dropped capabilities, the
// two workers, the generator and the counter stay as the file has them.
const composeOverride = `services:
  kafka:
    image: {{broker}}
    hostname: !reset null
    environment: !reset {}
    command: ["serve", "-port", "{{kafkaPort}}"]
    network_mode: host
    ports: !reset []
    healthcheck:
      test: ["CMD", "/test-broker", "ping", "-brokers", "127.0.0.1:{{kafkaPort}}", "-timeout", "2s"]
      interval: 1s
      start_period: 0s
  kafka-init:
    image: {{broker}}
    network_mode: host
    entrypoint: ["/test-broker"]
    command: ["create-topics", "-brokers", "127.0.0.1:{{kafkaPort}}", "-partitions", "6", "{{in}}", "{{out}}", "{{dlq}}"]
  redis:
    image: {{redis}}
    network_mode: host
    command: ["redis-server", "--appendonly", "yes", "--port", "{{redisPort}}"]
    healthcheck:
      test: ["CMD", "redis-cli", "-p", "{{redisPort}}", "ping"]
      interval: 1s
  worker-1:
    network_mode: host
    ports: !reset []
    build: {network: host, args: {GOPROXY: "{{goproxy}}"}}
    environment: {DEDUPE_KAFKA_BROKERS: "127.0.0.1:{{kafkaPort}}", DEDUPE_REDIS_ADDRS: "127.0.0.1:{{redisPort}}", DEDUPE_HTTP_ADDR: "127.0.0.1:{{worker1}}"}
  worker-2:
    network_mode: host
    ports: !reset []
    build: {network: host, args: {GOPROXY: "{{goproxy}}"}}
    environment: {DEDUPE_KAFKA_BROKERS: "127.0.0.1:{{kafkaPort}}", DEDUPE_REDIS_ADDRS: "127.0.0.1:{{redisPort}}", DEDUPE_HTTP_ADDR: "127.0.0.1:{{worker2}}"}
  generator:
    network_mode: host
    build: {network: host, args: {GOPROXY: "{{goproxy}}"}}
    environment: {DEDUPE_KAFKA_BROKERS: "127.0.0.1:{{kafkaPort}}"}
  counter:
    network_mode: host
    build: {network: host, args: {GOPROXY: "{{goproxy}}"}}
    environment: {DEDUPE_KAFKA_BROKERS: "127.0.0.1:{{kafkaPort}}"}
`

// totalsLine is a line of clicks count's running totals.
var totalsLine = regexp.MustCompile(`count: records (\d+), distinct sources (\d+), replays (\d+), distinct dedupe-id (\d+)`)

// The compose demo, up: two workers turn ready, the generator's stream is
// deduplicated (every input event forwarded or dead-lettered, no ID
// forwarded from two sources), the counter's totals are the output's, and
// docker compose down -v leaves no container, volume or network behind.
func TestComposeDemoUp(t *testing.T) {
	compose := os.Getenv("DEDUPE_TEST_COMPOSE")
	if compose == "" {
		t.Skip("DEDUPE_TEST_COMPOSE is not set: scripts/image-test fetches Compose v2 and runs this test")
	}
	broker, redisImage := os.Getenv("DEDUPE_TEST_BROKER_IMAGE"), os.Getenv("DEDUPE_TEST_REDIS_IMAGE")
	if broker == "" || redisImage == "" {
		t.Fatal("DEDUPE_TEST_BROKER_IMAGE and DEDUPE_TEST_REDIS_IMAGE must name the stand-ins of Kafka and Redis")
	}
	in, out, dlq := clicksTopics(t)
	ports := map[string]string{}
	for _, k := range []string{"kafkaPort", "redisPort", "worker1", "worker2"} {
		p, err := redisproc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[k] = strconv.Itoa(p)
	}
	override := composeOverride
	for k, v := range map[string]string{"broker": broker, "redis": redisImage, "goproxy": os.Getenv("DEDUPE_TEST_GOPROXY"),
		"in": in, "out": out, "dlq": dlq, "kafkaPort": ports["kafkaPort"], "redisPort": ports["redisPort"],
		"worker1": ports["worker1"], "worker2": ports["worker2"]} {
		override = strings.ReplaceAll(override, "{{"+k+"}}", v)
	}
	overridePath := filepath.Join(t.TempDir(), "compose.test.yml")
	if err := os.WriteFile(overridePath, []byte(override), 0o644); err != nil {
		t.Fatal(err)
	}
	project := fmt.Sprintf("dedupe-demo-test-%d", os.Getpid())
	run := func(limit time.Duration, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		all := append([]string{"-f", repoPath("docker-compose.yml"), "-f", overridePath, "-p", project}, args...)
		b, err := exec.CommandContext(ctx, compose, all...).CombinedOutput()
		if err != nil {
			return string(b), fmt.Errorf("docker-compose %s: %w\n%s", strings.Join(args, " "), err, tail(string(b), 4096))
		}
		return string(b), nil
	}
	down := func() (string, error) { return run(3*time.Minute, "down", "-v", "--remove-orphans") }
	down() // a project left by a run that was killed
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := run(time.Minute, "logs", "--no-color")
			t.Logf("the services' logs (the last 8 kB):\n%s", tail(logs, 8<<10))
		}
		down()
	})
	upAt := time.Now()
	if _, err := run(10*time.Minute, "up", "-d", "--build"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"worker1", "worker2"} {
		testenv.Eventually(t, 2*time.Minute, w+" to answer /readyz with 200", func() bool {
			return testenv.Status("http://127.0.0.1:"+ports[w]+"/readyz") == 200
		})
	}
	t.Logf("both workers ready %v after docker-compose up -d --build", time.Since(upAt).Round(time.Millisecond))
	counted := func() []string {
		logs, _ := run(time.Minute, "logs", "--no-color", "--no-log-prefix", "counter")
		all := totalsLine.FindAllStringSubmatch(logs, -1)
		if len(all) == 0 {
			return nil
		}
		return all[len(all)-1][1:]
	}
	testenv.Eventually(t, 2*time.Minute, "the counter to count 2,000 records or more", func() bool {
		c := counted()
		n := 0
		if c != nil {
			n, _ = strconv.Atoi(c[0])
		}
		return n >= 2000
	})
	if _, err := run(time.Minute, "stop", "generator"); err != nil {
		t.Fatal(err)
	}

	// Every input event is forwarded or dead-lettered, by its ID and
	// dedupe-source; then the counter's totals are the output's.
	brokers := []string{"127.0.0.1:" + ports["kafkaPort"]}
	read := func(topic string) []*kgo.Record {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		recs, err := clickstream.ReadToEnd(ctx, brokers, topic)
		if err != nil {
			t.Fatalf("reading %s: %v", topic, err)
		}
		return recs
	}
	var input, output, dead []*kgo.Record
	var lost []string
	if !testenv.Until(2*time.Minute, func() bool {
		input, output, dead = read(in), read(out), read(dlq)
		lost = missing(in, input, output, dead)
		return len(input) > 0 && len(lost) == 0
	}) {
		t.Fatalf("%d input events, %d forwarded, %d dead-lettered; neither forwarded nor dead-lettered (the first 10): %v", len(input), len(output), len(dead), lost)
	}
	sources, ids, idSources := map[string]bool{}, map[string]bool{}, map[string]map[string]bool{}
	for _, r := range output {
		src, id := clickstream.Header(r, clickstream.SourceHeader), clickstream.Header(r, clickstream.IDHeader)
		sources[src], ids[id] = true, true
		if idSources[id] == nil {
			idSources[id] = map[string]bool{}
		}
		idSources[id][src] = true
	}
	passed := 0
	for _, s := range idSources {
		if len(s) > 1 {
			passed++
		}
	}
	if passed > 0 {
		t.Errorf("%d IDs forwarded from more than one source: duplicates passed", passed)
	}
	want := []string{strconv.Itoa(len(output)), strconv.Itoa(len(sources)), strconv.Itoa(len(output) - len(sources)), strconv.Itoa(len(ids))}
	testenv.Eventually(t, time.Minute, fmt.Sprintf("the counter to show records %s, distinct sources %s, replays %s, distinct dedupe-id %s", want[0], want[1], want[2], want[3]),
		func() bool { return strings.Join(counted(), " ") == strings.Join(want, " ") })
	t.Logf("compose demo: %d input events, %d forwarded (%d distinct IDs), %d dead-lettered, no ID forwarded twice; the counter agrees",
		len(input), len(output), len(ids), len(dead))

	// The services stop within their grace periods, the workers with
	// exit 0 (a worker killed at the end of its grace period exits 137).
	stopAt := time.Now()
	if _, err := run(3*time.Minute, "stop"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(stopAt)
	ps, err := run(time.Minute, "ps", "-a", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	exits := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(ps), "\n") {
		var c struct {
			Service  string
			ExitCode int
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("docker-compose ps: %v: %q", err, line)
		}
		exits[c.Service] = c.ExitCode
	}
	for _, w := range []string{"worker-1", "worker-2"} {
		if code, ok := exits[w]; !ok || code != 0 {
			t.Errorf("%s: exit code %d after docker-compose stop (listed: %v)", w, code, ok)
		}
	}
	downAt := time.Now()
	if _, err := down(); err != nil {
		t.Fatal(err)
	}
	t.Logf("docker-compose stop took %v (the workers exit 0), down -v %v", stopped.Round(time.Millisecond), time.Since(downAt).Round(time.Millisecond))
	label := "label=com.docker.compose.project=" + project
	for _, what := range [][]string{{"ps", "-a", "-q", "--filter", label}, {"volume", "ls", "-q", "--filter", label}, {"network", "ls", "-q", "--filter", label}} {
		left, err := docker(time.Minute, what...)
		if err != nil {
			t.Fatal(err)
		}
		if left != "" {
			t.Errorf("after down -v, docker %s lists: %s", strings.Join(what[:2], " "), left)
		}
	}
}

// missing lists the input events that are neither forwarded (by their
// click ID) nor dead-lettered (by their dedupe-source), at most 10.
func missing(topic string, input, output, dead []*kgo.Record) []string {
	forwarded, deadSources := map[string]bool{}, map[string]bool{}
	for _, r := range output {
		forwarded[clickstream.Header(r, clickstream.IDHeader)] = true
	}
	for _, r := range dead {
		deadSources[clickstream.Header(r, clickstream.SourceHeader)] = true
	}
	var lost []string
	for _, r := range input {
		src := fmt.Sprintf("%s/%d/%d", topic, r.Partition, r.Offset)
		var v struct {
			ID string `json:"click_id"`
		}
		if deadSources[src] || json.Unmarshal(r.Value, &v) == nil && v.ID != "" && forwarded[v.ID] {
			continue
		}
		if lost = append(lost, src); len(lost) == 10 {
			break
		}
	}
	return lost
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

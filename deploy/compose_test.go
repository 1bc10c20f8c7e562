package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"

	"dedupe-worker/internal/app"
)

// composeFile is what the checks below read of docker-compose.yml, as
// compose-go (the loader of docker compose v2) loads it: the file checked
// against the Compose schema, anchors and merge keys resolved, variables
// interpolated, env_file read into environment.
type composeFile struct {
	Name     string
	Services map[string]composeService
}

type composeService struct {
	Image           string
	Build           *composeBuild
	Command         []string
	Entrypoint      []string
	Environment     map[string]string // env_file, then environment
	EnvFiles        []string          // relative to the repository
	Ports           []string          // published:target
	DependsOn       map[string]composeDependsOn
	Healthcheck     bool
	ReadOnly        bool
	CapDrop         []string
	StopGracePeriod time.Duration
}

type composeBuild struct {
	Context    string // relative to the repository
	Dockerfile string
	// Target is a stage of the Dockerfile; empty is the last, the worker.
	Target string
}

type composeDependsOn struct {
	Condition string
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	wd, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(wd, "docker-compose.yml")},
		cli.WithWorkingDirectory(wd), cli.WithInterpolation(true), cli.WithResolvedPaths(true), cli.WithConsistency(true))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	rel := func(path string) string {
		r, err := filepath.Rel(wd, path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return filepath.ToSlash(r)
	}
	c := composeFile{Name: p.Name, Services: map[string]composeService{}}
	for name, s := range p.Services {
		cs := composeService{Image: s.Image, Command: s.Command, Entrypoint: s.Entrypoint, Environment: map[string]string{},
			Healthcheck: s.HealthCheck != nil && !s.HealthCheck.Disable, ReadOnly: s.ReadOnly, CapDrop: s.CapDrop,
			DependsOn: map[string]composeDependsOn{}}
		if s.Build != nil {
			cs.Build = &composeBuild{Context: rel(s.Build.Context), Dockerfile: s.Build.Dockerfile, Target: s.Build.Target}
		}
		for k, v := range s.Environment {
			if v != nil {
				cs.Environment[k] = *v
			}
		}
		for _, f := range s.EnvFiles {
			cs.EnvFiles = append(cs.EnvFiles, rel(f.Path))
		}
		for _, port := range s.Ports {
			cs.Ports = append(cs.Ports, fmt.Sprintf("%s:%d", port.Published, port.Target))
		}
		for dep, d := range s.DependsOn {
			cs.DependsOn[dep] = composeDependsOn{Condition: d.Condition}
		}
		if s.StopGracePeriod != nil {
			cs.StopGracePeriod = time.Duration(*s.StopGracePeriod)
		}
		c.Services[name] = cs
	}
	if len(c.Services) == 0 {
		t.Fatal("docker-compose.yml: no services")
	}
	return c
}

// ourImage reports whether s runs the image built from the Dockerfile.
func ourImage(s composeService) bool { return s.Build != nil }

func TestComposeServices(t *testing.T) {
	c := loadCompose(t)

	kafka, ok := c.Services["kafka"]
	if !ok {
		t.Fatal("no kafka service")
	}
	if !regexp.MustCompile(`^apache/kafka:[34]\.\d+\.\d+$`).MatchString(kafka.Image) {
		t.Errorf("kafka image %q: want the official apache/kafka, pinned to a 3.x or 4.x release", kafka.Image)
	}
	env := kafka.Environment
	if !strings.Contains(env["KAFKA_PROCESS_ROLES"], "controller") || !strings.Contains(env["KAFKA_PROCESS_ROLES"], "broker") {
		t.Errorf("kafka: KAFKA_PROCESS_ROLES %q: want KRaft, broker and controller in one node", env["KAFKA_PROCESS_ROLES"])
	}
	if !slices.Contains(strings.Split(env["KAFKA_ADVERTISED_LISTENERS"], ","), "PLAINTEXT://kafka:9092") {
		t.Errorf("kafka: KAFKA_ADVERTISED_LISTENERS %q must advertise kafka:9092 to the other containers", env["KAFKA_ADVERTISED_LISTENERS"])
	}
	if !kafka.Healthcheck {
		t.Error("kafka: no healthcheck, so nothing can wait for it")
	}

	redis, ok := c.Services["redis"]
	if !ok {
		t.Fatal("no redis service")
	}
	if !regexp.MustCompile(`^redis:7(\.\d+)*$`).MatchString(redis.Image) {
		t.Errorf("redis image %q: want the official redis:7", redis.Image)
	}
	if !strings.Contains(strings.Join(redis.Command, " "), "--appendonly yes") {
		t.Errorf("redis: command %q: want --appendonly yes", redis.Command)
	}
	if !redis.Healthcheck {
		t.Error("redis: no healthcheck")
	}

	// Every service depended on with service_healthy has a healthcheck,
	// and every dependency exists.
	edges, built := 0, 0
	for name, s := range c.Services {
		for dep, cond := range s.DependsOn {
			edges++
			d, ok := c.Services[dep]
			switch {
			case !ok:
				t.Errorf("%s depends on %s, which is not a service", name, dep)
			case cond.Condition == "service_healthy" && !d.Healthcheck:
				t.Errorf("%s waits for %s to be healthy, which has no healthcheck", name, dep)
			case cond.Condition != "service_healthy" && cond.Condition != "service_completed_successfully" && cond.Condition != "service_started":
				t.Errorf("%s: depends_on %s condition %q", name, dep, cond.Condition)
			}
		}
		if ourImage(s) {
			built++
			if s.Build.Context != "." || s.Build.Dockerfile != "Dockerfile" {
				t.Errorf("%s: build %+v, want context . and the Dockerfile", name, *s.Build)
			}
			if _, err := os.Stat(repoPath(s.Build.Dockerfile)); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	// Without these the checks above had nothing to look at.
	if edges == 0 {
		t.Error("no service has depends_on: nothing waits for kafka or redis")
	}
	if built == 0 {
		t.Error("no service builds the Dockerfile")
	}
}

// The worker services: two replicas of the click pipeline, each with a
// valid configuration from its env_file, a read-only root filesystem and
// its metrics port on its own host port.
func TestComposeWorkers(t *testing.T) {
	c := loadCompose(t)
	var workers []string
	hostPorts := map[string]string{}
	for _, name := range sortedKeys(c.Services) {
		s := c.Services[name]
		if !ourImage(s) || s.Build.Target != "" || (len(s.Command) > 0 && s.Command[0] != "run") {
			continue
		}
		workers = append(workers, name)
		if !s.ReadOnly {
			t.Errorf("%s: read_only is not true", name)
		}
		if !slices.Contains(s.CapDrop, "ALL") {
			t.Errorf("%s: cap_drop does not hold ALL", name)
		}
		env := composeEnv(t, name, s)
		cfg, err := loadConfig(t, env)
		if err != nil {
			t.Errorf("%s: config.Load with its env_file: %v", name, err)
			continue
		}
		if cfg.Pipeline != "clicks" {
			t.Errorf("%s: pipeline %q, want clicks", name, cfg.Pipeline)
		}
		if !slices.Contains(cfg.KafkaBrokers, "kafka:9092") || !slices.Contains(cfg.RedisAddrs, "redis:6379") {
			t.Errorf("%s: brokers %v and Redis %v, want the compose services kafka:9092 and redis:6379", name, cfg.KafkaBrokers, cfg.RedisAddrs)
		}
		port := strconv.Itoa(int(httpPort(t, cfg)))
		exposed := false
		for _, p := range s.Ports {
			host, container, ok := strings.Cut(p, ":")
			if !ok || container != port {
				continue
			}
			exposed = true
			if other, dup := hostPorts[host]; dup {
				t.Errorf("%s and %s both publish host port %s", other, name, host)
			}
			hostPorts[host] = name
		}
		if !exposed {
			t.Errorf("%s: ports %v do not publish the metrics port %s (DEDUPE_HTTP_ADDR)", name, s.Ports, port)
		}
		for _, dep := range []string{"redis", "kafka"} {
			if !dependsOn(c, name, dep) {
				t.Errorf("%s does not wait for %s", name, dep)
			}
		}
		// The shutdown takes up to app.ShutdownBound; the default 10 s
		// would kill a worker in the middle of it.
		if need := app.ShutdownBound(cfg); s.StopGracePeriod < need {
			t.Errorf("%s: stop_grace_period %v, want at least %v", name, s.StopGracePeriod, need)
		}
	}
	if len(workers) != 2 {
		t.Errorf("worker services %v: want two", workers)
	}
}

// dependsOn reports whether service name waits for dep, directly or
// through another service.
func dependsOn(c composeFile, name, dep string) bool {
	seen := map[string]bool{}
	var walk func(string) bool
	walk = func(n string) bool {
		if seen[n] {
			return false
		}
		seen[n] = true
		for d := range c.Services[n].DependsOn {
			if d == dep || walk(d) {
				return true
			}
		}
		return false
	}
	return walk(name)
}

// composeEnv is the DEDUPE_* environment of a service as compose-go
// gives it (its env_files in order, then environment). It must come from
// an env_file, and hold only config variables.
func composeEnv(t *testing.T, name string, s composeService) map[string]string {
	t.Helper()
	if len(s.EnvFiles) == 0 {
		t.Fatalf("%s: no env_file", name)
	}
	env := map[string]string{}
	for k, v := range s.Environment {
		if strings.HasPrefix(k, "DEDUPE_") {
			env[k] = v
		}
	}
	if len(env) == 0 {
		t.Fatalf("%s: no DEDUPE_ variable from %v", name, s.EnvFiles)
	}
	checkKnownKeys(t, name+" environment", env)
	return env
}

// subcommands are the first words command prog (cmd/prog) accepts, from
// the usage text in its main.go ("usage: dedupe-worker [run | plan
// [flags] | stats]", "usage: clicks generate [flags] | count [flags]").
func subcommands(t *testing.T, prog string) []string {
	t.Helper()
	src := string(readRepoFile(t, "cmd", prog, "main.go"))
	m := regexp.MustCompile("const usage = `usage: " + prog + " ([^\\n]*)").FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("cmd/%s/main.go: no usage line", prog)
	}
	line := m[1]
	if strings.HasPrefix(line, "[") {
		line = strings.TrimSuffix(strings.TrimPrefix(line, "["), "]")
	}
	var cmds []string
	for _, alt := range strings.Split(line, "|") {
		if f := strings.Fields(alt); len(f) > 0 {
			cmds = append(cmds, f[0])
		}
	}
	if len(cmds) < 2 {
		t.Fatalf("cmd/%s/main.go: usage line %q names fewer than two subcommands", prog, m[1])
	}
	return cmds
}

// subcommandHelp is the usage text's description of cmd in cmd/prog (its
// line and the indented lines under it), empty if there is none.
func subcommandHelp(t *testing.T, prog, cmd string) string {
	t.Helper()
	src := string(readRepoFile(t, "cmd", prog, "main.go"))
	_, body, ok := strings.Cut(src, "const usage = `")
	if !ok {
		t.Fatalf("cmd/%s/main.go: no usage text", prog)
	}
	body, _, _ = strings.Cut(body, "`")
	var help []string
	in := false
	for _, l := range strings.Split(body, "\n")[1:] {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "   "):
			in = f[0] == cmd
			if in {
				help = append(help, l)
			}
		case in:
			help = append(help, l)
		}
	}
	return strings.Join(help, "\n")
}

func TestComposeGeneratorAndCounter(t *testing.T) {
	c := loadCompose(t)
	known := subcommands(t, "clicks")
	if !slices.Contains(stageNames(t), "clicks") {
		t.Fatal("Dockerfile: no stage named clicks, the image of the click generator and counter")
	}
	for _, tc := range []struct{ service, cmd string }{{"generator", "generate"}, {"counter", "count"}} {
		s, ok := c.Services[tc.service]
		if !ok {
			t.Errorf("no %s service", tc.service)
			continue
		}
		if !ourImage(s) || s.Build.Target != "clicks" {
			t.Errorf("%s: want the image of the Dockerfile's clicks stage (build target clicks)", tc.service)
		}
		if len(s.Command) == 0 || s.Command[0] != tc.cmd {
			t.Errorf("%s: command %q, want %s first", tc.service, s.Command, tc.cmd)
			continue
		}
		if !slices.Contains(known, s.Command[0]) {
			t.Errorf("%s: %s is not a subcommand of clicks (%v)", tc.service, s.Command[0], known)
		}
		// The usage text describes the subcommand, and its flags must be
		// among those it names.
		help := subcommandHelp(t, "clicks", tc.cmd)
		if help == "" {
			t.Errorf("%s: the usage text of cmd/clicks/main.go does not describe %s", tc.service, tc.cmd)
		}
		for _, arg := range s.Command[1:] {
			if strings.HasPrefix(arg, "-") && !regexp.MustCompile(regexp.QuoteMeta(arg)+`\b`).MatchString(help) {
				t.Errorf("%s: flag %s is not in the usage of %s: %q", tc.service, arg, tc.cmd, help)
			}
		}
		if !s.ReadOnly {
			t.Errorf("%s: read_only is not true", tc.service)
		}
		// They read DEDUPE_KAFKA_BROKERS and the topics from the same file
		// as the workers.
		env := composeEnv(t, tc.service, s)
		for _, k := range []string{"DEDUPE_KAFKA_BROKERS", "DEDUPE_INPUT_TOPIC", "DEDUPE_OUTPUT_TOPIC"} {
			if env[k] == "" {
				t.Errorf("%s: %s not set", tc.service, k)
			}
		}
		if !dependsOn(c, tc.service, "kafka") {
			t.Errorf("%s does not wait for kafka", tc.service)
		}
	}
	gen := c.Services["generator"]
	if got := strings.Join(gen.Command, " "); got != "generate -rate 500" {
		t.Errorf("generator: command %q, want generate -rate 500", got)
	}
	if got := strings.Join(c.Services["counter"].Command, " "); got != "count" {
		t.Errorf("counter: command %q, want count", got)
	}
}

// Automatic topic creation is off, so something must create the three
// topics of config/clicks.env, with more partitions than workers.
func TestComposeTopicsCreated(t *testing.T) {
	c := loadCompose(t)
	vars, err := parseEnvFile(readRepoFile(t, "config", "clicks.env"))
	if err != nil {
		t.Fatal(err)
	}
	auto := c.Services["kafka"].Environment["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]
	var script string
	for _, name := range sortedKeys(c.Services) {
		s := c.Services[name]
		if strings.HasPrefix(s.Image, "apache/kafka:") && name != "kafka" {
			script += strings.Join(append(append([]string{}, s.Entrypoint...), s.Command...), " ")
		}
	}
	if auto == "true" {
		return // the broker makes them on first use
	}
	if script == "" {
		t.Fatal("topic auto-creation is off and no init service creates the topics")
	}
	for _, k := range []string{"DEDUPE_INPUT_TOPIC", "DEDUPE_OUTPUT_TOPIC", "DEDUPE_DLQ_TOPIC"} {
		if vars[k] == "" {
			// An empty name would match any two spaces of the script.
			t.Errorf("config/clicks.env: %s not set", k)
			continue
		}
		if !regexp.MustCompile(`(^|[\s"'])` + regexp.QuoteMeta(vars[k]) + `($|[\s;"'])`).MatchString(script) {
			t.Errorf("the init service does not create %s %q", k, vars[k])
		}
	}
	if !strings.Contains(script, "--create") {
		t.Error("the init service runs no kafka-topics.sh --create")
	}
	m := regexp.MustCompile(`--partitions\s+(\d+)`).FindStringSubmatch(script)
	if m == nil {
		t.Fatal("the init service gives no --partitions")
	}
	if n, _ := strconv.Atoi(m[1]); n < 2 {
		t.Errorf("--partitions %d: two workers need at least two partitions", n)
	}
	waiting := 0
	for name, s := range c.Services {
		if !ourImage(s) {
			continue
		}
		waiting++
		if s.DependsOn["kafka-init"].Condition != "service_completed_successfully" {
			t.Errorf("%s does not wait for kafka-init to complete", name)
		}
	}
	if waiting == 0 {
		t.Error("no service runs the dedupe-worker image, so none was checked to wait for kafka-init")
	}
}

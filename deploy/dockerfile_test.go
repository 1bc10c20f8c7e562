package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case
	args string
}

type stage struct {
	from, name string
	insts      []instruction
}

// parseDockerfile reads the instructions and splits them into stages. It
// knows what this repository's Dockerfile uses: comments, parser
// directives, backslash continuations and heredoc-free instructions.
func parseDockerfile(src string) ([]stage, error) {
	var insts []instruction
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(src, "\n") {
		line := strings.TrimRight(raw, " \t\r")
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue // comments (and directives) are dropped, also inside continuations
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		cmd, args, _ := strings.Cut(text, " ")
		if strings.Contains(args, "<<") && strings.ToUpper(cmd) != "RUN" {
			return nil, fmt.Errorf("line %d: heredocs are not understood by this parser", start)
		}
		insts = append(insts, instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: continuation at the end of the file", start)
	}
	var stages []stage
	for _, in := range insts {
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			var s stage
			for _, w := range f {
				if !strings.HasPrefix(w, "--") {
					s.from = w
					break
				}
			}
			if n := len(f); n >= 3 && strings.EqualFold(f[n-2], "AS") {
				s.name = f[n-1]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			if in.cmd == "ARG" {
				continue // an ARG before the first FROM
			}
			return nil, fmt.Errorf("line %d: %s before FROM", in.line, in.cmd)
		}
		s := &stages[len(stages)-1]
		s.insts = append(s.insts, in)
	}
	return stages, nil
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.insts {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func (s stage) last(cmd string) (instruction, bool) {
	all := s.all(cmd)
	if len(all) == 0 {
		return instruction{}, false
	}
	return all[len(all)-1], true
}

func TestDockerfile(t *testing.T) {
	stages, err := parseDockerfile(string(readRepoFile(t, "Dockerfile")))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stages, want a build stage and a runtime stage", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]
	if !regexp.MustCompile(`^golang:1\.26([.-]|$)`).MatchString(build.from) || build.name == "" {
		t.Errorf("build stage FROM %q AS %q: want a named golang:1.26 stage (go.mod says go 1.26)", build.from, build.name)
	}

	// The build: static, trimmed, stripped, of cmd/dedupe-worker.
	var buildCmd string
	for _, in := range build.all("RUN") {
		if strings.Contains(in.args, "go build") {
			buildCmd = in.args
		}
	}
	cgoOff := strings.Contains(buildCmd, "CGO_ENABLED=0")
	for _, in := range build.all("ENV") {
		cgoOff = cgoOff || regexp.MustCompile(`\bCGO_ENABLED[= ]0\b`).MatchString(in.args)
	}
	switch {
	case buildCmd == "":
		t.Fatal("build stage: no RUN go build")
	case !cgoOff:
		t.Error("build stage: CGO_ENABLED=0 not set: the binary must be static for a distroless/static or scratch image")
	case !strings.Contains(buildCmd, "-trimpath"):
		t.Error("go build without -trimpath")
	case !regexp.MustCompile(`-ldflags[ =]+["']?-s -w["']?`).MatchString(buildCmd):
		t.Error(`go build without -ldflags "-s -w"`)
	case !regexp.MustCompile(`\./cmd/dedupe-worker(\s|$)`).MatchString(buildCmd):
		t.Error("go build does not build ./cmd/dedupe-worker")
	}
	out := regexp.MustCompile(`-o\s+(\S+)`).FindStringSubmatch(buildCmd)
	if out == nil || path.Base(out[1]) != "dedupe-worker" {
		t.Fatalf("go build -o: want a binary named dedupe-worker, got %v", out)
	}

	// The runtime: distroless static or scratch, the binary from the build
	// stage, a numeric non-root user, the metrics port, the binary as the
	// entrypoint.
	distroless := strings.HasPrefix(final.from, "gcr.io/distroless/static")
	if !distroless && final.from != "scratch" {
		t.Errorf("final stage FROM %q: want gcr.io/distroless/static* or scratch", final.from)
	}
	copied := false
	for _, in := range final.all("COPY") {
		f := strings.Fields(in.args)
		if len(f) == 3 && f[0] == "--from="+build.name && f[1] == out[1] && f[2] == "/dedupe-worker" {
			copied = true
		}
	}
	if !copied {
		t.Errorf("final stage: no COPY --from=%s %s /dedupe-worker", build.name, out[1])
	}
	if final.from == "scratch" {
		certs := false
		for _, in := range final.all("COPY") {
			certs = certs || strings.Contains(in.args, "ca-certificates")
		}
		if !certs {
			t.Error("scratch image without CA certificates: DEDUPE_KAFKA_TLS without a CA file would fail")
		}
	}
	user, hasUser := final.last("USER")
	switch {
	case hasUser:
		uid, _, _ := strings.Cut(user.args, ":")
		if n, err := strconv.Atoi(uid); err != nil || n == 0 {
			t.Errorf("USER %q: want a numeric, non-zero user (Kubernetes runAsNonRoot checks it without /etc/passwd)", user.args)
		}
	case !(distroless && strings.HasSuffix(final.from, ":nonroot")):
		t.Error("final stage runs as root: no USER and not a :nonroot image")
	}
	wantPort := defaultHTTPPort(t)
	exposed := false
	for _, in := range final.all("EXPOSE") {
		exposed = exposed || slices.Contains(strings.Fields(in.args), wantPort) || slices.Contains(strings.Fields(in.args), wantPort+"/tcp")
	}
	if !exposed {
		t.Errorf("final stage does not EXPOSE %s, the port of DEDUPE_HTTP_ADDR's default", wantPort)
	}
	ep, ok := final.last("ENTRYPOINT")
	var argv []string
	if !ok || json.Unmarshal([]byte(ep.args), &argv) != nil || len(argv) != 1 || argv[0] != "/dedupe-worker" {
		t.Errorf("ENTRYPOINT %q: want the exec form [\"/dedupe-worker\"] (no shell in the image)", ep.args)
	}
	if _, ok := final.last("CMD"); ok {
		t.Error("final stage has a CMD: the default subcommand is run")
	}
	for _, in := range final.all("VOLUME") {
		t.Errorf("line %d: VOLUME %s: the worker writes nothing to disk", in.line, in.args)
	}
	for _, in := range final.all("RUN") {
		t.Errorf("line %d: RUN in the runtime stage: it has no shell", in.line)
	}
}

// stageNames are the names of the Dockerfile's stages.
func stageNames(t *testing.T) []string {
	t.Helper()
	stages, err := parseDockerfile(string(readRepoFile(t, "Dockerfile")))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	var names []string
	for _, s := range stages {
		names = append(names, s.name)
	}
	return names
}

// The clicks stage is an image of the demo's traffic tools, built from the
// same sources; the worker's image (the last stage) holds only the worker.
func TestDockerfileClicksStage(t *testing.T) {
	stages, err := parseDockerfile(string(readRepoFile(t, "Dockerfile")))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	i := slices.IndexFunc(stages, func(s stage) bool { return s.name == "clicks" })
	if i < 0 || i == len(stages)-1 {
		t.Fatalf("Dockerfile: want a stage named clicks before the last (the worker's), got %d stages", len(stages))
	}
	clicks := stages[i]
	built := false
	for _, s := range stages[:i] {
		for _, in := range s.all("RUN") {
			built = built || (strings.Contains(in.args, "go build") && regexp.MustCompile(`\./cmd/clicks(\s|$)`).MatchString(in.args) &&
				strings.Contains(in.args, "CGO_ENABLED=0"))
		}
	}
	if !built {
		t.Error("no stage before clicks builds ./cmd/clicks statically")
	}
	ep, ok := clicks.last("ENTRYPOINT")
	var argv []string
	if !ok || json.Unmarshal([]byte(ep.args), &argv) != nil || len(argv) != 1 || argv[0] != "/clicks" {
		t.Errorf("clicks: ENTRYPOINT %q, want [\"/clicks\"]", ep.args)
	}
	if u, ok := clicks.last("USER"); !ok || strings.HasPrefix(u.args, "0") {
		t.Errorf("clicks: want a numeric non-root USER")
	}
	for _, in := range stages[len(stages)-1].all("COPY") {
		if strings.Contains(in.args, "clicks") {
			t.Errorf("line %d: the worker's image copies %s", in.line, in.args)
		}
	}
}

// defaultHTTPPort is the port of DEDUPE_HTTP_ADDR's default.
func defaultHTTPPort(t *testing.T) string {
	t.Helper()
	def := knownVars(t)["DEDUPE_HTTP_ADDR"].Default
	_, port, ok := strings.Cut(def, ":")
	if !ok || port == "" {
		t.Fatalf("DEDUPE_HTTP_ADDR default %q has no port", def)
	}
	return port
}

func TestDockerfileParser(t *testing.T) {
	stages, err := parseDockerfile("# syntax=docker/dockerfile:1\nARG V=1\nFROM a AS b\nRUN x \\\n  # note\n  y\nFROM c\nUSER 1\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) != 2 || stages[0].name != "b" || stages[1].from != "c" || strings.Join(strings.Fields(stages[0].insts[0].args), " ") != "x y" {
		t.Errorf("parsed %+v", stages)
	}
	if _, err := parseDockerfile("RUN x\nFROM a\n"); err == nil {
		t.Error("RUN before FROM accepted")
	}
}

// .dockerignore keeps out what the build does not need and keeps in what
// it does: go.mod, go.sum, the packages of the binary and their embedded
// files.
func TestDockerignore(t *testing.T) {
	var patterns []string
	for _, l := range strings.Split(string(readRepoFile(t, ".dockerignore")), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") {
			t.Fatalf(".dockerignore: exceptions (%s) are not understood by this test", l)
		}
		patterns = append(patterns, path.Clean(strings.TrimPrefix(l, "/")))
	}
	ignored := func(p string) bool {
		// A path is excluded when it or one of its parent folders matches.
		for q := p; q != "." && q != "/"; q = path.Dir(q) {
			for _, pat := range patterns {
				if ok, _ := path.Match(pat, q); ok {
					return true
				}
			}
		}
		return false
	}
	for _, p := range []string{".git", ".git/config", "deploy/kubernetes/clicks/deployment.yaml", "dedupe-worker"} {
		if !ignored(p) {
			t.Errorf(".dockerignore does not exclude %s", p)
		}
	}
	needed := []string{"go.mod", "go.sum", "cmd/dedupe-worker/main.go", "config/config.go", "internal/app/app.go",
		"internal/consumer/worker.go", "internal/bloom/filter.go", "internal/sink"}
	needed = append(needed, embeddedFiles(t)...)
	for _, p := range needed {
		if ignored(p) {
			t.Errorf(".dockerignore excludes %s, which the build needs", p)
		}
	}
}

// embeddedFiles are the files named by //go:embed in the non-test Go
// sources of cmd/ and internal/, relative to the repository root.
func embeddedFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, dir := range []string{"cmd", "internal", "config"} {
		err := filepath.WalkDir(repoPath(dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if rest, ok := strings.CutPrefix(sc.Text(), "//go:embed "); ok {
					for _, name := range strings.Fields(rest) {
						rel, _ := filepath.Rel(root, filepath.Join(filepath.Dir(p), name))
						files = append(files, filepath.ToSlash(rel))
					}
				}
			}
			return sc.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// internal/bloom embeds its Lua script: a scan that misses it (or
	// finds nothing) would leave the embedded files unchecked.
	if !slices.Contains(files, "internal/bloom/lua/testandset.lua") {
		t.Fatalf("//go:embed files %v: internal/bloom/lua/testandset.lua not found", files)
	}
	return files
}

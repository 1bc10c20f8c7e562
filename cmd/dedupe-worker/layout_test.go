package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layoutRow is a row of the Layout table (docs/layout.md).
type layoutRow struct {
	floor int // -1 for a folder without Go code
	ships bool
}

const module = "dedupe-worker"

// layoutPage holds the Layout table: the one table of the page.
const layoutPage = "docs/layout.md"

// readLayout reads the Layout table of layoutPage, by path
// ("internal/bloom").
func readLayout(t *testing.T, root string) map[string]layoutRow {
	t.Helper()
	f, err := os.Open(filepath.Join(root, layoutPage))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]layoutRow{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "| `") {
			continue
		}
		cells := strings.Split(l, "|")
		if len(cells) < 5 {
			t.Fatalf("%s: row %q has fewer than four cells", layoutPage, l)
		}
		path := strings.TrimSuffix(strings.Trim(strings.TrimSpace(cells[1]), "`"), "/")
		floor, ships := strings.TrimSpace(cells[2]), strings.TrimSpace(cells[3])
		r := layoutRow{floor: -1}
		if floor != "–" {
			if r.floor, err = strconv.Atoi(floor); err != nil {
				t.Fatalf("%s: %s: floor %q", layoutPage, path, floor)
			}
			if ships != "yes" && ships != "no" {
				t.Fatalf("%s: %s: ships %q, want yes or no", layoutPage, path, ships)
			}
			r.ships = ships == "yes"
		}
		if _, dup := rows[path]; dup {
			t.Fatalf("%s: %s listed twice", layoutPage, path)
		}
		rows[path] = r
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 10 {
		t.Fatalf("%s: %d rows; the table is missing or changed shape", layoutPage, len(rows))
	}
	return rows
}

type goPackage struct {
	ImportPath string
	Dir        string
	Imports    []string
	Deps       []string
}

func goList(t *testing.T, root string, args ...string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// The Layout table (docs/layout.md) is the tree: every folder with files is
// listed or under a listed one, every listed folder exists, and every Go
// package has a floor. No package imports one of a higher floor, and what
// ships imports only what ships.
func TestLayoutMatchesTreeAndImports(t *testing.T) {
	root := repoRoot(t)
	rows := readLayout(t, root)

	listed := func(dir string) bool {
		for d := dir; d != "."; d = filepath.Dir(d) {
			if _, ok := rows[filepath.ToSlash(d)]; ok {
				return true
			}
		}
		return false
	}
	dirs := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if d.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		dir := filepath.Dir(rel)
		if dir == "." {
			return nil
		}
		dirs++
		if !listed(dir) {
			t.Errorf("%s: its folder is not in the Layout table of %s", rel, layoutPage)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if dirs == 0 {
		t.Fatal("walked no files below the module root")
	}
	for path := range rows {
		if st, err := os.Stat(filepath.Join(root, path)); err != nil || !st.IsDir() {
			t.Errorf("%s lists %s, which is not a folder", layoutPage, path)
		}
	}

	pkgs := goList(t, root, "./...")
	floor := map[string]layoutRow{}
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		r, ok := rows[rel]
		if !ok || r.floor < 0 {
			t.Errorf("package %s has no floor in the Layout table of %s", p.ImportPath, layoutPage)
			continue
		}
		floor[p.ImportPath] = r
	}
	if len(floor) < 15 {
		t.Fatalf("%d packages with floors; go list found %d", len(floor), len(pkgs))
	}
	for _, p := range pkgs {
		me, ok := floor[p.ImportPath]
		if !ok {
			continue
		}
		for _, imp := range p.Imports {
			dep, ours := floor[imp]
			if !ours {
				continue
			}
			if dep.floor > me.floor {
				t.Errorf("%s (floor %d) imports %s (floor %d)", p.ImportPath, me.floor, imp, dep.floor)
			}
		}
		if !me.ships {
			continue
		}
		for _, d := range p.Deps {
			if dep, ours := floor[d]; ours && !dep.ships {
				t.Errorf("%s ships but depends on %s, which does not", p.ImportPath, d)
			}
		}
	}
}

// The binary Kubernetes runs links no test machinery: no broker, no
// redis-server launcher, no click generator.
func TestBinaryLinksNoTestMachinery(t *testing.T) {
	pkgs := goList(t, repoRoot(t), "-deps", "./cmd/dedupe-worker")
	var paths []string
	for _, p := range pkgs {
		paths = append(paths, p.ImportPath)
	}
	if !slices.Contains(paths, "dedupe-worker/internal/app") || !slices.Contains(paths, "github.com/segmentio/kafka-go") {
		t.Fatalf("go list -deps gave %d packages without the worker's own: %v", len(paths), paths)
	}
	for _, p := range paths {
		for _, bad := range []string{"github.com/twmb/franz-go", "/internal/redisproc", "/internal/clickstream", "/internal/testenv",
			"/internal/demo", "/internal/testcerts", "/internal/syncbuf", "testing"} {
			if p == bad || strings.Contains(p, bad+"/") || strings.HasSuffix(p, bad) {
				t.Errorf("the dedupe-worker binary links %s", p)
			}
		}
	}
}

// The libraries own their rules: the engine, the worker and the producer
// take their defaults and limits from their own constants, and only the
// application's packages read DEDUPE_* variables. Nothing they link may be
// config.
func TestLibrariesDoNotReadTheApplicationsSettings(t *testing.T) {
	root := repoRoot(t)
	libs := []string{"./internal/bloom", "./internal/consumer", "./internal/sink", "./internal/event", "./internal/retry"}
	pkgs := goList(t, root, append([]string{"-deps"}, libs...)...)
	seen := 0
	for _, p := range pkgs {
		if p.ImportPath == module+"/config" {
			t.Errorf("%s is linked by one of %v; a library must not read the application's settings", p.ImportPath, libs)
		}
		if strings.HasPrefix(p.ImportPath, module+"/internal/") {
			seen++
		}
	}
	if seen < len(libs) {
		t.Fatalf("go list -deps %v listed %d of the module's packages, want at least %d", libs, seen, len(libs))
	}
}

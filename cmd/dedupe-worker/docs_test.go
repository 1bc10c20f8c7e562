package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines is how long README.md may be: a page a user reads in
// minutes; depth goes to docs/.
const readmeMaxLines = 300

var (
	// mdLink is an inline Markdown link's target: [text](target). The text
	// may run over lines.
	mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	// htmlAnchor is an anchor set by hand: <a id="upgrading"></a>.
	htmlAnchor = regexp.MustCompile(`<a id="([^"]+)">`)
)

// mdPage is a Markdown file as the link checks read it.
type mdPage struct {
	rel     string          // path from the repository root, with slashes
	lines   []string        // every line
	links   []string        // link targets outside fenced code blocks
	anchors map[string]bool // the fragments that reach into the page
}

func readPage(t *testing.T, root, rel string) mdPage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	p := mdPage{rel: rel, lines: strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"), anchors: map[string]bool{}}
	var prose []string
	fence := false
	seen := map[string]int{}
	for _, l := range p.lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		prose = append(prose, l)
		if h := strings.TrimLeft(l, "#"); h != l && strings.HasPrefix(h, " ") {
			s := slug(h)
			if n := seen[s]; n > 0 {
				p.anchors[s+"-"+strconv.Itoa(n)] = true
			} else {
				p.anchors[s] = true
			}
			seen[s]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			p.anchors[m[1]] = true
		}
	}
	for _, m := range mdLink.FindAllStringSubmatch(strings.Join(prose, "\n"), -1) {
		p.links = append(p.links, m[1])
	}
	return p
}

// slug is a heading's anchor as GitHub makes it: lower case, letters,
// digits, '-' and '_' kept, spaces made '-', everything else dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The README is a page for users and links the pages of docs/; every
// relative link of the README and of those pages reaches a file that
// exists (and, into a Markdown page, a heading or anchor of it); the
// README's short table of settings says what the reference says.
func TestDocsLinkedAndLinksResolve(t *testing.T) {
	root := repoRoot(t)
	entries, err := os.ReadDir(filepath.Join(root, "docs"))
	if err != nil {
		t.Fatal(err)
	}
	readme := readPage(t, root, "README.md")
	pages := []mdPage{readme}
	var docs []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		docs = append(docs, "docs/"+e.Name())
		if strings.HasSuffix(e.Name(), ".md") {
			pages = append(pages, readPage(t, root, "docs/"+e.Name()))
		}
	}
	if len(docs) < 2 {
		t.Fatalf("docs/ holds %v; want its pages", docs)
	}

	if n := len(readme.lines); n > readmeMaxLines {
		t.Errorf("README.md is %d lines; at most %d: move depth to docs/", n, readmeMaxLines)
	}

	linked := map[string]bool{}
	byPath := map[string]mdPage{}
	for _, p := range pages {
		byPath[p.rel] = p
	}
	checked := 0
	for _, p := range pages {
		for _, target := range p.links {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := p.rel
			if file != "" {
				dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(p.rel), file)))
			}
			if p.rel == "README.md" {
				linked[dest] = true
			}
			checked++
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
				t.Errorf("%s: link %s: %s does not exist", p.rel, target, dest)
				continue
			}
			if frag == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			to, ok := byPath[dest]
			if !ok {
				to = readPage(t, root, dest)
				byPath[dest] = to
			}
			if !to.anchors[frag] {
				t.Errorf("%s: link %s: %s has no heading or anchor %q", p.rel, target, dest, frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no links in README.md and docs/")
	}
	for _, d := range docs {
		if !linked[d] {
			t.Errorf("README.md does not link %s", d)
		}
	}

	// The settings table of the README is a short copy of the reference's
	// rows: the same defaults.
	defaults := func(p mdPage) map[string]string {
		rows := map[string]string{}
		for _, l := range p.lines {
			cells := strings.Split(l, "|")
			if len(cells) >= 4 && strings.HasPrefix(strings.TrimSpace(cells[1]), "`DEDUPE_") {
				rows[strings.Trim(strings.TrimSpace(cells[1]), "`")] = strings.TrimSpace(cells[2])
			}
		}
		return rows
	}
	short, full := defaults(readme), defaults(readPage(t, root, "docs/configuration.md"))
	if len(short) == 0 || len(full) == 0 {
		t.Fatalf("settings rows: %d in README.md, %d in docs/configuration.md; want both", len(short), len(full))
	}
	for name, def := range short {
		if want, ok := full[name]; !ok {
			t.Errorf("README.md lists %s, which docs/configuration.md does not", name)
		} else if def != want {
			t.Errorf("README.md gives %s the default %s; docs/configuration.md says %s", name, def, want)
		}
	}
}

// Package scripts tests the shell scripts beside it: the Debian archive
// they take from the machine's apt sources, and the one line a failing
// step prints.
package scripts

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// aptDir writes files (path relative to an apt directory -> content) into
// a new directory standing for /etc/apt. A nil content makes a folder.
func aptDir(t *testing.T, files map[string]*string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if content == nil {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(*content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func text(s string) *string { return &s }

// run runs a script of this folder and returns its stdout, stderr and
// exit code.
func run(t *testing.T, script string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{script}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", script, err)
	}
	return stdout.String(), stderr.String(), code
}

const (
	debian12Installer = `#deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_ - Official amd64 NETINST with firmware 20240210-11:27]/ bookworm contrib main non-free-firmware

deb file:/srv/security/debian-security bookworm-security main non-free-firmware
deb-src file:/srv/security/debian-security bookworm-security main non-free-firmware

deb file:/srv/ftp/debian/ bookworm main non-free-firmware
deb-src file:/srv/ftp/debian/ bookworm main non-free-firmware

# bookworm-updates, to get updates before a point release is made;
deb file:/srv/ftp/debian/ bookworm-updates main non-free-firmware
`
	debian13 = `Types: deb deb-src
URIs: file:/srv/deb/debian
Suites: trixie trixie-updates
Components: main non-free-firmware
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: file:/srv/security/debian-security
Suites: trixie-security
Components: main non-free-firmware
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
`
	ubuntu2404 = `Types: deb
URIs: file:/srv/archive/ubuntu/
Suites: noble noble-updates noble-backports
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg

Types: deb
URIs: file:/srv/security-ubuntu/ubuntu/
Suites: noble-security
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
`
)

// The Debian archive is found in every source layout real systems have,
// and a system that names none gets one line and exit 3.
func TestDebianMirror(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]*string
		want  string // "" for exit 3
	}{
		{"debootstrap: sources.list only, no sources.list.d", map[string]*string{
			"sources.list": text("deb file:/srv/deb/debian bookworm main\n"),
		}, "file:/srv/deb/debian"},
		{"debootstrap: sources.list and an empty sources.list.d", map[string]*string{
			"sources.list":   text("deb file:/srv/deb/debian bookworm main\n"),
			"sources.list.d": nil,
		}, "file:/srv/deb/debian"},
		{"Debian 12 installer: security first, deb-src, a commented cdrom", map[string]*string{
			"sources.list": text(debian12Installer),
		}, "file:/srv/ftp/debian"},
		{"Debian 13: deb822 only", map[string]*string{
			"sources.list.d/debian.sources": text(debian13),
		}, "file:/srv/deb/debian"},
		{"deb822: the security stanza first, lower-case field names", map[string]*string{
			"sources.list.d/debian.sources": text("types: deb\nuris: file:/srv/security/debian-security\nsuites: trixie-security\ncomponents: main\n\n" +
				"types: deb\nuris: file:/srv/deb/debian\nsuites: trixie\ncomponents: main\n"),
		}, "file:/srv/deb/debian"},
		{"deb822: a disabled stanza and a deb-src one are skipped", map[string]*string{
			"sources.list.d/debian.sources": text("Types: deb\nURIs: file:/srv/old/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n" +
				"Types: deb-src\nURIs: file:/srv/src/debian\nSuites: bookworm\nComponents: main\n\n" +
				"# the archive\nTypes: deb\nURIs: file:/srv/deb/debian\nSuites:\n bookworm\n bookworm-updates\nComponents: main\n"),
		}, "file:/srv/deb/debian"},
		{"both: a commented sources.list and deb822", map[string]*string{
			"sources.list":                  text("# See /etc/apt/sources.list.d/debian.sources\n"),
			"sources.list.d/debian.sources": text(debian13),
		}, "file:/srv/deb/debian"},
		{"both: sources.list is read first", map[string]*string{
			"sources.list":                  text("deb file:/srv/one/debian bookworm main\n"),
			"sources.list.d/debian.sources": text(debian13),
		}, "file:/srv/one/debian"},
		{"signed-by and arch options", map[string]*string{
			"sources.list": text("deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] file:/srv/deb/debian bookworm main\n"),
		}, "file:/srv/deb/debian"},
		{"options with spaces inside the brackets", map[string]*string{
			"sources.list.d/mirror.list": text("deb [ signed-by=/usr/share/keyrings/debian-archive-keyring.gpg ] file:/srv/mirror/debian/ trixie main\n"),
		}, "file:/srv/mirror/debian"},
		{"-updates first", map[string]*string{
			"sources.list": text("deb file:/srv/deb/debian-security bookworm-security main\ndeb file:/srv/upd/debian bookworm-updates main\ndeb file:/srv/deb/debian bookworm main\n"),
		}, "file:/srv/upd/debian"},
		{"third-party sources first", map[string]*string{
			"sources.list.d/cloud.list":     text("deb file:/srv/packages/apt cloud-sdk-bookworm main\n"),
			"sources.list.d/node.sources":   text("Types: deb\nURIs: file:/srv/deb/node_20.x\nSuites: nodistro\nComponents: main\n"),
			"sources.list.d/debian.sources": text(debian13),
		}, "file:/srv/deb/debian"},
		{"an active cdrom entry is not an archive", map[string]*string{
			"sources.list": text("deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_ - Official amd64 DVD Binary-1 20240210-11:28]/ bookworm contrib main\n"),
		}, ""},
		{"Ubuntu 24.04: no Debian archive", map[string]*string{
			"sources.list":                  text("# Ubuntu sources have moved to /etc/apt/sources.list.d/ubuntu.sources\n"),
			"sources.list.d/ubuntu.sources": text(ubuntu2404),
		}, ""},
		{"none at all", map[string]*string{}, ""},
		{"an empty sources.list.d", map[string]*string{"sources.list.d": nil}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := aptDir(t, c.files)
			stdout, stderr, code := run(t, "debian-mirror", dir)
			if c.want != "" {
				if code != 0 || strings.TrimSpace(stdout) != c.want || stderr != "" {
					t.Fatalf("exit %d, stdout %q, stderr %q; want exit 0 and %q", code, stdout, stderr, c.want)
				}
				return
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if code != 3 || stdout != "" || len(lines) != 1 || !strings.Contains(lines[0], "name no Debian archive") ||
				!strings.Contains(lines[0], "DEDUPE_DEBIAN_MIRROR") {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 3 and one line naming DEDUPE_DEBIAN_MIRROR", code, stdout, stderr)
			}
		})
	}
}

// A failing step ends a script with exactly one line that names the
// script, the step, the command and what to do, wherever the command
// failed: a plain command, a command substitution, a pipeline, a subshell
// or a function.
func TestFailingStepSaysWhat(t *testing.T) {
	lib, err := filepath.Abs(filepath.Join("lib", "fail.bash"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, body, want string }{
		{"plain", `false`, "false"},
		{"substitution", `v=$(echo x; false)`, "v=$(echo x; false)"},
		{"pipeline", `false | cat`, "false | cat"},
		{"subshell", `(cd / && false)`, "(cd / && false)"},
		{"function", "f() {\n\ttrue\n\tfalse\n}\nf", "false"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			script := filepath.Join(t.TempDir(), "demo-script")
			body := "source " + lib + "\nstep \"doing the thing\" \"check the thing\"\n" + c.body + "\necho not reached\n"
			if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, code := run(t, script)
			if code == 0 || strings.Contains(stdout, "not reached") {
				t.Fatalf("exit %d, stdout %q: the script went on", code, stdout)
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			want := "demo-script: doing the thing failed (exit 1, line "
			if len(lines) != 1 || !strings.HasPrefix(lines[0], want) || !strings.HasSuffix(lines[0], ": "+c.want+"); check the thing") {
				t.Fatalf("stderr %q; want one line %q... naming %q and the hint", stderr, want, c.want)
			}
		})
	}
}

// Every script in this folder takes the failure handler, so none ends with
// a bare exit status.
func TestEveryScriptFailsLoudly(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	scripts := 0
	for _, e := range entries {
		if e.IsDir() || strings.Contains(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("#!/usr/bin/env bash\n")) {
			continue
		}
		scripts++
		if !bytes.Contains(b, []byte(`source "$(dirname "$0")/lib/fail.bash"`)) {
			t.Errorf("%s does not source lib/fail.bash", e.Name())
		}
		if bytes.Contains(b, []byte("set -euo pipefail")) || bytes.Contains(b, []byte("set +e")) {
			t.Errorf("%s sets its own error mode; lib/fail.bash sets it", e.Name())
		}
	}
	if scripts < 6 {
		t.Fatalf("found %d scripts; want at least the six of scripts/", scripts)
	}
}

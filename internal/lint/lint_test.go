package lint

import (
	"bytes"
	"errors"
	"go/format"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// moduleRoot returns the directory that holds go.mod, two levels above
// this package.
func moduleRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	return root
}

// needTools skips a check that runs the go command or a tool built by it:
// under -short and -race (see the package doc), and where there is no go
// command.
func needTools(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("skipped under -race: the verdict is the plain run's, at several times the cost")
	}
	if testing.Short() {
		t.Skip("skipped under -short: runs the go command over the whole module")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
}

// goCmd runs the go command in dir and returns its combined output and
// exit error (nil, or an *exec.ExitError); it fails t if the command
// cannot start.
func goCmd(t *testing.T, dir string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return out, err
}

// goFiles lists the module's Go files, relative to root, leaving out
// testdata and hidden directories as the go command does.
func goFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no Go files found")
	}
	return files
}

// staticcheckKnown are findings tolerated until the change that removes
// them lands, each by file and message (line numbers move). An entry that
// no longer matches fails the test, so the list cannot outlive its reason.
var staticcheckKnown = []struct{ file, msg string }{}

// finding is one staticcheck line: file:line:col: message (CHECK).
var finding = regexp.MustCompile(`^(\S+\.go):\d+:\d+: (.+ \([A-Z]+[0-9]+\))$`)

func TestLint(t *testing.T) {
	root := moduleRoot(t)

	t.Run("gofmt", func(t *testing.T) {
		for _, f := range goFiles(t, root) {
			src, err := os.ReadFile(filepath.Join(root, f))
			if err != nil {
				t.Fatal(err)
			}
			out, err := format.Source(src)
			if err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			if !bytes.Equal(src, out) {
				t.Errorf("%s: not gofmt'd (run gofmt -w %s)", f, f)
			}
		}
	})

	// go vet is the quickest check that everything builds; the others
	// would only repeat its build errors, so they wait for it.
	t.Run("vet", func(t *testing.T) {
		needTools(t)
		if out, err := goCmd(t, root, "vet", "./..."); err != nil {
			t.Errorf("go vet ./...: %v\n%s", err, out)
		}
	})
	if t.Failed() {
		t.Fatal("go vet failed; the other checks are skipped")
	}

	t.Run("tidy", func(t *testing.T) {
		needTools(t)
		out, err := goCmd(t, root, "mod", "tidy", "-diff")
		switch {
		case err == nil:
		case bytes.HasPrefix(out, []byte("diff ")):
			t.Errorf("go mod tidy would change go.mod or go.sum (run go mod tidy):\n%s", out)
		default:
			t.Skipf("go mod tidy could not run: %s", firstLine(out))
		}
	})

	t.Run("staticcheck", func(t *testing.T) {
		needTools(t)
		out, err := goCmd(t, root, "tool", "staticcheck", "./...")
		seen := make([]bool, len(staticcheckKnown))
		var found []string
	lines:
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			m := finding.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			for i, k := range staticcheckKnown {
				if filepath.ToSlash(m[1]) == k.file && m[2] == k.msg {
					seen[i] = true
					continue lines
				}
			}
			found = append(found, line)
		}
		if err != nil && len(found) == 0 && !anyTrue(seen) {
			// Not findings: the tool did not build or could not load
			// the packages (go vet, above, has already built them).
			if bytes.HasPrefix(out, []byte("go: ")) {
				t.Skipf("staticcheck unavailable: %s", firstLine(out))
			}
			t.Fatalf("go tool staticcheck ./...: %v\n%s", err, out)
		}
		for _, f := range found {
			t.Error(f)
		}
		for i, k := range staticcheckKnown {
			if !seen[i] {
				t.Errorf("staticcheck no longer reports %s: %s; remove it from staticcheckKnown", k.file, k.msg)
			}
		}
	})

	t.Run("contract", func(t *testing.T) {
		needTools(t)
		checkContractAssertions(t, root, "transport/emu")
	})
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

func anyTrue(bs []bool) bool {
	for _, b := range bs {
		if b {
			return true
		}
	}
	return false
}

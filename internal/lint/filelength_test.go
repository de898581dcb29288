package lint

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxFileLines bounds a non-test Go file (issue 23: one job per file, no
// file over about 600 lines without a reason). Past it, split the file by
// concern into files named for what they hold (docs/layout.md), or give
// the reason in longFiles.
const maxFileLines = 650

// longFiles are the non-test Go files allowed past maxFileLines, each with
// the reason it is one file. An entry whose file is back under the bound,
// or gone, fails the test, so the list cannot outlive its reasons.
var longFiles = map[string]string{}

// TestFileLength checks that no non-test Go file is longer than
// maxFileLines unless longFiles gives the reason.
func TestFileLength(t *testing.T) {
	root := moduleRoot(t)
	lines := map[string]int{}
	for _, f := range goFiles(t, root) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		lines[filepath.ToSlash(f)] = bytes.Count(b, []byte("\n"))
	}
	for _, msg := range checkFileLength(lines, longFiles) {
		t.Error(msg)
	}
}

// checkFileLength returns one line per file of lines (path → line count)
// over maxFileLines without an entry in long, and per entry of long that
// is not needed.
func checkFileLength(lines map[string]int, long map[string]string) []string {
	var msgs []string
	for _, f := range slices.Sorted(maps.Keys(lines)) {
		if n := lines[f]; n > maxFileLines && long[f] == "" {
			msgs = append(msgs, fmt.Sprintf("%s has %d lines, over %d: split it by concern (docs/layout.md) or give the reason in longFiles", f, n, maxFileLines))
		}
	}
	for f := range long {
		if lines[f] <= maxFileLines {
			msgs = append(msgs, fmt.Sprintf("longFiles names %s, which is not over %d lines: drop the entry", f, maxFileLines))
		}
	}
	slices.Sort(msgs)
	return msgs
}

// TestCheckFileLength shows what checkFileLength reports.
func TestCheckFileLength(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines map[string]int
		long  map[string]string
		want  []string
	}{
		{name: "within", lines: map[string]int{"a/a.go": maxFileLines}},
		{name: "over", lines: map[string]int{"a/a.go": maxFileLines + 1},
			want: []string{fmt.Sprintf("a/a.go has %d lines, over %d: split it by concern (docs/layout.md) or give the reason in longFiles", maxFileLines+1, maxFileLines)}},
		{name: "over with a reason", lines: map[string]int{"a/a.go": maxFileLines + 1}, long: map[string]string{"a/a.go": "one table"}},
		{name: "reason not needed", lines: map[string]int{"a/a.go": 10}, long: map[string]string{"a/a.go": "one table"},
			want: []string{fmt.Sprintf("longFiles names a/a.go, which is not over %d lines: drop the entry", maxFileLines)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := checkFileLength(tc.lines, tc.long); !slices.Equal(got, tc.want) {
				t.Errorf("checkFileLength:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

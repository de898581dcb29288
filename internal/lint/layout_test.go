package lint

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLayout checks docs/layout.md against the tree: every non-test Go file
// has a row (package, file, one sentence), and every row names a file that
// exists, so the table of the layout cannot drift from the code.
func TestLayout(t *testing.T) {
	root := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "layout.md"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range goFiles(t, root) {
		if !strings.HasSuffix(f, "_test.go") {
			files = append(files, filepath.ToSlash(f))
		}
	}
	for _, msg := range checkLayout(string(doc), files) {
		t.Error(msg)
	}
}

// checkLayout compares the table in layout (rows "| `pkg` | `file.go` |
// sentence |", an empty package cell meaning the row above's) with files,
// slash-separated paths from the module root. It returns one line per
// finding.
func checkLayout(layout string, files []string) []string {
	var msgs []string
	rows := map[string]bool{}
	pkg := ""
	for i, line := range strings.Split(layout, "\n") {
		cells := tableCells(line)
		if len(cells) != 3 || cells[0] == "package" || strings.HasPrefix(cells[0], "---") {
			continue
		}
		where := fmt.Sprintf("docs/layout.md:%d", i+1)
		if cells[0] != "" {
			pkg = cells[0]
		}
		file, sentence := cells[1], cells[2]
		switch {
		case pkg == "":
			msgs = append(msgs, where+": row names no package")
			continue
		case !strings.HasSuffix(file, ".go") || strings.Contains(file, "/"):
			msgs = append(msgs, fmt.Sprintf("%s: %q is not a Go file name", where, file))
			continue
		case !strings.HasSuffix(sentence, "."):
			msgs = append(msgs, fmt.Sprintf("%s: %s/%s needs one sentence ending with a full stop", where, pkg, file))
		}
		p := path.Join(pkg, file)
		if rows[p] {
			msgs = append(msgs, fmt.Sprintf("%s: %s has a second row", where, p))
		}
		rows[p] = true
	}
	for _, f := range files {
		if !rows[f] {
			msgs = append(msgs, fmt.Sprintf("docs/layout.md: %s has no row (add: | `%s` | `%s` | what it holds. |)", f, path.Dir(f), path.Base(f)))
		}
	}
	var gone []string
	for p := range rows {
		if !slices.Contains(files, p) {
			gone = append(gone, p)
		}
	}
	slices.Sort(gone)
	for _, p := range gone {
		msgs = append(msgs, fmt.Sprintf("docs/layout.md: the row for %s names a file that does not exist", p))
	}
	return msgs
}

// tableCells splits a Markdown table row into its cells, without the
// backticks of code spans; nil for a line that is not a row.
func tableCells(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || len(line) < 2 {
		return nil
	}
	cells := strings.Split(line[1:len(line)-1], "|")
	for i, c := range cells {
		cells[i] = strings.Trim(strings.TrimSpace(c), "`")
	}
	return cells
}

// TestCheckLayout shows what checkLayout reports: a file without a row, a
// row for a file that is gone, a row without a sentence, and a second row.
func TestCheckLayout(t *testing.T) {
	const table = "| package | file | what it holds |\n|---|---|---|\n"
	for _, tc := range []struct {
		name   string
		layout string
		files  []string
		want   []string
	}{
		{
			name:   "complete",
			layout: table + "| `frmr` | `pool.go` | The pool. |\n| | `reg.go` | Reg. |\n| `bench` | `main.go` | The command. |\n",
			files:  []string{"frmr/pool.go", "frmr/reg.go", "bench/main.go"},
		},
		{
			name:   "file without a row",
			layout: table + "| `frmr` | `pool.go` | The pool. |\n",
			files:  []string{"frmr/pool.go", "frmr/reg.go"},
			want:   []string{"docs/layout.md: frmr/reg.go has no row (add: | `frmr` | `reg.go` | what it holds. |)"},
		},
		{
			name:   "row for a file that is gone",
			layout: table + "| `frmr` | `pool.go` | The pool. |\n| | `more2.go` | More. |\n",
			files:  []string{"frmr/pool.go"},
			want:   []string{"docs/layout.md: the row for frmr/more2.go names a file that does not exist"},
		},
		{
			name:   "no sentence",
			layout: table + "| `frmr` | `pool.go` | |\n",
			files:  []string{"frmr/pool.go"},
			want:   []string{"docs/layout.md:3: frmr/pool.go needs one sentence ending with a full stop"},
		},
		{
			name:   "second row",
			layout: table + "| `frmr` | `pool.go` | The pool. |\n| `frmr` | `pool.go` | Again. |\n",
			files:  []string{"frmr/pool.go"},
			want:   []string{"docs/layout.md:4: frmr/pool.go has a second row"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := checkLayout(tc.layout, tc.files)
			if !slices.Equal(got, tc.want) {
				t.Errorf("checkLayout:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

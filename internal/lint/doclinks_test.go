package lint

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// docRef is a citation of a repository document and, optionally, one of
// its headings: docs/verbs.md#completions.
var docRef = regexp.MustCompile(`\bdocs/([a-z0-9_-]+\.md)(#[a-z0-9_-]+)?`)

// mdLink is a relative link inside a document: [text](file.md#anchor) or
// [text](#anchor).
var mdLink = regexp.MustCompile(`\]\(([a-z0-9_-]+\.md)?(#[a-z0-9_-]+)?\)`)

// TestDocLinks checks that every docs/<file>.md#<anchor> a Go file or a
// document cites exists, anchors as GitHub renders headings, so the
// comments that cite the verbs rules and the pool's invariants cannot
// point at a heading that was renamed.
func TestDocLinks(t *testing.T) {
	root := moduleRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{} // file name → anchors
	for _, d := range docs {
		anchors[filepath.Base(d)] = headingAnchors(t, d)
	}
	check := func(where, file, anchor string) {
		a, ok := anchors[file]
		if !ok {
			t.Errorf("%s: cites docs/%s, which does not exist", where, file)
			return
		}
		if anchor != "" && !a[strings.TrimPrefix(anchor, "#")] {
			t.Errorf("%s: cites docs/%s%s, which has no such heading", where, file, anchor)
		}
	}
	files := goFiles(t, root)
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, rel)
	}
	files = append(files, "README.md")
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			where := f + ":" + strconv.Itoa(i+1)
			for _, m := range docRef.FindAllStringSubmatch(line, -1) {
				check(where, m[1], m[2])
			}
			if filepath.Dir(f) == "docs" {
				for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
					file := m[1]
					if file == "" {
						file = filepath.Base(f)
					}
					check(where, file, m[2])
				}
			}
		}
	}
}

// headingAnchors returns the anchors GitHub gives the headings of the
// Markdown file path: lower case, spaces to hyphens, punctuation other
// than hyphens and underscores dropped.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	fence := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

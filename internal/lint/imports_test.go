package lint

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/gosrp/gosrp"

// TestImportRules checks who may import whom, the layering the package
// docs describe: transport imports nothing of the project; only transport/ibverbs
// and the rbd backend (block, built with the tag ceph) import "C";
// block imports nothing of RDMA; initiator and target do not import each
// other, block, or a concrete provider; frmr imports transport only;
// nothing imports a cmd; providers import only the transport packages.
func TestImportRules(t *testing.T) {
	root := moduleRoot(t)
	pkgs := map[string]map[string]bool{} // package dir → imports (non-test files)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		// The rbd backend calls librbd's asynchronous API, which go-ceph
		// does not bind (block/rbd_aio.go); only a ceph build has it.
		cephOnly := strings.HasPrefix(filepath.Base(path), "rbd_") && len(f.Comments) > 0 &&
			strings.HasPrefix(f.Comments[0].List[0].Text, "//go:build ceph")
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(rel)
		if pkgs[dir] == nil {
			pkgs[dir] = map[string]bool{}
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p == "C" && cephOnly && filepath.ToSlash(rel) == "block" {
				continue
			}
			pkgs[dir][p] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) == 0 {
		t.Fatal("no packages found")
	}
	own := func(p string) (string, bool) {
		if p == module {
			return ".", true
		}
		rel, ok := strings.CutPrefix(p, module+"/")
		return rel, ok
	}
	under := func(dir, root string) bool { return dir == root || strings.HasPrefix(dir, root+"/") }
	for dir, imps := range pkgs {
		for imp := range imps {
			rel, isOwn := own(imp)
			if imp == "C" && dir != "transport/ibverbs" {
				t.Errorf("%s imports \"C\": only transport/ibverbs may use cgo", dir)
			}
			if !isOwn {
				continue
			}
			if under(rel, "cmd") {
				t.Errorf("%s imports %s: nothing imports a cmd", dir, imp)
			}
			switch {
			case dir == "transport":
				t.Errorf("transport imports %s: the contract imports nothing of the project", imp)
			case dir == "frmr" && rel != "transport":
				t.Errorf("frmr imports %s: it may import transport only", imp)
			case under(dir, "block") && (under(rel, "transport") || rel == "frmr" || rel == "internal/wire"):
				t.Errorf("%s imports %s: block knows nothing of RDMA", dir, imp)
			case (dir == "initiator" || dir == "target") &&
				(rel == "initiator" || rel == "target" || under(rel, "block") || rel == "transport/emu" || rel == "transport/ibverbs"):
				if rel != dir {
					t.Errorf("%s imports %s: initiator and target use the transport contract and their own volume interface only", dir, imp)
				}
			case under(dir, "transport/") && dir != "transport/transporttest" && !under(rel, "transport"):
				t.Errorf("%s imports %s: providers import only the transport packages", dir, imp)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(root, "transport")); err != nil {
		t.Fatalf("transport package missing: %v", err)
	}
}

package lint

import (
	"fmt"
	"go/types"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// TestPublicAPI: the module's public packages (all but internal/... and
// the commands) expose only their own types, the standard library's and
// each other's. An exported name whose type, field, parameter or result
// is a type from an internal package is one an embedder can receive but
// never name, nor compare with its constants (initiator.SCSIError.Status
// was an internal scsi.Status until this test found it). The default
// build's API is checked; the tagged providers (ibverbs, ceph) keep to
// the same rule by review.
func TestPublicAPI(t *testing.T) {
	needTools(t)
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes, Dir: moduleRoot(t)}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			t.Fatalf("load %s: %v", p.PkgPath, p.Errors[0])
		}
		if !isPublic(p.PkgPath) || p.Name == "main" {
			continue
		}
		bad = append(bad, internalInAPI(p.Types)...)
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		t.Errorf("the public API names types of internal packages:\n\t%s", strings.Join(bad, "\n\t"))
	}
}

// isPublic reports whether the package at path is one an embedder may
// import: not under an internal directory, not a command.
func isPublic(path string) bool {
	return !strings.Contains(path+"/", "/internal/") && !strings.Contains(path+"/", "/cmd/")
}

// internalInAPI lists the exported declarations of pkg that reach a type
// of an internal package through their types: struct fields, method
// and function signatures, interface methods, element types.
func internalInAPI(pkg *types.Package) []string {
	var bad []string
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		report := func(where string, t types.Type) {
			if n := internalType(t, map[types.Type]bool{}); n != nil {
				bad = append(bad, fmt.Sprintf("%s.%s: %s", pkg.Path(), where, n))
			}
		}
		tn, ok := obj.(*types.TypeName)
		if !ok {
			report(name, obj.Type())
			continue
		}
		report(name, tn.Type().Underlying())
		if named, ok := tn.Type().(*types.Named); ok {
			for m := range named.Methods() {
				if m.Exported() {
					report(name+"."+m.Name(), m.Type())
				}
			}
		}
	}
	return bad
}

// internalType returns the first type of an internal package that t
// reaches through what an importer sees of it, or nil.
func internalType(t types.Type, seen map[types.Type]bool) *types.Named {
	if seen[t] {
		return nil
	}
	seen[t] = true
	var inner []types.Type
	switch x := t.(type) {
	case *types.Named:
		if p := x.Obj().Pkg(); p != nil && !isPublic(p.Path()) && strings.HasPrefix(p.Path(), "github.com/gosrp/") {
			return x
		}
		for a := range x.TypeArgs().Types() {
			inner = append(inner, a)
		}
	case *types.Alias:
		inner = append(inner, types.Unalias(x))
	case *types.Pointer:
		inner = append(inner, x.Elem())
	case *types.Slice:
		inner = append(inner, x.Elem())
	case *types.Array:
		inner = append(inner, x.Elem())
	case *types.Chan:
		inner = append(inner, x.Elem())
	case *types.Map:
		inner = append(inner, x.Key(), x.Elem())
	case *types.Signature:
		for v := range x.Params().Variables() {
			inner = append(inner, v.Type())
		}
		for v := range x.Results().Variables() {
			inner = append(inner, v.Type())
		}
	case *types.Struct:
		for f := range x.Fields() {
			if f.Exported() {
				inner = append(inner, f.Type())
			}
		}
	case *types.Interface:
		for m := range x.Methods() {
			if m.Exported() {
				inner = append(inner, m.Type())
			}
		}
	}
	for _, in := range inner {
		if n := internalType(in, seen); n != nil {
			return n
		}
	}
	return nil
}

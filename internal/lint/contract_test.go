package lint

import (
	"go/ast"
	"go/types"
	"sort"
	"testing"

	"golang.org/x/tools/go/packages"
)

// checkContractAssertions fails t for each pair (transport interface I,
// type T of the provider package dir) where *T or T implements I but the
// package's non-test files hold no var _ transport.I = (*T)(nil) (or
// T{}) line. Only the largest interfaces T implements are required: one
// whose methods another implemented interface also has is implied.
func checkContractAssertions(t *testing.T, root, dir string) {
	t.Helper()
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedTypes | packages.NeedSyntax | packages.NeedTypesInfo | packages.NeedImports,
		Dir:  root,
	}
	pkgs, err := packages.Load(cfg, "./transport", "./"+dir)
	if err != nil {
		t.Skipf("cannot load packages: %v", err)
	}
	if packages.PrintErrors(pkgs) > 0 {
		t.Fatal("packages did not load")
	}
	var contract, provider *packages.Package
	for _, p := range pkgs {
		switch p.PkgPath {
		case module + "/transport":
			contract = p
		case module + "/" + dir:
			provider = p
		}
	}
	if contract == nil || provider == nil {
		t.Fatalf("loaded %d packages, want transport and %s", len(pkgs), dir)
	}

	// The contract: every exported interface of package transport.
	var ifaces []*types.TypeName
	scope := contract.Types.Scope()
	for _, name := range scope.Names() {
		tn, ok := scope.Lookup(name).(*types.TypeName)
		if ok && tn.Exported() && types.IsInterface(tn.Type()) {
			ifaces = append(ifaces, tn)
		}
	}
	if len(ifaces) == 0 {
		t.Fatal("package transport declares no interfaces")
	}

	// The assertions present: var _ I = value, keyed by interface and the
	// value's named type.
	type pair struct{ iface, impl string }
	asserted := map[pair]bool{}
	for _, f := range provider.Syntax {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, spec := range gd.Specs {
				vs, ok := spec.(*ast.ValueSpec)
				if !ok || vs.Type == nil {
					continue
				}
				it := provider.TypesInfo.TypeOf(vs.Type)
				for i, n := range vs.Names {
					if n.Name != "_" || i >= len(vs.Values) {
						continue
					}
					if named := namedOf(provider.TypesInfo.TypeOf(vs.Values[i])); named != nil && it != nil {
						asserted[pair{types.TypeString(it, nil), named.Obj().Name()}] = true
					}
				}
			}
		}
	}

	// Every named type of the provider against every contract interface.
	var missing []string
	pscope := provider.Types.Scope()
	for _, name := range pscope.Names() {
		tn, ok := pscope.Lookup(name).(*types.TypeName)
		if !ok || tn.IsAlias() || types.IsInterface(tn.Type()) {
			continue
		}
		var impl []*types.TypeName
		for _, in := range ifaces {
			iface := in.Type().Underlying().(*types.Interface)
			if types.Implements(tn.Type(), iface) || types.Implements(types.NewPointer(tn.Type()), iface) {
				impl = append(impl, in)
			}
		}
		for _, in := range impl {
			if covered(in, impl) {
				continue
			}
			if !asserted[pair{types.TypeString(in.Type(), nil), tn.Name()}] {
				missing = append(missing, "var _ transport."+in.Name()+" = (*"+tn.Name()+")(nil)")
			}
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s: missing %s", dir, m)
	}
	if len(asserted) == 0 {
		t.Errorf("%s: no contract assertions found", dir)
	}
}

// covered reports whether another interface in impl has every method of
// in and more: a type asserted to be a FastRegMR need not also be asserted
// to be an MW because both have Key and Close.
func covered(in *types.TypeName, impl []*types.TypeName) bool {
	small := in.Type().Underlying().(*types.Interface)
	for _, other := range impl {
		big := other.Type().Underlying().(*types.Interface)
		if other != in && big.NumMethods() > small.NumMethods() && types.Implements(big, small) {
			return true
		}
	}
	return false
}

// namedOf returns the named type of t or of what t points to.
func namedOf(t types.Type) *types.Named {
	if p, ok := types.Unalias(t).(*types.Pointer); ok {
		t = p.Elem()
	}
	// An alias of an instantiated generic (tcpListener =
	// streamListener[tcpWire]) names its generic type.
	n, _ := types.Unalias(t).(*types.Named)
	if n != nil && n.Origin() != nil {
		n = n.Origin()
	}
	return n
}

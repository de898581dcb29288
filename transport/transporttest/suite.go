package transporttest

import (
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// All maps a test name to the test. Each test takes a fresh provider it may
// use as it likes; Run gives every test its own.
var All = map[string]func(t *testing.T, p transport.Provider){}

// Timeout bounds every wait for a completion, an event or a connection.
// Raise it for slow providers (rxe under TCG).
var Timeout = 5 * time.Second

// RandomSeed seeds the randomized tests; zero picks one from the clock (or
// from the TRANSPORTTEST_SEED environment variable). The seed in use is
// logged by every randomized test and again when it fails.
var RandomSeed int64

func register(name string, f func(t *testing.T, p transport.Provider)) {
	if _, dup := All[name]; dup {
		panic("transporttest: duplicate test " + name)
	}
	All[name] = f
}

// Names returns the names of All, sorted.
func Names() []string {
	names := make([]string, 0, len(All))
	for n := range All {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Run runs every test of All, in name order, as a subtest with a fresh
// provider from newProvider. The provider is closed when the subtest ends,
// and the arenas the test mapped are unmapped after that.
func Run(t *testing.T, newProvider func(t *testing.T) transport.Provider) {
	RunMatching(t, nil, newProvider)
}

// RunMatching is Run for the tests whose names keep accepts (all of them
// when keep is nil), such as the fault tests over a provider wrapped by
// transport/faults, whose other tests the plain run already covers.
func RunMatching(t *testing.T, keep func(name string) bool, newProvider func(t *testing.T) transport.Provider) {
	for _, name := range Names() {
		if keep != nil && !keep(name) {
			continue
		}
		f := All[name]
		t.Run(name, func(t *testing.T) {
			p := newProvider(t)
			if p == nil {
				t.Fatal("newProvider returned nil")
			}
			own := adoptProvider(p)
			t.Cleanup(func() {
				if err := p.Close(); err != nil {
					t.Logf("closing provider: %v", err)
				}
				own.closeArenas()
			})
			f(t, p)
		})
	}
}

// owned tracks the arenas a test maps on a provider that Run created, so
// they are unmapped only after the provider (which may still address them)
// is closed.
type owned struct {
	mu     sync.Mutex
	arenas []*transport.Arena
}

var owners sync.Map // transport.Provider -> *owned

func adoptProvider(p transport.Provider) *owned {
	o := &owned{}
	owners.Store(p, o)
	return o
}

func (o *owned) closeArenas() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range o.arenas {
		a.Close()
	}
	o.arenas = nil
}

// seedFor picks the seed of a randomized test.
func seedFor(t *testing.T) int64 {
	t.Helper()
	seed := RandomSeed
	if s := os.Getenv("TRANSPORTTEST_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 0, 64)
		if err != nil {
			t.Fatalf("TRANSPORTTEST_SEED=%q: %v", s, err)
		}
		seed = v
	}
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("random seed %d (rerun with TRANSPORTTEST_SEED=%d)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with random seed %d (rerun with TRANSPORTTEST_SEED=%d)", seed, seed)
		}
	})
	return seed
}

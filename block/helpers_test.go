package block

import (
	"testing"

	"github.com/gosrp/gosrp/internal/testenv"
	"github.com/stretchr/testify/require"
)

// backend describes one backend for the tests that run against all of them.
type backend struct {
	name string
	// open opens (or reopens) the store kept in dir.
	open       func(t testing.TB, dir string) Store
	persistent bool // data survives Close and reopen
}

func backends() []backend {
	return []backend{
		{name: "memory", open: func(t testing.TB, dir string) Store { return NewMemStore() }},
		{name: "file", persistent: true, open: func(t testing.TB, dir string) Store {
			s, err := OpenFileStore(dir)
			require.NoError(t, err)
			return s
		}},
		{name: "pebble", persistent: true, open: func(t testing.TB, dir string) Store {
			s, err := OpenPebbleStore(dir, &PebbleOptions{CacheSize: 8 << 20, MemTableSize: 4 << 20})
			require.NoError(t, err)
			return s
		}},
	}
}

// extraAPIBackends are backends that only some builds have (rbd, with
// the build tags ceph and pacific); the API tests run against them too.
var extraAPIBackends []backend

// apiBackends is backends plus extraAPIBackends: the stores the API tests
// (api_test.go) specify.
func apiBackends() []backend { return append(backends(), extraAPIBackends...) }

// seedFrom returns the seed from the environment variable name (for
// replay) or a fresh one, and logs it.
func seedFrom(t testing.TB, name string) int64 { return testenv.Seed(t, name) }

//go:build !(ceph && pacific)

package block

import "fmt"

// OpenRBDStore would open an RBD store; this build has no Ceph support
// (it needs cgo, librbd and the build tags ceph and pacific), so it fails
// with ErrUnsupported.
func OpenRBDStore(o RBDOptions) (Store, error) {
	return nil, fmt.Errorf("block: rbd store: built without Ceph support; build with -tags ceph,pacific: %w", ErrUnsupported)
}

// RBDSupported reports whether this build can open RBD stores.
const RBDSupported = false

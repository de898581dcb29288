// Package gateway lets several targets export one volume of a shared
// store (Ceph RBD: several srpd processes over one image), exactly one of
// them serving it at a time, and hands the initiators what they need to
// fail over: the path state of each open and a takeover that is fenced.
//
// A Catalog is the target.Catalog of one gateway:
//
//	st, _ := block.OpenRBDStore(block.RBDOptions{Pool: "rbd", Exclusive: true})
//	tgt, _ := target.New(target.Config{Catalog: gateway.New(st)})
//
// It opens each volume shared (block.SharedOpener) and tries its lock:
// the first gateway to open a volume takes the free lock and answers the
// open ACTIVE (wire.PathActive); the others find it held and answer
// STANDBY, and their handles refuse I/O with target.ErrStandby, which
// the initiator receives as wire.SenseNotActive. An open that asks for a
// takeover (wire.ControlRequest.Takeover) makes a standby break the
// owner's lock, which blocklists the owner on the cluster, then take the
// lock, and only then answer ACTIVE and let I/O through: no write the
// old gateway accepted can reach the image after the new one served any
// I/O, since the cluster refuses the old one's requests (ESHUTDOWN) from
// the break on. The old gateway learns it at its next I/O (block.ErrFenced),
// or from the store at once (FenceWatcher), and is Fenced; a store that
// can (block.Reconnector: rbd gives each shared volume a cluster client
// of its own) gives the volume a new client right away, and the gateway
// stands by again, ready to take the volume back when an initiator asks
// (failback is asked for, never taken).
//
// Stores without locks (pebble, memory) are not block.SharedOpeners:
// their volumes are always active, and Catalog passes them through.
//
// The decisions live in a pure core (core.go): one volume's state,
// events in (open, takeover, the outcome of each lock step, fenced,
// closed) and actions out (lock, break). testdata/core is its
// specification; FuzzCore checks its invariants on any event sequence.
// The shell (catalog.go) runs the store calls the core asks for.
package gateway

package emu

import (
	"fmt"
	"sort"

	"github.com/gosrp/gosrp/transport"
)

// Profile is a named bundle of device quirks
// (docs/verbs.md#device-differences). Every knob can also be set on its own
// through Config.Quirks.
type Profile struct {
	Name   string
	Quirks transport.Quirks
	// Vendor is what DeviceAttr.Vendor reports, to make logs readable.
	Vendor string
}

var profiles = map[string]Profile{
	// strict is the most unforgiving behaviour any real device shows, so
	// that consumer bugs surface in tests rather than in the field.
	"strict": {Name: "strict", Vendor: "gosrp-emu (strict)", Quirks: transport.Quirks{
		PoisonOnFlush:    true,
		LocalOpErrStatus: transport.StatusMWBindErr,
		ScrambleErrorWC:  true,
	}},
	// ib is ConnectX-3-like: a flushed REG/LINV poisons the MR until it is
	// deregistered (docs/verbs.md#flushed-invalidations; xprtrdma
	// acd9f2dd23c6).
	"ib": {Name: "ib", Vendor: "gosrp-emu (ConnectX-3-like)", Quirks: transport.Quirks{
		InvalidateIndexOnly: true,
		PoisonOnFlush:       true,
		LocalOpErrStatus:    transport.StatusMWBindErr,
		DropPostsBeforeRTS:  true,
		ScrambleErrorWC:     true,
		// Destroying a QP takes its type-2 windows with it.
		DestroyQPInvalidatesWindows: true,
	}},
	// iwarp is siw-like: invalidation ignores the 8-bit key and accepts an
	// already invalid STag (siw_invalidate_stag).
	"iwarp": {Name: "iwarp", Vendor: "gosrp-emu (iWARP/siw-like)", Quirks: transport.Quirks{
		InvalidateIndexOnly: true,
		InvalidateFreeOK:    true,
		LocalOpErrStatus:    transport.StatusMWBindErr,
		// Destroying a QP takes its type-2 windows with it.
		DestroyQPInvalidatesWindows: true,
	}},
	// rxe is Linux soft-RoCE as the project meets it: through user-space
	// verbs and the ibverbs provider, as measured in the VM (test/rxe; the
	// table in the package doc and in transport/ibverbs). Full key compare
	// on invalidate; failed LOCAL_INV and REG_MR complete LOC_QP_OP_ERR
	// (failed BIND_MW stays MW_BIND_ERR, as on rxe); no async event for a
	// responder error; an lkey that does not resolve and a SEND larger
	// than the receive are LOC_QP_OP_ERR; window bounds are not checked,
	// only the MR's under the window (a device bug, not a feature).
	// Invalidating a FREE object fails and posts before RTS are refused:
	// rxe itself would oops or queue them, and the provider stops both
	// before they reach the device. So is destroying a QP while a type-2
	// window bound through it is valid: rxe would wait ~50 s for the
	// window's reference and warn. Indices are handed out cyclically
	// (rxe_pool.c's xa_alloc_cyclic), not the one freed last. A WR that
	// fails at the requester completes WR_FLUSH_ERR, its cause unreported,
	// as on Linux 6.12 (LocalErrFlushed); Linux 6.1 reports the statuses
	// above instead, which the other profiles' consumers see. A retry
	// executes again the local operations behind the request it retries
	// (RetryRepeatsLocalOps), as every rxe release does. A received
	// SEND_WITH_INV invalidates a window whatever QP bound it and whatever
	// PD it is of (RemoteInvalidateAnyQP), and one naming a FREE window is
	// counted as the kernel oops it is (Counters.KernelOopses).
	"rxe": {Name: "rxe", Vendor: "gosrp-emu (rxe-like)", Quirks: transport.Quirks{
		LocalOpErrStatus:      transport.StatusLocQPOpErr,
		NoQPErrorEvents:       true,
		LocalKeyErrStatus:     transport.StatusLocQPOpErr,
		RecvLenErrStatus:      transport.StatusLocQPOpErr,
		WindowBoundsUnchecked: true,
		CyclicIndices:         true,
		LocalErrFlushed:       true,
		RetryRepeatsLocalOps:  true,
		RemoteInvalidateAnyQP: true,
	}},
}

// Profiles lists the profile names, sorted.
func Profiles() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupProfile returns the named profile.
func LookupProfile(name string) (Profile, error) {
	if name == "" {
		name = "strict"
	}
	p, ok := profiles[name]
	if !ok {
		return Profile{}, fmt.Errorf("emu: unknown profile %q (have %v): %w", name, Profiles(), transport.ErrNotFound)
	}
	return p, nil
}

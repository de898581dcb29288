// Package transporttest is the conformance suite of the verbs contract in
// package transport: a map of named tests, each taking a
// transport.Provider, that every provider runs (the go-fuse posixtest.All
// idea). A provider is correct when it passes the suite.
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, func(t *testing.T) transport.Provider {
//			p, err := myprovider.New(...)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return p
//		})
//	}
//
// The expected outcome of many rules depends on the device under test: the
// tests read DeviceAttr.Quirks (transport.Quirks) and DeviceAttr.Caps and
// assert the outcome the quirks promise. A test that needs a capability the
// device lacks skips with a message naming it.
//
// Every test uses two ends of one connection on one provider (Listen on a
// fresh local address, Resolve, Connect and Accept concurrently). The
// active end, "A", plays the initiator of gosrp's data path: it owns the
// registrations and posts REG_MR / BIND_MW / LOCAL_INV. The passive end,
// "B", plays the target: it issues the RDMA READs and WRITEs through A's
// keys and sends SEND_WITH_INV.
//
// Fault-injection tests need provider hooks. They are the small optional
// interfaces of hooks.go, whose method sets match the software NIC's
// (transport/emu); a provider that lacks one skips the tests that need it.
//
// Test families (names are "Family/Rule" or "FastReg/<FRMR|MW>/Rule"):
//
//   - Key, Arena, Device: key layout and wrap, arenas, device attributes.
//   - MR: regular MRs; local SGE checks (LOC_PROT_ERR, flush of both queues
//     in posting order); remote READ/WRITE key, access and bound checks
//     (REM_ACCESS_ERR at the requester, responder QP to ERR, no byte
//     changed).
//   - Send, Write: SEND/RECV, immediates, inline, byte_len, LOC_LEN_ERR,
//     RNR_RETRY_EXC_ERR.
//   - FastReg/FRMR and FastReg/MW: the same rules through REG_MR and
//     through BIND_MW of type-2 windows: registration, chained advertise,
//     REG on VALID (F13), LOCAL_INV with right/wrong key (F14) and on FREE,
//     staged vs device key, stray ops after re-registration (F5) and before
//     the invalidate executes (F6), key wrap (F20), poisoning after a flush
//     (F2), SEND_WITH_INV right and wrong (F15), fenced LINV after READ
//     (F18).
//   - QP, CQ, Event: state machine, posts before RTS (F19), flush on ERR
//     (F1), SQ overflow (F11), queue wrap, SQD, CQ overrun (F12), async
//     events.
//   - CM: private data and its limits, reject, disconnect, listener close.
//   - Order: posting order, RC ordering of WRITE before SEND, fences, and a
//     seeded randomized mix (RandomSeed, TRANSPORTTEST_SEED).
//   - Inject: fault injection through the hooks of hooks.go (F1, F8, F10,
//     F12, link cut); skipped without them.
//
// Rules are cited by their number in research/frmr-semantics.md: F1..F20 are
// the fault scenarios of §8, "§2.3" etc. are sections.
package transporttest

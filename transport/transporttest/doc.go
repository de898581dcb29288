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
//   - FastReg/FRMR and FastReg/MW: the same rules through REG_MR and through
//     BIND_MW of type-2 windows: registration, chained advertise, failed
//     registration (REG on VALID), wrong-key invalidation and LOCAL_INV on
//     FREE, staged vs device key, strays after re-registration and before
//     invalidation, key wrap, poisoned after a flush, bogus remote
//     invalidation, read then invalidate (fenced LOCAL_INV after READ).
//   - QP, CQ, Event: state machine, posts before RTS, flush on ERR (QP error
//     mid-burst), send-queue overflow, queue wrap, SQD, CQ overrun, async
//     events.
//   - CM: private data and its limits, reject, disconnect, listener close.
//   - Order: posting order, RC ordering of WRITE before SEND, fences, and a
//     seeded randomized mix (RandomSeed, TRANSPORTTEST_SEED).
//   - Inject: fault injection through the hooks of hooks.go (QP error
//     mid-burst, duplicate packets, partial post, CQ overrun, link cut);
//     skipped without them.
//
// The verbs rules the tests check are those of docs/verbs.md, cited by
// section; the fault scenarios, such as "failed registration", are the
// headings of docs/registration.md#fault-scenarios.
package transporttest

// Package faults injects transport faults into any provider, the real
// hardware one included, so that the tests that attack the registration
// discipline with lost, failed and refused work can run on the kernel's
// rxe in the VM as well as on the software NIC.
//
// Wrap a provider and use the result in its place:
//
//	hw, _ := transport.Open("ibverbs", nil)
//	p := faults.Wrap(hw, faults.Config{Seed: 1, PostFail: 0.001, CorruptCQE: 0.0005})
//	// p is a transport.Provider: listen, connect, register, post as usual.
//
// Everything a consumer does passes through to the provider underneath; the
// wrapper stands between the consumer and its queue pairs and completion
// queues, where a fault can be made without the device's help:
//
//   - a post failure: PostSend hands the device the WRs before the chosen
//     one and fails that one with an error wrapping transport.ErrQueueFull,
//     as ibv_post_send's bad_wr does when the send queue has no room
//     (docs/registration.md#partial-post);
//   - a QP error: the QP is moved to ERR just before the chosen WR is given
//     to the device, so it and every later WR flush, as after a real error
//     (docs/registration.md#qp-error-mid-burst);
//   - a lost completion: a successful send completion never reaches Poll,
//     as when a device or a driver drops a CQE;
//   - a corrupted completion: a successful send completion reports an error
//     status, the QP is moved to ERR, and every later completion of that QP
//     reports WR_FLUSH_ERR, what a consumer sees after a real error. The WR
//     did execute: the consumer must treat its memory as in an unknown
//     state, which is the case the pool's recovery exists for;
//   - a link cut: the connection under a QP is disconnected.
//
// Faults happen at seeded random rates (Config), or one at a time through
// the hooks transport/transporttest uses (InjectPostFailure, InjectQPError,
// InjectDropCQE, InjectCQEStatus, CutLink), so the conformance suite's
// fault tests run over any provider wrapped here. Faults that need the
// wire itself (duplicated or delayed packets, strays, CQ overruns) are the
// software NIC's alone (transport/emu).
//
// Two more are a slow device rather than a fault, each a right a real one
// has: PostLatency returns from PostSend late, with the WRs' completions
// already in the CQ (rxe can run its requester inside the post call), and
// DestroyLatency, or HoldDestroys until released, returns from a QP's
// Close late, after the QP underneath is gone (rxe's destroy waits for
// the references its tasks hold: 9 minutes once on Linux 6.12). They
// find a consumer that counts on a poll between a post and its completion,
// or that holds anything shared across a destroy.
//
// The programs take the rates as provider options named fault-postfail,
// fault-qperror, fault-dropcqe, fault-corruptcqe, fault-linkcut and
// fault-seed, and the latencies as fault-postlatency and
// fault-destroylatency (SplitOptions), with any provider:
//
//	bench --provider ibverbs --provider-option fault-corruptcqe=0.001 ...
//	srpd --provider-option fault-destroylatency=10m
//
// A lost completion is judged on successful completions only: a failed
// completion does not say whether it was a send or a receive (struct
// ibv_wc leaves the opcode undefined on error).
package faults

// Package transport is the verbs contract of gosrp: the objects an RDMA
// consumer programs against (provider, device, protection domain, memory
// regions and windows, completion queues, reliable-connected queue pairs,
// work requests and completions, connection management) and nothing else.
//
// The contract follows libibverbs and librdmacm closely so that the
// hardware provider (transport/ibverbs) maps it one to one, and it is
// strict where the InfiniBand Architecture is strict so that the software
// provider (transport/emu) can hold consumers to the rules real devices
// enforce:
//
//   - Work requests on one send queue execute in posting order; a REG_MR or
//     BIND_MW chained in front of the SEND that advertises its key is
//     therefore in force before the peer can learn the key (ibv_bind_mw(3)).
//   - PostSend and PostRecv take a slice and report how many requests were
//     accepted together with the error of the first one that was not, the
//     bad_wr contract of ibv_post_send(3). Requests that were not accepted
//     never complete and must never be waited for.
//   - Every signaled success and every error, signaled or not, produces one
//     work completion. On an error completion only ID, Status, QPNum and
//     VendorErr are meaningful (ibv_poll_cq(3)); providers may scramble the
//     rest.
//   - A key (lkey or rkey) is a 24-bit index and an 8-bit consumer key. The
//     consumer bumps the 8-bit part before every fast registration; the
//     device's copy of the key, page list and state change only when the
//     registering or invalidating work request executes.
//
// Memory handed to a device lives in an Arena: page-aligned, mmap'd, off the
// Go heap, so that a device (or the software NIC, or a peer process) may read
// and write it at any time without racing the garbage collector.
//
// Providers register themselves by name (Register); programs pick one with
// Open. The conformance suite in transport/transporttest defines, by test,
// what a correct provider does.
package transport

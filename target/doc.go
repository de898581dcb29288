// Package target is the server side of gosrp: it serves block volumes to
// initiators over a transport.Listener, moving data with RDMA READ and
// RDMA WRITE through the descriptors each command carries and answering
// with a response that can invalidate the initiator's key
// (SEND_WITH_INV), in the style of ib_srpt and nvmet-rdma.
//
// Embedding a target takes a few lines (emu is the software NIC; any
// transport.Provider works, and any Catalog of volumes):
//
//	nic, _ := emu.New(emu.Config{})
//	l, _ := nic.Listen(ctx, "127.0.0.1:4420")
//	t, err := target.New(target.Config{
//		Name:    "tgt0",
//		Catalog: myCatalog, // List + OpenVolume over e.g. a block.Store
//		ACL:     &target.ACL{Rules: []target.ACLRule{{Initiator: "*", Volume: "*", Access: target.AccessReadOnly}}},
//	})
//	if err != nil { ... }
//	go t.Serve(ctx, l)
//	defer t.Shutdown(context.Background())
//
// # Protocol
//
// A connection request must carry a wire.Hello with the right magic and
// version (otherwise it is rejected, with the target's Hello when only the
// version is wrong), or a T10 SRP login (see Standard SRP below). The target then creates, on the request's device, a
// PD, one CQ (send depth + receive depth + 1 entries), an RC QP with
// Credits × (MaxDesc + 1) + 2 send and Credits + 1 receive entries, and
// two registered arenas: IU buffers (every receive, large enough for a
// command with 8 KiB of immediate data; a 4 KiB send buffer per request
// slot, one for login) and data buffers (Credits ×
// MaxTransfer, local access only; REMOTE_WRITE is added on iWARP-like
// devices, whose RDMA READ sinks need it). With Config.SpareBuffers set,
// the PD and arenas of a connection that ended, once its QP is gone, go
// to the next accept, which then registers nothing: on rxe the data
// buffers' registration is most of an accept. Every receive is posted
// before the connection is accepted.
//
// The first IU must be a LoginRequest, within Config.LoginTimeout. The
// target checks the version, the target name (when given), the IU sizes
// (an initiator IU larger than 4 KiB is rejected IUTooLarge) and, when
// Config.Secrets requires it, runs the HMAC-SHA256 challenge: the proofs
// bind both nonces, the initiator name and the target name the initiator
// addressed (LoginRequest.Target, possibly empty). Credits, MaxTransfer
// and MaxDesc are the minimum of both sides, and so is the immediate data
// a WRITE may carry (at most 8 KiB); remote invalidation is used only if
// both offer it. A refused login is answered with a LoginReject
// and then disconnected.
//
// Control requests (LIST, OPEN, CLOSE, EXTENTS, and the reservations'
// PR-OUT and PR-IN, see Reservations below) and commands each consume
// a credit and each response returns one. EXTENTS asks which parts of a
// range of an open volume hold data; a worker answers it from the
// volume's Allocator (at most wire.MaxExtents extents from the start of
// the range, a prefix the initiator asks again after), or reports the
// range allocated for a volume without one. OPEN checks the ACL (a denied volume is
// answered SenseNoSuchVolume with an explicit "access denied" Error;
// LIST leaves out what the initiator may not open, and a snapshot
// VOL@SNAP is never more open than VOL, see ACL); a
// read-only ACL rule, a read-only open or a read-only catalog entry makes
// the handle read-only. A store that has not opened the volume within
// Config.OpenWait has the OPEN answered SenseBecomingReady, to be asked
// again, so that one hung volume stops no session (conn_open.go).
// Commands are validated before any data moves: an
// unknown handle, a transfer over the negotiated limits, a write to a
// read-only handle, a misaligned or out-of-range request is answered with
// an error Response and touches neither the volume nor the initiator's
// memory, and so is one a reservation forbids. A WRITE's data is fetched with one RDMA READ per descriptor; the
// volume is written only after the last READ completed, so the response,
// and any SEND_WITH_INV in it, never overtakes a READ of that key. A WRITE
// with immediate data is copied out of its receive buffer before the
// buffer is posted again, and goes to the volume at once; more immediate
// data than was granted is a protocol violation. A READ's
// data is pushed with unsignaled RDMA WRITEs chained in front of the
// response SEND.
//
// Protocol violations (a malformed IU, a wrong opcode, a command before
// login, more requests than credits, a failed receive) are logged and end
// that connection only. A failed RDMA READ or WRITE (a bad rkey: the QP is
// in ERR) ends the connection without a response; the initiator sees its
// own QP fail and reconnects.
//
// # Reservations
//
// Persistent reservations (SPC-4 §5.13) bind hosts, not connections: a
// volume's registrations (initiator name, 64-bit key) and reservation
// live in a table the connections share (reservation.go), changed by the
// control requests wire.ControlReserveOut and read by
// wire.ControlReserveIn, and each change publishes an immutable copy that
// every command is checked against with one atomic load (core_pr.go has
// the state machine and SPC-4's table). A command the reservation
// forbids is answered SenseReservationConflict: at its arrival, and for
// a write again as it is handed to the store, so a host preempted
// meanwhile writes nothing more; PREEMPT AND ABORT also waits for the
// preempted hosts' writes already in the store before it is answered. An OPEN with Exclusive is an implicit Write
// Exclusive reservation of its session, refused while another session
// has the volume open for writing, and ended when the session closes its
// last handle or ends.
//
// # Standard SRP
//
// A connection request whose private data is the RDMA-CM SRP_LOGIN_REQ
// the Linux kernel's ib_srp sends is served as T10 SRP (docs/srp.md): the
// login is answered in the accept (SRP_LOGIN_RSP: the credits, 8260-byte
// initiator IUs, immediate data at ib_srp's offset) or the reject
// (SRP_LOGIN_REJ with its reason). The initiator name the ACL and Secrets
// see is the initiator port identifier in hex, and the ACL's rules naming
// the session's source host (SourcePrefix) apply too; SRP has no secret,
// so an initiator that must authenticate is rejected. The catalog's volumes, in
// name order, are the LUNs (LUN 0 the first; those the ACL denies have no
// unit), each a SCSI block device (package internal/scsi) opened for the
// session. SRP_CMDs run INQUIRY, REPORT LUNS, TEST UNIT READY, READ
// CAPACITY, MODE SENSE, READ and WRITE 10/16 and SYNCHRONIZE CACHE on the
// same slots, jobs and RDMA path as gosrp commands, through direct
// descriptors, inline indirect tables or immediate data, and are
// answered with an SRP_RSP in a plain SEND (SRP has no remote
// invalidation). A login with the multi-channel action SINGLE ends the
// other channels of its (initiator port, target port) nexus, as channel
// reinstatement does; SRP_I_LOGOUT ends the channel. The channels of a
// nexus share its unit attentions (srp_nexus.go): each is reported once
// per I_T nexus, on whichever channel asks first (SAM-5 5.14); ABORT
// TASK SET and CLEAR TASK SET abort the unit's commands on every channel
// of the nexus (a task set per I_T nexus, TST 001b). LOGICAL UNIT RESET
// aborts them on every channel of every nexus that has the unit (SAM-5
// 6.3.3), another nexus's answered TASK ABORTED (TAS), is answered once
// they all stopped, and raises a unit attention for the other nexuses.
//
// # Structure
//
// Each connection is a core and a shell. The core (a state machine per
// connection, with explicit connection and request-slot states) takes
// events — a work completion, a finished backend job, a tick, a drain
// request — and returns actions: receives and sends to post, jobs to
// start, a disconnect. It has no goroutines, reads no clock and makes no
// provider calls. The shell is one goroutine per connection that polls
// the CQ in batches, posts the core's work requests, and hands volume and
// catalog calls to a pool of workers (one per credit), so the poller never
// blocks on storage. Two kinds of volume call run on the shell itself,
// where a hand-off would cost more than the call: I/O on an Immediate
// volume (memory), and the plain writes that became ready in one pass to
// a BatchWriter volume (pebble), as one batch, unless the volume reports
// that writes are stalled. Every wr_id encodes the connection generation, the
// kind of request (receive, RDMA READ, RDMA WRITE, response, login) and
// the slot or buffer index. In steady state a command allocates nothing.
//
// Shutdown stops accepting, lets each connection finish and answer what is
// in flight (new commands are answered Busy), disconnects and waits; its
// context bounds the wait.
//
// # Policy changes
//
// Target.SetACL and Target.PolicyChanged (after the answers of
// Config.Secrets change) send every connection a policy event; its core
// re-evaluates the session at once, not at its next request. A session
// whose initiator's secret changed or was removed is disconnected (the
// core keeps a keyed digest of what Secrets answered at login, never the
// secret), and a login waiting for its proof is rejected, so only the
// current secret gets back in. A handle whose volume the ACL no longer
// allows is revoked: the shell closes the volume once the operations it
// is running finish, and the handle answers every command, including a
// WRITE whose data was still being fetched, SenseAccessDenied until the
// initiator closes it (its number is not reused before, so no I/O meant
// for the old volume reaches another). A handle narrowed to read-only
// answers writes SenseWriteProtected. An OPEN is checked again when its
// volume is open. Access is never widened on an open handle. Each effect
// is logged at Info.
//
// # Write verifier
//
// Every login response carries the target's instance (the Target's
// Instance, a random nonzero 64-bit value drawn by New), NFS's write
// verifier. What it promises: while it stays the same, every write this
// target acknowledged is still there to be made durable by a FLUSH, and a
// FLUSH covers every write to the volume acknowledged before the FLUSH
// arrived, on any connection. Whenever that may have stopped being true
// it changes, and a new process, which starts with whatever the store
// kept, always gets a new one: a crashed target's acknowledged but
// unflushed writes may be gone. A graceful restart changes it too (the
// store was flushed, but the target does not remember what it promised);
// initiators then replay or report a loss that did not happen, which is
// safe. The core sends the value it is given; only the shell draws it.
//
// # Channel reinstatement
//
// An initiator names its session and channel in the login. A login for a
// channel the target still serves on an older connection (the initiator
// saw that connection die first) ends the old connection and waits, up
// to 30 s, for the volume calls it had started before the new login is
// answered; otherwise a write the dead connection had already fetched
// could land after the initiator re-issued it and wrote newer data
// (iSCSI session reinstatement, RFC 7143 §6.3.5). A login with no session
// opts out.
//
// # Gateways
//
// Several targets may export one volume of a shared store, one of them
// serving it at a time: a volume that implements PathStater (cmd/srpd's
// catalog over rbd) is answered standby or active in the OPEN's answer
// (wire.PathState), an OPEN with Takeover calls its TakeOver before it
// answers, and I/O failing with ErrStandby is answered SenseNotActive so
// that the initiator fails over. Target.PathStateChanged (the gateway
// catalog's hook) tells every session that has the volume open, unasked,
// with a wire.PathNotice when its state changes (core_notice.go), and a
// wire.ControlPing is answered on the connection's loop, the initiator's
// keepalive. SRP hosts see the same states as ALUA target port groups
// when Config.SRPPortGroup is set: REPORT TARGET PORT GROUPS gives the
// state, SET TARGET PORT GROUPS runs TakeOver, and a change is a unit
// attention (internal/scsi/alua.go). docs/gateways.md has the whole
// design.
package target

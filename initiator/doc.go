// Package initiator is the client side of gosrp: it dials a target over a
// transport provider, logs in, opens volumes and reads and writes them,
// exposing the application's memory to the target only through the FRMR
// pool (package frmr) and only for the life of each I/O.
//
// A ten-line program:
//
//	p, _ := transport.Open("emu", transport.Options{"wire": "tcp"})
//	s, err := initiator.Dial(ctx, initiator.Config{Provider: p, Addr: "127.0.0.1:4420", Name: "host-a"})
//	if err != nil {
//		return err
//	}
//	defer s.Close()
//	v, _ := s.Open(ctx, "vol0", initiator.OpenOptions{})
//	buf := make([]byte, 4096)
//	_, err = v.ReadAt(buf, 0)
//
// How an I/O travels: the channel's poller takes a credit, registers the
// buffer (a per-credit bounce buffer, or the application's own memory if
// it came from Session.AllocBuffer) with a freshly bumped key, and chains
// REG_MR (or BIND_MW) → SEND(command) on one send queue. The target moves
// the data with RDMA READ or WRITE and answers, normally with
// SEND_WITH_INV naming the key. The I/O completes only when the response
// has arrived, the command's SEND has completed, and the key is proven
// invalid: by the remote invalidation if it names exactly the key
// registered, otherwise by a signaled LOCAL_INV that completed SUCCESS.
// A write of up to Config.ImmediateData bytes (8 KiB by default, as the
// target grants) skips all of that: its SEND gathers the command and the
// data through local keys (SRP-2 immediate data), no key is exposed, and
// it completes when the response arrives (on RC the target answers only a
// command it received; the NIC may still resend the SEND until it sees the
// ACK, but the responder drops a duplicate without delivering it again).
//
// Besides I/O, Volume.Extents asks the target which parts of a range hold
// data (a control request, no data moved), so that a copy can skip the
// holes; srpc nbd answers NBD's BLOCK_STATUS with it.
//
// A volume resized on the target while open follows without a reopen:
// the target marks the handle, the next response on it carries the new
// size (a capacity notice, as SCSI's UNIT ATTENTION "capacity data has
// changed"), and Volume.Size changes and OpenOptions.OnResize is called
// before that request completes. A request sent past the end of a volume
// shrunk under it fails out of range, saying so; later ones are refused
// locally.
//
// Hosts sharing a volume coordinate with persistent reservations, as
// SCSI's PERSISTENT RESERVE and NVMe reservations do: Volume.Reservations
// registers this host's key (hosts are known by Config.Name), reserves
// the volume Write Exclusive or Exclusive Access, releases, clears and
// preempts a dead host's key; a command a reservation forbids fails with
// ErrReservationConflict. OpenOptions.Exclusive is the simple case: the
// volume opened as its only writer for as long as it stays open.
//
// Failures: any error completion, a bogus remote invalidation, an answer
// that breaks the protocol (an OPEN answered with a handle already open
// on the connection, which would send one volume's I/O to another), a
// missing completion past Config.IOTimeout, a target silent past
// Config.KeepaliveTimeout (pinged after half of it; off unless set) or a
// lost link tears the connection down: the QP is moved to ERR and drained, every registration not proven
// invalid is deregistered and replaced, and the channel reconnects with
// backoff, logs in again, re-opens its volumes and re-issues the I/O that
// had not completed. The first try is at once, unless the connection
// ended before any I/O completed on it, within 2 s of coming up, and
// not by a timeout: then it waits 25 ms, doubling with each such
// connection to 2 s (as ib_srp's reconnect_delay does), so that a
// target that takes every login and cuts it is not asked hundreds of
// times a second, while a path that carries no I/O (a standby) does not
// carry the pacing of flaps long past into its next reconnect. In T10
// SRP a channel other than the first waits, before it logs in again, for
// the first to log in again with SINGLE, which ends the nexus's older
// channels and their I/O (srp_fence.go): a channel's loss costs every
// channel a login, as in ib_srp. I/O fails with ErrConnectionLost only after
// Config.LossTimeout; a command the target leaves unanswered through five
// I/O timeouts fails with os.ErrDeadlineExceeded, and one re-issued across
// connections that ended with it on them, whatever ended them (a target
// that breaks the protocol in every answer and takes every login again),
// fails with ErrConnectionLost once LossTimeout has passed since the
// first. A volume whose store
// the target is still opening (answered NOT READY, becoming ready, past
// the target's OpenWait) is asked for again until Open's context ends.
// One that a reconnect cannot re-open at once (its store hung, or the
// volume deleted meanwhile) does not hold the others: the connection
// comes up without it, and its I/O waits for it until LossTimeout, as
// it would have for the connection (late_open.go).
// Each channel is one QP with its own poller
// goroutine, pool and credits; a session spreads I/O over its channels.
//
// # Multipath
//
// DialMultipath connects to several gateways of the same volumes
// (targets over one shared store, as srpd processes over one Ceph RBD
// image). A volume opened through it does its I/O on the gateway that
// answers active (Volume.Standby tells a plain open's answer); when that
// path stays down past MultipathConfig.FastFail or answers standby, the
// volume asks the next gateway to take over (OpenOptions.Takeover: it
// fences the old one before it serves anything) and re-issues there what
// had not completed, synchronous calls and Submit alike, as new requests
// with new keys of that path's session. A path whose reconnect is
// refused (the gateway's process is gone) fails over at once. Each
// path's keepalive (MultipathConfig.Keepalive, FastFail by default)
// finds a gateway that hangs with its connections up, so that its I/O
// fails over too; and the gateways' path notices (wire.PathNotice, to
// the active handle and to the standby handles the volume keeps on the
// other paths) move it as soon as its gateway loses the volume or
// another takes it. The rules and figures are in docs/gateways.md.
//
// # Inside a channel
//
// A channel's I/O logic is a pure state machine, the core (core.go): it
// takes events (a request to start, polled completions, the outcome of a
// post, a tick, the connection coming up or being torn down) and returns
// actions (work requests to post, requests to deliver or re-queue, a
// reason to end the connection). It starts no goroutines, reads no clock
// and calls no provider. The shell (loop.go, channel.go) owns the QP, the
// CQ and the goroutine: it stages every request it can in one pass and
// posts their chains (and the LOCAL_INVs owed) in a single PostSend, one
// doorbell for the batch, then hands the core what the CQ returns. The
// traces in testdata/core are the core's specification, each an event
// and what it asked for: hostile answers, flushed invalidations, partial
// posts, timeouts. FuzzCore drives it with arbitrary event sequences.
//
// # Standard SRP
//
// With Config.Protocol set to ProtocolSRP a session speaks T10 SRP
// instead, to a standard SRP target (the kernel's ib_srpt, srpd's SRP
// personality): the login rides in the connect request
// (Config.SRPTargetPortID names the target port, SRPInitiatorPortID or
// SRPPortID(Name) this side), the target's LUNs are the volumes "lun0",
// "lun1", ... (Session.Volumes, Open), and I/O is SCSI READ(16),
// WRITE(16), SYNCHRONIZE CACHE(16) and UNMAP through the same core,
// pool and rules. SRP has no remote invalidation: every registered I/O
// ends with a signaled LOCAL_INV. A target's refusal of a command is a
// *SCSIError; docs/srp.md has the details. After every re-login a LUN's
// requests wait until its Device Identification page has been read
// again (srp_identity.go): another unit there ends the Volume with
// ErrVolumeReplaced, none at all (LOGICAL UNIT NOT SUPPORTED) with
// ErrVolumeGone; a unit still becoming ready (NOT READY 04h/01h) is
// asked again, as Open asks while its context lasts.
//
// # Target restarts
//
// Re-issuing what had not completed is enough when only the connection
// died. When the target process died, it may also have lost writes it
// had acknowledged and not yet made durable, and a Flush after the
// reconnect would succeed on the new process without them. The target's
// login response therefore carries its instance, a value that changes
// whenever such writes may have been lost (NFS's write verifier). The
// session learns it at its first login and compares at every later one.
//
// A volume is dirty while writes were acknowledged since the last
// successful flush; a flush covers the writes acknowledged before it was
// issued, whichever channel carried them. When a login finds another
// instance, each dirty volume either has its writes replayed or is marked
// as having lost them:
//
//   - With Config.ReplayBuffer = 0 (the default) there is nothing to
//     replay: the volume's next Flush and its next FUA write fail with
//     ErrWriteCacheLost, each once per loss (as Linux reports a writeback
//     error to the next fsync and only to it), and VolumeStats counts it.
//     So does every other Flush issued before a Flush reported the loss
//     that may cover lost writes, however many are in flight: the loss
//     is never reported as durable. A Flush issued after the report
//     covers only what was written since, and succeeds.
//   - With a replay buffer, the session keeps a copy of every write
//     acknowledged since its volume's last successful flush, in one ring
//     of that many bytes allocated at Dial (FUA writes need none unless
//     the ring holds older writes of their volume, which a replay must
//     not put back over them; DISCARD and WRITE_ZEROES take only their
//     range). A successful flush drops the copies it covered. When the
//     ring is full, the completion of the write that does not fit waits
//     while the session flushes (NFS's COMMIT under too many unstable
//     writes): nothing is ever dropped to make room. After an instance
//     change the copies are re-issued one at a time, in the order they
//     were acknowledged, through the channel whose login saw the change;
//     until they are done every channel holds back everything else,
//     including requests re-issued from the lost connections and any
//     Flush, so the application's next Flush covers them. A replay write
//     that fails turns its volume's case into a loss, as without a ring.
//
// Writes still waiting for room in a full ring at the restart are
// replayed too, after the ring's entries, from copies taken then. What
// replay cannot restore is a loss: a write acknowledged on a connection
// to an instance another channel has already seen replaced, and a write
// whose caller gave up on it (its context ended) while the ring was
// full. A FUA write re-issued after a reconnect is still FUA, and a
// flush in flight at the loss that the new instance answers still
// reports it. A target
// that sends no instance (an older one) promises nothing, and its
// restarts go unnoticed; a change to or from one counts as a restart. A
// graceful target restart changes the instance too, which costs a replay
// or a spurious ErrWriteCacheLost, never a silent loss.
//
// The volume itself may have changed meanwhile: deleted and created
// again under its name, or served by another target now at the address.
// An open's answer carries the volume's identity, and a re-open that
// finds another one ends the Volume: nothing is replayed onto the new
// volume, and every request fails with ErrVolumeReplaced (which is also
// ErrWriteCacheLost) until the name is opened again (replaced.go).
//
// A volume the target keeps in memory (srpd --backend memory; its open
// says so) loses everything at a restart, what was flushed too. The ring
// brings it back only while it holds every write the session made to
// the volume: once a flush has dropped a copy, or the ring never held
// one (no ring, a FUA write it did not keep), the restart is a loss,
// reported as ErrVolumeLost (which is also ErrWriteCacheLost).
package initiator

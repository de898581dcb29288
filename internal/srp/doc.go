// Package srp encodes and decodes the information units (IUs) of T10's
// SCSI RDMA Protocol (SRP r16a, with SRP-2's immediate data), the
// protocol the Linux kernel's ib_srp initiator and ib_srpt target speak.
// It is gosrp's second personality beside its own protocol (package
// internal/wire): pure byte layouts, no I/O. Every field is big-endian;
// every IU but the RDMA-CM login starts with its opcode (PeekOpcode).
//
// Tags are opaque to the target: the kernel writes them in host byte
// order, and decoding and encoding them big-endian carries the 8 bytes
// through unchanged, which is all a response needs.
//
// Decoders take untrusted bytes: they check every length against the
// buffer, never panic, and return errors wrapping ErrMalformed that say
// what was wrong. Hot-path decoders (Cmd, Rsp) do not allocate: the CDB,
// partial descriptor tables, immediate data and sense data they return
// alias the buffer they decoded.
//
// # An SRP exchange
//
// Login. The initiator connects with RDMA CM, and its connection request
// carries an SRP_LOGIN_REQ in the private data. Over RDMA CM only 56
// bytes fit, so ib_srp sends the compact form (LoginRequest.DecodeRDMA,
// the opcode at byte 11); over the IB CM it is the 64-byte form of SRP
// r16a (DecodeIB). The request names the I_T nexus (initiator and target
// port identifiers), the largest IU the initiator will send
// (MaxITIULen), the buffer formats it needs, a multi-channel action and,
// with ImmediateRequested, the offset of immediate data in an SRP_CMD.
//
// The target answers in the accept's private data with an SRP_LOGIN_RSP
// (LoginResponse: the initial request limit, its own IU size limits,
// ImmediateSupported if it takes immediate data) or rejects the
// connection with an SRP_LOGIN_REJ and a RejectReason.
//
// Commands. Each SRP_CMD (Cmd) costs the initiator one credit of the
// request limit. It carries a tag, a LUN, a task attribute, the CDB and,
// per direction, where the data is (DataBuffer): one direct descriptor
// (VA, rkey, length), an indirect table whose first entries ride inline,
// or, for data-out with SRP-2, the data itself at the agreed offset. The
// target moves the data with RDMA READ (data-out) or RDMA WRITE
// (data-in) through those descriptors, then sends an SRP_RSP (Rsp) with
// the same tag, the SCSI status, sense data when the status is CHECK
// CONDITION, residual counts and ReqLimDelta, the credits it returns.
// SRP has no remote invalidation: the SRP_RSP is a plain SEND and the
// initiator invalidates its own registrations.
//
// Task management. SRP_TSK_MGMT (TaskMgmt: ABORT TASK, LOGICAL UNIT
// RESET, ...) is answered by an SRP_RSP whose 4 bytes of response data
// hold a response code (TaskComplete, TaskNotSupported, ...).
//
// Target requests. The target may grant credits outside a response
// (SRP_CRED_REQ, CredReq) or report an asynchronous event with sense data
// (SRP_AER_REQ, AERReq); the initiator answers each with an SRP_CRED_RSP
// or SRP_AER_RSP (TargetRsp), which costs no credit.
//
// Logout. The initiator may send SRP_I_LOGOUT (ILogout; ib_srp simply
// disconnects), the target SRP_T_LOGOUT (TLogout) with a reason; then
// the connection is torn down.
//
// A target's receive loop, in outline:
//
//	op, err := srp.PeekOpcode(buf)
//	switch op {
//	case srp.OpCmd:
//		var c srp.Cmd
//		err = c.Decode(buf, immOffset) // immOffset from the login
//		// run c.CDB against c.LUN; move c.DataOut/c.DataIn; then
//		rsp := srp.Rsp{Tag: c.Tag, ReqLimDelta: 1, Status: status}
//		n, err := rsp.Encode(sendBuf)
//	case srp.OpTaskMgmt:
//		...
//	}
package srp

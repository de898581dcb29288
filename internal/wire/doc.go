// Package wire defines gosrp's information units (IUs): the messages an
// initiator and a target exchange in SEND work requests, in the style of
// SRP (T10 SRP r16a) and RPC-over-RDMA (RFC 8166).
//
// Every IU starts with an opcode byte. The hot-path IUs, Command and
// Response, have a fixed little-endian layout and are encoded and decoded
// into caller-owned structs without allocation. Control IUs (login, login
// response and reject, control requests and responses) are the opcode byte
// followed by a msgpack map, so fields can be added without breaking older
// peers: decoders ignore fields they do not know.
//
// A connection carries, in order:
//
//  1. RDMA-CM private data on connect: Hello (magic, protocol version); a
//     target that cannot speak the version rejects with a Hello of its own.
//  2. LoginRequest (initiator → target). The target answers LoginChallenge
//     when the initiator must authenticate (HMAC-SHA256 over both nonces;
//     the secret never crosses the wire), the initiator answers
//     LoginProof, and the target ends the login with LoginResponse or
//     LoginReject.
//  3. Commands and control requests, each consuming one credit, each
//     answered by a Response or ControlResponse that returns credits
//     (SRP's req_lim_delta).
//  4. Logout, or a CM disconnect.
//
// Data moves by RDMA, always issued by the target: for a WRITE command the
// target RDMA-READs the initiator's buffer through the command's
// descriptors, for a READ it RDMA-WRITEs into them, then it sends the
// Response — with SEND_WITH_INV naming Command.InvalidateKey when the
// initiator set FlagInvalidate and the login allowed it. The exception is
// a WRITE with FlagImmediate, whose data rides in the command IU itself
// (SRP-2 immediate data), up to the LoginResponse.MaxImmediate bytes the
// target granted: no descriptor, no RDMA READ, nothing to invalidate.
package wire

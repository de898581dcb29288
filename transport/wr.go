package transport

// Opcode is a send-queue work request opcode (enum ibv_wr_opcode plus the
// kernel's IB_WR_REG_MR).
type Opcode uint8

// Send work request opcodes.
const (
	OpSend Opcode = iota
	OpSendWithImm
	// OpSendWithInv sends and invalidates InvalidateKey at the receiver
	// (IBA "Send with Invalidate", RFC 5040 for iWARP).
	OpSendWithInv
	OpRDMAWrite
	OpRDMAWriteWithImm
	OpRDMARead
	// OpLocalInv invalidates InvalidateKey on this device.
	OpLocalInv
	// OpRegMR registers a FastRegMR's staged page list under Reg.Key.
	OpRegMR
	// OpBindMW binds a type-2 window under Bind.Key.
	OpBindMW
)

var opcodeNames = [...]string{"SEND", "SEND_WITH_IMM", "SEND_WITH_INV", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "RDMA_READ", "LOCAL_INV", "REG_MR", "BIND_MW"}

// String is the verbs name of the opcode.
func (o Opcode) String() string { return nameOf(opcodeNames[:], o, "Opcode") }

// IsLocal reports whether the opcode is a local memory operation, executed
// once by the requester and never retransmitted.
func (o Opcode) IsLocal() bool { return o == OpLocalInv || o == OpRegMR || o == OpBindMW }

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint8

// Send flags.
const (
	// FlagSignaled asks for a completion on success; errors always complete.
	FlagSignaled SendFlags = 1 << iota
	// FlagFence waits for earlier RDMA READs to complete; on LOCAL_INV it is
	// the Local Invalidate Fence: wait for every earlier WR (as mlx5
	// get_fence() and rxe rxe_wqe_is_fenced() interpret IB_SEND_FENCE).
	FlagFence
	// FlagSolicited sets the solicited-event bit for the receiver.
	FlagSolicited
	// FlagInline copies the SGL data at post time; the buffers may be reused
	// as soon as PostSend returns and need no lkey.
	FlagInline
)

// SGE is a scatter/gather element: Length bytes at virtual address Addr in a
// region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   Key
}

// RegWR are the REG_MR arguments (struct ib_reg_wr).
type RegWR struct {
	MR     FastRegMR
	Key    Key // new key; its Index must equal the MR's
	Access Access
}

// BindWR are the BIND_MW arguments (struct ibv_mw_bind_info plus the new
// rkey of a type-2 window).
type BindWR struct {
	MW     MW
	Key    Key // new rkey; its Index must equal the window's
	MR     MR  // registered with AccessMWBind
	Addr   uint64
	Length uint64
	Access Access // remote access granted through the window
}

// SendWR is a send-queue work request. The caller owns SGL and may reuse it
// once PostSend returns: providers copy what they need.
type SendWR struct {
	// ID is returned in the work completion; the provider never interprets
	// it (a slot handle, never a Go pointer).
	ID     uint64
	Opcode Opcode
	Flags  SendFlags
	SGL    []SGE
	// Imm is the immediate data of *_WITH_IMM.
	Imm uint32
	// InvalidateKey is the key SEND_WITH_INV invalidates at the peer, or the
	// key LOCAL_INV invalidates here.
	InvalidateKey Key
	// RemoteAddr and RKey address the peer's memory for RDMA READ/WRITE.
	RemoteAddr uint64
	RKey       Key
	Reg        RegWR
	Bind       BindWR
}

// RecvWR is a receive-queue work request: a buffer for one incoming SEND.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// SGLLen is the total byte length of an SGL.
func SGLLen(sgl []SGE) uint64 {
	var n uint64
	for _, s := range sgl {
		n += uint64(s.Length)
	}
	return n
}

package transport

// QPState is a queue pair state (enum ibv_qp_state, same values).
type QPState uint8

// QP states (IBA 10.3.1).
const (
	QPReset QPState = iota
	QPInit
	QPRTR
	QPRTS
	QPSQD
	QPSQE
	QPErr
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String is the state's verbs name.
func (s QPState) String() string { return nameOf(qpStateNames[:], s, "QPState") }

// QPConfig sizes a reliable-connected QP (struct ibv_qp_init_attr).
type QPConfig struct {
	SendCQ     CQ
	RecvCQ     CQ
	MaxSendWR  int
	MaxRecvWR  int
	MaxSendSGE int
	MaxRecvSGE int
	MaxInline  int
	// SignalAll makes every send WR signaled (sq_sig_all).
	SignalAll bool
}

// QP is a reliable-connected queue pair.
type QP interface {
	// Num is the QP number (qp_num), unique on its device.
	Num() uint32
	// State is the current state as the consumer can observe it.
	State() QPState
	// Modify moves the QP to state. Consumers may move any state to ERR or
	// RESET, RESET to INIT, and RTS to SQD and back. INIT to RTR and RTR to
	// RTS need the peer's address and are done by connection management. An
	// illegal transition fails with ErrInvalidState.
	Modify(to QPState) error
	// PostSend appends work requests to the send queue in order. It returns
	// how many were accepted and, if fewer than len(wrs), the error for
	// wrs[n] (ibv_post_send's bad_wr). Accepted requests will complete (or
	// flush); the rest never will.
	PostSend(wrs []SendWR) (int, error)
	// PostRecv appends receive buffers, with the same contract.
	PostRecv(wrs []RecvWR) (int, error)
	// Close destroys the QP (ibv_destroy_qp). Completions of requests still
	// outstanding are lost; drain first (move to ERR, wait for the flush)
	// to learn the fate of every request. Unless the device has
	// Quirks.DestroyQPInvalidatesWindows, Close fails with ErrBusy and the
	// QP stays while a type-2 window bound through it may still be valid:
	// invalidate or deallocate those windows first.
	Close() error
}

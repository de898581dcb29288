package transport

import "fmt"

// Status is a work completion status. The values are those of enum
// ibv_wc_status so the hardware provider maps them without a table.
type Status uint8

// Work completion statuses.
const (
	StatusSuccess Status = iota
	StatusLocLenErr
	StatusLocQPOpErr
	StatusLocEECOpErr
	StatusLocProtErr
	StatusWRFlushErr
	StatusMWBindErr
	StatusBadRespErr
	StatusLocAccessErr
	StatusRemInvReqErr
	StatusRemAccessErr
	StatusRemOpErr
	StatusRetryExcErr
	StatusRNRRetryExcErr
	StatusLocRDDViolErr
	StatusRemInvRdReqErr
	StatusRemAbortErr
	StatusInvEECNErr
	StatusInvEECStateErr
	StatusFatalErr
	StatusRespTimeoutErr
	StatusGeneralErr
)

var statusNames = [...]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR",
	"REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",
	"REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
	"RESP_TIMEOUT_ERR", "GENERAL_ERR",
}

// String is the ibv_wc_status_str-style name, e.g. "WR_FLUSH_ERR".
func (s Status) String() string { return nameOf(statusNames[:], s, "Status") }

// WCOpcode says what a successful completion completed (enum ibv_wc_opcode).
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend WCOpcode = iota
	WCRDMAWrite
	WCRDMARead
	WCCompSwap
	WCFetchAdd
	WCBindMW
	WCLocalInv
	WCRegMR
	WCRecv
	WCRecvRDMAWithImm
)

var wcOpcodeNames = [...]string{"SEND", "RDMA_WRITE", "RDMA_READ", "COMP_SWAP", "FETCH_ADD", "BIND_MW", "LOCAL_INV", "REG_MR", "RECV", "RECV_RDMA_WITH_IMM"}

// String is the opcode's verbs name.
func (o WCOpcode) String() string { return nameOf(wcOpcodeNames[:], o, "WCOpcode") }

// WCFlags qualify a receive completion.
type WCFlags uint8

// Completion flags.
const (
	// WCWithImm: Imm holds immediate data.
	WCWithImm WCFlags = 1 << iota
	// WCWithInv: the SEND carried an invalidation and the device has
	// invalidated InvalidatedKey before reporting this completion
	// (IB_WC_WITH_INVALIDATE).
	WCWithInv
)

// WC is a work completion (struct ibv_wc). On a non-success Status only ID,
// Status, QPNum and VendorErr are meaningful; consumers must not read the
// other fields of a failed completion.
type WC struct {
	ID             uint64
	Status         Status
	Opcode         WCOpcode
	Flags          WCFlags
	ByteLen        uint32
	Imm            uint32
	InvalidatedKey Key
	QPNum          uint32
	VendorErr      uint32
}

// String summarises the completion for logs.
func (wc *WC) String() string {
	if wc.Status != StatusSuccess {
		return fmt.Sprintf("wc{id=%#x qp=%d %s vendor=%#x}", wc.ID, wc.QPNum, wc.Status, wc.VendorErr)
	}
	return fmt.Sprintf("wc{id=%#x qp=%d %s %s len=%d flags=%d imm=%#x inv=%s}",
		wc.ID, wc.QPNum, wc.Status, wc.Opcode, wc.ByteLen, wc.Flags, wc.Imm, wc.InvalidatedKey)
}

package emu

import "github.com/gosrp/gosrp/transport"

// pktKind is a message type on the emulated wire: requests from a
// requester to its peer's responder and the responder's answers (an RC
// transport with one message per work request; the wire never reorders).
type pktKind uint8

const (
	pktSend pktKind = iota + 1
	pktWrite
	pktRead
	pktAck
	pktNak
	pktReadResp
	pktDisconnect // CM DREQ on the tcp wire
)

func (k pktKind) isRequest() bool { return k == pktSend || k == pktWrite || k == pktRead }

// Packet flags.
const (
	pfImm uint8 = 1 << iota
	pfInv
	pfSolicited
)

// NAK codes (IBA 9.7.5.2.8 classes, collapsed to what a requester reports).
const (
	nakRNR    uint8 = iota + 1 // receiver not ready: retry later
	nakAccess                  // remote access error → REM_ACCESS_ERR
	nakInvReq                  // invalid request → REM_INV_REQ_ERR
	nakRemOp                   // remote operational error → REM_OP_ERR
)

type packet struct {
	kind    pktKind
	flags   uint8
	nak     uint8
	psn     uint32
	imm     uint32
	key     transport.Key // rkey of WRITE/READ; invalidate key of SEND_WITH_INV
	va      uint64
	length  uint32 // READ length
	payload []byte
}

// link is one end of a connection's wire.
type link interface {
	// sendRequest carries a request to the peer's responder.
	sendRequest(p *packet)
	// sendResponse carries a response to the peer's requester.
	sendResponse(p *packet)
	// disconnect ends the connection on both sides (DREQ, link cut).
	disconnect(err error)
}

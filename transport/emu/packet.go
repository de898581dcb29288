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

	// On the shm wire payload bytes never travel: a sender names the
	// memory (segs) and the receiving NIC copies straight out of the
	// peer's mapped arena (pieces) into its own memory, one copy per
	// transfer, as a NIC's DMA.
	//
	// segs is set instead of payload by a requester whose link is direct
	// (SEND and WRITE sources, READ sinks; lkey-checked) and by a
	// responder answering a duplicate READ (the rkey-checked source).
	segs []seg
	// pieces is set instead of payload by the shm link on delivery: the
	// memory the peer named in segs, mapped here and bounded by the link
	// against the mapped size. On the other links a requester's SEND and
	// WRITE carry their checked local sources as pieces, which the link
	// copies once: into its frame (tcp) or into the peer's memory (loop).
	pieces [][]byte
	// placed marks a READ response whose data the responder's NIC has
	// already written into the requester's sinks (shm).
	placed bool
}

// seg is a range of local arena memory a peer NIC may read.
type seg struct {
	arena *transport.Arena
	off   int
	n     int
}

// dataLen is the number of message bytes the packet carries.
func (p *packet) dataLen() int {
	if p.pieces == nil {
		return len(p.payload)
	}
	n := 0
	for _, b := range p.pieces {
		n += len(b)
	}
	return n
}

// gather copies the message bytes into dst (at most len(dst) bytes).
func (p *packet) gather(dst []byte) {
	if p.pieces == nil {
		copy(dst, p.payload)
		return
	}
	for _, b := range p.pieces {
		dst = dst[copy(dst, b):]
	}
}

// link is one end of a connection's wire.
type link interface {
	// sendRequest carries a request to the peer's responder.
	sendRequest(p *packet)
	// sendResponse carries a response to the peer's requester.
	sendResponse(p *packet)
	// flush transmits what the link holds back to batch (the doorbell): a
	// sender calls it once it has no more packets ready. Links that send
	// at once ignore it.
	flush()
	// disconnect ends the connection on both sides (DREQ, link cut).
	disconnect(err error)
	// direct reports whether the wire reaches the peer's memory itself
	// (shm): requests and duplicate READ responses then name memory with
	// segs instead of staging bytes in payload.
	direct() bool
	// closeSinks makes sure no READ data lands in this side's sinks any
	// more: called when the QP goes to ERR, before its WRs are flushed and
	// their buffers handed back. REQUIRES: q.mu (it never takes it).
	closeSinks()
}

package emu

import "github.com/gosrp/gosrp/transport"

// The contract types each emu type implements, checked by the compiler so
// that a method renamed or lost in the transport contract breaks the build
// here, not a conformance run. internal/lint checks that every contract
// interface an emu type implements is listed.
var (
	_ transport.Provider    = (*Provider)(nil)
	_ transport.Device      = (*device)(nil)
	_ transport.PD          = (*pd)(nil)
	_ transport.CQ          = (*cq)(nil)
	_ transport.CQNotifier  = (*cq)(nil)
	_ transport.QP          = (*qp)(nil)
	_ transport.MR          = (*mr)(nil)
	_ transport.FastRegMR   = (*frmr)(nil)
	_ transport.MW          = (*mw)(nil)
	_ transport.Conn        = (*conn)(nil)
	_ transport.Listener    = (*loopListener)(nil)
	_ transport.Listener    = (*shmListener)(nil) // streamListener[shmWire]
	_ transport.Listener    = (*tcpListener)(nil) // streamListener[tcpWire]
	_ transport.ConnRequest = (*loopReq)(nil)
	_ transport.ConnRequest = (*shmReq)(nil) // streamReq[shmWire]
	_ transport.ConnRequest = (*tcpReq)(nil) // streamReq[tcpWire]
	_ transport.Endpoint    = (*endpoint)(nil)
)

package initiator

// Keepalive: a channel that hears nothing from its target for a while
// asks it (a ping), and takes a target silent for KeepaliveTimeout while
// it owes an answer for dead, as NVMe over Fabrics' Keep Alive (KATO,
// NVMe-oF 1.1 §3.9) and iSCSI's NOP-Out (RFC 7143 §11.18) do. A
// response of any kind is proof of life, so a channel whose I/O
// completes sends no ping at all.

import (
	"errors"
	"time"
)

// errSilent is the failure of a channel whose target answered nothing
// for KeepaliveTimeout: its connection is torn down as lost since the
// target was last heard from.
var errSilent = errors.New("initiator: target silent past the keepalive timeout")

// kaAction is what the keepalive asks of the channel.
type kaAction uint8

const (
	kaNone kaAction = iota
	// kaPing: send a ping (it takes a credit, like any control request).
	kaPing
	// kaDead: the target is silent; end the connection.
	kaDead
)

// keepalive decides when a channel pings and when it gives up. It is
// pure: the shell passes the time in at each tick, and a receive only
// sets a flag (no clock read per I/O). Its rules, checked by
// TestKeepalive:
//   - a receive since the last tick is the target heard from at that
//     tick: no ping, silence counted from there;
//   - silence of timeout/2 sends one ping, whether the channel is idle
//     (standby paths, a quiet volume) or waits for answers (requests
//     outstanding that long: a live target answers the ping at once);
//   - silence of timeout with an answer owed (a request outstanding, or
//     the ping) is death; an idle channel that was never pinged is not
//     dead however long the silence.
type keepalive struct {
	timeout int64 // ns; 0: off
	heardAt int64 // the tick at which the target was last heard from
	heard   bool  // something arrived since the last tick
	pinged  bool  // a ping was asked for since heardAt
}

// reset starts counting silence at now (a login).
func (k *keepalive) reset(now int64) { k.heardAt, k.heard, k.pinged = now, false, false }

// tick applies the passage of time; busy says whether an answer is owed
// (a request outstanding on the wire).
func (k *keepalive) tick(now int64, busy bool) kaAction {
	if k.timeout <= 0 {
		return kaNone
	}
	if k.heard {
		k.reset(now)
		return kaNone
	}
	silent := now - k.heardAt
	switch {
	case silent >= k.timeout && (busy || k.pinged):
		return kaDead
	case silent >= k.timeout/2 && !k.pinged:
		k.pinged = true
		return kaPing
	}
	return kaNone
}

// silence is how long the target has been silent at now.
func (k *keepalive) silence(now int64) time.Duration { return time.Duration(now - k.heardAt) }

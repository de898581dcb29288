package initiator

// Keepalive: a channel that hears nothing from its target for a while
// asks it (a ping), and takes a target that leaves the ping unanswered,
// silent for KeepaliveTimeout, for dead, as NVMe over Fabrics' Keep
// Alive (KATO, NVMe-oF 1.1 §3.9) and iSCSI's NOP-Out (RFC 7143 §11.18)
// do. A response of any kind is proof of life, so a channel whose I/O
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
//   - death is silence of timeout with the ping asked at least
//     timeout/2 before: a live target always has half the timeout to
//     answer it, whatever the phase of the ticks. A tick that comes
//     late (the shell's ticker is coarse: a 200 ms timeout is two
//     100 ms ticks, and one that lands a microsecond before timeout/2
//     skips the ping) sends the ping then, instead of taking a target
//     that was never asked for dead; TestKeepaliveTickPhase is that
//     case. A ping that cannot go out (no credit) still counts: its
//     target is as silent as one that drops it.
type keepalive struct {
	timeout  int64 // ns; 0: off
	heardAt  int64 // the tick at which the target was last heard from
	heard    bool  // something arrived since the last tick
	pinged   bool  // a ping was asked for since heardAt
	pingedAt int64 // the tick at which it was asked for
}

// reset starts counting silence at now (a login).
func (k *keepalive) reset(now int64) { k.heardAt, k.heard, k.pinged = now, false, false }

// tick applies the passage of time.
func (k *keepalive) tick(now int64) kaAction {
	if k.timeout <= 0 {
		return kaNone
	}
	if k.heard {
		k.reset(now)
		return kaNone
	}
	switch silent := now - k.heardAt; {
	case silent < k.timeout/2:
		return kaNone
	case !k.pinged:
		k.pinged, k.pingedAt = true, now
		return kaPing
	case silent >= k.timeout && now-k.pingedAt >= k.timeout/2:
		return kaDead
	}
	return kaNone
}

// due is when the keepalive next decides anything, for a channel that
// has nothing else to time: at the end of half the timeout's silence (the
// ping), or, once pinged, when silence may be death. every asks for the
// shell's regular tick instead: something heard is stamped at the next
// tick, and silence counts from there.
func (k *keepalive) due() (at int64, every bool) {
	switch {
	case k.timeout <= 0:
		return 0, false
	case k.heard:
		return 0, true
	case !k.pinged:
		return k.heardAt + k.timeout/2, false
	}
	return max(k.heardAt+k.timeout, k.pingedAt+k.timeout/2), false
}

// silence is how long the target has been silent at now.
func (k *keepalive) silence(now int64) time.Duration { return time.Duration(now - k.heardAt) }

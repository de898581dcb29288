package initiator

// A volume replaced while the connection was down. A target's OPEN
// answer carries the volume's identity (target.Identifier), which a
// volume deleted and created again under its name, or another target's
// volume of that name, does not share. The session keeps the first
// open's, and every re-open after a reconnect compares: another
// identity means the writes the session made, and the copies it keeps
// to replay after a target restart, belong to a volume that is gone.
// Replaying them onto the new one, and then answering a Flush, once
// reported an import of a file as done over a volume that held only its
// last megabytes. Now nothing of the session reaches the new volume
// through the old Volume: its requests fail with ErrVolumeReplaced, and
// the application opens the name again to use the new one.

import "fmt"

// volIdentity is what an open's answer said of the volume's identity.
type volIdentity struct {
	id uint64 // wire.ControlResponse.Identity; 0: the target tells none
	// volatile: the target keeps the volume in memory
	// (wire.CapVolatile), so its every restart makes it anew, and the
	// session's instance generation it was learned under.
	volatile bool
	instGen  uint64
}

// learnIdentity records what the first answer of Open said: identity id
// (and whether the volume is volatile) under instance generation gen.
func (v *Volume) learnIdentity(id uint64, volatile bool, gen uint64) {
	v.ident.Store(&volIdentity{id: id, volatile: volatile, instGen: gen})
}

// sameVolume reports whether a re-open's answer, identity id on a
// connection whose login saw instance generation gen, names the volume
// the session opened (or Open has not learned which that is yet). A
// target or volume that tells no identity matches only one that told
// none either. A volume the target keeps in memory is made anew by
// every restart of the target, whose loss the instance change accounts
// for (a replay of every write, or ErrVolumeLost): under a new instance
// it takes the new identity.
func (v *Volume) sameVolume(id, gen uint64) bool {
	k := v.ident.Load()
	switch {
	case k == nil || k.id == id:
		return true
	case k.volatile && gen != k.instGen:
		v.learnIdentity(id, true, gen)
		return true
	}
	return false
}

// replacedErr is the error of v's requests once it was replaced.
func (v *Volume) replacedErr() error {
	if v.gone.Load() {
		return fmt.Errorf("initiator: volume %q on %s: no logical unit at its LUN since the re-login: %w", v.name, v.s.cfg.Addr, ErrVolumeGone)
	}
	return fmt.Errorf("initiator: volume %q on %s: %w", v.name, v.s.cfg.Addr, ErrVolumeReplaced)
}

// volumeReplaced records that a re-open of v found another volume of its
// name (identity got): v's copies for replay are dropped, so nothing is
// replayed onto the new volume, and its requests fail with
// ErrVolumeReplaced from now on, those waiting for room in the ring too.
func (s *Session) volumeReplaced(v *Volume, got uint64) {
	if v.replaced.Swap(true) {
		return
	}
	if v.gone.Load() {
		s.cfg.Logger.Error("initiator: the target has no logical unit at the volume's LUN since the re-login; its I/O fails",
			"volume", v.name, "target", s.cfg.Addr, "identity", fmt.Sprintf("%#x", v.ident.Load().id))
	} else {
		s.cfg.Logger.Error("initiator: the volume re-opened after the reconnect is another of the same name; its I/O fails",
			"volume", v.name, "target", s.cfg.Addr, "identity", fmt.Sprintf("%#x", v.ident.Load().id), "now", fmt.Sprintf("%#x", got))
	}
	var rel queue
	s.dmu.Lock()
	s.dropWritesLocked(v, &rel)
	for r := rel.head; r != nil; r = r.next {
		r.Err = v.replacedErr()
	}
	s.dmu.Unlock()
	deliverAll(&rel)
}

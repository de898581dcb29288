package target

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/wire"
)

// ReservationStore keeps the volumes' persistent reservations across a
// target's restarts (SPC-4 §5.13.4: "persist through power loss" is what
// makes them persistent, which SCSI leaves optional and a fencing host
// relies on). srpd keeps them in a file of its data directory.
type ReservationStore interface {
	// LoadReservations returns every saved volume's state; New calls it
	// once.
	LoadReservations() (map[string]ReservationState, error)
	// SaveReservation records volume's state durably (on stable storage
	// when it returns), replacing what was saved for it; an empty state
	// may be forgotten. The target calls it for every change, one at a
	// time per volume, and answers the change only after it returned
	// nil; an error fails the change, which the target then undoes (one
	// that matches ErrStandby is answered as a path that is not active:
	// a gateway that does not hold the volume cannot record it).
	SaveReservation(volume string, st ReservationState) error
}

// ReservationReader is implemented by ReservationStores that keep a
// volume's reservations where other targets change them: srpd's
// gateways keep them with the RBD image, written by the gateway that
// serves it. A target that does not serve a volume (PathStater standby)
// answers a report of its reservations from ReadReservation, not from
// what it last read or made.
type ReservationReader interface {
	// ReadReservation returns the volume's state as recorded now; an
	// error that matches ErrStandby is answered as a path that is not
	// active.
	ReadReservation(volume string) (ReservationState, error)
}

// ReservationState is the persistent reservation state of a volume.
type ReservationState struct {
	// Generation is SPC-4's PRgeneration: it moves with each change of
	// the registrations.
	Generation uint32 `json:"generation"`
	// Holder is the initiator holding the reservation ("" for none), and
	// Type its type's name (wire.ReservationType's: "write-exclusive",
	// ...).
	Holder string `json:"holder,omitempty"`
	Type   string `json:"type,omitempty"`
	// Registrations in the order they were made.
	Registrations []Registration `json:"registrations,omitempty"`
	// ExclusiveHolder is the initiator of the session that has the
	// volume open exclusively. It is no part of what is saved (a
	// restart ends sessions); Target.Reservations reports it.
	ExclusiveHolder string `json:"-"`
	// Serial counts the changes recorded (every change, where
	// Generation counts only the registrations'), and Notices are the
	// unit attentions the latest of them owe hosts, the newest
	// maxRecordedNotices: a gateway that reads the state another one
	// changed raises on its own I_T nexuses those it has not seen
	// (prVolume.setLocked), as SPC-4 5.13.11 establishes them on every
	// I_T nexus of the hosts named, whichever target port.
	Serial  uint64              `json:"serial,omitempty"`
	Notices []ReservationNotice `json:"notices,omitempty"`
}

// ReservationNotice is a unit attention a recorded change owes a host:
// the change's Serial, the host, and what: "registrations-preempted",
// "reservations-preempted" or "reservations-released".
type ReservationNotice struct {
	Serial    uint64 `json:"serial"`
	Initiator string `json:"initiator"`
	What      string `json:"what"`
}

// maxRecordedNotices bounds the notices a state carries: a change
// tells at most every other registrant, so this holds the last few
// changes' whole. A gateway that missed more changes than it holds
// raises only these; the hosts still learn of the rest from their next
// refused command, as gosrp hosts always do.
const maxRecordedNotices = 4 * wire.MaxRegistrants

// noticeConditions are the conditions a notice may name.
var noticeConditions = []scsi.Condition{scsi.RegistrationsPreempted, scsi.ReservationsPreempted, scsi.ReservationsReleased}

// record returns notices with ns, made by the change serial, added
// and the oldest dropped past maxRecordedNotices; notices itself is
// not changed (it may be what the last state saved shares).
func record(notices []ReservationNotice, serial uint64, ns []prNotice) []ReservationNotice {
	out := slices.Clone(notices)
	for _, n := range ns {
		out = append(out, ReservationNotice{Serial: serial, Initiator: n.initiator, What: n.what.String()})
	}
	if len(out) > maxRecordedNotices {
		out = out[len(out)-maxRecordedNotices:]
	}
	return out
}

// unseen returns the notices of st newer than serial, as conditions to
// raise. The state is input (a record anyone with access to the image
// can write): only its newest maxRecordedNotices count, and a notice
// whose condition this target does not know is left out (a newer
// gateway may record more).
func unseen(st ReservationState, serial uint64) []prNotice {
	var ns []prNotice
	for _, n := range st.Notices[max(len(st.Notices)-maxRecordedNotices, 0):] {
		if n.Serial <= serial || n.Serial > st.Serial {
			continue
		}
		for _, c := range noticeConditions {
			if c.String() == n.What {
				ns = append(ns, prNotice{n.Initiator, c})
			}
		}
	}
	return ns
}

// Registration is a host's registered key.
type Registration struct {
	Initiator string `json:"initiator"`
	Key       uint64 `json:"key"`
}

// Empty reports whether the state holds nothing: no registration, no
// reservation, no exclusive open.
func (s ReservationState) Empty() bool {
	return s.Holder == "" && len(s.Registrations) == 0 && s.ExclusiveHolder == ""
}

// state returns p's persistent part (and its exclusive holder).
func (p *prState) state() ReservationState {
	st := ReservationState{Generation: p.gen, Holder: p.holder, ExclusiveHolder: p.exclIni}
	if p.holder != "" {
		st.Type = p.typ.String()
	}
	for _, r := range p.regs {
		st.Registrations = append(st.Registrations, Registration{r.initiator, r.key})
	}
	return st
}

// setState replaces p's persistent part with st, checking it: a state
// file is input like any other.
func (p *prState) setState(st ReservationState) error {
	var regs []prReg
	for _, r := range st.Registrations {
		if r.Key == 0 || r.Initiator == "" {
			return fmt.Errorf("registration %+v: a key and an initiator are required", r)
		}
		if slices.ContainsFunc(regs, func(x prReg) bool { return x.initiator == r.Initiator }) {
			return fmt.Errorf("initiator %q is registered twice", r.Initiator)
		}
		regs = append(regs, prReg{r.Initiator, r.Key})
	}
	if len(regs) > wire.MaxRegistrants {
		return fmt.Errorf("%d registrations, at most %d", len(regs), wire.MaxRegistrants)
	}
	typ := wire.ResNone
	if st.Holder != "" {
		var err error
		if typ, err = wire.ParseReservationType(st.Type); err != nil {
			return err
		}
		if !slices.ContainsFunc(regs, func(x prReg) bool { return x.initiator == st.Holder }) {
			return fmt.Errorf("holder %q is not registered", st.Holder)
		}
	}
	p.gen, p.regs, p.holder, p.typ = st.Generation, regs, st.Holder, typ
	return nil
}

// load fills the table from store and keeps store for the changes.
func (t *prTable) load(store ReservationStore) error {
	t.store = store
	if store == nil {
		return nil
	}
	saved, err := store.LoadReservations()
	if err != nil {
		return fmt.Errorf("target: load reservations: %w", err)
	}
	for name, st := range saved {
		v := t.newVolume(name)
		if err := v.st.setState(st); err != nil {
			return fmt.Errorf("target: load reservations of volume %q: %w", name, err)
		}
		// What this target saved it raised then (or lost with its
		// nexuses, which a restart ends).
		v.serial, v.notices = st.Serial, record(st.Notices, 0, nil)
		v.view.Store(v.st.snapshot())
		t.vols[name] = v
	}
	return nil
}

// Reservations returns the reservation state of every volume that has
// any (registrations, a reservation, an exclusive open), by volume name.
func (t *Target) Reservations() map[string]ReservationState {
	t.pr.mu.Lock()
	vols := slices.Collect(maps.Values(t.pr.vols))
	t.pr.mu.Unlock()
	sort.Slice(vols, func(i, j int) bool { return vols[i].name < vols[j].name })
	out := map[string]ReservationState{}
	for _, v := range vols {
		v.mu.Lock()
		st := v.st.state()
		v.mu.Unlock()
		if !st.Empty() {
			out[v.name] = st
		}
	}
	return out
}

// SetReservations replaces the registrations and reservation of the
// volume named volume with st, without saving them: st is what the
// store already holds. A gateway calls it when it takes a volume over,
// before it serves the volume's I/O, with what the gateway that served
// it before recorded in the shared store (srpd keeps a volume's
// reservations with an RBD image, in its metadata): the hosts' fence
// (SPC-4 5.13) holds whichever gateway serves them. An exclusive open
// stays with its session. A state that does not hold together is
// refused, and the volume's state is left as it was.
func (t *Target) SetReservations(volume string, st ReservationState) error {
	return t.pr.volume(volume).set(st)
}

// set replaces v's persistent state with st, unsaved, and publishes it;
// then it raises the unit attentions st records that this target has
// not seen (another gateway's changes).
func (v *prVolume) set(st ReservationState) error {
	v.mu.Lock()
	ns, err := v.setLocked(st)
	v.mu.Unlock()
	v.tell(ns)
	return err
}

// setLocked is set, but returns the notices to raise once v.mu is
// released. A state whose Serial is behind the one this target last
// saw was recorded afresh (the volume forgotten and made again): its
// notices are of changes older than this target's nexuses' view, and
// none is raised. REQUIRES: v.mu.
func (v *prVolume) setLocked(st ReservationState) ([]prNotice, error) {
	if err := v.st.setState(st); err != nil {
		return nil, fmt.Errorf("target: reservations of volume %q: %w", v.name, err)
	}
	ns := unseen(st, v.serial)
	v.serial, v.notices = st.Serial, record(st.Notices, 0, nil)
	v.view.Store(v.st.snapshot())
	return ns, nil
}

// tell raises ns on the SRP I_T nexuses of the hosts they name.
func (v *prVolume) tell(ns []prNotice) {
	if v.notify != nil && len(ns) > 0 {
		v.notify(v.name, ns)
	}
}

// refresh reads v's state from its store when the store keeps it where
// other targets change it and this one does not serve vol (standby, or
// fenced): the report that follows is then the volume's, not this
// target's last word. The active target's state is the volume's: only
// it changes it. The read holds v.mu, as apply holds it across its
// save: were this target to turn active meanwhile and record a change,
// a read older than the change must not replace it.
func (v *prVolume) refresh(vol Volume) error {
	r, ok := v.store.(ReservationReader)
	if !ok {
		return nil
	}
	v.mu.Lock()
	if stateOf(vol) == gwActive {
		v.mu.Unlock()
		return nil
	}
	var ns []prNotice
	st, err := r.ReadReservation(v.name)
	if err == nil {
		ns, err = v.setLocked(st)
	}
	v.mu.Unlock()
	if err != nil {
		return fmt.Errorf("read the reservations of %q where they are kept: %w", v.name, err)
	}
	v.tell(ns)
	return nil
}

// ForgetReservations drops the registrations and reservation of the
// volume named volume, saved state included, as when the volume is
// deleted: a new volume of that name starts with none. An exclusive open
// stays with its session.
func (t *Target) ForgetReservations(volume string) error {
	v := t.pr.volume(volume)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.store != nil {
		if err := v.store.SaveReservation(volume, ReservationState{}); err != nil {
			return fmt.Errorf("target: forget the reservations of %q: %w", volume, err)
		}
	}
	v.st.gen, v.st.regs, v.st.holder, v.st.typ = 0, nil, "", wire.ResNone
	v.serial, v.notices = 0, nil
	v.view.Store(v.st.snapshot())
	return nil
}

package target

// The persistent reservation state of one volume, as a pure state
// machine: requests in, outcome out, no locks, no I/O. The shared table
// (reservation.go) serializes calls and persists the result; the core
// checks each command against an immutable copy (prState.allows).

import (
	"fmt"
	"slices"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/wire"
)

// prReg is one registration: a host (by initiator name) and its key.
type prReg struct {
	initiator string
	key       uint64
}

// prState is a volume's reservation state. gen is SPC-4's PRgeneration:
// it moves with every change of the registrations (SPC-4 §6.16.2: REGISTER,
// REGISTER AND IGNORE EXISTING KEY, CLEAR, PREEMPT, PREEMPT AND ABORT),
// not with RESERVE or RELEASE, so a host can tell whether the set of keys
// changed since it last looked.
//
// excl and the writers are the exclusive-open state: not persistent, since
// they belong to sessions, which a restart ends.
type prState struct {
	gen    uint32
	regs   []prReg
	holder string // initiator name; "" when there is no reservation
	typ    wire.ReservationType

	// excl is the session (conn.go's session key) holding the volume
	// open exclusively, exclIni its initiator, exclN its handles.
	excl    string
	exclIni string
	exclN   int
	// writers counts each session's handles open for writing.
	writers map[string]int
}

// prOutcome is what a reservation request came to.
type prOutcome struct {
	sense wire.Sense // SenseNone: done
	msg   string     // why not, for the control response
	// scsi is the sense an SRP host is answered when sense alone does
	// not say it (an invalid field of the parameter list, not the CDB;
	// no room for a registration); zero: scsi.FromWire(sense).
	scsi scsi.Sense
	// preempted are the hosts a preempt removed.
	preempted []string
	// notices are the unit attentions the change owes other hosts.
	notices []prNotice
}

// prNotice is a unit attention that a change establishes for another
// host on its SRP I_T nexuses of the volume (SPC-4 5.13.11): what,
// one of scsi.Condition's reservation conditions. gosrp hosts hear of
// it by their next command's refusal, as they always did.
type prNotice struct {
	initiator string
	what      scsi.Condition
}

// tell adds what for every registrant but ini.
func (p *prState) tell(out *prOutcome, ini string, what scsi.Condition) {
	for _, r := range p.regs {
		if r.initiator != ini {
			out.notices = append(out.notices, prNotice{r.initiator, what})
		}
	}
}

// registrantsOnly reports whether typ is a reservation of the
// registrants (one whose release the others must hear of).
func registrantsOnly(typ wire.ReservationType) bool {
	return typ == wire.ResWriteExclusiveRegistrants || typ == wire.ResExclusiveAccessRegistrants
}

func (p *prState) find(ini string) int {
	return slices.IndexFunc(p.regs, func(r prReg) bool { return r.initiator == ini })
}

// registered reports whether ini is registered with key key.
func (p *prState) keyOK(ini string, key uint64) bool {
	i := p.find(ini)
	return i >= 0 && p.regs[i].key == key
}

func conflict(format string, args ...any) prOutcome {
	return prOutcome{sense: wire.SenseReservationConflict, msg: fmt.Sprintf(format, args...)}
}

func invalid(format string, args ...any) prOutcome {
	return prOutcome{sense: wire.SenseInvalidField, msg: fmt.Sprintf(format, args...)}
}

func invalidInList(format string, args ...any) prOutcome {
	return prOutcome{sense: wire.SenseInvalidField, scsi: scsi.SenseInvalidParam, msg: fmt.Sprintf(format, args...)}
}

// room says whether the volume has room for n more registrations; if
// not, the refusal (INSUFFICIENT REGISTRATION RESOURCES for an SRP
// host) is the outcome. Every way of registering a host asks it.
func (p *prState) room(n int) (prOutcome, bool) {
	left := wire.MaxRegistrants - len(p.regs)
	switch {
	case n <= left:
		return prOutcome{}, true
	case left == 0:
		return prOutcome{sense: wire.SenseInvalidField, scsi: scsi.SenseNoRegistrationRoom,
			msg: fmt.Sprintf("volume has %d registrations, the most it keeps", len(p.regs))}, false
	}
	return prOutcome{sense: wire.SenseInvalidField, scsi: scsi.SenseNoRegistrationRoom,
		msg: fmt.Sprintf("volume has %d registrations and room for %d more, not %d", len(p.regs), left, n)}, false
}

// apply runs one PERSISTENT RESERVE OUT service action of host ini
// (req.Action). req.Key is the host's current reservation key, NewKey
// the service action key (the key to register, or the key to preempt).
func (p *prState) apply(ini string, req *wire.ControlRequest) prOutcome {
	act, key, newKey, typ := req.Action, req.Key, req.NewKey, req.Type
	switch act {
	case wire.ActionRegister, wire.ActionRegisterIgnore:
		if len(req.Ports) > 0 {
			return p.registerPorts(ini, act == wire.ActionRegisterIgnore, key, newKey, req.Ports)
		}
		return p.register(ini, act == wire.ActionRegisterIgnore, key, newKey)
	}
	if !act.Valid() {
		return invalid("unknown reservation action %d", uint8(act))
	}
	// Every other action needs the host registered with the key it
	// gives (SPC-4 §5.13.11: a mismatch is a RESERVATION CONFLICT).
	if !p.keyOK(ini, key) {
		if p.find(ini) < 0 {
			return conflict("initiator %q is not registered", ini)
		}
		return conflict("initiator %q is registered with another key", ini)
	}
	switch act {
	case wire.ActionReserve:
		if !typ.Valid() {
			return invalid("reservation type %d is not one of the four supported", uint8(typ))
		}
		switch {
		case p.holder == "":
			if p.excl != "" && p.exclIni != ini {
				return conflict("volume is open exclusively by initiator %q", p.exclIni)
			}
			p.holder, p.typ = ini, typ
			return prOutcome{}
		case p.holder == ini && p.typ == typ:
			return prOutcome{} // SPC-4 §5.13.9.2: a repeat is no error
		}
		return conflict("reserved %s by initiator %q", p.typ, p.holder)
	case wire.ActionRelease:
		if p.holder != ini {
			return prOutcome{} // SPC-4 §5.13.11.2: not the holder, nothing happens
		}
		if p.typ != typ {
			return invalid("the reservation is %s, not %s", p.typ, typ)
		}
		var out prOutcome
		if registrantsOnly(p.typ) { // SPC-4 5.13.11.2
			p.tell(&out, ini, scsi.ReservationsReleased)
		}
		p.holder, p.typ = "", wire.ResNone
		return out
	case wire.ActionClear:
		var out prOutcome
		p.tell(&out, ini, scsi.ReservationsPreempted) // SPC-4 5.13.11.3
		p.regs = p.regs[:0]
		p.holder, p.typ = "", wire.ResNone
		p.gen++
		return out
	case wire.ActionPreempt, wire.ActionPreemptAbort:
		return p.preempt(ini, newKey, typ)
	case wire.ActionRegisterMove:
		return p.move(ini, newKey, req.Dest, req.Unreg)
	}
	return invalid("unknown reservation action %d", uint8(act))
}

// move is REGISTER AND MOVE (SPC-4 5.13.8): the holder ini registers
// dest with newKey (or gives it that key, if registered) and makes it
// the holder, with the reservation's scope and type; with unreg, ini's
// own registration goes. Only the holder moves the reservation: from
// any other host, or with none held, a RESERVATION CONFLICT.
func (p *prState) move(ini string, newKey uint64, dest string, unreg bool) prOutcome {
	switch {
	case p.holder != ini:
		return conflict("initiator %q does not hold a reservation to move", ini)
	case newKey == 0:
		return invalid("a move needs the key to register the destination with")
	case dest == "" || dest == ini:
		return invalid("a move needs another host to move the reservation to")
	}
	if i := p.find(dest); i >= 0 {
		p.regs[i].key = newKey
	} else {
		if out, ok := p.room(1); !ok {
			return out
		}
		p.regs = append(p.regs, prReg{dest, newKey})
	}
	p.holder = dest
	if unreg {
		p.regs = slices.DeleteFunc(p.regs, func(r prReg) bool { return r.initiator == ini })
	}
	p.gen++
	return prOutcome{}
}

// register is REGISTER and REGISTER AND IGNORE EXISTING KEY (SPC-4
// §5.13.7): register newKey, replace the key with it, or unregister with
// newKey 0; an unregistering holder loses its reservation.
func (p *prState) register(ini string, ignore bool, key, newKey uint64) prOutcome {
	i := p.find(ini)
	if i < 0 {
		if !ignore && key != 0 {
			return conflict("initiator %q is not registered (give key 0 to register)", ini)
		}
		if newKey == 0 {
			return prOutcome{} // nothing to register or remove
		}
		if out, ok := p.room(1); !ok {
			return out
		}
		p.regs = append(p.regs, prReg{ini, newKey})
		p.gen++
		return prOutcome{}
	}
	if !ignore && p.regs[i].key != key {
		return conflict("initiator %q is registered with another key", ini)
	}
	if newKey != 0 {
		p.regs[i].key = newKey
		p.gen++
		return prOutcome{}
	}
	p.regs = slices.Delete(p.regs, i, i+1)
	var out prOutcome
	if p.holder == ini {
		if registrantsOnly(p.typ) { // SPC-4 5.13.10.2
			p.tell(&out, ini, scsi.ReservationsReleased)
		}
		p.holder, p.typ = "", wire.ResNone
	}
	p.gen++
	return out
}

// registerPorts is a REGISTER with SPEC_I_PT (SPC-4 5.13.7): host ini,
// not registered, registers newKey for itself and for each host in
// ports, all of them or none. A key other than 0 from an unregistered
// host is a RESERVATION CONFLICT, as for any REGISTER. A registered
// host, REGISTER AND IGNORE EXISTING KEY, and a host named that is
// registered already are invalid fields of the list: SPC-4 aborts the
// whole registration rather than give a registered host a key it did
// not ask for (LIO skips such a host, core_scsi3_decode_spec_i_port; a
// caller cannot tell that it did). No room for them all is
// INSUFFICIENT REGISTRATION RESOURCES. Naming ini itself adds nothing.
func (p *prState) registerPorts(ini string, ignore bool, key, newKey uint64, ports []string) prOutcome {
	switch i := p.find(ini); {
	case ignore:
		return invalidInList("SPEC_I_PT is for REGISTER only")
	case i >= 0 && p.regs[i].key != key:
		return conflict("initiator %q is registered with another key", ini)
	case i >= 0:
		return invalidInList("initiator %q is registered: only an unregistered host registers others", ini)
	case key != 0:
		return conflict("initiator %q is not registered (give key 0 to register)", ini)
	case newKey == 0:
		return invalidInList("registering other hosts needs a key to register")
	}
	add := []prReg{{ini, newKey}}
	for _, h := range ports {
		switch {
		case h == ini || slices.ContainsFunc(add, func(r prReg) bool { return r.initiator == h }):
			continue
		case p.find(h) >= 0:
			return invalidInList("initiator %q, named by a TransportID, is registered already", h)
		}
		add = append(add, prReg{h, newKey})
	}
	if out, ok := p.room(len(add)); !ok {
		return out
	}
	p.regs = append(p.regs, add...)
	p.gen++
	return prOutcome{}
}

// preempt is PREEMPT (SPC-4 §5.13.11.4): the registrations with key
// victim go; if the holder's key was victim, ini takes the reservation
// with typ; with no registration of that key, a RESERVATION CONFLICT.
// The hosts it removed hear REGISTRATIONS PREEMPTED; if it changed the
// reservation's type, the registrants it left hear RESERVATIONS
// RELEASED (5.13.11.4.3).
func (p *prState) preempt(ini string, victim uint64, typ wire.ReservationType) prOutcome {
	if victim == 0 {
		return invalid("preempt needs the key to preempt (0 names no host)")
	}
	takes := false
	if p.holder != "" {
		if h := p.find(p.holder); h >= 0 && p.regs[h].key == victim {
			if !typ.Valid() {
				return invalid("reservation type %d is not one of the four supported", uint8(typ))
			}
			takes = true
		}
	}
	var out prOutcome
	p.regs = slices.DeleteFunc(p.regs, func(r prReg) bool {
		if r.key == victim && r.initiator != ini {
			out.preempted = append(out.preempted, r.initiator)
			return true
		}
		return false
	})
	if len(out.preempted) == 0 && !takes {
		return conflict("no other host is registered with key %#x", victim)
	}
	for _, h := range out.preempted {
		out.notices = append(out.notices, prNotice{h, scsi.RegistrationsPreempted})
	}
	if takes {
		if p.typ != typ {
			p.tell(&out, ini, scsi.ReservationsReleased) // the preempted are gone
		}
		p.holder, p.typ = ini, typ
	}
	p.gen++
	return out
}

// allows reports whether host ini, in session owner, may do a command
// that writes (write) or only reads: SPC-4 §5.13.1's table, with
// SYNCHRONIZE CACHE counted as a read (it changes no data, and what it
// makes durable may be the holder's own writes), and the exclusive open
// an implicit write-exclusive reservation of its session.
func (p *prState) allows(ini, owner string, write bool) bool {
	if p.excl != "" && write && p.excl != owner {
		return false
	}
	if p.holder == "" || p.holder == ini {
		return true
	}
	switch p.typ {
	case wire.ResWriteExclusive:
		return !write
	case wire.ResExclusiveAccess:
		return false
	case wire.ResWriteExclusiveRegistrants:
		return !write || p.find(ini) >= 0
	case wire.ResExclusiveAccessRegistrants:
		return p.find(ini) >= 0
	}
	return true
}

// openWriter records a handle opened for writing by session owner of host
// ini; with excl, the open must be the volume's only writer: refused while
// another session has it open for writing or exclusively, or a
// reservation keeps ini from writing.
func (p *prState) openWriter(owner, ini string, excl bool) prOutcome {
	if excl {
		switch {
		case p.excl != "" && p.excl != owner:
			return conflict("volume is open exclusively by initiator %q", p.exclIni)
		case !p.allows(ini, owner, true):
			return conflict("reserved %s by initiator %q", p.typ, p.holder)
		}
		for o, n := range p.writers {
			if o != owner && n > 0 {
				return conflict("volume is open for writing by another session")
			}
		}
		p.excl, p.exclIni = owner, ini
		p.exclN++
	}
	if p.writers == nil {
		p.writers = map[string]int{}
	}
	p.writers[owner]++
	return prOutcome{}
}

// closeWriter undoes openWriter; the exclusive open ends with the
// session's last exclusive handle.
func (p *prState) closeWriter(owner string, excl bool) {
	if p.writers[owner]--; p.writers[owner] <= 0 {
		delete(p.writers, owner)
	}
	if excl && p.excl == owner {
		if p.exclN--; p.exclN <= 0 {
			p.excl, p.exclIni, p.exclN = "", "", 0
		}
	}
}

// snapshot is an immutable copy for the core's checks (no writers map).
func (p *prState) snapshot() *prState {
	return &prState{gen: p.gen, regs: slices.Clone(p.regs), holder: p.holder, typ: p.typ,
		excl: p.excl, exclIni: p.exclIni, exclN: p.exclN}
}

// report is PERSISTENT RESERVE IN's READ FULL STATUS as a control
// response.
func (p *prState) report() *wire.ControlResponse {
	rsp := &wire.ControlResponse{Generation: p.gen, Holder: p.holder, ResType: p.typ, ExclusiveHolder: p.exclIni}
	rsp.Registrants = make([]wire.Registrant, 0, len(p.regs))
	for _, r := range p.regs {
		name := r.initiator
		if len(name) > wire.MaxReportName {
			name = name[:wire.MaxReportName]
		}
		rsp.Registrants = append(rsp.Registrants, wire.Registrant{Initiator: name, Key: r.key})
		if r.initiator == p.holder {
			rsp.HolderKey = r.key
		}
	}
	if len(rsp.Holder) > wire.MaxReportName {
		rsp.Holder = rsp.Holder[:wire.MaxReportName]
	}
	if len(rsp.ExclusiveHolder) > wire.MaxReportName {
		rsp.ExclusiveHolder = rsp.ExclusiveHolder[:wire.MaxReportName]
	}
	return rsp
}

// String prints the state for traces: generation, reservation,
// registrations in order, exclusive open.
func (p *prState) String() string {
	s := fmt.Sprintf("gen=%d", p.gen)
	if p.holder != "" {
		s += fmt.Sprintf(" holder=%s type=%s", p.holder, p.typ)
	}
	for _, r := range p.regs {
		s += fmt.Sprintf(" reg=%s:%#x", r.initiator, r.key)
	}
	if p.excl != "" {
		s += fmt.Sprintf(" excl=%s(%d)", p.excl, p.exclN)
	}
	if len(p.writers) > 0 {
		ws := make([]string, 0, len(p.writers))
		for o, n := range p.writers {
			ws = append(ws, fmt.Sprintf("%s:%d", o, n))
		}
		slices.Sort(ws)
		s += fmt.Sprintf(" writers=%v", ws)
	}
	return s
}

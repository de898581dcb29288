package target

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gosrp/gosrp/internal/fieldhex"
	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
)

// prOut sends PERSISTENT RESERVE OUT service action sa (SPC-4 6.16) of
// reservation type typ on lun, with the host's key and the service
// action key, its 24-byte parameter list from client data [0, 24).
func (c *srpClient) prOut(lun uint16, sa, typ byte, key, saKey uint64) srp.Rsp {
	p := c.data(0, 24)
	clear(p)
	binary.BigEndian.PutUint64(p, key)
	binary.BigEndian.PutUint64(p[8:], saKey)
	return c.do(c.out(srpCmd(lun, 0x5F, sa, typ, 0, 0, 0, 0, 0, 24, 0), 0, 24))
}

// PERSISTENT RESERVE OUT service actions and types (SPC-4 6.16.2,
// 6.15.3.4).
const (
	prRegister = 0x00
	prReserve  = 0x01
	prRelease  = 0x02
	prClear    = 0x03
	prPreempt  = 0x04
	prWERO     = 0x05 // WRITE EXCLUSIVE - REGISTRANTS ONLY
	prWE       = 0x01
	prNoType   = 0x00
)

// TestSRPReservationUnitAttention: the unit attentions a persistent
// reservation change owes the other SRP hosts (SPC-4 5.13.11), through a
// target with three SRP I_T nexuses on one LUN. A host preempted hears
// REGISTRATIONS PREEMPTED on its next command, once, before it is
// refused; the registrants of a released registrants-only reservation
// hear RESERVATIONS RELEASED; a CLEAR tells every other registrant
// RESERVATIONS PREEMPTED. The host that made the change hears nothing.
// Before, a preempted host learned of it only from its next write's
// RESERVATION CONFLICT, and a host whose registrants-only reservation
// was gone not at all.
func TestSRPReservationUnitAttention(t *testing.T) {
	forSRPEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{})
		var a, b, c *srpClient
		for i, p := range []**srpClient{&a, &b, &c} {
			cl, err := r.srpDial(t, srpLoginReq(byte(i+1)))
			if err != nil {
				t.Fatal(err)
			}
			*p = cl
		}
		tur := func(c *srpClient) srp.Rsp { return c.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)) }
		for _, cl := range []*srpClient{a, b, c} {
			cl.good("TEST UNIT READY", tur(cl), 0)
		}
		a.good("A registers", a.prOut(lunVol0, prRegister, prNoType, 0, 0xa), 0)
		b.good("B registers", b.prOut(lunVol0, prRegister, prNoType, 0, 0xb), 0)
		c.good("C registers", c.prOut(lunVol0, prRegister, prNoType, 0, 0xc), 0)
		a.good("A reserves write-exclusive, registrants only", a.prOut(lunVol0, prReserve, prWERO, 0xa, 0), 0)
		a.good("A releases", a.prOut(lunVol0, prRelease, prWERO, 0xa, 0), 0)
		for _, cl := range []*srpClient{b, c} {
			cl.checkSense("a registrant after the registrants-only reservation's release", tur(cl), scsi.SenseReservationsReleased)
			cl.good("the same registrant's next command", tur(cl), 0)
		}
		a.good("the releasing host", tur(a), 0)

		a.good("A reserves write-exclusive", a.prOut(lunVol0, prReserve, prWE, 0xa, 0), 0)
		b.good("B preempts A, keeping the type", b.prOut(lunVol0, prPreempt, prWE, 0xb, 0xa), 0)
		a.checkSense("A after B preempted it", tur(a), scsi.SenseRegistrationsPreempted)
		a.good("A's next command", tur(a), 0)
		b.good("the preempting host", tur(b), 0)
		c.good("C, whose reservation type did not change", tur(c), 0)
		w := a.do(a.out(srpCmd(lunVol0, rw10(0x2A, 0, 1, false)...), 0, bs))
		if w.Status != uint8(scsi.StatusResvConflict) {
			t.Fatalf("A's write under B's reservation: status %s, want RESERVATION CONFLICT", scsi.Status(w.Status))
		}

		c.good("C clears", c.prOut(lunVol0, prClear, prNoType, 0xc, 0), 0)
		b.checkSense("B after C's CLEAR", tur(b), scsi.SenseReservationsPreempted)
		a.good("A, no longer registered, hears nothing of the CLEAR", tur(a), 0)
		c.good("the clearing host", tur(c), 0)
		for _, cl := range []*srpClient{a, b, c} {
			cl.logout()
		}
	})
}

// TestSRPReadFullStatus: PERSISTENT RESERVE IN, READ FULL STATUS (SPC-4
// 6.15.5), as sg_persist --read-full-status asks it, names each
// registrant: SRP host A (the holder, write exclusive) and B by their
// initiator ports in SRP TransportIDs, and a gosrp host by its name,
// with every registration on all target ports. Before, the service
// action was refused (INVALID FIELD IN CDB).
func TestSRPReadFullStatus(t *testing.T) {
	r, a, b := newSRPPair(t)
	g := r.dial(t)
	defer g.close()
	g.login("gosrp-host")
	h := g.open("vol0", false)
	if rsp := g.control(wire.ControlRequest{Op: wire.ControlReserveOut, Handle: h, Action: wire.ActionRegister, NewKey: 0xc}); rsp.Error != "" {
		t.Fatalf("the gosrp host registers: %s", rsp.Error)
	}
	a.good("A registers", a.prOut(lunVol0, prRegister, prNoType, 0, 0xa), 0)
	b.good("B registers", b.prOut(lunVol0, prRegister, prNoType, 0, 0xb), 0)
	a.good("A reserves write-exclusive", a.prOut(lunVol0, prReserve, prWE, 0xa, 0), 0)

	clear(a.data(0, 512))
	a.good("READ FULL STATUS", a.do(a.in(srpCmd(lunVol0, 0x5E, 0x03, 0, 0, 0, 0, 0, 0x02, 0, 0), 0, 512)), srp.DIUnder)
	desc := func(key uint64, holder bool, tid []byte) string {
		flags, typ := "02", "00"
		if holder {
			flags, typ = "03", "01"
		}
		return fmt.Sprintf("%016x 00000000 %s %s 00000000 0000 %08x %x", key, flags, typ, len(tid), tid)
	}
	port := func(b byte) []byte { p := srpPort(b); return append([]byte{0x04, 0, 0, 0, 0, 0, 0, 0}, p[:]...) }
	named := append([]byte{0x0f, 0, 0, 20}, "gosrp-host"...)
	named = append(named, make([]byte, 24-len(named))...)
	body := desc(0xc, false, named) + " " + desc(0xa, true, port(1)) + " " + desc(0xb, false, port(2))
	want := fieldhex.Bytes(t, strings.Fields(body)...)
	// PRGENERATION 3: the registrations count, the reservation does
	// not (SPC-4 6.15.2).
	want = append(fieldhex.Bytes(t, "00000003", fmt.Sprintf("%08x", len(want))), want...)
	if got := a.data(0, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("READ FULL STATUS:\n% x\nwant\n% x", got, want)
	}
}

// newSRPPair is a rig with two SRP hosts logged in, A on port 1 and B
// on port 2, their unit attentions of the login taken.
func newSRPPair(t *testing.T) (r *rig, a, b *srpClient) {
	t.Helper()
	r = newRig(t, srpEnvs[0], Config{})
	for i, p := range []**srpClient{&a, &b} {
		cl, err := r.srpDial(t, srpLoginReq(byte(i+1)))
		if err != nil {
			t.Fatal(err)
		}
		*p = cl
		cl.clearUA(t, lunVol0)
	}
	return r, a, b
}

// prMove sends PERSISTENT RESERVE OUT, REGISTER AND MOVE (SPC-4 6.16.4)
// on lun: the host's key, the key to register dest's port with, UNREG,
// and dest's port in an SRP TransportID.
func (c *srpClient) prMove(lun uint16, key, saKey uint64, unreg bool, dest [16]byte) srp.Rsp {
	const n = 24 + 24
	p := c.data(0, n)
	clear(p)
	binary.BigEndian.PutUint64(p, key)
	binary.BigEndian.PutUint64(p[8:], saKey)
	if unreg {
		p[17] = 0x02
	}
	binary.BigEndian.PutUint32(p[20:], 24)
	copy(p[24:], scsi.SRPTransportID(dest))
	return c.do(c.out(srpCmd(lun, 0x5F, 0x07, prWE, 0, 0, 0, 0, 0, n, 0), 0, n))
}

// TestSRPRegisterAndMove: the holder of a write-exclusive reservation
// moves it to another SRP host's port with REGISTER AND MOVE and UNREG
// (SPC-4 5.13.8): the other host now holds it, registered with the key
// given, and writes; the mover, unregistered, is refused its write. A
// move by a host that holds nothing is a reservation conflict; a move
// to the host's own port is refused as an invalid field in the
// parameter list. Before, the service action was refused outright.
func TestSRPRegisterAndMove(t *testing.T) {
	r, a, b := newSRPPair(t)
	write := func(c *srpClient) srp.Rsp { return c.do(c.out(srpCmd(lunVol0, rw10(0x2A, 0, 1, false)...), 0, bs)) }
	a.good("A registers", a.prOut(lunVol0, prRegister, prNoType, 0, 0xa), 0)
	b.good("B registers", b.prOut(lunVol0, prRegister, prNoType, 0, 0xb), 0)
	a.good("A reserves write-exclusive", a.prOut(lunVol0, prReserve, prWE, 0xa, 0), 0)
	if rsp := b.prMove(lunVol0, 0xb, 0xbb, false, srpPort(1)); rsp.Status != uint8(scsi.StatusResvConflict) {
		t.Fatalf("B, not the holder, moves the reservation: status %s, want RESERVATION CONFLICT", scsi.Status(rsp.Status))
	}
	a.checkSense("A moves the reservation to its own port", a.prMove(lunVol0, 0xa, 0xaa, false, srpPort(1)), scsi.SenseInvalidParam)
	a.good("A moves the reservation to B, unregistering", a.prMove(lunVol0, 0xa, 0xbb, true, srpPort(2)), 0)
	b.good("B writes, holding the reservation now", write(b), 0)
	if rsp := write(a); rsp.Status != uint8(scsi.StatusResvConflict) {
		t.Fatalf("A's write after it moved the reservation away: status %s, want RESERVATION CONFLICT", scsi.Status(rsp.Status))
	}
	st := r.tgt.pr.volume("vol0").report()
	if st.Holder != srpInitiatorName(srpPort(2)) || st.HolderKey != 0xbb || len(st.Registrants) != 1 || st.ResType != wire.ResWriteExclusive {
		t.Fatalf("after the move: %+v, want B alone registered, holding write-exclusive with key 0xbb", st)
	}
}

// prRegisterPorts sends PERSISTENT RESERVE OUT, REGISTER with SPEC_I_PT
// (SPC-4 6.16.3) on lun: the host's key (0 when it is not registered),
// the key to register saKey, and the ports it names, in SRP
// TransportIDs.
func (c *srpClient) prRegisterPorts(lun uint16, key, saKey uint64, ports ...[16]byte) srp.Rsp {
	n := 24 + 4 + 24*len(ports)
	p := c.data(0, n)
	clear(p)
	binary.BigEndian.PutUint64(p, key)
	binary.BigEndian.PutUint64(p[8:], saKey)
	p[20] = 0x08 // SPEC_I_PT
	binary.BigEndian.PutUint32(p[24:], uint32(24*len(ports)))
	for i, port := range ports {
		copy(p[28+24*i:], scsi.SRPTransportID(port))
	}
	return c.do(c.out(srpCmd(lun, 0x5F, 0x00, 0, 0, 0, 0, 0, 0, byte(n), 0), 0, n))
}

// TestSRPSpecifyInitiatorPorts: a host registers itself and another
// host's port with one REGISTER and SPEC_I_PT (SPC-4 5.13.7), as a
// cluster manager sets up the hosts it fences. The other host, which
// sent no registration of its own, reserves with the key and writes;
// READ KEYS lists the key twice. Naming a port registered already
// registers nobody and is an invalid field of the parameter list.
// REPORT CAPABILITIES says SIP_C. Before, every SPEC_I_PT was refused.
func TestSRPSpecifyInitiatorPorts(t *testing.T) {
	r, a, b := newSRPPair(t)
	caps := a.do(a.in(srpCmd(lunVol0, 0x5E, 0x02, 0, 0, 0, 0, 0, 0, 8, 0), 0, 8))
	if a.good("REPORT CAPABILITIES", caps, 0); a.data(0, 8)[2]&0x08 == 0 {
		t.Fatalf("REPORT CAPABILITIES % x: no SIP_C", a.data(0, 8))
	}
	a.good("A registers itself and B's port", a.prRegisterPorts(lunVol0, 0, 0xab, srpPort(2)), 0)
	b.good("B reserves with the key A registered it with", b.prOut(lunVol0, prReserve, prWE, 0xab, 0), 0)
	b.good("B writes", b.do(b.out(srpCmd(lunVol0, rw10(0x2A, 0, 1, false)...), 0, bs)), 0)
	st := r.tgt.pr.volume("vol0").report()
	if len(st.Registrants) != 2 || st.Registrants[0].Key != 0xab || st.Registrants[1].Key != 0xab || st.Holder != srpInitiatorName(srpPort(2)) {
		t.Fatalf("after SPEC_I_PT: %+v, want A and B registered with 0xab, B holding", st)
	}
	// A third port, and B's again: nobody is registered.
	c, err := r.srpDial(t, srpLoginReq(3))
	if err != nil {
		t.Fatal(err)
	}
	c.clearUA(t, lunVol0)
	c.checkSense("C names a new port and B's", c.prRegisterPorts(lunVol0, 0, 0xc, srpPort(4), srpPort(2)), scsi.SenseInvalidParam)
	if st := r.tgt.pr.volume("vol0").report(); len(st.Registrants) != 2 {
		t.Fatalf("a refused SPEC_I_PT registered hosts: %+v", st.Registrants)
	}
	a.checkSense("A, registered, names another port", a.prRegisterPorts(lunVol0, 0xab, 0xab, srpPort(4)), scsi.SenseInvalidParam)
	if rsp := a.prRegisterPorts(lunVol0, 0, 0xab, srpPort(4)); rsp.Status != uint8(scsi.StatusResvConflict) {
		t.Fatalf("A, registered, names another port with key 0: status %s, want RESERVATION CONFLICT", scsi.Status(rsp.Status))
	}
}

// TestSRPUnitAttentionAfterRestart: reservations a target loaded from
// its store at start (srpd's reservations file after a restart) owe the
// same unit attentions as ones made since: B preempts A, and A's next
// command hears REGISTRATIONS PREEMPTED. Before, a volume loaded from
// the store had nobody to tell (its state had no notifier), so after a
// restart a preempted SRP host heard nothing until its writes failed.
func TestSRPUnitAttentionAfterRestart(t *testing.T) {
	a, b := srpInitiatorName(srpPort(1)), srpInitiatorName(srpPort(2))
	st := &memPRStore{saved: map[string]ReservationState{"vol0": {Generation: 2, Holder: a, Type: "write-exclusive",
		Registrations: []Registration{{a, 0xa}, {b, 0xb}}}}}
	r := newRig(t, srpEnvs[0], Config{Reservations: st})
	var ca, cb *srpClient
	for i, p := range []**srpClient{&ca, &cb} {
		cl, err := r.srpDial(t, srpLoginReq(byte(i+1)))
		if err != nil {
			t.Fatal(err)
		}
		*p = cl
		cl.clearUA(t, lunVol0)
	}
	cb.good("B preempts A", cb.prOut(lunVol0, prPreempt, prWE, 0xb, 0xa), 0)
	ca.checkSense("A after B preempted it", ca.do(srpCmd(lunVol0, 0, 0, 0, 0, 0, 0)), scsi.SenseRegistrationsPreempted)
}

// sharedPRStore keeps each volume's reservations where every target of
// a test reads them (ReservationReader), as srpd's gateways keep them
// with an RBD image.
type sharedPRStore struct {
	mu  sync.Mutex
	rec map[string]ReservationState
}

func (s *sharedPRStore) LoadReservations() (map[string]ReservationState, error) {
	return map[string]ReservationState{}, nil
}

func (s *sharedPRStore) SaveReservation(vol string, st ReservationState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rec[vol] = st
	return nil
}

func (s *sharedPRStore) ReadReservation(vol string) (ReservationState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec[vol], nil
}

// TestSRPUnitAttentionAcrossGateways: two targets keep vol0's
// reservations in one store, as two gateways of an RBD image. Host A
// has an I_T nexus on each, B on the first. B preempts A through the
// first: A hears REGISTRATIONS PREEMPTED there at once, and through the
// second once that one reads the state (as it does when it takes the
// volume over, SetReservations), once only, however often it reads it
// again. A change made through the second (B's CLEAR, after A
// registered again there) reaches A's nexus on the first the same way,
// without the preempt told twice. SPC-4 5.13.11 owes the unit attention
// to every I_T nexus of the host, whichever target port. Before, a
// gateway raised only the changes made through itself: after a
// failover, the preempted host learned of it from its next refused
// write.
func TestSRPUnitAttentionAcrossGateways(t *testing.T) {
	shared := &sharedPRStore{rec: map[string]ReservationState{}}
	r1 := newRig(t, srpEnvs[0], Config{Reservations: shared})
	r2 := newRig(t, srpEnvs[0], Config{Reservations: shared})
	login := func(r *rig, port byte) *srpClient {
		c, err := r.srpDial(t, srpLoginReq(port))
		if err != nil {
			t.Fatal(err)
		}
		c.clearUA(t, lunVol0)
		return c
	}
	a1, b1, a2 := login(r1, 1), login(r1, 2), login(r2, 1)
	tur := func(c *srpClient) srp.Rsp { return srpTUR(c, lunVol0) }
	takeOver := func(r *rig) {
		t.Helper()
		st, _ := shared.ReadReservation("vol0")
		if err := r.tgt.SetReservations("vol0", st); err != nil {
			t.Fatal(err)
		}
	}
	a1.good("A registers through gateway 1", a1.prOut(lunVol0, prRegister, prNoType, 0, 0xa), 0)
	b1.good("B registers through gateway 1", b1.prOut(lunVol0, prRegister, prNoType, 0, 0xb), 0)
	a1.good("A reserves", a1.prOut(lunVol0, prReserve, prWE, 0xa, 0), 0)
	b1.good("B preempts A", b1.prOut(lunVol0, prPreempt, prWE, 0xb, 0xa), 0)
	a1.checkSense("A on gateway 1", tur(a1), scsi.SenseRegistrationsPreempted)
	a2.good("A on gateway 2, which has not read the change", tur(a2), 0)
	takeOver(r2)
	a2.checkSense("A on gateway 2 once it read the change", tur(a2), scsi.SenseRegistrationsPreempted)
	takeOver(r2)
	a2.good("A on gateway 2 after a second read", tur(a2), 0)

	b2 := login(r2, 2)
	a2.good("A registers again, through gateway 2", a2.prOut(lunVol0, prRegister, prNoType, 0, 0xa2), 0)
	b2.good("B clears through gateway 2", b2.prOut(lunVol0, prClear, prNoType, 0xb, 0), 0)
	a2.checkSense("A on gateway 2 after the CLEAR", tur(a2), scsi.SenseReservationsPreempted)
	takeOver(r1)
	a1.checkSense("A on gateway 1 once it read the CLEAR", tur(a1), scsi.SenseReservationsPreempted)
	a1.good("A on gateway 1 hears nothing more", tur(a1), 0)
	b1.good("B, the clearing host, on gateway 1", tur(b1), 0)
}

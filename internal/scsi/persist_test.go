package scsi

import (
	"bytes"
	"slices"
	"testing"

	"github.com/gosrp/gosrp/internal/fieldhex"
	"github.com/gosrp/gosrp/internal/wire"
)

// prOut is a PERSISTENT RESERVE OUT CDB: service action sa, scope and
// type st, parameter list length n.
func prOut(sa, st byte, n uint32) []byte {
	c := []byte{opPersistOut, sa, st, 0, 0, 0, 0, 0, 0, 0}
	be.PutUint32(c[5:], n)
	return c
}

// prParams is the basic parameter list: key, service action key, flags.
func prParams(key, saKey uint64, flags byte) []byte {
	p := make([]byte, prOutParamLen)
	be.PutUint64(p, key)
	be.PutUint64(p[8:], saKey)
	p[20] = flags
	return p
}

// moveParams is REGISTER AND MOVE's parameter list: key, service action
// key, UNREG (bit 1 of byte 17), the TransportID's length, tid.
func moveParams(key, saKey uint64, unreg bool, tid []byte) []byte {
	p := prParams(key, saKey, 0)
	if unreg {
		p[17] = 0x02
	}
	be.PutUint32(p[20:], uint32(len(tid)))
	return append(p, tid...)
}

// specParams is a REGISTER's parameter list with SPEC_I_PT: key,
// service action key, the TransportIDs' length, the TransportIDs.
func specParams(key, saKey uint64, tids ...[]byte) []byte {
	p := prParams(key, saKey, specIPT)
	var list []byte
	for _, tid := range tids {
		list = append(list, tid...)
	}
	p = be.AppendUint32(p, uint32(len(list)))
	return append(p, list...)
}

// TestPersistOut: PERSISTENT RESERVE OUT's CDB and parameter list, as
// sg_persist and Linux's block layer (blk_pr_ops: sd_pr_command) send
// them, decoded to the target's action; what SPC-4 6.16 refuses,
// refused with its sense.
func TestPersistOut(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cdb, param []byte
		sense      Sense // of the CDB, or else of the list
		act        wire.ReserveAction
		key, saKey uint64
		typ        wire.ReservationType
		dest       string
		unreg      bool
		ports      []string
	}{
		{name: "REGISTER", cdb: prOut(0, 0, 24), param: prParams(0, 0xabc, 0), act: wire.ActionRegister, saKey: 0xabc},
		{name: "REGISTER, ALL_TG_PT and APTPL (sd_pr_register)", cdb: prOut(0, 0, 24), param: prParams(0xabc, 0xdef, 0x05),
			act: wire.ActionRegister, key: 0xabc, saKey: 0xdef},
		{name: "REGISTER ignores scope and type", cdb: prOut(0, 0xff, 24), param: prParams(0, 1, 0), act: wire.ActionRegister, saKey: 1},
		{name: "RESERVE write exclusive", cdb: prOut(1, 0x01, 24), param: prParams(0xabc, 0, 0), act: wire.ActionReserve, key: 0xabc, typ: wire.ResWriteExclusive},
		{name: "RELEASE exclusive access, registrants only", cdb: prOut(2, 0x06, 24), param: prParams(7, 0, 0), act: wire.ActionRelease, key: 7, typ: wire.ResExclusiveAccessRegistrants},
		{name: "CLEAR", cdb: prOut(3, 0, 24), param: prParams(7, 0, 0), act: wire.ActionClear, key: 7},
		{name: "PREEMPT", cdb: prOut(4, 0x03, 24), param: prParams(7, 9, 0), act: wire.ActionPreempt, key: 7, saKey: 9, typ: wire.ResExclusiveAccess},
		{name: "PREEMPT AND ABORT", cdb: prOut(5, 0x05, 24), param: prParams(7, 9, 0), act: wire.ActionPreemptAbort, key: 7, saKey: 9, typ: wire.ResWriteExclusiveRegistrants},
		{name: "REGISTER AND IGNORE EXISTING KEY", cdb: prOut(6, 0, 24), param: prParams(0, 5, 0), act: wire.ActionRegisterIgnore, saKey: 5},
		{name: "REGISTER AND MOVE to an SRP port, UNREG", cdb: prOut(7, 0x01, 48), param: moveParams(7, 9, true, SRPTransportID([16]byte{0: 0xfe, 15: 2})),
			act: wire.ActionRegisterMove, key: 7, saKey: 9, dest: "fe000000000000000000000000000002", unreg: true},
		{name: "REGISTER AND MOVE to a named host", cdb: prOut(7, 0, 48), param: moveParams(7, 9, false, NamedTransportID("host-b")),
			act: wire.ActionRegisterMove, key: 7, saKey: 9, dest: "host-b"},
		{name: "REGISTER AND MOVE without a key to register", cdb: prOut(7, 0, 48), param: moveParams(7, 0, false, NamedTransportID("b")), sense: SenseInvalidParam},
		{name: "REGISTER AND MOVE to an iSCSI name", cdb: prOut(7, 0, 48), param: moveParams(7, 9, false, append([]byte{0x05, 0, 0, 20}, make([]byte, 20)...)), sense: SenseInvalidParam},
		{name: "REGISTER AND MOVE with a TransportID past the list", cdb: prOut(7, 0, 48), param: moveParams(7, 9, false, SRPTransportID([16]byte{}))[:40], sense: SenseParamListLength},
		{name: "REGISTER AND MOVE with the basic list", cdb: prOut(7, 0, 24), sense: SenseParamListLength},
		{name: "a service action past the last", cdb: prOut(0x1f, 0, 24), sense: SenseInvalidField},
		{name: "RESERVE of an ALL_REG type: not served", cdb: prOut(1, 0x07, 24), sense: SenseInvalidField},
		{name: "RESERVE with type 0", cdb: prOut(1, 0, 24), sense: SenseInvalidField},
		{name: "RESERVE with another scope", cdb: prOut(1, 0x21, 24), sense: SenseInvalidField},
		{name: "a list that is not 24 bytes", cdb: prOut(1, 0x01, 28), sense: SenseParamListLength},
		{name: "no list", cdb: prOut(0, 0, 0), sense: SenseParamListLength},
		{name: "REGISTER with SPEC_I_PT: an SRP port and a named host, each once", cdb: prOut(0, 0, 128),
			param: specParams(0, 0xabc, SRPTransportID([16]byte{15: 2}), NamedTransportID("host-b"), SRPTransportID([16]byte{15: 2})),
			act:   wire.ActionRegister, saKey: 0xabc, ports: []string{"00000000000000000000000000000002", "host-b"}},
		{name: "SPEC_I_PT without TransportIDs", cdb: prOut(0, 0, 28), param: specParams(0, 1), sense: SenseInvalidParam},
		{name: "SPEC_I_PT to unregister", cdb: prOut(0, 0, 52), param: specParams(0, 0, SRPTransportID([16]byte{})), sense: SenseInvalidParam},
		{name: "SPEC_I_PT naming an iSCSI initiator", cdb: prOut(0, 0, 52), param: specParams(0, 1, append([]byte{0x05, 0, 0, 20}, make([]byte, 20)...)), sense: SenseInvalidParam},
		{name: "SPEC_I_PT with a length past the list", cdb: prOut(0, 0, 52), param: func() []byte {
			p := specParams(0, 1, SRPTransportID([16]byte{}))
			be.PutUint32(p[24:], 48)
			return p
		}(), sense: SenseParamListLength},
		{name: "SPEC_I_PT with a TransportID cut short", cdb: prOut(0, 0, 40), param: func() []byte {
			p := specParams(0, 1, SRPTransportID([16]byte{}))[:40]
			be.PutUint32(p[24:], 12)
			return p
		}(), sense: SenseParamListLength},
		{name: "REGISTER with a longer list but no SPEC_I_PT", cdb: prOut(0, 0, 28), param: append(prParams(0, 1, 0), 0, 0, 0, 0), sense: SenseParamListLength},
		{name: "REGISTER's list past what a volume could register", cdb: prOut(0, 0, prSpecParamMax+1), sense: SenseParamListLength},
		{name: "SPEC_I_PT with REGISTER AND IGNORE EXISTING KEY", cdb: prOut(6, 0, 24), param: prParams(0, 1, specIPT), sense: SenseInvalidParam},
		{name: "SPEC_I_PT with RESERVE", cdb: prOut(1, 0x01, 24), param: prParams(1, 0, specIPT), sense: SenseInvalidParam},
		{name: "a list shorter than it said", cdb: prOut(0, 0, 24), param: make([]byte, 20), sense: SenseParamListLength},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := disk().Execute(&Nexus{}, tc.cdb, nil)
			if a.Status != StatusGood {
				if a.Sense != tc.sense {
					t.Fatalf("CDB: %v %v, want %v", a.Status, a.Sense, tc.sense)
				}
				return
			}
			if a.Op != OpReserveOut || a.DataOut != be.Uint32(tc.cdb[5:]) {
				t.Fatalf("CDB: %+v", a)
			}
			req, r := ReserveOut(a.PR, tc.param)
			act, key, saKey, typ := req.Action, req.Key, req.NewKey, req.Type
			if r.Status != StatusGood {
				if r.Sense != tc.sense {
					t.Fatalf("list: %v %v, want %v", r.Status, r.Sense, tc.sense)
				}
				return
			}
			if tc.sense != (Sense{}) || act != tc.act || key != tc.key || saKey != tc.saKey || typ != tc.typ || req.Dest != tc.dest || req.Unreg != tc.unreg ||
				!slices.Equal(req.Ports, tc.ports) {
				t.Fatalf("decoded %v key %#x sa key %#x type %v dest %q unreg %v ports %q; want %v %#x %#x %v %q %v %q (sense %v)",
					act, key, saKey, typ, req.Dest, req.Unreg, req.Ports, tc.act, tc.key, tc.saKey, tc.typ, tc.dest, tc.unreg, tc.ports, tc.sense)
			}
		})
	}
}

// TestPersistIn: PERSISTENT RESERVE IN's answers in SPC-4's layouts, cut
// to the allocation length; any other service action is refused
// (INVALID FIELD IN CDB). A standby port serves both
// commands (SPC-4 5.15.2.4.5).
func TestPersistIn(t *testing.T) {
	in := func(sa byte, alloc uint16) []byte {
		c := []byte{opPersistIn, sa, 0, 0, 0, 0, 0, 0, 0, 0}
		be.PutUint16(c[7:], alloc)
		return c
	}
	regs := []Registration{{Key: 0xa, TransportID: SRPTransportID([16]byte{15: 1})}, {Key: 0xbbbb, Holder: true, TransportID: NamedTransportID("host-b")}}
	for _, tc := range []struct {
		name string
		cdb  []byte
		typ  wire.ReservationType
		want []byte
	}{
		{"READ KEYS", in(0, 512), wire.ResWriteExclusive, fieldhex.Bytes(t, "00000007", "00000010", "000000000000000a", "000000000000bbbb")},
		{"READ KEYS cut to 8 bytes (sg_persist asks the length first)", in(0, 8), 0, fieldhex.Bytes(t, "00000007", "00000010")},
		{"READ RESERVATION held", in(1, 512), wire.ResExclusiveAccess, fieldhex.Bytes(t,
			"00000007", "00000010", "000000000000bbbb", "00000000", "00", "03", "0000")},
		{"READ RESERVATION, none", in(1, 512), 0, fieldhex.Bytes(t, "00000007", "00000000")},
		{"REPORT CAPABILITIES", in(2, 512), 0, fieldhex.Bytes(t, "0008", "0d", "81", "6a", "00", "0000")},
		{"READ FULL STATUS", in(3, 512), wire.ResExclusiveAccess, fieldhex.Bytes(t, "00000007", "00000060",
			"000000000000000a", "00000000", "02", "00", "00000000", "0000", "00000018", "04", "00000000000000", "00000000000000000000000000000001",
			"000000000000bbbb", "00000000", "03", "03", "00000000", "0000", "00000018", "0f", "00", "0014", "686f73742d62", "0000000000000000000000000000")},
		{"READ FULL STATUS, no reservation", in(3, 512), 0, fieldhex.Bytes(t, "00000007", "00000060",
			"000000000000000a", "00000000", "02", "00", "00000000", "0000", "00000018", "04", "00000000000000", "00000000000000000000000000000001",
			"000000000000bbbb", "00000000", "02", "00", "00000000", "0000", "00000018", "0f", "00", "0014", "686f73742d62", "0000000000000000000000000000")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := disk()
			d.PortGroup, d.Standby = 2, true
			a := d.Execute(&Nexus{}, tc.cdb, nil)
			if a.Status != StatusGood {
				t.Fatalf("%v %v", a.Status, a.Sense)
			}
			if a.Op == OpReserveIn {
				a = ReserveInData(a.PR, 7, regs, 0xbbbb, tc.typ)
			}
			if !bytes.Equal(a.Data, tc.want) {
				t.Fatalf("% x\nwant\n% x", a.Data, tc.want)
			}
		})
	}
	for _, sa := range []byte{4, 0x1f} {
		if a := disk().Execute(&Nexus{}, in(sa, 512), nil); a.Sense != SenseInvalidField {
			t.Errorf("service action %d: %v %v, want INVALID FIELD IN CDB", sa, a.Status, a.Sense)
		}
	}
}

// TestTransportIDRoundTrip: TransportIDOf and ParseTransportID are each
// other's inverse for the hosts a target has: SRP ports (hex) and
// named hosts, up to the longest name a report carries.
func TestTransportIDRoundTrip(t *testing.T) {
	for _, name := range []string{"fe000000000000000000000000000002", "gosrp-host", "h", string(bytes.Repeat([]byte{'n'}, wire.MaxReportName))} {
		got, ok := ParseTransportID(TransportIDOf(name))
		if !ok || got != name {
			t.Errorf("%q: TransportIDOf then ParseTransportID gave %q, %v", name, got, ok)
		}
	}
	if id := TransportIDOf("fe000000000000000000000000000002"); id[0] != 0x04 {
		t.Errorf("an SRP port's TransportID has protocol %#x, want 4", id[0])
	}
}

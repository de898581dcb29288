package scsi

import (
	"slices"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
)

// FuzzExecute runs arbitrary CDBs, and for UNMAP and PERSISTENT RESERVE
// OUT arbitrary parameter lists, against devices of each kind: the model never panics, a CHECK
// CONDITION always has a sense key, and every block operation it asks for
// lies within the unit and its limits.
func FuzzExecute(f *testing.F) {
	seeds := [][]byte{
		cdb(0x12, 1, 0x83, 0, 255), cdb(0x1a, 0, 0x3f, 0, 192), cdb(0x5a, 0x10, 0x08, 0, 0, 0, 0, 1, 0),
		cdb(0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32), cdb(0x28, 0, 0, 0, 0, 1, 0, 0, 8),
		cdb(0x8a, 0x08, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 1), cdb(0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0),
		cdb(0x42, 0, 0, 0, 0, 0, 0, 0, 24), cdb(0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0), cdb(0x03, 1, 0, 0, 18),
		cdb(0xa3, 0x0c, 0x01, 0x93, 0, 0, 0, 0, 2, 0), cdb(0xa3, 0x0c, 0x83, 0x9e, 0, 0x10, 0, 0, 2, 0),
		cdb(0xa3, 0x0c, 0x80, 0, 0, 0, 0, 0, 2, 0),
		cdb(0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0), cdb(0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8),
		cdb(0x5e, 0x00, 0, 0, 0, 0, 0, 0x10, 0), cdb(0x5e, 0x01, 0, 0, 0, 0, 0, 0, 24), cdb(0x5e, 0x02, 0, 0, 0, 0, 0, 0, 8),
		cdb(0x5f, 0x00, 0, 0, 0, 0, 0, 0, 24), cdb(0x5f, 0x01, 0x01, 0, 0, 0, 0, 0, 24), cdb(0x5f, 0x05, 0x03, 0, 0, 0, 0, 0, 24),
	}
	unmap := []byte{0, 22, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 8, 0, 0, 0, 0}
	spec := specParams(0, 1, SRPTransportID([16]byte{15: 2}), NamedTransportID("host-b"))
	seeds = append(seeds, cdb(0x5f, 0x00, 0, 0, 0, 0, 0, 0, byte(len(spec))))
	for i, s := range seeds {
		f.Add(s, spec, uint8(i), uint64(262144), uint8(3), "vol-0001", uint32(0))
		f.Add(s, unmap, uint8(i), uint64(262144), uint8(3), "vol-0001", uint32(0))
		f.Add(s, []byte{0, 0, 0, 0, 0, 0, 0, 2}, uint8(i&7), uint64(262144), uint8(3), "vol-0001", uint32(1<<16|2))
	}
	f.Fuzz(func(t *testing.T, c, params []byte, kind uint8, blocks uint64, bsShift uint8, serial string, limit uint32) {
		d := disk()
		d.ReadOnly = kind&1 != 0
		d.Discard = kind&2 != 0
		d.WriteCache = kind&4 != 0
		d.Blocks, d.BlockSize, d.Serial = blocks, 512<<(bsShift%8), serial
		if kind&8 != 0 {
			d.MaxTransferBlocks, d.MaxUnmapBlocks, d.MaxUnmapDescriptors, d.MaxWriteSameBlocks = limit, limit, limit, limit
		} else {
			// A gateway's unit: limit holds its port group and state.
			d.PortGroup, d.Standby, d.Unavailable = uint16(limit), limit&(1<<16) != 0, limit&(1<<17) != 0
		}
		n := &Nexus{}
		n.Raise(Condition(kind >> 4))
		for range 4 { // through the pending unit attentions
			a := d.Execute(n, c, []uint16{0, 300})
			checkAction(t, d, a)
			if len(c) >= 6 && c[0] == opInquiry && c[1]&1 != 0 && a.Status == StatusGood && be.Uint16(c[3:]) == 0xFFFF {
				if n := int(be.Uint16(a.Data[2:])); n != len(a.Data)-4 {
					t.Fatalf("VPD %#x says %d bytes, has %d", c[2], n, len(a.Data)-4)
				}
			}
			if a.Op != OpNone && d.PortGroup != 0 && (d.Standby || d.Unavailable) && a.Op != OpSetPortGroups &&
				a.Op != OpReserveIn && a.Op != OpReserveOut { // a standby port serves both (SPC-4 5.15.2.4.5)
				t.Fatalf("%v on a standby port", a.Op)
			}
			if a.Op == OpSetPortGroups {
				if d.PortGroup == 0 || a.DataOut < 4 || a.DataOut%4 != 0 {
					t.Fatalf("SET TARGET PORT GROUPS fetching %d bytes on port group %d", a.DataOut, d.PortGroup)
				}
				act, res := d.SetPortGroups(params)
				checkAction(t, d, res)
				if act && res.Status != StatusGood {
					t.Fatalf("takeover asked with %+v", res)
				}
			}
			if a.Op == OpReserveOut {
				if a.DataOut != prOutParamLen && (a.PR.Service != prRegisterMove || a.DataOut > prMoveParamMax) &&
					(a.PR.Service != prRegister || a.DataOut > prSpecParamMax) {
					t.Fatalf("PERSISTENT RESERVE OUT fetching %d bytes", a.DataOut)
				}
				req, res := ReserveOut(a.PR, params)
				checkAction(t, d, res)
				if res.Status == StatusGood && (!req.Action.Valid() || req.Type != 0 && !req.Type.Valid()) {
					t.Fatalf("PERSISTENT RESERVE OUT decoded to %v of type %v", req.Action, req.Type)
				}
				if res.Status == StatusGood && req.Action == wire.ActionRegisterMove && (req.Dest == "" || req.NewKey == 0) {
					t.Fatalf("REGISTER AND MOVE decoded to %+v", req)
				}
				if res.Status == StatusGood && len(req.Ports) > 0 && (req.Action != wire.ActionRegister || req.NewKey == 0 ||
					len(req.Ports) >= wire.MaxRegistrants || slices.Contains(req.Ports, "")) {
					t.Fatalf("SPEC_I_PT decoded to %+v", req)
				}
			}
			if a.Op == OpReserveIn {
				regs := []Registration{{Key: 1, TransportID: NamedTransportID("a")}, {Key: 2, Holder: true, TransportID: SRPTransportID([16]byte{})}, {Key: 3}}
				r := ReserveInData(a.PR, 7, regs, 2, wire.ResWriteExclusive)
				checkAction(t, d, r)
				if r.Status == StatusGood && len(r.Data) > a.PR.Alloc {
					t.Fatalf("PERSISTENT RESERVE IN answers %d bytes for %d", len(r.Data), a.PR.Alloc)
				}
			}
			if a.Op == OpUnmap {
				ext, u := d.Unmap(params, nil)
				checkAction(t, d, u)
				if len(ext) > int(d.maxUnmapDescriptors()) {
					t.Fatalf("%d extents", len(ext))
				}
				var total uint64
				for _, e := range ext {
					total += uint64(e.Blocks)
					if e.Blocks == 0 || !d.inRange(e.LBA, uint64(e.Blocks)) {
						t.Fatalf("extent %+v outside %d blocks", e, d.Blocks)
					}
				}
				if total > uint64(d.maxUnmapBlocks()) {
					t.Fatalf("unmaps %d blocks", total)
				}
			}
		}
		NoUnit(c, nil)
		BecomingReady(c, nil)
	})
}

func checkAction(t *testing.T, d *Device, a Action) {
	t.Helper()
	if a.Status == StatusCheckCondition {
		if a.Sense.Key == KeyNoSense || a.Op != OpNone || a.Data != nil {
			t.Fatalf("CHECK CONDITION %+v", a)
		}
		return
	}
	if a.Status != StatusGood {
		t.Fatalf("status %v", a.Status)
	}
	switch a.Op {
	case OpRead, OpWrite, OpWriteSame:
		if a.Blocks == 0 || !d.inRange(a.LBA, uint64(a.Blocks)) {
			t.Fatalf("%v of %d blocks at %d, outside %d", a.Op, a.Blocks, a.LBA, d.Blocks)
		}
		if a.Op != OpRead && d.ReadOnly {
			t.Fatalf("%v on a read-only unit", a.Op)
		}
		if a.Op == OpWrite && uint64(a.DataOut) != uint64(a.Blocks)*uint64(d.BlockSize) {
			t.Fatalf("write of %d blocks fetches %d bytes", a.Blocks, a.DataOut)
		}
		if a.Op != OpWriteSame && a.Blocks > d.maxTransfer() {
			t.Fatalf("%v of %d blocks, max %d", a.Op, a.Blocks, d.maxTransfer())
		}
	case OpUnmap:
		if !d.Discard || d.ReadOnly {
			t.Fatalf("unmap on %+v", d)
		}
	}
}

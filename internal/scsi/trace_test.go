package scsi

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestTraces runs testdata/unit_attention and friends: each trace sets up
// a device and named I_T nexuses, changes the device (resize, raise a
// condition) and runs commands from one nexus or another; the output is
// each command's status and what it returned. Run with -rewrite after a
// deliberate change, and read the diff.
func TestTraces(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var dev *Device
		nexus := map[string]*Nexus{}
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "device":
				dev = disk()
				var blocks uint64
				if td.MaybeScanArgs(t, "blocks", &blocks) {
					dev.Blocks = blocks
				}
				dev.WriteCache = td.HasArg("wc")
				dev.ReadOnly = td.HasArg("ro")
				var group int
				td.MaybeScanArgs(t, "group", &group)
				dev.PortGroup = uint16(group)
				dev.Standby = td.HasArg("standby")
				clear(nexus)
				return "ok"
			case "login":
				var name string
				td.ScanArgs(t, "nexus", &name)
				nexus[name] = &Nexus{}
				return "ok"
			case "standby", "active", "unavailable":
				// The target changes the unit's ALUA state and tells
				// every nexus but the one that asked for it, if any.
				dev.Standby, dev.Unavailable = td.Cmd == "standby", td.Cmd == "unavailable"
				var except string
				td.MaybeScanArgs(t, "except", &except)
				var b strings.Builder
				for _, name := range slices.Sorted(maps.Keys(nexus)) {
					if name != except {
						nexus[name].Raise(AccessChanged)
					}
					fmt.Fprintf(&b, "%s: pending %s\n", name, nexus[name].Pending())
				}
				return b.String()
			case "set-port-groups":
				// The parameter list of SET TARGET PORT GROUPS, one
				// group:state pair per descriptor.
				var descs []string
				td.MaybeScanArgs(t, "desc", &descs)
				param := make([]byte, 4)
				for _, d := range descs {
					var g uint16
					var st byte
					if _, err := fmt.Sscanf(d, "%d:%d", &g, &st); err != nil {
						t.Fatalf("%s: desc %q: %v", td.Pos, d, err)
					}
					param = append(param, st, 0)
					param = be.AppendUint16(param, g)
				}
				if td.HasArg("short") {
					param = param[:len(param)-1]
				}
				act, a := dev.SetPortGroups(param)
				return fmt.Sprintf("activate=%v %s", act, describe(a, ""))
			case "resize":
				td.ScanArgs(t, "blocks", &dev.Blocks)
				return raiseAll(nexus, CapacityChanged)
			case "raise":
				var names []string
				td.ScanArgs(t, "cond", &names)
				var c Condition
				for _, n := range names {
					switch n {
					case "write-cache-lost":
						c |= WriteCacheLost
					case "capacity-changed":
						c |= CapacityChanged
					case "luns-changed":
						c |= LUNsChanged
					case "reset-occurred":
						c |= ResetOccurred
					case "access-changed":
						c |= AccessChanged
					default:
						t.Fatalf("%s: unknown condition %q", td.Pos, n)
					}
				}
				return raiseAll(nexus, c)
			case "exec":
				var name, op string
				td.ScanArgs(t, "nexus", &name)
				td.ScanArgs(t, "op", &op)
				n := nexus[name]
				if n == nil {
					t.Fatalf("%s: no nexus %q (login first)", td.Pos, name)
				}
				var lba, blocks uint64
				td.MaybeScanArgs(t, "lba", &lba)
				blocks = 1
				td.MaybeScanArgs(t, "blocks", &blocks)
				c := traceCDB(t, td, op, lba, blocks)
				return describe(dev.Execute(n, c, []uint16{0, 1}), op)
			}
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
			return ""
		})
	})
}

// raiseAll raises c on every nexus, as the target does for a unit, and
// says what each has pending.
func raiseAll(nexus map[string]*Nexus, c Condition) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(nexus)) {
		nexus[name].Raise(c)
		fmt.Fprintf(&b, "%s: pending %s\n", name, nexus[name].Pending())
	}
	return b.String()
}

// traceCDB builds the CDB a trace names.
func traceCDB(t *testing.T, td *datadriven.TestData, op string, lba, blocks uint64) []byte {
	c := make([]byte, 16)
	put16 := func(code byte) {
		c[0] = code
		be.PutUint64(c[2:], lba)
		be.PutUint32(c[10:], uint32(blocks))
	}
	switch op {
	case "tur":
	case "inquiry":
		c[0], c[4] = opInquiry, 36
	case "report-luns":
		c[0], c[9] = opReportLUNs, 64
	case "request-sense":
		c[0], c[4] = opRequestSense, 18
		if td.HasArg("desc") {
			c[1] = 1
		}
	case "read-capacity":
		c[0], c[1], c[13] = opServiceIn16, saReadCapacity16, 32
	case "read":
		put16(opRead16)
	case "write":
		put16(opWrite16)
		if td.HasArg("fua") {
			c[1] = 0x08
		}
	case "sync":
		c[0] = opSyncCache10
	case "mode-sense":
		c[0], c[2], c[4] = opModeSense6, 0x3f, 255
	case "rtpg":
		c[0], c[1], c[9] = opMaintenanceIn, saPortGroups, 255
		if td.HasArg("ext") {
			c[1] |= rtpgExtended
		}
	case "stpg":
		var n uint32
		td.MaybeScanArgs(t, "len", &n)
		c[0], c[1] = opMaintenanceOut, saPortGroups
		be.PutUint32(c[6:], n)
	default:
		t.Fatalf("%s: unknown op %q", td.Pos, op)
	}
	return c
}

// describe prints an Action as the trace shows it.
func describe(a Action, op string) string {
	if a.Status != StatusGood {
		return fmt.Sprintf("%s %s\n", a.Status, a.Sense)
	}
	switch {
	case a.Op != OpNone:
		s := fmt.Sprintf("GOOD %s", a.Op)
		if a.Op == OpRead || a.Op == OpWrite {
			s += fmt.Sprintf(" lba=%d blocks=%d", a.LBA, a.Blocks)
		}
		if a.Op == OpSetPortGroups {
			s += fmt.Sprintf(" data-out=%d", a.DataOut)
		}
		if a.FUA {
			s += " fua"
		}
		return s + "\n"
	case op == "request-sense":
		s, err := ParseSense(a.Data)
		if err != nil {
			return fmt.Sprintf("GOOD, bad sense data % x: %v\n", a.Data, err)
		}
		return fmt.Sprintf("GOOD sense format %#x: %s\n", a.Data[0], s)
	case op == "read-capacity":
		return fmt.Sprintf("GOOD last-lba=%d block-size=%d\n", be.Uint64(a.Data), be.Uint32(a.Data[8:]))
	case op == "report-luns":
		return fmt.Sprintf("GOOD %d luns\n", be.Uint32(a.Data)/8)
	case op == "rtpg":
		return describeRTPG(a.Data)
	case len(a.Data) > 0:
		return fmt.Sprintf("GOOD %d bytes\n", len(a.Data))
	}
	return "GOOD\n"
}

// describeRTPG prints REPORT TARGET PORT GROUPS data: the header's
// format and transition time, then each group's state, supported states
// and relative target ports.
func describeRTPG(b []byte) string {
	var s strings.Builder
	off := 4
	if len(b) >= 8 && b[4]&0x70 == rtpgFormatExtended {
		fmt.Fprintf(&s, "GOOD extended transition=%ds", b[5])
		off = 8
	} else {
		s.WriteString("GOOD")
	}
	if int(be.Uint32(b))+4 != len(b) {
		fmt.Fprintf(&s, " (length %d, %d bytes)", be.Uint32(b), len(b))
	}
	for off+8 <= len(b) {
		d := b[off:]
		fmt.Fprintf(&s, " group=%d state=%d supported=%#02x status=%d ports=", be.Uint16(d[2:]), d[0]&0x0f, d[1], d[5])
		off += 8
		for range int(d[7]) {
			if off+4 > len(b) {
				break
			}
			fmt.Fprintf(&s, "%d", be.Uint16(b[off+2:]))
			off += 4
		}
	}
	return s.String() + "\n"
}

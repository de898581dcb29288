package target

import (
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/wire"
)

// prTrace runs the reservation commands of the core traces against the
// target's reservation table (the one the traced core checks):
//
//	pr vol=V ini=I act=ACTION [key=K] [new=N] [type=T]  a PERSISTENT RESERVE OUT
//	pr-check vol=V ini=I owner=O write|read              may I (session O) do it?
//	pr-open vol=V ini=I owner=O [excl]                   a handle opened for writing
//	pr-close vol=V owner=O [excl]                        ... and closed
//	pr-show vol=V                                        the state and its report
//	pr-table                                             the volumes the table has
//
// Each prints the outcome and the volume's state after it.
func (h *traceHarness) prTrace(t *testing.T, td *datadriven.TestData) {
	if td.Cmd == "pr-table" {
		h.printf("volumes with reservation state: %v\n", slices.Sorted(maps.Keys(h.c.p.pr.vols)))
		return
	}
	var vol, ini, owner string
	td.ScanArgs(t, "vol", &vol)
	td.MaybeScanArgs(t, "ini", &ini)
	td.MaybeScanArgs(t, "owner", &owner)
	v := h.c.p.pr.volume(vol)
	switch td.Cmd {
	case "pr":
		var act string
		var typ string
		td.ScanArgs(t, "act", &act)
		key, newKey := scanKey(t, td, "key"), scanKey(t, td, "new")
		td.MaybeScanArgs(t, "type", &typ)
		a := parseAction(act)
		rt := wire.ResNone
		if typ != "" {
			var err error
			if rt, err = wire.ParseReservationType(typ); err != nil {
				t.Fatalf("%s: %v", td.Pos, err)
			}
		}
		var dest string
		var ports []string
		td.MaybeScanArgs(t, "dest", &dest)
		td.MaybeScanArgs(t, "ports", &ports)
		out, gen := v.apply(ini, &wire.ControlRequest{Action: a, Key: key, NewKey: newKey, Type: rt, Dest: dest, Unreg: td.HasArg("unreg"), Ports: ports})
		h.printOutcome(out)
		h.printf("generation %d\n", gen)
	case "pr-check":
		write := td.HasArg("write")
		if !write && !td.HasArg("read") {
			t.Fatalf("%s: pr-check needs write or read", td.Pos)
		}
		h.printf("allowed: %v\n", v.allows(ini, owner, write))
	case "pr-open":
		h.printOutcome(v.openWriter(owner, ini, td.HasArg("excl")))
	case "pr-close":
		v.closeWriter(owner, td.HasArg("excl"))
	case "pr-show":
		r := v.report()
		h.printf("report: gen=%d holder=%q key=%#x type=%s excl=%q regs=%v\n", r.Generation, r.Holder, r.HolderKey, r.ResType, r.ExclusiveHolder, r.Registrants)
	}
	h.printf("state: %s\n", v)
}

func (h *traceHarness) printOutcome(out prOutcome) {
	if out.sense == wire.SenseNone {
		h.printf("ok")
	} else {
		h.printf("%s: %s", out.sense, out.msg)
	}
	if out.scsi != scsi.SenseNone {
		h.printf(" (SCSI: %s)", out.scsi)
	}
	if len(out.preempted) > 0 {
		h.printf(" (preempted %v)", out.preempted)
	}
	for _, n := range out.notices {
		h.printf(" (tells %s %s)", n.initiator, n.what)
	}
	h.printf("\n")
}

// prControlArgs reads a control request's reservation arguments:
// act=ACTION key=K new=N type=T excl.
func prControlArgs(t *testing.T, td *datadriven.TestData, req *wire.ControlRequest) {
	var act, typ string
	if td.MaybeScanArgs(t, "act", &act) {
		req.Action = parseAction(act)
	}
	req.Key, req.NewKey = scanKey(t, td, "key"), scanKey(t, td, "new")
	if td.MaybeScanArgs(t, "type", &typ) {
		var err error
		if req.Type, err = wire.ParseReservationType(typ); err != nil {
			t.Fatalf("%s: %v", td.Pos, err)
		}
	}
	req.Exclusive = td.HasArg("excl")
}

// parseAction reads a ReserveAction by name; ActionNone if it has none.
func parseAction(s string) wire.ReserveAction {
	for a := wire.ActionNone; a.Valid() || a == wire.ActionNone; a++ {
		if a.String() == s {
			return a
		}
	}
	return wire.ActionNone
}

// scanKey reads a key argument in any base strconv knows (0xa, 10).
func scanKey(t *testing.T, td *datadriven.TestData, name string) uint64 {
	var s string
	if !td.MaybeScanArgs(t, name, &s) {
		return 0
	}
	k, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		t.Fatalf("%s: %s: %v", td.Pos, name, err)
	}
	return k
}

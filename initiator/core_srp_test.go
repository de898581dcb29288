package initiator

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// describeSRP names a SEND of an SRP core as a trace shows it: an
// SRP_CMD decoded (its CDB's operation, LUN, LBA and blocks, where its
// data is), or the answer to a target request.
func (h *coreHarness) describeSRP(wr *transport.SendWR, sig string) string {
	off := int(wr.SGL[0].Addr - h.msgMR.Addr())
	iu := h.msg.Bytes()[off : off+int(wr.SGL[0].Length)]
	if wr.ID>>56 == idAnswer {
		var a srp.TargetRsp
		if err := a.Decode(iu); err != nil {
			return "SEND " + err.Error()
		}
		return fmt.Sprintf("SEND %s tag=%#x recv=%d%s", a.Op, a.Tag, wr.ID&0xffffff, sig)
	}
	si := int(wr.ID & 0xffffff)
	name := h.names[h.core.slots[si].req]
	if len(wr.SGL) == 2 {
		doff := int(wr.SGL[1].Addr - h.dataMR.Addr())
		iu = append(slices.Clip(iu), h.data.Bytes()[doff:doff+int(wr.SGL[1].Length)]...)
	}
	var cmd srp.Cmd
	if err := cmd.Decode(iu, srpImmOffset); err != nil {
		return fmt.Sprintf("SEND %s slot=%d %v", name, si, err)
	}
	h.tags[name] = cmd.Tag
	lun, _ := scsi.DecodeLUN(cmd.LUN)
	what := fmt.Sprintf("SRP_CMD %s lun=%d", cdbName(cmd.CDB), lun)
	delete(h.keys, name)
	for _, d := range []struct {
		dir string
		b   *srp.DataBuffer
	}{{"out", &cmd.DataOut}, {"in", &cmd.DataIn}} {
		switch d.b.Format {
		case srp.FormatDirect:
			h.keys[name] = transport.Key(d.b.Direct.Key)
			what += fmt.Sprintf(" %s=direct key=%s len=%d", d.dir, transport.Key(d.b.Direct.Key), d.b.Direct.Len)
		case srp.FormatImmediate:
			what += fmt.Sprintf(" %s=immediate len=%d sge=%d", d.dir, len(d.b.Imm), len(wr.SGL))
		}
	}
	return fmt.Sprintf("SEND %s slot=%d %s%s", name, si, what, sig)
}

// cdbName prints a CDB's operation and its block fields.
func cdbName(cdb []byte) string {
	switch cdb[0] {
	case scsiRead16, scsiWrite16:
		op := "READ(16)"
		if cdb[0] == scsiWrite16 {
			op = "WRITE(16)"
		}
		s := fmt.Sprintf("%s lba=%d blocks=%d", op, be.Uint64(cdb[2:]), be.Uint32(cdb[10:]))
		if cdb[1]&0x08 != 0 {
			s += " fua"
		}
		return s
	case scsiSyncCache16:
		return "SYNCHRONIZE_CACHE(16)"
	case scsiUnmap:
		return fmt.Sprintf("UNMAP params=%d", be.Uint16(cdb[7:]))
	}
	return fmt.Sprintf("CDB(%#x)", cdb[0])
}

// recvSRP writes an IU from an SRP target into buf and returns its
// length: kind=rsp (the default; status=good|busy|aborted|check with
// sense=medium|protect|ua, resid=N for DIUNDER/DOUNDER of N bytes,
// over=N for DIOVER), cred-req, aer-req, t-logout, gosrp (a gosrp
// response, which an SRP target never sends) or garbage.
func (h *coreHarness) recvSRP(t testing.TB, td *datadriven.TestData, buf []byte, name string, tag uint64, credits int) int {
	kind, st, sense := "rsp", "good", "medium"
	td.MaybeScanArgs(t, "kind", &kind)
	td.MaybeScanArgs(t, "status", &st)
	td.MaybeScanArgs(t, "sense", &sense)
	var n int
	switch kind {
	case "rsp":
		rsp := srp.Rsp{Tag: tag, ReqLimDelta: uint32(credits)}
		if st == "check" {
			sn := map[string]scsi.Sense{"medium": scsi.SenseReadError, "protect": scsi.SenseWriteProtected, "ua": scsi.SensePowerOn}[sense]
			rsp.Status, rsp.Flags, rsp.Sense = uint8(scsi.StatusCheckCondition), srp.SnsValid, sn.AppendFixed(nil)
		} else if st == "busy" {
			rsp.Status = uint8(scsi.StatusBusy)
		} else if st == "aborted" {
			rsp.Status = uint8(scsi.StatusTaskAborted)
		}
		var resid, over int
		td.MaybeScanArgs(t, "resid", &resid)
		td.MaybeScanArgs(t, "over", &over)
		switch {
		case resid > 0:
			rsp.Flags |= srp.DIUnder
			rsp.DataInResid = uint32(resid)
			if r := h.reqs[name]; r != nil && r.Op != OpRead {
				rsp.Flags ^= srp.DIUnder | srp.DOUnder
				rsp.DataInResid, rsp.DataOutResid = 0, uint32(resid)
			}
		case over > 0:
			rsp.Flags |= srp.DIOver
			rsp.DataInResid = uint32(over)
		}
		n, _ = rsp.Encode(buf)
	case "cred-req":
		q := srp.CredReq{Tag: 0xc0ffee, ReqLimDelta: uint32(credits)}
		n, _ = q.Encode(buf)
	case "aer-req":
		q := srp.AERReq{Tag: 0xae4, ReqLimDelta: uint32(credits), Sense: scsi.SenseCapacityChanged.AppendFixed(nil)}
		n, _ = q.Encode(buf)
	case "t-logout":
		l := srp.TLogout{Reason: 0x1}
		n, _ = l.Encode(buf)
	case "gosrp":
		rsp := wire.Response{Tag: tag, Credits: uint32(credits)}
		n, _ = rsp.Encode(buf)
	case "garbage":
		n = copy(buf, []byte{byte(srp.OpRsp), 1, 2, 3})
	default:
		t.Fatalf("%s: unknown kind %q", td.Pos, kind)
	}
	return n
}

// FuzzSRPCore drives the core in SRP mode with arbitrary events and
// arbitrary target IUs (responses for any tag with any status, sense and
// residual, target requests, logouts, gosrp IUs, garbage, invalidations
// SRP does not have), as FuzzCore does for gosrp. Whatever the order,
// the core never panics, keeps its invariants after every event (slots
// and the pool: no slot is free while its key is registered), completes
// no request twice, and completes a request that had a key only after a
// LOCAL_INV of that key completed SUCCESS.
func FuzzSRPCore(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 3, 0, 0, 2, 1, 0})
	f.Add([]byte{1, 0, 1, 1, 0, 0, 2, 1, 3, 1, 1, 2, 0, 0, 5, 1, 0, 2, 3})
	f.Add([]byte{0, 2, 0, 3, 0, 2, 1, 1, 1, 2, 3, 0, 4, 2, 2, 1, 3, 1, 0, 6, 0, 2, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzCore(t, data, fuzzDialect{
			srp:     true,
			ops:     []string{"read", "write", "flush", "discard", "close", "list"},
			connect: func(func() int) []string { return nil },
			open: func(next func() int) []string {
				if next()%2 == 0 {
					return []string{"unmap"}
				}
				return nil
			},
			submit: func(next func() int) []string {
				if next()%4 == 0 {
					return []string{"fua"}
				}
				return nil
			},
			recv: func(_ *coreHarness, next func() int, pick func() string) []string {
				var args []string
				switch next() % 8 {
				case 0:
					args = append(args, "inv="+pick())
				case 1:
					args = append(args, "inv=bogus")
				}
				kinds := []string{"rsp", "rsp", "rsp", "rsp", "cred-req", "aer-req", "t-logout", "gosrp", "garbage"}
				args = append(args, "kind="+kinds[next()%len(kinds)])
				args = append(args, "status="+[]string{"good", "good", "check", "busy", "aborted"}[next()%5])
				args = append(args, "sense="+[]string{"medium", "protect", "ua"}[next()%3])
				switch next() % 4 {
				case 0:
					args = append(args, fmt.Sprintf("resid=%d", 512*(next()%32)))
				case 1:
					args = append(args, fmt.Sprintf("over=%d", 512*(next()%32)))
				}
				return args
			},
			done: func(h *coreHarness, name, failed string) string {
				if k, ok := h.keys[name]; ok && failed == "" && !h.invDone[uint32(k)] {
					return fmt.Sprintf("%s completed before the LOCAL_INV of its key %s", name, k)
				}
				return ""
			},
		})
	})
}

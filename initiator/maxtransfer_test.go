package initiator_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/gosrp/gosrp/frmr"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestMaxTransferAboveRegistration: a Config.MaxTransfer larger than one
// fast registration of the device covers (emu: 1024 pages) is lowered to
// what it covers, in both protocols, and Volume splits larger I/O. It
// once made every connect fail ("alloc fast-reg mr of 2049 pages (max
// 1024)"): bench --bs 4m could not start. A memory window has no page
// list, and keeps the MaxTransfer asked for.
func TestMaxTransferAboveRegistration(t *testing.T) {
	for _, proto := range protocols {
		for _, mech := range mechanisms {
			t.Run("protocol="+proto.name+"/"+mech.String(), func(t *testing.T) { testMaxTransferAboveRegistration(t, proto, mech) })
		}
	}
}

func testMaxTransferAboveRegistration(t *testing.T, proto protocol, mech frmr.Mechanism) {
	{
		{
			tcfg := proto.tcfg
			tcfg.MaxTransfer = 16 << 20
			r := newRig(t, emu.Config{Seed: 1}, 32<<20, tcfg)
			cfg := proto.cfg
			cfg.MaxTransfer, cfg.Mechanism = 8<<20, mech
			s := r.dial(t, cfg)
			dev, err := r.ip.OpenDevice(emu.DeviceName)
			if err != nil {
				t.Fatal(err)
			}
			pages := dev.Attr().MaxFastRegPages
			dev.Close()
			limit := (pages - 1) * transport.PageSize
			if mech == frmr.MW {
				limit = cfg.MaxTransfer
			}
			if s.MaxTransfer() != limit {
				t.Fatalf("MaxTransfer %d with a device of %d pages per registration; want %d", s.MaxTransfer(), pages, limit)
			}
			v := openNamed(t, context.Background(), s, proto.vol)
			buf := bytes.Repeat([]byte("0123456789abcdef"), (8<<20)/16)
			if _, err := v.WriteAt(buf, 4096); err != nil {
				t.Fatalf("an 8 MiB write: %v", err)
			}
			got := make([]byte, len(buf))
			if _, err := v.ReadAt(got, 4096); err != nil || !bytes.Equal(got, buf) {
				t.Fatalf("an 8 MiB read: %v (equal %v)", err, bytes.Equal(got, buf))
			}
			over := make([]byte, limit+transport.PageSize)
			if err := v.Submit(&initiator.Request{Op: initiator.OpRead, Buf: over, Offset: 0, Done: make(chan *initiator.Request, 1)}); err == nil {
				t.Fatal("Submit took a transfer above MaxTransfer")
			}
		}
	}
}

package target

import (
	"bytes"
	"testing"

	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// postImmediate sends cmd as a WRITE carrying client data [doff, doff+n)
// as immediate data: the header from a send slot and the data gathered
// from the data buffer, as the initiator sends it.
func (c *client) postImmediate(cmd wire.Command, doff int) {
	c.tb.Helper()
	c.tag++
	cmd.Tag = c.tag
	cmd.Flags |= wire.FlagImmediate
	var b [wire.MaxCommandLen]byte
	n, err := cmd.Encode(b[:])
	if err != nil {
		c.tb.Fatal(err)
	}
	data := transport.SGE{Addr: c.mr.Addr() + uint64(cliDataOff+doff), Length: cmd.Length, LKey: c.mr.LKey()}
	if err := c.sendIU(b[:n], data); err != nil {
		c.tb.Fatal(err)
	}
}

// loginImmediate logs in asking for max bytes of immediate data and
// returns what the target granted.
func (c *client) loginImmediate(ini string, max uint32) uint32 {
	c.tb.Helper()
	req := c.loginRequest(ini)
	req.MaxImmediate = max
	op, b := c.loginWith(req, nil)
	var rsp wire.LoginResponse
	if op != wire.OpLoginResponse {
		c.tb.Fatalf("login answered %s", op)
	}
	if err := wire.DecodeControl(b, op, &rsp); err != nil {
		c.tb.Fatal(err)
	}
	return rsp.MaxImmediate
}

// TestImmediateData: a WRITE that carries its data in the command
// (SRP-2 immediate data) lands in the volume like one the target fetches
// with RDMA READ, is checked like any WRITE, and is accepted only up to
// the size granted at login.
func TestImmediateData(t *testing.T) {
	forEnvs(t, func(t *testing.T, e env) {
		r := newRig(t, e, Config{Credits: 8})
		c := r.dial(t)
		if got := c.loginImmediate("imm", 1<<20); got != maxImmediate {
			t.Fatalf("asked for 1 MiB of immediate data, granted %d, want the target's %d", got, maxImmediate)
		}
		h := c.open("vol0", false)
		data := pattern(maxImmediate, 3)
		copy(c.data(0, len(data)), data)
		for i, cmd := range []wire.Command{
			{Op: wire.OpWrite, Volume: h, Offset: 3 * bs, Length: maxImmediate},
			{Op: wire.OpWrite, Volume: h, Offset: 40 * bs, Length: bs, Flags: wire.FlagFUA},
		} {
			c.postImmediate(cmd, 0)
			rsp, _ := c.readResponse()
			expectGood(t, rsp)
			rd := c.io(wire.OpRead, h, cmd.Offset, 1<<20, int(cmd.Length), 1)
			rsp, _ = c.do(rd)
			expectGood(t, rsp)
			if !bytes.Equal(c.data(1<<20, int(cmd.Length)), data[:cmd.Length]) {
				t.Fatalf("write %d: read back differs from the immediate data", i)
			}
		}
		// Checked like any WRITE; the connection goes on.
		for _, tc := range []struct {
			cmd   wire.Command
			sense wire.Sense
		}{
			{wire.Command{Op: wire.OpWrite, Volume: h, Offset: 1, Length: bs}, wire.SenseMisaligned},
			{wire.Command{Op: wire.OpWrite, Volume: h, Offset: volSize, Length: bs}, wire.SenseOutOfRange},
			{wire.Command{Op: wire.OpWrite, Volume: h + 7, Offset: 0, Length: bs}, wire.SenseNoSuchVolume},
			{wire.Command{Op: wire.OpWrite, Volume: c.open("ro", false), Offset: 0, Length: bs}, wire.SenseWriteProtected},
		} {
			c.postImmediate(tc.cmd, 0)
			rsp, _ := c.readResponse()
			expectSense(t, rsp, tc.sense)
		}
		c.close()

		// More than was granted ends the connection.
		c = r.dial(t)
		if got := c.loginImmediate("imm-small", bs); got != bs {
			t.Fatalf("asked for %d bytes of immediate data, granted %d", bs, got)
		}
		h = c.open("vol0", false)
		c.postImmediate(wire.Command{Op: wire.OpWrite, Volume: h, Length: 2 * bs}, 0)
		c.expectDisconnect()

		// So does immediate data nobody asked for.
		c = r.dial(t)
		if got := c.loginImmediate("imm-none", 0); got != 0 {
			t.Fatalf("asked for no immediate data, granted %d", got)
		}
		h = c.open("vol0", false)
		c.postImmediate(wire.Command{Op: wire.OpWrite, Volume: h, Length: bs}, 0)
		c.expectDisconnect()
	})
}

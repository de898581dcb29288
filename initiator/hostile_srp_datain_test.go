package initiator_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
	"github.com/gosrp/gosrp/internal/srp"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/targettest"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// The SCSI commands whose data an SRP open parses, by their CDB's first
// bytes (SPC-4, SBC-3).
const (
	cdbInquiry     = 0x12 // INQUIRY; byte 1 bit 0 EVPD, byte 2 the page
	cdbServiceIn16 = 0x9E // SERVICE ACTION IN(16); 0x10 READ CAPACITY(16)
	cdbMaintIn     = 0xA3 // MAINTENANCE IN; 0x0A REPORT TARGET PORT GROUPS
)

// dataInLie is a way an SRP target that claims ALUA lies in the data of
// the commands an open sends, and what the open must make of it.
type dataInLie struct {
	name string
	// cdb picks the command whose data is rewritten.
	cdb func(cdb []byte) bool
	// data rewrites the command's data in place; nil leaves it.
	data func(b []byte)
	// rsp rewrites the command's SRP_RSP; nil leaves it.
	rsp func(r *srp.Rsp)
	// failErr is the error the open must fail with; nil: the open
	// succeeds, with standby as the volume's path state, and the volume
	// reads back what it wrote.
	failErr error
	standby bool
}

func isRTPG(c []byte) bool   { return c[0] == cdbMaintIn && c[1]&0x1f == 0x0a }
func isVPD83(c []byte) bool  { return c[0] == cdbInquiry && c[1]&1 == 1 && c[2] == 0x83 }
func isStdInq(c []byte) bool { return c[0] == cdbInquiry && c[1]&1 == 0 }
func isRC16(c []byte) bool   { return c[0] == cdbServiceIn16 && c[1]&0x1f == 0x10 }

// firstDesc is the offset of REPORT TARGET PORT GROUPS' first target
// port group descriptor (after its 4-byte length).
const firstDesc = 4

var dataInLies = []dataInLie{
	{name: "honest", cdb: isRTPG},
	{name: "rtpg-length-huge", cdb: isRTPG, data: func(b []byte) { binary.BigEndian.PutUint32(b, 0xffffffff) }},
	{name: "rtpg-all-ff", cdb: isRTPG, data: func(b []byte) {
		for i := range b {
			b[i] = 0xff
		}
	}},
	{name: "rtpg-port-count-overrun", cdb: isRTPG, data: func(b []byte) {
		// Another group, claiming 255 target ports the data does not
		// hold: the walk must stop, and the session's group, absent,
		// counts as active.
		binary.BigEndian.PutUint16(b[firstDesc+2:], 9)
		b[firstDesc+7] = 255
	}},
	{name: "rtpg-standby", cdb: isRTPG, standby: true, data: func(b []byte) {
		b[firstDesc] = b[firstDesc]&0xf0 | 0x02
	}},
	{name: "rtpg-two-bytes", cdb: isRTPG, failErr: initiator.ErrProtocol, rsp: func(r *srp.Rsp) {
		r.Flags |= srp.DIUnder
		r.DataInResid = 4 + 64*8 - 2
	}},
	{name: "rtpg-check-condition", cdb: isRTPG, rsp: func(r *srp.Rsp) { r.Status = 0x02 }},
	{name: "inquiry-tpgs-off", cdb: isStdInq, data: func(b []byte) { b[5] &^= 0x30 }},
	{name: "vpd83-wrong-page", cdb: isVPD83, data: func(b []byte) { b[1] = 0x80 }},
	{name: "vpd83-designator-overrun", cdb: isVPD83, data: func(b []byte) { b[4+3] = 255 }},
	{name: "vpd83-length-huge", cdb: isVPD83, data: func(b []byte) { binary.BigEndian.PutUint16(b[2:], 0xffff) }},
	{name: "capacity-block-3", cdb: isRC16, failErr: initiator.ErrProtocol, data: func(b []byte) { binary.BigEndian.PutUint32(b[8:], 3) }},
	{name: "capacity-huge", cdb: isRC16, failErr: initiator.ErrProtocol, data: func(b []byte) { binary.BigEndian.PutUint64(b, 1<<63) }},
}

// TestHostileSRPDataIn: an SRP target that claims ALUA (a gateway with a
// target port group) lies in the data of the commands an open sends
// and parses (INQUIRY, VPD 0x83, READ CAPACITY(16), REPORT TARGET PORT
// GROUPS): lengths past the data, descriptor counts past the end, the
// wrong page, a check condition, a residual that leaves two bytes, an
// impossible geometry. Through a real login and open, the open must end
// within its deadline, either failing with ErrProtocol for what it
// cannot use or succeeding with the path state the data says (a group
// the data leaves out is active, as Linux's alua_rtpg takes it), and a
// volume it opens must work. The parsers are fuzzed alone
// (FuzzALUAParse); this checks the lengths they are handed.
func TestHostileSRPDataIn(t *testing.T) {
	for _, tc := range dataInLies {
		t.Run(tc.name, func(t *testing.T) { testHostileSRPDataIn(t, tc, emuNICs) })
	}
}

// nics gives a test the target's NIC and the initiator's: emuNICs, or
// the device in the rxe VM (rxe_test.go).
type nics func(t *testing.T) (tp, ip transport.Provider)

// emuNICs are two software NICs over the TCP wire, closed when the test
// ends.
func emuNICs(t *testing.T) (tp, ip transport.Provider) {
	t.Helper()
	for _, p := range []*transport.Provider{&tp, &ip} {
		nic, err := emu.New(emu.Config{Wire: emu.WireTCP, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nic.Close() })
		*p = nic
	}
	return tp, ip
}

func testHostileSRPDataIn(t *testing.T, tc dataInLie, nics nics) {
	var mu sync.Mutex
	tags := map[uint64]bool{} // SRP_CMD tags of the command to lie in
	lying := false            // the command in flight is (QD1: the open's commands go one by one)
	lies := 0
	script := targettest.Script{
		Swallow: func(iu []byte) bool {
			if len(iu) >= srp.CmdLen && srp.Opcode(iu[0]) == srp.OpCmd {
				mu.Lock()
				lying = tc.cdb(iu[32:48]) // SRP r16a: the CDB at bytes 32-47
				if lying {
					tags[binary.BigEndian.Uint64(iu[8:])] = true
				}
				mu.Unlock()
			}
			return false
		},
		Write: func(b []byte) {
			mu.Lock()
			defer mu.Unlock()
			if lying && len(b) >= 8 {
				if tc.data != nil {
					tc.data(b)
				}
				lies++ // the honest case counts the data it let pass
			}
		},
		Respond: func(r *targettest.Response) targettest.Action {
			iu := r.IU()
			if tc.rsp == nil || len(iu) < srp.RspLen || srp.Opcode(iu[0]) != srp.OpRsp {
				return targettest.Pass
			}
			mu.Lock()
			defer mu.Unlock()
			if tags[binary.BigEndian.Uint64(iu[8:])] {
				putRsp(iu, tc.rsp)
				lies++
			}
			return targettest.Pass
		},
	}
	tp, ip := nics(t)
	addr := aluaGateway(t, aluaCluster(t), tp, script)
	s := dial(t, initiator.Config{Provider: ip, Addr: addr, Name: "victim", Logger: quiet, Protocol: initiator.ProtocolSRP,
		SRPTargetPortID: srpPort, LossTimeout: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
	mu.Lock()
	n := lies
	mu.Unlock()
	if n == 0 {
		t.Fatal("the script never lied: the open sent no such command (does the target claim ALUA?)")
	}
	if ctx.Err() != nil {
		t.Fatalf("the open took its whole deadline: %v", err)
	}
	if tc.failErr != nil {
		if !errors.Is(err, tc.failErr) {
			t.Fatalf("open: %v, want %v", err, tc.failErr)
		}
		t.Logf("open: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if v.Standby() != tc.standby {
		t.Fatalf("open: standby %v, want %v", v.Standby(), tc.standby)
	}
	if tc.standby {
		return
	}
	w := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := v.WriteAtContext(ctx, w, 8192); err != nil {
		t.Fatalf("write: %v", err)
	}
	r := make([]byte, 4096)
	if _, err := v.ReadAtContext(ctx, r, 8192); err != nil || !bytes.Equal(r, w) {
		t.Fatalf("read back: %v (equal %v)", err, bytes.Equal(r, w))
	}
}

// aluaCluster is a gatewaytest cluster holding vol0 (4 MiB).
func aluaCluster(t *testing.T) *gatewaytest.Cluster {
	t.Helper()
	cl := gatewaytest.NewCluster()
	if err := cl.Create("vol0", 4<<20, 4096); err != nil {
		t.Fatal(err)
	}
	return cl
}

// aluaGateway serves vol0 of cluster cl on NIC tp, as a gateway with
// ALUA target port group 1 for SRP hosts, behind the hostile-peer kit
// with script, and returns its address. vol0 is active there unless
// another client of cl holds its lock.
func aluaGateway(t *testing.T, cl *gatewaytest.Cluster, tp transport.Provider, script targettest.Script) string {
	t.Helper()
	tgt, err := target.New(target.Config{Name: "gw", Catalog: gateway.New(cl.Client()), SRPTargetPortID: srpPort,
		SRPPortGroup: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, tgt, targettest.Wrap(tp, script).Listen)
}

package initiator_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport/emu"
)

// srpPort is the target port identifier the SRP tests' target serves.
var srpPort = [16]byte{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}

// newSRPRig is a target whose SRP personality serves vol0 (16 MiB, LUN
// 0) and vol2 (1 MiB, LUN 2) read-write and vol1 (1 MiB, LUN 1)
// read-only to the initiator named "srp-host" (its ACL key is the port
// identifier derived from the name).
func newSRPRig(t *testing.T, cfg emu.Config) *rig {
	t.Helper()
	host := initiator.SRPPortID("srp-host")
	acl := &target.ACL{Rules: []target.ACLRule{{Initiator: hex.EncodeToString(host[:]), Volume: "vol1", Access: target.AccessReadOnly}}}
	r := newRig(t, cfg, 16<<20, target.Config{SRPTargetPortID: srpPort, ACL: acl})
	for _, name := range []string{"vol1", "vol2"} {
		if _, err := r.store.Create(name, 1<<20, 4096); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// profileWires is every emu profile on every wire.
func profileWires() []emu.Config {
	var l []emu.Config
	for _, p := range emu.Profiles() {
		for _, w := range emu.Wires() {
			l = append(l, emu.Config{Profile: p, Wire: w})
		}
	}
	return l
}

// TestSRPEndToEnd: the initiator speaks T10 SRP to srpd's SRP
// personality on every emu profile and wire: it logs in, lists the LUNs
// with their size and write protection, reads and writes (immediate data
// and registered buffers) with verification at QD1 and QD32, flushes,
// and sees the target's refusals as the package's sentinels.
func TestSRPEndToEnd(t *testing.T) {
	for _, pw := range profileWires() {
		t.Run("profile="+pw.Profile+"/wire="+pw.Wire, func(t *testing.T) {
			seed := testSeed(t)
			r := newSRPRig(t, emu.Config{Profile: pw.Profile, Wire: pw.Wire, Seed: seed, RetryTimeout: 200 * time.Millisecond})
			s := r.dial(t, initiator.Config{Name: "srp-host", Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort, Credits: 32})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			vols, err := s.Volumes(ctx)
			want := []initiator.VolumeInfo{{Name: "lun0", Size: 16 << 20, BlockSize: 4096}, {Name: "lun1", Size: 1 << 20, BlockSize: 4096, ReadOnly: true},
				{Name: "lun2", Size: 1 << 20, BlockSize: 4096}}
			if err != nil || len(vols) != 3 {
				t.Fatalf("Volumes = %+v, %v; want %+v", vols, err, want)
			}
			for i, v := range vols {
				// The ID is the LUN's VPD 0x83 NAA designator: srpd's
				// locally assigned NAA 3h, 8 bytes.
				if id := v.ID; len(id) != len("naa.")+16 || !strings.HasPrefix(id, "naa.3") {
					t.Errorf("%s: ID %q, want naa.3 and 15 more hex digits", v.Name, id)
				}
				if v.ID = ""; v != want[i] {
					t.Errorf("Volumes[%d] = %+v, want %+v", i, v, want[i])
				}
			}
			if vols[0].ID == vols[2].ID {
				t.Errorf("lun0 and lun2 have the same ID %q", vols[0].ID)
			}
			again, err := s.Volumes(ctx)
			if err != nil || again[0].ID != vols[0].ID {
				t.Fatalf("a second listing gives lun0 ID %q (%v), the first %q", again[0].ID, err, vols[0].ID)
			}
			v, err := s.Open(ctx, "lun0", initiator.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v2, err := s.Open(ctx, "lun2", initiator.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			gens := workload(t, v2, seed, 1, 200)
			verifyAll(t, v2, gens, seed)
			gens = workload(t, v, seed+1, 32, 2000)
			if err := v.Flush(ctx); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			verifyAll(t, v, gens, seed+1)
			buf := make([]byte, 64<<10)
			pattern(buf[:4096], 0, 99, 1)
			if _, err := v.WriteAtFUA(ctx, buf[:4096], 0); err != nil {
				t.Fatalf("WriteAtFUA: %v", err)
			}
			if _, err := v.ReadAt(buf[:4096], 0); err != nil || check(buf[:4096], 0, 99) != nil {
				t.Fatalf("read after the FUA write: %v, %v", err, check(buf[:4096], 0, 99))
			}
			// The memory store deallocates, so srpd reports LBPU (VPD
			// 0xB2) and the discard is an UNMAP that reads back zeros.
			if err := v.Discard(ctx, 0, 4096); err != nil {
				t.Fatalf("Discard (UNMAP) on a LUN with LBPU: %v", err)
			}
			if _, err := v.ReadAt(buf[:4096], 0); err != nil || !bytes.Equal(buf[:4096], make([]byte, 4096)) {
				t.Fatalf("read after the discard: %v, zeros %v", err, bytes.Equal(buf[:4096], make([]byte, 4096)))
			}
			ro, err := s.Open(ctx, "lun1", initiator.OpenOptions{})
			if err != nil || !ro.ReadOnly() || ro.Size() != 1<<20 {
				t.Fatalf("open lun1: %v (read-only %v)", err, ro != nil && ro.ReadOnly())
			}
			if _, err := ro.ReadAt(buf, 0); err != nil {
				t.Fatalf("read the write-protected LUN: %v", err)
			}
			if _, err := s.Open(ctx, "lun7", initiator.OpenOptions{}); err == nil {
				t.Fatal("opened lun7, which the target does not have")
			}
			// The target itself refuses: lun0 turns read-only under the
			// open volume.
			host := initiator.SRPPortID("srp-host")
			r.tgt.SetACL(&target.ACL{Rules: []target.ACLRule{{Initiator: hex.EncodeToString(host[:]), Volume: "*", Access: target.AccessReadOnly}}})
			// The policy reaches the session asynchronously.
			var werr error
			for start := time.Now(); werr == nil && time.Since(start) < 5*time.Second; time.Sleep(time.Millisecond) {
				_, werr = v.WriteAt(buf[:8192], 0) // immediate data
			}
			if !errors.Is(werr, initiator.ErrReadOnly) {
				t.Fatalf("write after the ACL narrowed: %v, want ErrReadOnly", werr)
			}
			if _, err := v.WriteAt(buf, 0); !errors.Is(err, initiator.ErrReadOnly) {
				t.Fatalf("registered write after the ACL narrowed: %v, want ErrReadOnly", err)
			}
			if err := s.Check(ctx); err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); st.ConnectionsLost != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestSRPLoginRejected: a login naming another target port is refused
// with a one-line LoginError that names SRP's reason, on every profile.
func TestSRPLoginRejected(t *testing.T) {
	for _, prof := range emu.Profiles() {
		t.Run("profile="+prof, func(t *testing.T) { testSRPLoginRejected(t, prof) })
	}
}

// testSRPLoginRejected is TestSRPLoginRejected on one profile.
func testSRPLoginRejected(t *testing.T, prof string) {
	r := newSRPRig(t, emu.Config{Profile: prof, Seed: 3})
	other := srpPort
	other[15] ^= 1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, initiator.Config{Provider: r.ip, Addr: r.addr, Name: "srp-host", Protocol: initiator.ProtocolSRP, SRPTargetPortID: other})
	if err == nil {
		s.Close()
		t.Fatal("login to the wrong target port succeeded")
	}
	var le *initiator.LoginError
	if !errors.As(err, &le) || !errors.Is(err, initiator.ErrRejected) || !strings.Contains(err.Error(), "unable to associate") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v, want a one-line LoginError naming 'unable to associate'", err)
	}
	t.Log(err)
}

// TestSRPSteadyStateAllocs: 4 KiB reads and writes (immediate and
// registered) of an SRP session allocate nothing per I/O, on the
// initiator's SRP path and srpd's (loop wire, memory backend), on every
// profile.
func TestSRPSteadyStateAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are measured in full runs")
	}
	for _, prof := range emu.Profiles() {
		t.Run("profile="+prof, func(t *testing.T) { testSRPSteadyStateAllocs(t, prof) })
	}
}

// testSRPSteadyStateAllocs is TestSRPSteadyStateAllocs on one profile.
func testSRPSteadyStateAllocs(t *testing.T, prof string) {
	r := newSRPRig(t, emu.Config{Profile: prof, Seed: 5})
	for _, imm := range []int{0, -1} {
		s := r.dial(t, initiator.Config{Name: "srp-host", Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort, Credits: 8, ImmediateData: imm})
		v, err := s.Open(context.Background(), "lun0", initiator.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkSteadyAllocs(t, v, fmt.Sprintf("SRP, immediate data %d", imm))
		// The next session logs in with the same initiator port, SINGLE:
		// while this one lived, each would end the other's channel in
		// turn (SRP's I_T nexus is the pair of ports), and the reconnects
		// allocate.
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSRPLiveLUN: a volume created while the initiator is logged in
// (issue 25) becomes a LUN without a new login: a listing finds the new
// LUN with the next number, and it is written and read back. The
// target's REPORTED LUNS DATA HAS CHANGED on the way is retried by the
// session, as Linux retries it, and fails nothing (target's
// TestSRPLiveLUN sees it on the wire).
func TestSRPLiveLUN(t *testing.T) {
	r := newSRPRig(t, emu.Config{})
	s := r.dial(t, initiator.Config{Name: "srp-host", Protocol: initiator.ProtocolSRP, SRPTargetPortID: srpPort})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if vols, err := s.Volumes(ctx); err != nil || len(vols) != 3 {
		t.Fatalf("Volumes before the create = %+v, %v; want 3", vols, err)
	}
	if _, err := r.store.Create("vol3", 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	r.tgt.CatalogChanged()
	var vols []initiator.VolumeInfo
	for start := time.Now(); len(vols) != 4; time.Sleep(time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the new LUN was not listed: last %+v", vols)
		}
		var err error
		if vols, err = s.Volumes(ctx); err != nil {
			t.Fatalf("Volumes after the create: %v", err)
		}
	}
	if vols[3].Name != "lun3" || vols[3].Size != 1<<20 {
		t.Fatalf("Volumes after the create = %+v; want lun3 of 1 MiB", vols)
	}
	v, err := s.Open(ctx, "lun3", initiator.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	pattern(buf, 0, 7, 1)
	if _, err := v.WriteAt(buf, 4096); err != nil {
		t.Fatalf("write the new LUN: %v", err)
	}
	clear(buf)
	if _, err := v.ReadAt(buf, 4096); err != nil || check(buf, 0, 7) != nil {
		t.Fatalf("read the new LUN back: %v, %v", err, check(buf, 0, 7))
	}
	if st := s.Stats(); st.ConnectionsLost != 0 {
		t.Fatalf("stats %+v", st)
	}
}

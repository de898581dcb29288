package initiator

// Volumes of a ProtocolSRP session: the target's logical units, found and
// described with SCSI commands the session sends itself (REPORT LUNS,
// READ CAPACITY(16), MODE SENSE(6), INQUIRY with VPD pages B0 and B2,
// and for a unit with ALUA, REPORT TARGET PORT GROUPS). LUN n is the
// volume "lun<n>".

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gosrp/gosrp/internal/scsi"
	"github.com/gosrp/gosrp/internal/wire"
	"github.com/gosrp/gosrp/transport"
)

// srpLUNName is the volume name of LUN n.
func srpLUNName(n uint16) string { return "lun" + strconv.Itoa(int(n)) }

// parseLUNName reads a name srpLUNName writes.
func parseLUNName(name string) (uint16, error) {
	d, ok := strings.CutPrefix(name, "lun")
	n, err := strconv.ParseUint(d, 10, 16)
	if !ok || err != nil || n > scsi.MaxLUN || strconv.FormatUint(n, 10) != d {
		return 0, fmt.Errorf("initiator: %q names no LUN of an SRP target (want lun0, lun1, ...): %w", name, ErrInvalid)
	}
	return uint16(n), nil
}

// scsiRun submits r, a SCSI command the session sends itself, on
// channel c and waits for it or for ctx.
func scsiRun(ctx context.Context, c *channel, r *Request) error {
	done := make(chan *Request, 1)
	r.Done = done
	if err := c.submit(r); err != nil {
		return err
	}
	select {
	case <-done:
	case <-ctx.Done():
		if r.abandon() {
			return ctx.Err()
		}
		<-done
	}
	return r.Err
}

// scsiOut runs a SCSI command with data-out for lun on channel c.
func (s *Session) scsiOut(ctx context.Context, c *channel, lun uint16, cdb, data []byte) error {
	return scsiRun(ctx, c, &Request{Op: OpWrite, Buf: data, scsi: &scsiCmd{lun: lun, cdb: cdb, out: true}})
}

// scsiIn runs a SCSI command with up to n bytes of data-in for lun on
// channel c and returns the data the target sent.
func (s *Session) scsiIn(ctx context.Context, c *channel, lun uint16, cdb []byte, n int) ([]byte, error) {
	r := &Request{Op: OpRead, Buf: make([]byte, n), scsi: &scsiCmd{lun: lun, cdb: cdb}}
	if err := scsiRun(ctx, c, r); err != nil {
		return nil, err
	}
	return r.Buf[:r.scsi.got], nil
}

// srpVolumes lists the target's LUNs (REPORT LUNS, SPC-4 6.33, sent to
// LUN 0, which every target answers it for) with their geometry.
func (s *Session) srpVolumes(ctx context.Context) ([]VolumeInfo, error) {
	c := s.chans[0]
	cdb := make([]byte, 12)
	cdb[0] = scsiReportLUNs
	const alloc = 8 + 8*512
	be.PutUint32(cdb[6:], alloc)
	b, err := s.scsiIn(ctx, c, 0, cdb, alloc)
	if err != nil {
		return nil, fmt.Errorf("initiator: list LUNs: %w", err)
	}
	if len(b) < 8 {
		return nil, fmt.Errorf("initiator: REPORT LUNS returned %d bytes: %w", len(b), ErrProtocol)
	}
	n := min(int(be.Uint32(b)), len(b)-8) / 8
	var out []VolumeInfo
	for i := range n {
		lun, err := scsi.DecodeLUN([8]byte(b[8+8*i:]))
		if err != nil {
			continue // a well-known or hierarchical LUN: no block device for us
		}
		u, err := s.srpUnit(ctx, c, lun)
		if err != nil {
			return nil, err
		}
		out = append(out, VolumeInfo{Name: srpLUNName(lun), Size: u.size, BlockSize: u.bs, ReadOnly: u.readOnly, ID: u.id})
	}
	return out, nil
}

// srpUnitInfo is what the session learns of a LUN.
type srpUnitInfo struct {
	size        int64
	bs          int
	readOnly    bool
	unmap       bool // VPD B2 LBPU: UNMAP is served
	maxTransfer int  // VPD B0 MAXIMUM TRANSFER LENGTH in bytes, 0 if none
	id          string
	// incarnation tells the unit from any other given its LUN
	// (luIdentity), 0 if VPD 0x83 told nothing.
	incarnation uint64
	// group is this port's target port group, when VPD 0x83 names one
	// (hasGroup); alua says the unit reports explicit ALUA (INQUIRY TPGS
	// bit 5, SPC-4 6.6.2) and standby the group's state in REPORT TARGET
	// PORT GROUPS, both asked only by an open (aluaState), since a list
	// reports no path state.
	group    uint16
	hasGroup bool
	alua     bool
	standby  bool
}

// srpUnit describes LUN lun: READ CAPACITY(16) (SBC-3 5.16) for its
// size and block size, MODE SENSE(6)'s WP bit (SBC-3 6.5.1) for write
// protection, and, when it is thin provisioned (LBPME), VPD B2's LBPU
// (SBC-3 6.6.4) for UNMAP; VPD B0's MAXIMUM TRANSFER LENGTH (SBC-3
// 6.6.3) bounds commands.
func (s *Session) srpUnit(ctx context.Context, c *channel, lun uint16) (srpUnitInfo, error) {
	var u srpUnitInfo
	cdb := make([]byte, 16)
	cdb[0], cdb[1] = scsiServiceIn16, 0x10
	be.PutUint32(cdb[10:], 32)
	b, err := s.scsiIn(ctx, c, lun, cdb, 32)
	if err != nil {
		return u, fmt.Errorf("initiator: READ CAPACITY(16) of LUN %d: %w", lun, err)
	}
	if len(b) < 32 {
		return u, fmt.Errorf("initiator: READ CAPACITY(16) of LUN %d returned %d bytes: %w", lun, len(b), ErrProtocol)
	}
	last, bs := be.Uint64(b), be.Uint32(b[8:])
	if bs < 512 || bs > 1<<16 || bs&(bs-1) != 0 || last >= 1<<62/uint64(bs) {
		return u, fmt.Errorf("initiator: LUN %d reports %d blocks of %d bytes: %w", lun, last+1, bs, ErrProtocol)
	}
	u.bs, u.size = int(bs), int64(last+1)*int64(bs)
	lbpme := b[14]&0x80 != 0

	cdb = []byte{scsiModeSense6, 0x08, 0x3F, 0, 192, 0} // DBD, all pages
	if m, err := s.scsiIn(ctx, c, lun, cdb, 192); err == nil && len(m) >= 4 {
		u.readOnly = m[2]&0x80 != 0
	} else if err != nil && !isCheckCondition(err) {
		return u, fmt.Errorf("initiator: MODE SENSE(6) of LUN %d: %w", lun, err)
	}
	if p, err := s.vpd(ctx, c, lun, 0xB0, 64); err == nil && len(p) >= 12 {
		u.maxTransfer = int(min(uint64(be.Uint32(p[8:]))*uint64(bs), 1<<30))
	}
	if lbpme {
		if p, err := s.vpd(ctx, c, lun, 0xB2, 8); err == nil && len(p) >= 6 {
			u.unmap = p[5]&0x80 != 0
		}
	}
	if p, err := s.vpd(ctx, c, lun, 0x83, 255); err == nil {
		u.id = designator(p)
		u.incarnation = luIdentity(p)
		u.group, u.hasGroup = portGroup(p)
	}
	return u, nil
}

// portGroup finds the target port group designator (type 5h, SPC-4
// 7.8.6.8) of a Device Identification page: the group of the port the
// session talks to, which REPORT TARGET PORT GROUPS reports by number.
func portGroup(p []byte) (g uint16, ok bool) {
	eachDesignator(p, func(assoc, typ byte, d []byte) bool {
		if typ == 5 && len(d) >= 4 {
			g, ok = be.Uint16(d[2:]), true
		}
		return !ok
	})
	return g, ok
}

// eachDesignator calls f with each whole designator of a Device
// Identification page (VPD 0x83, SPC-4 7.8.6): its association, its type
// and its bytes, until f returns false; a designator cut short by the
// page ends the walk.
func eachDesignator(p []byte, f func(assoc, typ byte, d []byte) bool) {
	n := min(int(be.Uint16(p[2:]))+4, len(p))
	for off := 4; off+4 <= n; {
		l := int(p[off+3])
		if off+4+l > n {
			return
		}
		if !f(p[off+1]>>4&3, p[off+1]&0xf, p[off+4:off+4+l]) {
			return
		}
		off += 4 + l
	}
}

// aluaState fills u's ALUA fields for LUN lun, if its VPD 0x83 named a
// target port group: the standard INQUIRY's TPGS says whether the
// unit takes SET TARGET PORT GROUPS, and REPORT TARGET PORT GROUPS
// (SPC-4 6.27, the length-only format every ALUA target serves) gives
// the group's state; a group missing from it is taken as active, as
// Linux's alua_rtpg leaves it.
func (s *Session) aluaState(ctx context.Context, c *channel, lun uint16, u *srpUnitInfo) error {
	if !u.hasGroup {
		return nil
	}
	g := u.group
	b, err := s.scsiIn(ctx, c, lun, []byte{scsiInquiry, 0, 0, 0, 36, 0}, 36)
	if err != nil || len(b) < 6 || b[5]&0x30 == 0 {
		return nil // no ALUA to speak of
	}
	u.alua = b[5]&0x20 != 0
	const alloc = 4 + 64*8
	cdb := []byte{scsiMaintenanceIn, saPortGroups, 0, 0, 0, 0, 0, 0, alloc >> 8, alloc & 0xff, 0, 0}
	b, err = s.scsiIn(ctx, c, lun, cdb, alloc)
	switch {
	case isCheckCondition(err):
		u.alua = false // refused: nothing to ask it, and taken as active
		return nil
	case err != nil:
		return fmt.Errorf("initiator: REPORT TARGET PORT GROUPS of LUN %d: %w", lun, err)
	case len(b) < 4:
		return fmt.Errorf("initiator: REPORT TARGET PORT GROUPS of LUN %d returned %d bytes: %w", lun, len(b), ErrProtocol)
	}
	u.standby = groupStandby(b, g)
	return nil
}

// groupStandby reads group g's state in REPORT TARGET PORT GROUPS data
// of the length-only format (a 4-byte length, then 8-byte group
// descriptors each followed by its 4-byte target port descriptors):
// true unless it is active (optimized or not); a group the data leaves
// out is active. b holds at least the length.
func groupStandby(b []byte, g uint16) bool {
	n := min(len(b), 4+int(be.Uint32(b)))
	for off := 4; off+8 <= n; {
		if be.Uint16(b[off+2:]) == g {
			st := b[off] & 0x0f
			return st != aluaActiveOptimized && st != aluaActiveNonOptimized
		}
		off += 8 + 4*int(b[off+7])
	}
	return false
}

// setPortGroup asks, with SET TARGET PORT GROUPS (SPC-4 6.37), that
// target port group g of LUN lun become active/optimized: a standby
// gateway takes the volume over.
func (s *Session) setPortGroup(ctx context.Context, c *channel, lun, g uint16) error {
	param := []byte{0, 0, 0, 0, aluaActiveOptimized, 0, byte(g >> 8), byte(g)}
	cdb := []byte{scsiMaintenanceOut, saPortGroups, 0, 0, 0, 0, 0, 0, 0, byte(len(param)), 0, 0}
	if err := s.scsiOut(ctx, c, lun, cdb, param); err != nil {
		return fmt.Errorf("initiator: SET TARGET PORT GROUPS of LUN %d, group %d: %w", lun, g, err)
	}
	return nil
}

// designator picks the logical unit's identifier from a Device
// Identification page (VPD 0x83, SPC-4 7.8.6): the first designator
// associated with the logical unit (not its port or target), preferring
// NAA, then EUI-64, then T10 vendor ID, as udev's scsi_id does; "" if
// there is none.
func designator(p []byte) string {
	best, rank := "", 0
	eachDesignator(p, func(assoc, typ byte, d []byte) bool {
		if assoc != 0 || len(d) == 0 {
			return true
		}
		var id string
		r := 0
		switch typ {
		case 3:
			id, r = "naa."+hex.EncodeToString(d), 3
		case 2:
			id, r = "eui."+hex.EncodeToString(d), 2
		case 1:
			id, r = "t10."+strings.Join(strings.Fields(strings.Map(printable, string(d))), "_"), 1
		}
		if r > rank {
			best, rank = id, r
		}
		return true
	})
	return best
}

// printable keeps printable ASCII and blanks the rest.
func printable(r rune) rune {
	if r < 0x20 || r > 0x7e {
		return ' '
	}
	return r
}

// vpd reads a VPD page (INQUIRY with EVPD, SPC-4 6.6).
func (s *Session) vpd(ctx context.Context, c *channel, lun uint16, page byte, n int) ([]byte, error) {
	cdb := []byte{scsiInquiry, 0x01, page, byte(n >> 8), byte(n), 0}
	b, err := s.scsiIn(ctx, c, lun, cdb, n)
	if err == nil && (len(b) < 4 || b[1] != page) {
		return nil, fmt.Errorf("initiator: INQUIRY VPD %#x of LUN %d: %w", page, lun, ErrProtocol)
	}
	return b, err
}

// isCheckCondition reports whether the target answered a command CHECK
// CONDITION (an optional command it does not serve, say).
func isCheckCondition(err error) bool {
	var se *SCSIError
	return errors.As(err, &se) && se.Status == SCSIStatusCheckCondition
}

// scsiSense is the sense of a command err says the target answered
// CHECK CONDITION, or the zero Sense.
func scsiSense(err error) scsi.Sense {
	var se *SCSIError
	if !errors.As(err, &se) || se.Status != SCSIStatusCheckCondition {
		return scsi.Sense{}
	}
	return se.sense()
}

// srpUnitReady is srpUnit, asked again while the target answers that
// the unit is becoming ready (NOT READY 04h/01h: srpd has not opened
// its volume yet), until ctx ends, as openOn asks gosrp's OPEN again.
// The waits double from openRetry to a second: the target answers at
// once.
func (s *Session) srpUnitReady(ctx context.Context, c *channel, lun uint16) (srpUnitInfo, error) {
	wait := openRetry
	for {
		u, err := s.srpUnit(ctx, c, lun)
		if err == nil || scsiSense(err) != scsi.SenseBecomingReady {
			return u, err
		}
		if werr := openRetryWait(ctx, wait); werr != nil {
			return u, fmt.Errorf("%w (%w): %w", ErrNotReady, err, werr)
		}
		wait = min(2*wait, time.Second)
	}
}

// srpOpen opens LUN "lun<n>": nothing is opened on the target (a LUN is
// there for the whole login); the session learns its geometry and every
// channel addresses it by its number.
func (s *Session) srpOpen(ctx context.Context, name string, opts OpenOptions) (*Volume, error) {
	lun, err := parseLUNName(name)
	if err != nil {
		return nil, err
	}
	u, err := s.srpUnitReady(ctx, s.chans[0], lun)
	if err != nil {
		return nil, fmt.Errorf("initiator: open %q: %w", name, err)
	}
	if err := s.aluaState(ctx, s.chans[0], lun, &u); err != nil {
		return nil, fmt.Errorf("initiator: open %q: %w", name, err)
	}
	if opts.Takeover && u.standby && u.alua {
		if err := s.setPortGroup(ctx, s.chans[0], lun, u.group); err != nil {
			return nil, fmt.Errorf("initiator: open %q: take over: %w: %w", name, ErrStandby, err)
		}
		u.standby = false
	}
	v := &Volume{s: s, name: name, lun: lun, bs: u.bs, readOnly: u.readOnly || opts.ReadOnly, onResize: opts.OnResize,
		caps: wire.CapFlush | wire.CapFUA}
	v.standby.Store(u.standby)
	v.learnIdentity(u.incarnation, false, 0)
	if u.unmap {
		v.caps |= wire.CapDiscard
	}
	v.size.Store(u.size)
	v.dur.ovf.OnDone = s.overflowDone
	s.mu.Lock()
	if u.maxTransfer > 0 {
		s.maxTransfer = min(s.maxTransfer, max(u.maxTransfer&^(transport.PageSize-1), u.bs))
	}
	s.vols[v] = struct{}{}
	s.mu.Unlock()
	for _, c := range s.chans {
		c.mu.Lock()
		epoch := c.epoch
		c.mu.Unlock()
		c.setHandle(v, uint32(lun), epoch)
	}
	return v, nil
}

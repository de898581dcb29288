package target

import (
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/gosrp/gosrp/internal/wire"
)

// runJob does a slot's backend work on a worker goroutine. It reads only
// the slot's job fields and writes only its result fields.
func runJob(s *slot, cat Catalog) {
	// Counted in the handle's inflight by dispatch, on the same
	// condition: a close waits for them (a takeover too: the volume
	// must not close under it; an SRP host's reservation job too).
	isIO := s.ov != nil && !s.control
	defer func() {
		if r := recover(); r != nil {
			s.err = fmt.Errorf("target: %s job panicked: %v", jobName(s.job), r)
		}
		if isIO {
			s.ov.ioDone(s.job)
		}
	}()
	s.err = nil
	off, n := int64(s.cmd.Offset), int64(s.cmd.Length)
	if m := s.ov.markOf(); m != nil {
		switch s.job {
		case jobWrite, jobWriteFUA, jobDiscard, jobWriteZeroes, jobUnmap:
			if s.err = m.beforeWrite(); s.err != nil {
				return
			}
			defer m.afterWrite()
		case jobFlush:
			f := m.flushStart()
			defer func() {
				if s.err == nil {
					m.flushed(f)
				}
			}()
		}
	}
	var moved int
	switch s.job {
	case jobRead:
		moved, s.err = s.ov.vol.ReadAt(s.data[:n], off)
		s.err = full(moved, int(n), s.err)
	case jobWrite:
		moved, s.err = s.ov.vol.WriteAt(s.data[:n], off)
		s.err = full(moved, int(n), s.err)
	case jobWriteFUA:
		moved, s.err = s.ov.vol.WriteAtFUA(s.data[:n], off)
		s.err = full(moved, int(n), s.err)
	case jobFlush:
		s.err = s.ov.vol.Flush()
	case jobDiscard:
		s.err = s.ov.vol.Discard(off, n)
	case jobWriteZeroes:
		s.err = s.ov.vol.WriteZeroes(off, n)
	case jobList:
		s.list, s.err = cat.List()
	case jobOpen:
		// A connection's workers run OPENs with conn.runOpen instead,
		// which does not wait on a hung store (conn_open.go).
		s.setOpened(openFor(cat, openKey{s.ctl.Volume, s.ctl.Takeover}))
		if s.err == nil {
			s.err = openWriter(s)
		}
	case jobClose:
		// No new operation can start: the handle left the table before
		// this job was dispatched.
		s.ov.inflight.Wait()
		s.err = closeVolume(s.ov.vol)
		s.ov.releasePR()
	case jobExtents:
		s.extents, s.err = volumeExtents(s.ov, int64(s.ctl.Offset), int64(s.ctl.Length), wire.MaxExtents)
	case jobUnmap:
		s.err = srpUnmap(s)
	case jobReserve:
		s.prOut, s.prGen = s.ov.pr.apply(s.prIni, &s.ctl)
	case jobReport:
		if s.err = s.ov.pr.refresh(s.ov.vol); s.err == nil {
			s.prRep = s.ov.pr.report()
		}
	case jobTakeOver:
		if ps, ok := s.ov.vol.(PathStater); ok {
			s.err = ps.TakeOver()
		} else {
			s.err = fmt.Errorf("target: volume %q has no path state to take over", s.ov.name)
		}
	}
}

// runBatch writes the chain of slots that starts at lead (linked by next)
// with one call to the volume's WriteBatch (see BatchWriter), or one by one
// if the batch fails, so that each request gets its own status. bufs and
// offs are the caller's scratch, returned for reuse.
func runBatch(slots []slot, lead int32, bufs [][]byte, offs []int64) ([][]byte, []int64) {
	for i := lead; i >= 0; i = slots[i].next {
		s := &slots[i]
		bufs = append(bufs, s.data[:s.cmd.Length])
		offs = append(offs, int64(s.cmd.Offset))
	}
	var err error
	if m := slots[lead].ov.markOf(); m != nil {
		if err = m.beforeWrite(); err == nil {
			defer m.afterWrite()
		}
	}
	if err == nil {
		err = writeBatch(slots[lead].ov.batch, bufs, offs)
	}
	for i := lead; i >= 0; i = slots[i].next {
		if s := &slots[i]; err != nil {
			runJob(s, nil)
		} else {
			s.err = nil
			s.ov.ioDone(s.job)
		}
	}
	return bufs, offs
}

// writeBatch calls w.WriteBatch, turning a panic into an error like runJob.
func writeBatch(w BatchWriter, bufs [][]byte, offs []int64) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("target: write batch panicked: %v", r)
		}
	}()
	return w.WriteBatch(bufs, offs)
}

// full is the error of a volume call that moved n of want bytes. A read
// of every byte may still say io.EOF, when they end the volume
// (io.ReaderAt). A short count without an error breaks io.ReaderAt's and
// io.WriterAt's contract and is one: what a READ sends is the slot's
// whole buffer, so the bytes a short read left would go out as data, and
// they are an earlier command's, maybe another connection's (spareBufs).
func full(n, want int, err error) error {
	switch {
	case n == want && errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err
	case n != want:
		return fmt.Errorf("target: volume transferred %d of %d bytes without an error", n, want)
	}
	return nil
}

func openVolume(cat Catalog, name string) (Volume, VolumeInfo, error) {
	v, err := cat.OpenVolume(name)
	if err != nil {
		return nil, VolumeInfo{}, err
	}
	info := VolumeInfo{Name: name, Size: v.Size(), BlockSize: v.BlockSize()}
	if bs := info.BlockSize; bs <= 0 || bs&(bs-1) != 0 || info.Size < 0 || info.Size%int64(bs) != 0 {
		closeVolume(v)
		return nil, VolumeInfo{}, fmt.Errorf("volume reports block size %d and size %d", info.BlockSize, info.Size)
	}
	if list, err := cat.List(); err == nil {
		for _, x := range list {
			if x.Name == name {
				info.ReadOnly = x.ReadOnly
				break
			}
		}
	}
	return v, info, nil
}

// errReserved fails an OPEN that the volume's reservation state refused;
// the slot's prOut says why.
var errReserved = errors.New("reservation conflict")

// openWriter counts an OPEN for writing in the volume's reservation
// state, or refuses it there (an exclusive open while another session
// writes); a refused OPEN closes its volume.
func openWriter(s *slot) error {
	s.prWriter, s.prOut = false, prOutcome{}
	if s.prt == nil {
		return nil
	}
	s.prv = s.prt.volume(s.ctl.Volume)
	if s.ctlRO {
		return nil
	}
	if s.openInfo.ReadOnly {
		if s.ctl.Exclusive {
			closeVolume(s.opened)
			s.opened = nil
			s.prOut = prOutcome{sense: wire.SenseWriteProtected, msg: "a read-only volume cannot be opened exclusively"}
			return errReserved
		}
		return nil
	}
	if out := s.prv.openWriter(s.prOwner, s.prIni, s.ctl.Exclusive); out.sense != wire.SenseNone {
		closeVolume(s.opened)
		s.opened = nil
		s.prOut = out
		return errReserved
	}
	s.prWriter = true
	return nil
}

func closeVolume(v Volume) error {
	if c, ok := v.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func jobName(j jobKind) string {
	names := [...]string{"none", "read", "write", "write-fua", "flush", "discard", "write-zeroes", "list", "open", "close", "extents", "unmap", "reserve", "report", "take-over"}
	if int(j) < len(names) {
		return names[j]
	}
	return fmt.Sprintf("job(%d)", uint8(j))
}

// jobSense is the sense the failed block job in slot s is answered with:
// senseOf its error, unless the volume shrank under it. A shrink reaches
// the sessions (VolumeResized) before the store; a request that passed
// the range check before and reaches past the new end at the store
// fails there, and is out of range, not a bad medium (it was answered
// MEDIUM ERROR, and srpc said "medium error" of an import into a volume
// resized under it).
func (c *core) jobSense(s *slot) wire.Sense {
	sense := senseOf(s.err)
	switch s.job {
	case jobRead, jobWrite, jobWriteFUA, jobDiscard, jobWriteZeroes:
		if sense == wire.SenseMediumError && s.ov != nil && int64(s.cmd.Offset)+int64(s.cmd.Length) > s.ov.size {
			return wire.SenseOutOfRange
		}
	}
	return sense
}

// senseOf is the sense a failed backend job is answered with. A volume
// this gateway does not serve (ErrStandby) is SenseNotActive. A volume out
// of space (an error matching syscall.ENOSPC, as block.ErrNoSpace does) is
// SenseSpaceAllocFailed, SBC-4's DATA PROTECT / 27h/07h SPACE ALLOCATION
// FAILED WRITE PROTECT: the initiator must not treat it as a bad medium,
// the write may succeed once space is freed. Anything else is a medium
// error.
func senseOf(err error) wire.Sense {
	if errors.Is(err, ErrStandby) {
		return wire.SenseNotActive
	}
	if errors.Is(err, syscall.ENOSPC) {
		return wire.SenseSpaceAllocFailed
	}
	return wire.SenseMediumError
}

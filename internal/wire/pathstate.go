package wire

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/enum"
)

// PathState is what a target says, in its answer to an open, about the
// volume on this path, after SCSI ALUA's target port group states
// (SPC-4 §5.16) and NVMe's ANA states: several gateways export one
// volume, exactly one of them is active (it holds the volume's lock in
// the shared store and serves I/O), the others are standby. A standby
// gateway refuses I/O with SenseNotActive; an open with
// ControlRequest.Takeover makes it active, after it has fenced the old
// one. The zero value is PathActive, so the answer of a target without
// gateways (which sends no state) reads as active.
type PathState uint8

// Path states.
const (
	// PathActive: this target serves the volume.
	PathActive PathState = iota
	// PathStandby: another gateway serves the volume (or none does
	// until a takeover); I/O here fails with SenseNotActive.
	PathStandby
)

func (p PathState) String() string { return enum.Name(pathStateNames[:], p, "PathState") }

var pathStateNames = [...]string{PathActive: "active", PathStandby: "standby"}

// Valid reports whether p is a state this package defines; an
// initiator takes any other as standby (it cannot serve I/O it does not
// understand the state of).
func (p PathState) Valid() bool { return p <= PathStandby }

// PathNotice is the one IU a target sends without being asked
// (OpPathNotice): the state of a volume this connection has open
// changed at this gateway — it was fenced or lost the volume's lock
// (PathStandby), or it took the lock (PathActive) — so that the
// initiator fails over, or learns of a new active path, at once instead
// of at its next I/O (ALUA's asymmetric access state change, reported
// as a unit attention, SPC-4 §5.16.2.3; NVMe's ANA change notice). Only
// to an initiator that asked at login (LoginRequest.PathNotices); it
// takes no credit, and the target sends the next only once the previous
// one's SEND completed, so one receive beyond the credits covers them.
type PathNotice struct {
	// Handle names the open volume, as the open's answer did.
	Handle uint32 `msgpack:"h"`
	// State is the volume's state at this gateway now.
	State PathState `msgpack:"ps"`
}

// Encode appends the notice's IU to dst.
func (n *PathNotice) Encode(dst []byte) ([]byte, error) {
	return EncodeControl(dst, OpPathNotice, n)
}

// DecodePathNotice parses a PathNotice IU. A notice without a handle is
// malformed; a state this package does not define is kept (the
// initiator takes it as standby, see PathState.Valid).
func DecodePathNotice(b []byte) (PathNotice, error) {
	var n PathNotice
	if err := DecodeControl(b, OpPathNotice, &n); err != nil {
		return PathNotice{}, err
	}
	if n.Handle == 0 {
		return PathNotice{}, fmt.Errorf("%w: path notice without a handle", ErrMalformed)
	}
	return n, nil
}

package wire

import "github.com/gosrp/gosrp/internal/enum"

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

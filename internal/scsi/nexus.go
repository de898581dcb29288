package scsi

import "github.com/gosrp/gosrp/internal/enum"

// Condition is an event a logical unit reports to each I_T nexus once,
// as a unit attention (SAM-5 5.14).
type Condition uint8

// Conditions, in the order they are reported when several are pending
// (the power-on class first, as SAM-5 5.14 ranks it).
const (
	// WriteCacheLost: the volume lost acknowledged writes that were not
	// yet flushed (a target restart with a volatile cache), as a disk
	// loses its cache with its power. It is reported as POWER ON
	// OCCURRED; and since Linux retries a command failed by a unit
	// attention without telling anyone, the loss also fails the nexus's
	// next SYNCHRONIZE CACHE and its next FUA write with HARDWARE
	// ERROR, WRITE ERROR (SenseCacheLost: a sense Linux does not retry),
	// once each (gosrp's ErrWriteCacheLost rule), so a filesystem's
	// fsync or journal commit sees it.
	WriteCacheLost Condition = 1 << iota
	// CapacityChanged: the volume was resized (CAPACITY DATA HAS
	// CHANGED; Linux rereads the capacity).
	CapacityChanged
	// LUNsChanged: the target port's LUN inventory changed (REPORTED
	// LUNS DATA HAS CHANGED; Linux rescans).
	LUNsChanged
	// ResetOccurred: another I_T nexus reset the logical unit (LOGICAL
	// UNIT RESET aborted its tasks; SAM-5 7.7 establishes BUS DEVICE
	// RESET FUNCTION OCCURRED for every I_T nexus but that one).
	ResetOccurred
	// AccessChanged: the unit's ALUA state at this target port changed
	// on its own (another gateway took it over, or this one took it
	// over for another nexus): ASYMMETRIC ACCESS STATE CHANGED, on which
	// Linux's scsi_dh_alua asks REPORT TARGET PORT GROUPS again.
	AccessChanged
	// RegistrationsPreempted: another host preempted this host's
	// registration (PREEMPT, PREEMPT AND ABORT; SPC-4 5.13.11.4.3);
	// ReservationsPreempted: another host cleared every registration
	// and the reservation (CLEAR, 5.13.11.3); ReservationsReleased: the
	// registrants-only reservation this host was registered under was
	// released by its holder or went with its holder's registration
	// (5.13.11.2, 5.13.10.2), or a preempt changed its type. Linux
	// retries the command they come with; a host that watches for them
	// learns it was fenced before its next write is refused.
	RegistrationsPreempted
	ReservationsPreempted
	ReservationsReleased
)

// uaOrder lists the conditions with their sense, in reporting order.
var uaOrder = [...]struct {
	c Condition
	s Sense
}{
	{WriteCacheLost, SensePowerOn},
	{ResetOccurred, SenseResetOccurred},
	{CapacityChanged, SenseCapacityChanged},
	{LUNsChanged, SenseLUNsChanged},
	{AccessChanged, SenseAccessChanged},
	{RegistrationsPreempted, SenseRegistrationsPreempted},
	{ReservationsPreempted, SenseReservationsPreempted},
	{ReservationsReleased, SenseReservationsReleased},
}

// conditionNames names the conditions by bit.
var conditionNames = []string{"write-cache-lost", "capacity-changed", "luns-changed", "reset-occurred", "access-changed",
	"registrations-preempted", "reservations-preempted", "reservations-released"}

func (c Condition) String() string { return enum.Flags(conditionNames, c) }

// Nexus is what one I_T nexus holds for one logical unit: its pending
// unit attentions and, after a lost write cache, the failures still owed
// to its next flush and FUA write. The zero value has nothing pending,
// which is right for a new login (SAM-5 makes a new nexus see a power
// on; srpd's volumes have not changed for a newcomer, so it reports
// nothing). Not safe for concurrent use: the target's core owns it.
type Nexus struct {
	pending   Condition
	lostFlush bool
	lostFUA   bool
}

// Raise makes c pending on the nexus (the target raises it on every
// nexus of the unit).
func (n *Nexus) Raise(c Condition) {
	n.pending |= c
	if c&WriteCacheLost != 0 {
		n.lostFlush, n.lostFUA = true, true
	}
}

// Pending returns the unit attentions not yet reported.
func (n *Nexus) Pending() Condition { return n.pending }

// Idle reports whether the nexus owes nothing: no unit attention and no
// failure of a lost write cache. Execute on an idle nexus leaves it as
// it was, so a target may run commands against a fresh zero Nexus
// instead of a shared one while the shared one is idle.
func (n *Nexus) Idle() bool { return n.pending == 0 && !n.lostFlush && !n.lostFUA }

// takeUA returns the first pending unit attention's sense and clears it.
func (n *Nexus) takeUA() (Sense, bool) {
	for _, x := range uaOrder {
		if n.pending&x.c != 0 {
			n.pending &^= x.c
			return x.s, true
		}
	}
	return SenseNone, false
}

// OwesLoss reports whether the nexus's next flush is still to report a
// write cache loss (the target learns from it going false that the host
// was told).
func (n *Nexus) OwesLoss() bool { return n.lostFlush }

// takeLostFlush reports, once, that a flush owes a write cache loss.
func (n *Nexus) takeLostFlush() bool {
	l := n.lostFlush
	n.lostFlush = false
	return l
}

// takeLostFUA reports, once, that a FUA write owes a write cache loss.
func (n *Nexus) takeLostFUA() bool {
	l := n.lostFUA
	n.lostFUA = false
	return l
}

package initiator

import (
	"context"
	"errors"
	"fmt"

	"github.com/gosrp/gosrp/internal/wire"
)

// ReservationType is the kind of a persistent reservation; the values
// are SPC-4's TYPE codes.
type ReservationType uint8

// Reservation types.
const (
	// NoReservation: none is held (a report's Type).
	NoReservation = ReservationType(wire.ResNone)
	// WriteExclusive: only the holder writes; every host reads.
	WriteExclusive = ReservationType(wire.ResWriteExclusive)
	// ExclusiveAccess: only the holder reads or writes.
	ExclusiveAccess = ReservationType(wire.ResExclusiveAccess)
	// WriteExclusiveRegistrants: registered hosts write; every host reads.
	WriteExclusiveRegistrants = ReservationType(wire.ResWriteExclusiveRegistrants)
	// ExclusiveAccessRegistrants: only registered hosts read or write.
	ExclusiveAccessRegistrants = ReservationType(wire.ResExclusiveAccessRegistrants)
)

// String names the type ("write-exclusive").
func (t ReservationType) String() string { return wire.ReservationType(t).String() }

// ParseReservationType reads a type by its String name.
func ParseReservationType(s string) (ReservationType, error) {
	t, err := wire.ParseReservationType(s)
	return ReservationType(t), err
}

// Reservations are the persistent reservations of an open volume, in the
// manner of SCSI's PERSISTENT RESERVE IN/OUT and NVMe reservations: a
// host (known to the target by its Config.Initiator name, over every
// session it has) registers a 64-bit key of its choice, then may take a
// reservation that keeps other hosts from writing (or reading) the
// volume. Registrations and reservations outlive sessions, and a target
// that keeps state (srpd) keeps them across its restarts; a host that
// died is fenced off by another one preempting its key.
//
// Methods that the state forbids fail with ErrReservationConflict (a
// wrong key, a reservation held by another host); malformed ones with
// ErrInvalid. Over ProtocolSRP they are SCSI's PERSISTENT RESERVE OUT
// and IN (reservation_srp.go), which LIO serves too.
type Reservations struct {
	v  *Volume
	mv *MultipathVolume // set: through its active path (v nil)
}

// Reservations returns the volume's reservations.
func (v *Volume) Reservations() *Reservations { return &Reservations{v: v} }

// Reservations returns the volume's reservations, asked of the active
// path. Gateways keep them with the volume (srpd over RBD records them
// with the image), so the gateway that serves the volume enforces them
// whichever one it is. A request the active path refuses as standby, or
// loses with its connection, fails over and is made again on the new
// active path, as I/O is: one lost with its connection may have been
// made already (its second making then fails for a key that changed,
// say, and Report tells what holds).
func (mv *MultipathVolume) Reservations() *Reservations { return &Reservations{mv: mv} }

// Register registers newKey for this host, which must give its current
// key (0 when not registered): it registers, replaces the key, or with
// newKey 0 unregisters (ending a reservation the host holds).
func (r *Reservations) Register(ctx context.Context, key, newKey uint64) error {
	return r.out(ctx, wire.ActionRegister, key, newKey, NoReservation)
}

// RegisterIgnoringKey is Register without the check of the current key
// (REGISTER AND IGNORE EXISTING KEY), for a host that lost its key.
func (r *Reservations) RegisterIgnoringKey(ctx context.Context, newKey uint64) error {
	return r.out(ctx, wire.ActionRegisterIgnore, 0, newKey, NoReservation)
}

// Reserve takes a reservation of type typ; key is the host's key.
// Asking again for the one the host holds is no error.
func (r *Reservations) Reserve(ctx context.Context, key uint64, typ ReservationType) error {
	return r.out(ctx, wire.ActionReserve, key, 0, typ)
}

// Release gives up the reservation of type typ the host holds; it does
// nothing when the host holds none.
func (r *Reservations) Release(ctx context.Context, key uint64, typ ReservationType) error {
	return r.out(ctx, wire.ActionRelease, key, 0, typ)
}

// Clear removes every registration and the reservation, of every host.
func (r *Reservations) Clear(ctx context.Context, key uint64) error {
	return r.out(ctx, wire.ActionClear, key, 0, NoReservation)
}

// Preempt removes the registrations of the hosts registered with
// victimKey and, if one of them held the reservation, takes it with
// type typ. With abort (PREEMPT AND ABORT) the preempted hosts' writes
// that had not yet reached the target's store fail, and Preempt returns
// only once those already in the store are done: from then on no write
// of theirs lands, which is what fencing a dead host needs.
func (r *Reservations) Preempt(ctx context.Context, key, victimKey uint64, typ ReservationType, abort bool) error {
	act := wire.ActionPreempt
	if abort {
		act = wire.ActionPreemptAbort
	}
	return r.out(ctx, act, key, victimKey, typ)
}

// Registrant is a host's registration.
type Registrant struct {
	Initiator string
	Key       uint64
}

// ReservationReport is the reservation state of a volume.
type ReservationReport struct {
	// Generation moves with every change of the registrations (SPC-4's
	// PRgeneration), not with reserve and release.
	Generation uint32
	// Holder is the host holding the reservation ("" for none), with
	// its key and the reservation's type. Over ProtocolSRP the target
	// names no hosts (SCSI's READ KEYS lists keys): Holder and every
	// Registrant's Initiator are "", and Type says whether a
	// reservation is held.
	Holder    string
	HolderKey uint64
	Type      ReservationType
	// Registrants are every registration, in the order they were made.
	Registrants []Registrant
	// ExclusiveHolder names the host of a session that has the volume
	// open with OpenOptions.Exclusive, if one has.
	ExclusiveHolder string
}

// Report returns the volume's reservation state.
func (r *Reservations) Report(ctx context.Context) (ReservationReport, error) {
	rsp, err := r.call(ctx, &wire.ControlRequest{Op: wire.ControlReserveIn}, "report reservations")
	if err != nil {
		return ReservationReport{}, err
	}
	rep := ReservationReport{Generation: rsp.Generation, Holder: rsp.Holder, HolderKey: rsp.HolderKey,
		Type: ReservationType(rsp.ResType), ExclusiveHolder: rsp.ExclusiveHolder}
	for _, g := range rsp.Registrants {
		rep.Registrants = append(rep.Registrants, Registrant(g))
	}
	return rep, nil
}

func (r *Reservations) out(ctx context.Context, act wire.ReserveAction, key, newKey uint64, typ ReservationType) error {
	_, err := r.call(ctx, &wire.ControlRequest{Op: wire.ControlReserveOut, Action: act, Key: key, NewKey: newKey,
		Type: wire.ReservationType(typ)}, act.String())
	return err
}

// call runs a reservation request on the session's first channel, which
// has the volume open like every other.
func (r *Reservations) call(ctx context.Context, req *wire.ControlRequest, what string) (*wire.ControlResponse, error) {
	if r.mv != nil {
		var rsp *wire.ControlResponse
		err := r.mv.do(ctx, func(v *Volume) error {
			var err error
			rsp, err = (&Reservations{v: v}).call(ctx, req, what)
			return err
		})
		return rsp, err
	}
	v := r.v
	var rsp *wire.ControlResponse
	var err error
	if v.s.cfg.Protocol == ProtocolSRP {
		rsp, err = v.s.srpReservation(ctx, v.lun, req)
		var se *SCSIError
		if errors.As(err, &se) && se.Status == SCSIStatusReservationConflict {
			// SCSI says no more than the status: a wrong key, or another
			// host's reservation.
			return nil, &ReservationError{Action: what, Volume: v.name, Reason: "reservation conflict (the target's status; SCSI gives no reason)",
				Err: ErrReservationConflict}
		}
	} else {
		rsp, err = v.s.controlReq(ctx, v.s.chans[0], &Request{Op: opControl, ctrl: req, vol: v})
	}
	if err != nil {
		return nil, fmt.Errorf("initiator: %s of %q: %w", what, v.name, err)
	}
	if rsp.Error != "" || rsp.Sense != wire.SenseNone {
		return nil, &ReservationError{Action: what, Volume: v.name, Reason: rsp.Error, Err: reservationErr(rsp.Sense)}
	}
	return rsp, nil
}

// ReservationError is a reservation request the target refused.
type ReservationError struct {
	Action string // "reserve", "preempt-abort", "report reservations", ...
	Volume string
	// Reason is the target's: "reserved write-exclusive by initiator
	// \"B\"", "initiator \"A\" is registered with another key", ...
	Reason string
	// Err is ErrReservationConflict when the reservation state forbids
	// it, ErrInvalid for a malformed request, or another sentinel.
	Err error
}

func (e *ReservationError) Error() string {
	return fmt.Sprintf("initiator: %s of %q: %s", e.Action, e.Volume, e.Reason)
}

// Unwrap gives Err, so errors.Is(err, ErrReservationConflict) works.
func (e *ReservationError) Unwrap() error { return e.Err }

func reservationErr(s wire.Sense) error {
	if s == wire.SenseUnsupported {
		return fmt.Errorf("the target takes no reservations: %w", ErrInvalid)
	}
	return errNoVolume(s)
}

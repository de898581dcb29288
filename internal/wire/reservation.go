package wire

import (
	"fmt"

	"github.com/gosrp/gosrp/internal/enum"
	"github.com/vmihailenco/msgpack/v5"
)

// Persistent reservations (SPC-4 §5.13, PERSISTENT RESERVE IN/OUT; NVMe's
// Reservation Register/Acquire/Release/Report model the same thing): a
// host registers a key for a volume, then the holder of a reservation
// decides who else may read or write it. Hosts are known by the
// initiator name they logged in with, so a registration covers every
// session of that initiator.

// Control operations of reservations. Both name an open volume by
// ControlRequest.Handle.
const (
	// ControlReserveOut changes the volume's reservation state:
	// ControlRequest.Action says how (PERSISTENT RESERVE OUT).
	ControlReserveOut = "pr-out"
	// ControlReserveIn reports the volume's registrations and
	// reservation (PERSISTENT RESERVE IN, READ FULL STATUS).
	ControlReserveIn = "pr-in"
)

// ReserveAction is what a ControlReserveOut asks (SPC-4's PERSISTENT
// RESERVE OUT service actions).
type ReserveAction uint8

// Reserve actions. Values after the last are refused as an invalid field.
const (
	ActionNone ReserveAction = iota
	// ActionRegister, with the current Key (0
	// when unregistered) registers NewKey, replaces the key with it, or
	// with NewKey 0 unregisters.
	ActionRegister
	// ActionRegisterIgnore is ActionRegister without checking Key
	// (REGISTER AND IGNORE EXISTING KEY).
	ActionRegisterIgnore
	// ActionReserve takes a reservation of Type.
	ActionReserve
	// ActionRelease gives up the reservation of Type the host holds.
	ActionRelease
	// ActionClear removes every registration and the reservation.
	ActionClear
	// ActionPreempt removes the registrations of key NewKey and, if they
	// held the reservation, takes it with Type.
	ActionPreempt
	// ActionPreemptAbort is ActionPreempt that also fails the writes of
	// the preempted hosts that have not yet reached the store, and is
	// answered once those already there are done.
	ActionPreemptAbort
	// ActionRegisterMove (REGISTER AND MOVE), from the holder, registers
	// the host named Dest with NewKey and makes it the holder; with
	// Unreg the holder's own registration goes.
	ActionRegisterMove
	actionEnd
)

var actionNames = [...]string{"none", "register", "register-ignore", "reserve", "release", "clear", "preempt", "preempt-abort", "register-move"}

// Valid reports whether a is an action the protocol defines.
func (a ReserveAction) Valid() bool { return a > ActionNone && a < actionEnd }

func (a ReserveAction) String() string { return enum.Name(actionNames[:], a, "ReserveAction") }

// ReservationType is the kind of a reservation; its values are SPC-4's
// TYPE codes (Table 170).
type ReservationType uint8

// Reservation types.
const (
	// ResNone: no reservation.
	ResNone ReservationType = 0
	// ResWriteExclusive: only the holder writes; every host reads.
	ResWriteExclusive ReservationType = 1
	// ResExclusiveAccess: only the holder reads or writes.
	ResExclusiveAccess ReservationType = 3
	// ResWriteExclusiveRegistrants: registered hosts write; every host
	// reads.
	ResWriteExclusiveRegistrants ReservationType = 5
	// ResExclusiveAccessRegistrants: only registered hosts read or write.
	ResExclusiveAccessRegistrants ReservationType = 6
)

// Valid reports whether t is a type a reservation can take (not ResNone).
func (t ReservationType) Valid() bool {
	switch t {
	case ResWriteExclusive, ResExclusiveAccess, ResWriteExclusiveRegistrants, ResExclusiveAccessRegistrants:
		return true
	}
	return false
}

func (t ReservationType) String() string {
	return enum.Name(reservationTypeNames[:], t, "ReservationType")
}

var reservationTypeNames = [...]string{
	ResNone: "none", ResWriteExclusive: "write-exclusive", ResExclusiveAccess: "exclusive-access",
	ResWriteExclusiveRegistrants: "write-exclusive-registrants", ResExclusiveAccessRegistrants: "exclusive-access-registrants",
}

// ParseReservationType reads a type by its String name.
func ParseReservationType(s string) (ReservationType, error) {
	for _, t := range []ReservationType{ResWriteExclusive, ResExclusiveAccess, ResWriteExclusiveRegistrants, ResExclusiveAccessRegistrants} {
		if t.String() == s {
			return t, nil
		}
	}
	return ResNone, fmt.Errorf("unknown reservation type %q (want write-exclusive, exclusive-access, write-exclusive-registrants or exclusive-access-registrants)", s)
}

// Registrant is one registration in a ControlReserveIn answer. It is
// encoded as an array (initiator, key) to keep reports small.
type Registrant struct {
	Initiator string
	Key       uint64
}

// EncodeMsgpack implements msgpack.CustomEncoder: [initiator, key].
func (r Registrant) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeArrayLen(2); err != nil {
		return err
	}
	if err := enc.EncodeString(r.Initiator); err != nil {
		return err
	}
	return enc.EncodeUint(r.Key)
}

// DecodeMsgpack implements msgpack.CustomDecoder. Elements after the
// second are skipped, so that a later version may add some.
func (r *Registrant) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := decodeTuple(dec, "registrant", 2)
	if err != nil {
		return err
	}
	if r.Initiator, err = dec.DecodeString(); err != nil {
		return err
	}
	if r.Key, err = dec.DecodeUint64(); err != nil {
		return err
	}
	return skipRest(dec, n-2)
}

// MaxRegistrants is the most registrations a volume keeps: a report of
// all of them, with names of up to MaxReportName bytes, fits one IU.
const MaxRegistrants = 16

// MaxReportName is the most bytes of an initiator name a report carries;
// a longer name is cut (a report is for people and for matching keys,
// which are whole).
const MaxReportName = 200

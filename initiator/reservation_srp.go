package initiator

// Reservations over ProtocolSRP: PERSISTENT RESERVE OUT and IN (SPC-4
// 6.16, 6.15), which SRP targets serve (srpd's SRP personality, LIO
// behind ib_srpt), sent as Linux's sd sends them (sd_pr_out_command).
// SCSI knows a host by its initiator port, and READ KEYS lists keys
// only: a report over SRP has the keys, the generation and the holder's
// key and type, but no names.

import (
	"context"
	"fmt"

	"github.com/gosrp/gosrp/internal/wire"
)

const (
	scsiPersistIn  = 0x5E
	scsiPersistOut = 0x5F
	// prKeysAlloc is READ KEYS' allocation length: room for 255 keys
	// after the 8-byte header.
	prKeysAlloc = 8 + 8*255
)

// prOutService is each action's PERSISTENT RESERVE OUT service action
// (SPC-4 Table 174).
var prOutService = map[wire.ReserveAction]byte{
	wire.ActionRegister: 0, wire.ActionReserve: 1, wire.ActionRelease: 2, wire.ActionClear: 3,
	wire.ActionPreempt: 4, wire.ActionPreemptAbort: 5, wire.ActionRegisterIgnore: 6,
}

// srpReservation runs a reservation request on LUN lun as SCSI commands
// and answers it as the target of ProtocolGoSRP would: a report's
// fields, or nothing for a change. A change the state forbids fails
// with a *SCSIError of status RESERVATION CONFLICT, which is
// ErrReservationConflict.
func (s *Session) srpReservation(ctx context.Context, lun uint16, req *wire.ControlRequest) (*wire.ControlResponse, error) {
	c := s.chans[0]
	if req.Op == wire.ControlReserveIn {
		return s.srpReport(ctx, c, lun)
	}
	sa, ok := prOutService[req.Action]
	if !ok {
		return nil, fmt.Errorf("initiator: reservation action %s: %w", req.Action, ErrInvalid)
	}
	param := make([]byte, 24)
	be.PutUint64(param, req.Key)
	be.PutUint64(param[8:], req.NewKey)
	if req.Action == wire.ActionRegister || req.Action == wire.ActionRegisterIgnore {
		param[20] = 0x01 // APTPL: kept across the target's power loss, as sd_pr_register asks
	}
	cdb := []byte{scsiPersistOut, sa, byte(req.Type) & 0x0f, 0, 0, 0, 0, 0, 24, 0}
	if err := s.scsiOut(ctx, c, lun, cdb, param); err != nil {
		return nil, err
	}
	return &wire.ControlResponse{}, nil
}

// srpReport reads the reservation state of LUN lun: READ KEYS, then
// READ RESERVATION. Lengths the target claims past the data it sent are
// cut to the data.
func (s *Session) srpReport(ctx context.Context, c *channel, lun uint16) (*wire.ControlResponse, error) {
	b, err := s.scsiIn(ctx, c, lun, []byte{scsiPersistIn, 0, 0, 0, 0, 0, 0, prKeysAlloc >> 8, prKeysAlloc & 0xff, 0}, prKeysAlloc)
	if err != nil {
		return nil, err
	}
	if len(b) < 8 {
		return nil, fmt.Errorf("initiator: READ KEYS of LUN %d returned %d bytes: %w", lun, len(b), ErrProtocol)
	}
	rsp := &wire.ControlResponse{Generation: be.Uint32(b)}
	n := min(int(be.Uint32(b[4:])), len(b)-8) / 8
	for i := range n {
		rsp.Registrants = append(rsp.Registrants, wire.Registrant{Key: be.Uint64(b[8+8*i:])})
	}
	b, err = s.scsiIn(ctx, c, lun, []byte{scsiPersistIn, 1, 0, 0, 0, 0, 0, 0, 24, 0}, 24)
	if err != nil {
		return nil, err
	}
	if len(b) < 8 {
		return nil, fmt.Errorf("initiator: READ RESERVATION of LUN %d returned %d bytes: %w", lun, len(b), ErrProtocol)
	}
	if be.Uint32(b[4:]) >= 16 && len(b) >= 24 {
		rsp.HolderKey, rsp.ResType = be.Uint64(b[8:]), wire.ReservationType(b[21]&0x0f)
	}
	return rsp, nil
}

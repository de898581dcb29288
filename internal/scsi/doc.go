// Package scsi models a SCSI block device (SPC-4, SBC-3) for gosrp's
// SRP personality: a pure function from a CDB and the logical unit's
// state to an Action. It does no I/O, starts no goroutine and reads no
// clock; the target runs the block operation an Action names and answers
// with its outcome.
//
// # A command's life
//
// The target keeps a Device per volume it exports as a LUN (geometry,
// read-only, write cache, discard, a stable ID) and a Nexus per (I_T
// nexus, LUN) for the unit attentions that nexus has not yet seen. For
// each SRP_CMD it calls Execute (or NoUnit when the LUN has no volume):
//
//	a := dev.Execute(&nexus, cmd.CDB, luns)
//	switch {
//	case a.Status != scsi.StatusGood:
//		// CHECK CONDITION: send a.Sense.AppendFixed(nil) as the
//		// SRP_RSP's sense data.
//	case a.Op == scsi.OpNone:
//		// a.Data (INQUIRY, READ CAPACITY, MODE SENSE, ...) goes to
//		// the initiator by RDMA WRITE, then SRP_RSP GOOD.
//	default:
//		// run a.Op (read, write with FUA, flush, write same) on the
//		// volume; on failure answer CHECK CONDITION with
//		// scsi.FromWire(sense, a.Op).
//	}
//
// UNMAP takes two steps: Execute says OpUnmap and how many parameter
// bytes to fetch (DataOut); the target fetches them and Unmap decodes
// them, bounded, into extents to deallocate.
//
// A first exchange as Linux's sd runs it when ib_srp adds the disk:
//
//	INQUIRY                  → standard data: direct access, SPC-4, CMDQUE
//	REPORT LUNS              → the port's LUNs
//	INQUIRY VPD 0x00         → pages 00 80 83 B0 B1 B2
//	READ CAPACITY(16)        → last LBA, block size, LBPME/LBPRZ
//	MODE SENSE(6) page 0x3F  → WP for a read-only unit, DPOFUA
//	MODE SENSE(6) page 0x08  → WCE when the volume caches writes
//	INQUIRY VPD 0xB0/B1/B2   → limits, non-rotating, UNMAP and WRITE SAME
//	REPORT SUPPORTED OPERATION CODES for INQUIRY, WRITE SAME(16), (10)
//	                         → supported: sd may zero with WRITE SAME
//	INQUIRY VPD 0x83         → the NAA identifier udev names the disk by
//
// # Unit attention
//
// When a volume changes under its initiators, the target raises a
// Condition on every Nexus of the unit: CapacityChanged after a resize,
// WriteCacheLost after a restart lost acknowledged writes, LUNsChanged
// when volumes come and go, ResetOccurred when another nexus reset the
// unit. A Nexus is per I_T nexus, not per connection: a target whose
// nexus has several channels shares one Nexus among them, so that each
// condition is reported once. Each nexus then sees it once, as CHECK
// CONDITION UNIT ATTENTION on its next command other than INQUIRY,
// REPORT LUNS and REQUEST SENSE, or as REQUEST SENSE's data; a lost
// write cache also fails the nexus's next SYNCHRONIZE CACHE and next FUA
// write (see WriteCacheLost). testdata/unit_attention traces the rules.
//
// # Gateways
//
// A unit that several gateways export, one serving it at a time, is
// given a Device.PortGroup: the model then speaks ALUA (SPC-4 5.15;
// alua.go). It reports the gateway's target port group and whether the
// unit is Standby or Unavailable (fenced) there, refuses what such a
// port refuses, and turns
// SET TARGET PORT GROUPS into OpSetPortGroups, whose parameter list
// SetPortGroups reads: a takeover for the target to run. A state change
// the target makes is the AccessChanged condition. testdata/alua traces
// the rules.
//
// # Persistent reservations
//
// PERSISTENT RESERVE IN and OUT become OpReserveIn and OpReserveOut
// (persist.go): the state is the target's, one per volume and shared
// with its gosrp hosts, so the model only decodes the CDB and, once the
// target has fetched it, the parameter list (ReserveOut), and encodes a
// report (ReserveInData). A command the state forbids is answered by
// the target with the status RESERVATION CONFLICT (StatusResvConflict).
//
// Anything the model does not implement answers ILLEGAL REQUEST,
// INVALID COMMAND OPERATION CODE; a field it does not accept, INVALID
// FIELD IN CDB. Sense is fixed format unless REQUEST SENSE asks for
// descriptors.
package scsi

package scsi

import "testing"

// linuxRetries is how Linux's SCSI midlayer disposes of a CHECK
// CONDITION with sense s on a disk (scsi_check_sense in
// drivers/scsi/scsi_error.c, kernel 6.1): true when it re-issues the
// command without telling the block layer, false when the failure goes
// up to the filesystem. A retried command is sent up to sd's
// max_retries (5) more times, so a condition the target reports once
// is never seen by the host if the sense is retried.
func linuxRetries(s Sense) bool {
	switch s.Key {
	case KeyUnitAttention:
		return true // re-issued after the attention is noted
	case KeyNotReady:
		return s.ASC == 0x04 && (s.ASCQ == 0x01 || s.ASCQ == 0x04 || s.ASCQ == 0x05 || s.ASCQ == 0x06 ||
			s.ASCQ == 0x07 || s.ASCQ == 0x08 || s.ASCQ == 0x09 || s.ASCQ == 0x14 || s.ASCQ == 0x1a || s.ASCQ == 0x1b)
	case KeyAbortedCommand:
		return !(s.ASC == 0x10) // protection information errors are final
	case KeyMediumError:
		return s.ASC != 0x11 && s.ASC != 0x13 && s.ASC != 0x14
	}
	// HARDWARE ERROR (without the retry_hwerror quirk), ILLEGAL
	// REQUEST, DATA PROTECT and the rest complete with the error.
	return false
}

// TestLinuxSeesFailures specifies, for every failure sense the model
// reports, whether Linux retries it, and so which of them a host is
// sure to see when the target reports it once. The write cache loss is
// reported once per nexus, so its sense must be final: it was MEDIUM
// ERROR, WRITE ERROR until srpd, SIGKILLed under a mounted ext4 in the
// rxe VM (test/rxe/srp-guest.sh), reported the loss, the midlayer
// retried the failed SYNCHRONIZE CACHE, the retry succeeded and ext4
// went on over the lost writes.
func TestLinuxSeesFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		s       Sense
		retried bool
		why     string
	}{
		{"lost write cache", SenseCacheLost, false, "reported once per nexus: a retry would hide it"},
		{"backend write error", SenseWriteError, true, "a store's EIO may be transient; after 5 retries it goes up"},
		{"read error", SenseReadError, false, "final"},
		{"data phase error", SenseDataPhaseError, true, "an RDMA transfer that failed: the retry may pass"},
		{"overlapped command", SenseOverlapped, true, "the nexus's commands were aborted: the retry runs alone"},
		{"internal failure", SenseInternalFailure, false, "final"},
		{"space allocation failed", SenseSpaceAllocFailed, false, "the filesystem must see ENOSPC"},
		{"write protected", SenseWriteProtected, false, "final"},
		{"access denied", SenseAccessDenied, false, "final"},
		{"LBA out of range", SenseLBAOutOfRange, false, "final"},
		{"invalid field", SenseInvalidField, false, "final"},
		{"invalid opcode", SenseInvalidOpcode, false, "final"},
		{"power on", SensePowerOn, true, "a unit attention: noted, then retried"},
		{"capacity changed", SenseCapacityChanged, true, "a unit attention"},
		{"access state changed", SenseAccessChanged, true, "a unit attention; scsi_dh_alua asks the port groups again"},
		{"standby port", SenseStandby, false, "a path error, which dm-multipath retries on another path"},
		{"unavailable port", SenseUnavailable, false, "a fenced gateway: a path error as standby is"},
	} {
		if got := linuxRetries(tc.s); got != tc.retried {
			t.Errorf("%s (%s): Linux retries it: %v, want %v (%s)", tc.name, tc.s, got, tc.retried, tc.why)
		}
	}
	// Every condition the nexus owes once must fail with a final sense.
	var n Nexus
	n.Raise(WriteCacheLost)
	d := disk()
	for _, c := range [][]byte{cdb(opSyncCache10), cdb(opWrite10, 0x08, 0, 0, 0, 0, 0, 0, 1)} {
		var a Action
		for a = d.Execute(&n, c, nil); a.Sense.Key == KeyUnitAttention; a = d.Execute(&n, c, nil) {
		}
		if a.Status != StatusCheckCondition || linuxRetries(a.Sense) {
			t.Errorf("CDB %x after a lost write cache: %v %v; want a CHECK CONDITION Linux does not retry", c[0], a.Status, a.Sense)
		}
	}
}

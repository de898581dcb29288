#!/bin/bash
# test/rxe/srp.sh: the Linux kernel's SRP initiator (ib_srp) against srpd
# over rxe, in one boot of a guest that carries ib_srp, sd_mod, fio,
# e2fsprogs and sg3-utils: add_target from the line srpd status prints,
# the volume as /dev/sdX (sg_inq, sg_vpd, sg_readcap), a reservation the
# kernel takes (sg_persist) seen by a gosrp host (srpc), whose preempt
# with abort fences the kernel under fio's QD16 writes (no kernel write
# lands after it), 4 MiB written and
# read back, fio randwrite with crc32c verification, blkdiscard read back
# as zeros, a resize seen after a rescan, mkfs.ext4 + a file synced, srpd
# SIGKILLed and restarted while mounted with ib_srp reconnecting, both
# files intact and e2fsck -fn clean; a volume created under the
# logged-in host found by a rescan without a new login; each disk still
# its own volume after volumes are created (one sorting first) and srpd
# restarts; a second
# initiator port's verified writes riding through the first's LUN reset;
# then a
# pebble-backed srpd SIGKILLed
# under ext4 with direct writes in flight: ext4 must abort its journal
# on the reported lost write cache, and the file synced before the kill
# must read back after e2fsck. Exits non-zero on failure. Needs
# root; the guest lives in $GOSRP_RXE_SRP_DIR (default
# /var/cache/gosrp-rxe-srp), rebuilt when the package list changes. OUT
# keeps the logs.
export GOSRP_RXE_DIR=${GOSRP_RXE_SRP_DIR:-/var/cache/gosrp-rxe-srp}
export GOSRP_RXE_EXTRA_PKGS="fio e2fsprogs sg3-utils"
export GOSRP_RXE_EXTRA_MODS="ib_srp sd_mod scsi_transport_srp ext4"
. "$(dirname "$0")/common.sh"
ROOT=$(cd "$RXE_SCRIPTS/../.." && pwd)
guest_ready || bash "$RXE_SCRIPTS/build-guest.sh"
B=$(mktemp -d "${TMPDIR:-/tmp}/gosrp-srp.XXXXXX")
trap 'rm -rf "$B"' EXIT
(cd "$ROOT" && CGO_ENABLED=1 go build -tags ibverbs -o "$B/" ./cmd/srpd ./cmd/srpc)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gosrp-srp-out.XXXXXX")}
rc=0
VM_MEM=${VM_MEM:-2048} VM_LIMIT=${VM_LIMIT:-900} VM_FILES="$B/srpd $B/srpc" VM_OUT="$OUT" \
  bash "$RXE_SCRIPTS/vm-exec.sh" "$RXE_SCRIPTS/srp-guest.sh" || rc=$?
cat "$OUT/steps.log" 2>/dev/null
echo "srp: rc=$rc, logs in $OUT"
exit $rc

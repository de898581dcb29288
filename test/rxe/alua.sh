#!/bin/bash
# test/rxe/alua.sh: the Linux kernel's SRP initiator (ib_srp) with its
# ALUA device handler (scsi_dh_alua) and dm-multipath, against two gosrp
# gateways of one volume over rxe, in one boot: gwpair (test/rxe/gwpair)
# serves the volume through two targets whose catalogs lock and fence as
# srpd's over RBD do, each its own SRP target port and ALUA target port
# group. The kernel must attach scsi_dh_alua to both disks, read one
# path active/optimized and the other standby, and, when dm-multipath
# switches to the standby path's group, activate it with SET TARGET PORT
# GROUPS: the volume moves, the data written through the first gateway
# reads back through the second, and the first reads standby. Exits
# non-zero on failure. Needs root; the guest lives in
# $GOSRP_RXE_ALUA_DIR (default /var/cache/gosrp-rxe-alua). OUT keeps the
# logs.
export GOSRP_RXE_DIR=${GOSRP_RXE_ALUA_DIR:-/var/cache/gosrp-rxe-alua}
export GOSRP_RXE_EXTRA_PKGS="sg3-utils dmsetup"
export GOSRP_RXE_EXTRA_MODS="ib_srp sd_mod scsi_transport_srp scsi_dh_alua dm_multipath dm_round_robin"
. "$(dirname "$0")/common.sh"
ROOT=$(cd "$RXE_SCRIPTS/../.." && pwd)
guest_ready || bash "$RXE_SCRIPTS/build-guest.sh"
B=$(mktemp -d "${TMPDIR:-/tmp}/gosrp-alua.XXXXXX")
trap 'rm -rf "$B"' EXIT
(cd "$ROOT" && CGO_ENABLED=1 go build -tags ibverbs -o "$B/" ./test/rxe/gwpair)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gosrp-alua-out.XXXXXX")}
rc=0
VM_MEM=${VM_MEM:-2048} VM_LIMIT=${VM_LIMIT:-600} VM_FILES="$B/gwpair" VM_OUT="$OUT" \
  bash "$RXE_SCRIPTS/vm-exec.sh" "$RXE_SCRIPTS/alua-guest.sh" || rc=$?
cat "$OUT/steps.log" 2>/dev/null
echo "alua: rc=$rc, logs in $OUT"
exit $rc

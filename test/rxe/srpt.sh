#!/bin/bash
# test/rxe/srpt.sh: srpc --protocol srp against the kernel's SRP target
# (ib_srpt with a LIO RAM disk) over rxe, in one boot of a guest that
# carries ib_srpt and target_core_mod: srpc list and info see LUN 0 with
# its size, 16 MiB imported and exported back compare byte for byte
# (sha256), and bench --protocol srp --verify randrw 4 KiB at QD1 and
# QD16, past the imported region, finds no mismatch. Exits non-zero on
# failure. Needs root; the guest lives in $GOSRP_RXE_SRPT_DIR (default
# /var/cache/gosrp-rxe-srpt). OUT keeps the logs.
export GOSRP_RXE_DIR=${GOSRP_RXE_SRPT_DIR:-/var/cache/gosrp-rxe-srpt}
export GOSRP_RXE_EXTRA_PKGS=""
export GOSRP_RXE_EXTRA_MODS="configfs target_core_mod ib_srpt"
. "$(dirname "$0")/common.sh"
ROOT=$(cd "$RXE_SCRIPTS/../.." && pwd)
guest_ready || bash "$RXE_SCRIPTS/build-guest.sh"
B=$(mktemp -d "${TMPDIR:-/tmp}/gosrp-srpt.XXXXXX")
trap 'rm -rf "$B"' EXIT
(cd "$ROOT" && CGO_ENABLED=1 go build -tags ibverbs -o "$B/" ./cmd/srpc ./bench)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gosrp-srpt-out.XXXXXX")}
rc=0
VM_MEM=${VM_MEM:-2048} VM_LIMIT=${VM_LIMIT:-900} VM_FILES="$B/srpc $B/bench" VM_OUT="$OUT" \
  bash "$RXE_SCRIPTS/vm-exec.sh" "$RXE_SCRIPTS/srpt-guest.sh" || rc=$?
cat "$OUT/steps.log" 2>/dev/null
echo "srpt: rc=$rc, logs in $OUT"
exit $rc

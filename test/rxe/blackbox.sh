#!/bin/bash
# test/rxe/blackbox.sh: srpd, srpc and bench as a user runs them, over the
# kernel's rxe, in one VM boot. Builds the three programs with -tags ibverbs
# on the host, boots the rxe guest with them in the share and runs
# blackbox-guest.sh there, which fails on the first broken promise: a step
# that exits non-zero, checksums that differ, a verify mismatch, or any QP
# error, lost completion, missed deadline or reconnect in a clean run. A
# kernel warning in the guest fails the run too (vm-exec.sh).
# Env: OUT (where the guest's logs land; a temp dir by default),
# BB_RUNTIME (each bench job's runtime, default 5s). Needs root.
. "$(dirname "$0")/common.sh"
ROOT=$(cd "$RXE_SCRIPTS/../.." && pwd)
if ! [ -f /usr/include/infiniband/verbs.h ] || ! [ -f /usr/include/rdma/rdma_cma.h ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libibverbs-dev librdmacm-dev >/dev/null
fi
guest_ready || bash "$RXE_SCRIPTS/build-guest.sh"
B=$(mktemp -d "${TMPDIR:-/tmp}/gosrp-bb.XXXXXX")
trap 'rm -rf "$B"' EXIT
(cd "$ROOT" && CGO_ENABLED=1 go build -tags ibverbs -o "$B/" ./cmd/srpd ./cmd/srpc ./bench)
OUT=${OUT:-$B/out}
rc=0
VM_ENV="BB_RUNTIME" BB_RUNTIME=${BB_RUNTIME:-5s} VM_FILES="$B/srpd $B/srpc $B/bench" VM_OUT="$OUT" \
  bash "$RXE_SCRIPTS/vm-exec.sh" "$RXE_SCRIPTS/blackbox-guest.sh" || rc=$?
echo "rxe blackbox: rc=$rc (logs in $OUT)"
[ "$rc" = 0 ] || { [ -f "$OUT/steps.log" ] && cat "$OUT/steps.log"; }
exit $rc

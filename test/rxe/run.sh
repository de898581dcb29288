#!/bin/bash
# test/rxe/run.sh [PACKAGES...]: build the rxe guest if needed, then run
#   go test -tags ibverbs -exec test/rxe/vm-exec.sh -p 1 ./transport/ibverbs/...
# (or the given packages) from the module root; exits non-zero on failure.
# Extra go test flags: GOTESTFLAGS (e.g. "-v -run Smoke"). Needs root (apt, debootstrap).
. "$(dirname "$0")/common.sh"
ROOT=$(cd "$RXE_SCRIPTS/../.." && pwd)
T0=$SECONDS
if ! [ -f /usr/include/infiniband/verbs.h ] || ! [ -f /usr/include/rdma/rdma_cma.h ]; then
  echo "rxe: installing libibverbs-dev librdmacm-dev on the host"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libibverbs-dev librdmacm-dev >/dev/null
fi
if ! guest_ready; then
  bash "$RXE_SCRIPTS/build-guest.sh"
fi
T1=$SECONDS
[ $# -gt 0 ] || set -- ./transport/ibverbs/...
cd "$ROOT"
rc=0
# shellcheck disable=SC2086
CGO_ENABLED=1 go test -tags ibverbs -exec "$RXE_SCRIPTS/vm-exec.sh" -p 1 -count=1 ${GOTESTFLAGS:-} "$@" || rc=$?
echo "rxe: guest build/check $((T1 - T0)) s, tests $((SECONDS - T1)) s, rc=$rc"
exit $rc

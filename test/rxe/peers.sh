#!/bin/bash
# test/rxe/peers.sh: a benchmark, not a test. In one boot of an rxe guest
# that also carries fio, nvme-cli, perftest and the kernel's NVMe-oF and
# SRP modules, it runs the same jobs against three targets over the same
# rxe0, round after round:
#   gosrp   bench --provider ibverbs -> srpd (memory backend)
#   nvme    fio (libaio, direct) -> nvme-rdma -> nvmet-rdma (brd namespace)
#   srp     fio (libaio, direct) -> ib_srp -> ib_srpt + LIO (rd_mcp)
# and perftest's ib_write_bw / ib_read_bw at 4 KiB as the raw device, then
# prints a table and gosrp's ratios to the better kernel peer and to raw rxe
# (peers-summary.py). The VM runs under TCG: compare figures within one boot
# only. Env: ROUNDS (2), RUNTIME (5 s), RAMP (1 s), PEERS ("gosrp nvme srp"),
# OUT (a temp dir), OPTS_<peer>: any PEERS word starting with gosrp is a
# gosrp peer of its own (its own srpd) whose ibverbs provider options,
# comma-separated KEY=VALUE, are OPTS_<peer>, e.g.
#   PEERS="gosrp gosrpnopoll nvme srp" OPTS_gosrpnopoll=busy_poll=0 Needs root; the guest (~1 GB) lives in
# $GOSRP_RXE_PEERS_DIR (default /var/cache/gosrp-rxe-peers).
export GOSRP_RXE_DIR=${GOSRP_RXE_PEERS_DIR:-/var/cache/gosrp-rxe-peers}
export GOSRP_RXE_EXTRA_PKGS="fio nvme-cli perftest"
export GOSRP_RXE_EXTRA_MODS="configfs brd nvme-rdma nvmet-rdma ib_srp ib_srpt target_core_mod sd_mod scsi_transport_srp"
. "$(dirname "$0")/common.sh"
ROOT=$(cd "$RXE_SCRIPTS/../.." && pwd)
guest_ready || bash "$RXE_SCRIPTS/build-guest.sh"
B=$(mktemp -d "${TMPDIR:-/tmp}/gosrp-peers.XXXXXX")
trap 'rm -rf "$B"' EXIT
(cd "$ROOT" && CGO_ENABLED=1 go build -tags ibverbs -o "$B/" ./cmd/srpd ./bench)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gosrp-peers-out.XXXXXX")}
export ROUNDS=${ROUNDS:-2} RUNTIME=${RUNTIME:-5} RAMP=${RAMP:-1} PEERS=${PEERS:-"gosrp nvme srp"}
rc=0
VM_ENV="ROUNDS RUNTIME RAMP PEERS $(compgen -v OPTS_ | tr '\n' ' ')" VM_MEM=${VM_MEM:-4096} VM_LIMIT=${VM_LIMIT:-2400} \
  VM_FILES="$B/srpd $B/bench" VM_OUT="$OUT" bash "$RXE_SCRIPTS/vm-exec.sh" "$RXE_SCRIPTS/peers-guest.sh" || rc=$?
python3 "$RXE_SCRIPTS/peers-summary.py" "$OUT" || rc=1
echo "peers: rc=$rc, results in $OUT"
exit $rc

#!/bin/bash
# test/rxe/peers.sh: a benchmark, not a test. In one boot of an rxe guest
# that also carries fio, nvme-cli, perftest and the kernel's NVMe-oF and
# SRP modules, it runs the same jobs against three targets over the same
# rxe0, round after round:
#   gosrp   bench --provider ibverbs -> srpd (memory backend)
#   nvme    fio (libaio, direct) -> nvme-rdma -> nvmet-rdma (brd namespace)
#   srp     fio (libaio, direct) -> ib_srp -> ib_srpt + LIO (rd_mcp)
#   srpd    fio (libaio, direct) -> ib_srp -> srpd's SRP personality
#           (memory backend), the same kernel initiator as srp's
# and perftest's ib_write_bw / ib_read_bw at 4 KiB as the raw device, then
# prints a table and gosrp's ratios to the better kernel peer and to raw rxe
# (peers-summary.py). The VM runs under TCG: compare figures within one boot
# only; for srpd it also prints ib_srp -> srpd against ib_srp -> ib_srpt.
# Env: ROUNDS (2), RUNTIME (5 s), RAMP (1 s), PEERS ("gosrp srpd nvme srp"),
# JOBS (NAME:RW:BS:QD words, default all five), FIO_FLAGS (more fio
# options for every fio job: --cpus_allowed=0), PERF (1: perf record and
# stat of the whole guest over each job of round 1; stat: counts only),
# OUT (a temp dir), OPTS_<peer>: any PEERS word starting with gosrp is a
# gosrp peer of its own (its own srpd) whose ibverbs provider options,
# comma-separated KEY=VALUE, are OPTS_<peer>, e.g.
#   PEERS="gosrp gosrpnopoll nvme srp" OPTS_gosrpnopoll=busy_poll=0
# Likewise any PEERS word starting with srpd is an srpd of its own behind
# ib_srp, with extra srpd flags SRPD_FLAGS_<peer> and the binary
# SRPD_BIN_<peer> (a file named in PEERS_FILES, copied into the guest),
# so two builds of srpd meet in one boot:
#   PEERS="srpd srpdbase srp" PEERS_FILES=/tmp/srpd-base SRPD_BIN_srpdbase=srpd-base
# PPROF=1 fetches each srpd peer's CPU profile over every job of round 1
# (OUT/1-PEER-JOB.pprof). Needs root; the guest (~1 GB) lives in
# $GOSRP_RXE_PEERS_DIR (default /var/cache/gosrp-rxe-peers).
export GOSRP_RXE_DIR=${GOSRP_RXE_PEERS_DIR:-/var/cache/gosrp-rxe-peers}
export GOSRP_RXE_EXTRA_PKGS="fio nvme-cli perftest linux-perf"
export GOSRP_RXE_EXTRA_MODS="configfs brd nvme-rdma nvmet-rdma ib_srp ib_srpt target_core_mod sd_mod scsi_transport_srp"
. "$(dirname "$0")/common.sh"
ROOT=$(cd "$RXE_SCRIPTS/../.." && pwd)
guest_ready || bash "$RXE_SCRIPTS/build-guest.sh"
B=$(mktemp -d "${TMPDIR:-/tmp}/gosrp-peers.XXXXXX")
trap 'rm -rf "$B"' EXIT
(cd "$ROOT" && CGO_ENABLED=1 go build -tags ibverbs -o "$B/" ./cmd/srpd ./bench)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gosrp-peers-out.XXXXXX")}
export ROUNDS=${ROUNDS:-2} RUNTIME=${RUNTIME:-5} RAMP=${RAMP:-1} PEERS=${PEERS:-"gosrp srpd nvme srp"}
rc=0
VM_ENV="ROUNDS RUNTIME RAMP PEERS PPROF PERF JOBS FIO_FLAGS $(for x in OPTS_ SRPD_FLAGS_ SRPD_BIN_; do compgen -v $x; done | tr '\n' ' ')" VM_MEM=${VM_MEM:-4096} VM_LIMIT=${VM_LIMIT:-2400} \
  VM_FILES="$B/srpd $B/bench ${PEERS_FILES:-}" VM_OUT="$OUT" bash "$RXE_SCRIPTS/vm-exec.sh" "$RXE_SCRIPTS/peers-guest.sh" || rc=$?
python3 "$RXE_SCRIPTS/peers-summary.py" "$OUT" || rc=1
echo "peers: rc=$rc, results in $OUT"
exit $rc

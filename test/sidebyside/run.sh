#!/usr/bin/env bash
# Side by side: gosrp against NBD peers on this machine, in one run.
#
# The job set (fio, numjobs=1, latency = fio lat): 4 KiB randread and
# randwrite at QD1 and QD32, 128 KiB sequential read and write at QD8, a
# 1 GiB device pre-written end to end, 5 s + 1 s ramp — against:
#   tmpfs file with fio psync and io_uring (ceilings), nbdkit memory over a
#   unix socket and TCP, qemu-nbd on a raw tmpfs file (fio's nbd engine);
#   srpd (memory backend, emu over tcp and over shm) through 'srpc nbd'
#   (fio's nbd engine) and directly with 'bench';
# plus 4 KiB randwrite QD32 with a flush about every second (fio fsync=N,
# N = that target's plain QD32 randwrite IOPS of the same round) for
# pebble-backed srpd (data on tmpfs; through 'srpc nbd' over tcp, and with
# 'bench --fsync' over tcp and over shm) and qemu-nbd. Targets are started,
# pre-written, measured and stopped one at a time, interleaved per round.
# It prints a table (median [min–max] over rounds, p50 latency, IOPS per
# busy core) and the issue's goals as ratios.
#
#   test/sidebyside/run.sh                 # 3 rounds, about 22 minutes
#   ROUNDS=1 QUICK=1 test/sidebyside/run.sh   # 2 s + 1 s jobs, about 4 minutes
#
# Env: ROUNDS (3), QUICK (0), OUT (results dir; default a new /tmp dir,
# kept), ONLY (space-separated target keys to run, e.g. "nbdkit-unix
# gosrp-nbd-shm"), POLL_PRESSURE (emu poll-pressure, default on here),
# SHM_POLL (the emu shm-poll option: adaptive, the
# default, or eager), PROCS (--procs of every gosrp process, default 1:
# the processes of one job share two cores; 0 is Go's default, a thread
# per CPU in each; bench's auto is 1 here, one job), PEBBLE_PROCS (the
# pebble srpd's --procs, default 0: its compactions run beside the I/O),
# GOSRP_GODEBUG (the gosrp processes' GODEBUG, see below). All traffic
# stays on loopback and unix sockets. Missing
# tools (fio, nbdkit, qemu-utils, libnbd-bin, python3) are installed with
# apt-get. A benchmark, never a test: run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=test/sidebyside

ROUNDS=${ROUNDS:-3}
QUICK=${QUICK:-0}
RUNTIME=5 RAMP=1
if [ "$QUICK" = 1 ]; then RUNTIME=2 RAMP=1; fi
SIZE=1g
OUT=${OUT:-$(mktemp -d /tmp/gosrp-sidebyside.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d /dev/shm/gosrp-sbs.XXXXXX) # tmpfs: files, sockets, pebble data
ONLY=${ONLY:-}
# SHM_POLL=eager runs every gosrp process with --provider-option
# shm-poll=eager (poll for answers as a dedicated core would).
# POLL_PRESSURE=on (the default here, a small shared VM) lets the emu
# readers consult /proc/pressure/cpu (emu's Config.PollPressure, off in
# the programs' own defaults); off judges from their own polls alone.
POLL_PRESSURE=${POLL_PRESSURE:-on}
POLL_OPT=(--provider-option "poll-pressure=$POLL_PRESSURE")
if [ -n "${SHM_POLL:-}" ]; then POLL_OPT+=(--provider-option "shm-poll=$SHM_POLL"); fi
PROCS=${PROCS:-1}
# The gosrp processes run with GOSRP_GODEBUG as their GODEBUG:
# schedtrace=2147483647 by default, the setting docs/performance.md
# describes for small shared hosts (the programs never set it
# themselves); GOSRP_GODEBUG= runs them with Go's defaults.
export GODEBUG=${GOSRP_GODEBUG-schedtrace=2147483647}
PEBBLE_PROCS=${PEBBLE_PROCS:-0}

# ---- tools ----
need=()
for t in fio:fio nbdkit:nbdkit qemu-nbd:qemu-utils qemu-img:qemu-utils nbdinfo:libnbd-bin python3:python3; do
	command -v "${t%%:*}" >/dev/null 2>&1 || need+=("${t#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "== installing ${need[*]}"
	sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
	DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "this fio has no nbd engine"; exit 1; }

echo "== building srpd, srpc and bench into $WORK/bin"
go build -o "$WORK/bin/" ./cmd/srpd ./cmd/srpc
BENCH=
if [ -d bench ] && go build -o "$WORK/bin/bench" ./bench 2>"$OUT/bench-build.log"; then
	BENCH=$WORK/bin/bench
else
	echo "   ('go build ./bench' failed or bench/ is missing: skipping the bench rows; see $OUT/bench-build.log)"
fi

# ---- process bookkeeping: only what this script started ----
PIDS=()
SERVER_PIDS=
cleanup() {
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start() { # start LOG CMD... ; sets LASTPID
	"${@:2}" >"$1" 2>&1 &
	LASTPID=$!
	PIDS+=("$LASTPID")
}
stop_servers() { # the last started first: srpc nbd flushes before srpd stops
	local p
	for p in $(echo "${SERVER_PIDS//,/ }" | tr ' ' '\n' | tac); do
		kill -TERM "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	SERVER_PIDS=
}
wait_for() { # wait_for WHAT CMD...: retry for 30 s while the last started process lives
	for _ in $(seq 300); do
		"${@:2}" >/dev/null 2>&1 && return 0
		kill -0 "$LASTPID" 2>/dev/null || { echo "   ! $1 exited before it came up"; return 1; }
		sleep 0.1
	done
	echo "   ! $1 did not come up"; return 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---- jobs ----
job_args() { # job_args JOB -> fio-style rw bs iodepth
	case $1 in
	rr1) echo randread 4k 1 ;; rr32) echo randread 4k 32 ;;
	rw1) echo randwrite 4k 1 ;; rw32 | fl32) echo randwrite 4k 32 ;;
	sr8) echo read 128k 8 ;; sw8) echo write 128k 8 ;;
	esac
}
JOBS="rr1 rr32 rw1 rw32 sr8 sw8"
RD=

# fsync_every TARGET: the N of fsync=N for a flush about every second, N =
# the IOPS TARGET measured just before: the plain QD32 run the first time,
# the previous flush run the second (fio and bench write the same JSON).
fsync_every() {
	local prev=$RD/$1.rw32.json
	[ -f "$RD/$1.fl32.json" ] && prev=$RD/$1.fl32.json
	python3 -c "import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index('{'):])['jobs'][0]['write']; print(max(1,int(j['iops'])))" "$prev" 2>/dev/null || echo 10000
}
# fio_job TARGET JOB ENGINE-ARGS... (iodepth forced to 1 for psync)
fio_job() {
	local target=$1 job=$2; shift 2
	read -r rw bs qd <<<"$(job_args "$job")"
	local extra=()
	if [ "$job" = fl32 ]; then extra=(--fsync="$(fsync_every "$target")"); fi
	case " $* " in *" --ioengine=psync "*) qd=1 ;; esac
	python3 $HERE/sbs.py run "$RD/$target.$job" "$SERVER_PIDS" -- \
		fio --name="$target-$job" "$@" --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=1 \
		--size=$SIZE --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --norandommap --randrepeat=0 \
		--lat_percentiles=1 "${extra[@]}" --output-format=json --output="$RD/$target.$job.json" || true
}
bench_job() { # bench_job TARGET JOB bench-args...
	local target=$1 job=$2; shift 2
	read -r rw bs qd <<<"$(job_args "$job")"
	local extra=()
	if [ "$job" = fl32 ]; then extra=(--fsync "$(fsync_every "$target")"); fi
	python3 $HERE/sbs.py run "$RD/$target.$job" "$SERVER_PIDS" -- \
		"$BENCH" "$@" "${extra[@]}" --volume vol0 --rw "$rw" --bs "$bs" --iodepth "$qd" --size 1GiB \
		--runtime "${RUNTIME}s" --ramp "${RAMP}s" --prefill=false --interval 1h \
		--output-format json --output "$RD/$target.$job.json" || true
}
bench_procs() { if [ "$PROCS" = 0 ]; then nproc; else echo "$PROCS"; fi; } # bench's --procs for PROCS
prefill_nbd() { # prefill_nbd URI: write the device end to end
	fio --name=prefill --ioengine=nbd --uri="$1" --rw=write --bs=1m --iodepth=8 --size=$SIZE \
		--output="$RD/prefill.log" >/dev/null 2>&1 || echo "   ! prefill of $1 failed"
}
want() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

# ---- targets ----
run_tmpfs() {
	want tmpfs-psync || want tmpfs-uring || return 0
	[ -f "$WORK/file.raw" ] || head -c 1G /dev/urandom >"$WORK/file.raw"
	SERVER_PIDS=
	for j in rr1 rw1 sr8 sw8; do want tmpfs-psync && fio_job tmpfs-psync $j --ioengine=psync --filename="$WORK/file.raw"; done
	for j in $JOBS; do want tmpfs-uring && fio_job tmpfs-uring $j --ioengine=io_uring --filename="$WORK/file.raw"; done
}
run_nbdkit() { # run_nbdkit unix|tcp
	local key=nbdkit-$1 uri
	want "$key" || return 0
	local try
	for try in 1 2 3; do
		# A fresh socket path and port each try: a previous nbdkit that
		# has not finished exiting must not hold them.
		if [ "$1" = unix ]; then
			local sock=$WORK/nbdkit-$RANDOM.sock
			start "$RD/$key.log" nbdkit -f -U "$sock" memory 1G
			uri="nbd+unix:///?socket=$sock"
		else
			local port; port=$(free_port)
			start "$RD/$key.log" nbdkit -f -i 127.0.0.1 -p "$port" memory 1G
			uri="nbd://127.0.0.1:$port/"
		fi
		SERVER_PIDS=$LASTPID
		wait_for nbdkit nbdinfo --size "$uri" && break
		stop_servers
		[ "$try" = 3 ] && return 0
	done
	prefill_nbd "$uri"
	for j in $JOBS; do fio_job "$key" $j --ioengine=nbd --uri="$uri"; done
	stop_servers
}
run_qemu_nbd() {
	want qemu-nbd || return 0
	[ -f "$WORK/qemu.raw" ] || head -c 1G /dev/urandom >"$WORK/qemu.raw"
	start "$RD/qemu-nbd.log" qemu-nbd -t -f raw -e 8 -k "$WORK/qemu.sock" "$WORK/qemu.raw"
	SERVER_PIDS=$LASTPID
	local uri="nbd+unix:///?socket=$WORK/qemu.sock"
	wait_for qemu-nbd nbdinfo --size "$uri" || { stop_servers; return 0; }
	for j in $JOBS fl32 fl32; do fio_job qemu-nbd $j --ioengine=nbd --uri="$uri"; done
	stop_servers
}
# start_srpd WIRE BACKEND: srpd plus 'srpc nbd' in front of it; sets
# SRPD_ADDR, NBD_URI, SERVER_PIDS.
start_srpd() {
	local wire=$1 backend=$2 d=$WORK/srpd-$1-$2 procs=$PROCS
	if [ "$2" = pebble ]; then procs=$PEBBLE_PROCS; fi
	rm -rf "$d"
	mkdir -p "$d"
	if [ "$wire" = shm ]; then SRPD_ADDR=$d/srpd.shm; else SRPD_ADDR=127.0.0.1:$(free_port); fi
	start "$RD/srpd-$wire-$backend.log" "$WORK/bin/srpd" --data "$d/data" --listen "$SRPD_ADDR" \
		--backend "$backend" --wire "$wire" --log-level warn --procs "$procs" "${POLL_OPT[@]}"
	SERVER_PIDS=$LASTPID
	wait_for srpd "$WORK/bin/srpd" status --data "$d/data" || return 1
	start "$RD/srpc-nbd-$wire-$backend.log" "$WORK/bin/srpc" nbd --target "$SRPD_ADDR" --wire "$wire" \
		--procs "$PROCS" "${POLL_OPT[@]}" --socket "$d/nbd.sock" vol0
	SERVER_PIDS=$SERVER_PIDS,$LASTPID
	NBD_URI="nbd+unix:///vol0?socket=$d/nbd.sock"
	wait_for "srpc nbd" nbdinfo --size "$NBD_URI"
}
run_gosrp() { # run_gosrp tcp|shm
	local wire=$1
	want "gosrp-nbd-$wire" || want "bench-$wire" || return 0
	start_srpd "$wire" memory || { stop_servers; return 0; }
	prefill_nbd "$NBD_URI"
	if want "gosrp-nbd-$wire"; then
		for j in $JOBS; do fio_job "gosrp-nbd-$wire" $j --ioengine=nbd --uri="$NBD_URI"; done
	fi
	if [ -n "$BENCH" ] && want "bench-$wire"; then
		# bench is the only client now: the NBD front end idles (its CPU counts).
		for j in $JOBS; do bench_job "bench-$wire" $j --target "$SRPD_ADDR" --provider emu --wire "$wire" --procs "$(bench_procs)" "${POLL_OPT[@]}"; done
	fi
	stop_servers
}
run_pebble() { # run_pebble tcp|shm
	local wire=$1 nbd=gosrp-pebble
	[ "$wire" = tcp ] || nbd= # the NBD front end is measured over tcp only
	{ [ -n "$nbd" ] && want $nbd; } || want "bench-pebble-$wire" || return 0
	start_srpd "$wire" pebble || { stop_servers; return 0; }
	prefill_nbd "$NBD_URI"
	if [ -n "$nbd" ] && want $nbd; then
		for j in rw32 fl32 fl32; do fio_job $nbd $j --ioengine=nbd --uri="$NBD_URI"; done
	fi
	if [ -n "$BENCH" ] && want "bench-pebble-$wire"; then
		for j in rw32 fl32 fl32; do bench_job "bench-pebble-$wire" $j --target "$SRPD_ADDR" --provider emu --wire "$wire" --procs "$(bench_procs)" "${POLL_OPT[@]}"; done
	fi
	stop_servers
}

per_round=$((6 * 9 + 16))
echo "== gosrp processes: --procs $PROCS (pebble srpd: $PEBBLE_PROCS), shm-poll ${SHM_POLL:-adaptive}, poll-pressure $POLL_PRESSURE, GODEBUG=$GODEBUG"
echo "== $ROUNDS round(s) of about $((per_round * (RUNTIME + RAMP + 1) / 60 + 1)) min; results in $OUT"
for r in $(seq "$ROUNDS"); do
	RD=$OUT/r$r
	mkdir -p "$RD"
	echo "== round $r/$ROUNDS ($(date +%T)): load $(cut -d' ' -f1-3 /proc/loadavg); $(python3 $HERE/sbs.py wake 2>&1)"
	for step in run_tmpfs "run_nbdkit unix" "run_nbdkit tcp" run_qemu_nbd "run_gosrp tcp" "run_gosrp shm" "run_pebble tcp" "run_pebble shm"; do
		echo "   $step"
		$step
	done
done
python3 $HERE/sbs.py report "$OUT" | tee "$OUT/table.txt"

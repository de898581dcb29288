#!/usr/bin/env bash
# A benchmark, not a test: 4 KiB random writes at QD32 on one RBD image,
# through srpd --backend rbd (bench over the emulated NIC, tcp) and then
# straight through librbd (rbd bench, once before and once after, so that
# a drift of the machine's load does not favour either), and the ratio of
# srpd's IOPS to the mean of the two rbd bench runs. rbd bench runs twice
# each time: as the rbd tool does by default (librbd's cache on, in
# writethrough until a flush) and with the cache off, as srpd runs
# librbd (a write acknowledged from the cache of a gateway whose lock was
# just broken could never land: block/rbd.go); the second ratio is the
# like-for-like one.
#
#	test/ceph/bench.sh            # starts its own micro cluster
#	CEPH_CONF=... test/ceph/bench.sh   # uses that cluster's pool rbd
#
# RUNTIME (default 20s) is bench's run; SRPD_PROCS, when set, is srpd's
# --procs; SPLIT_CPUS=1 (with the micro cluster this script starts) runs
# the cluster's daemons on CPU 0 and the clients (srpd, bench, rbd
# bench) on the others, as on a gateway with OSDs on other machines; each rbd bench writes IO_TOTAL
# (default 256M, 65536 writes: about 10 s, so that the OSD's sustained
# rate is measured, not a burst). The image (SIZE, default 256MiB) is written
# sequentially first, so that neither run pays for creating RADOS
# objects. Needs a build with -tags ceph,pacific (librbd-dev,
# librados-dev) and ceph-common; stops everything it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."

runtime=${RUNTIME:-20s}
io_total=${IO_TOTAL:-256M}
size=${SIZE:-256MiB}
work=$(mktemp -d)
own_cluster=0
srpd_pid=
ns=
cleanup() {
	if [ -n "$srpd_pid" ]; then kill -TERM "$srpd_pid" 2>/dev/null || true; wait "$srpd_pid" 2>/dev/null || true; fi
	if [ "$own_cluster" = 1 ]; then
		test/ceph/cluster.sh stop "$work/ceph"
	elif [ -n "$ns" ]; then
		# Leave the cluster as it was: each run's image is SIZE of
		# written objects, which a small cluster soon runs out of.
		rbd -c "$conf" rm --no-progress "rbd/$ns/vol0" >/dev/null 2>&1 || true
		rbd -c "$conf" namespace rm "rbd/$ns" >/dev/null 2>&1 || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

if [ -z "${CEPH_CONF:-}" ]; then
	own_cluster=1
	test/ceph/cluster.sh start "$work/ceph"
	eval "$(test/ceph/cluster.sh env "$work/ceph")"
fi
conf=$CEPH_CONF
# on_clients: the prefix that runs a command where the clients run
# (taskset execs it: a background srpd's $! is srpd's own PID).
on_clients=()
if [ "${SPLIT_CPUS:-0}" = 1 ]; then
	[ "$own_cluster" = 1 ] || { echo "SPLIT_CPUS=1 needs the micro cluster this script starts" >&2; exit 2; }
	last=$(($(nproc) - 1))
	[ "$last" -ge 1 ] || { echo "SPLIT_CPUS=1 needs 2 CPUs or more" >&2; exit 2; }
	for pid in $(cat "$work"/ceph/run/*.pid 2>/dev/null); do taskset -a -cp 0 "$pid" >/dev/null; done
	on_clients=(taskset -c "1-$last")
	echo "== the cluster's daemons on CPU 0, the clients on CPUs 1-$last"
fi

go build -tags ceph,pacific -o "$work/bin/" ./cmd/srpd
go build -o "$work/bin/" ./cmd/srpc ./bench

ns=bench$$
rbd -c "$conf" namespace create "rbd/$ns"
image="rbd/$ns/vol0"
port=$((20000 + RANDOM % 20000))
addr=127.0.0.1:$port
procs=()
if [ -n "${SRPD_PROCS:-}" ]; then procs=(--procs "$SRPD_PROCS"); fi
"${on_clients[@]}" "$work/bin/srpd" "${procs[@]}" --backend rbd --rbd-pool rbd --rbd-namespace "$ns" --ceph-conf "$conf" \
	--data "$work/data" --listen "$addr" --default-volume-size "$size" --log-level warn \
	>"$work/srpd.log" 2>&1 &
srpd_pid=$!
for _ in $(seq 1 100); do
	"$work/bin/srpc" list --target "$addr" --timeout 1s >/dev/null 2>&1 && break
	kill -0 "$srpd_pid" 2>/dev/null || { echo "srpd exited: $(tail -n 3 "$work/srpd.log")" >&2; exit 1; }
	sleep 0.2
done
# Allocate every object of the image (srpd opens it only per session).
rbd -c "$conf" bench --io-type write --io-pattern seq --io-size 4M --io-threads 4 \
	--io-total "$(rbd -c "$conf" info "$image" --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')" \
	"$image" >/dev/null

# osd_writes: the OSDs' write count and the sum of their write latencies
# (seconds), from osd.0 alone (the micro cluster has one OSD); empty if
# it cannot be asked.
osd_writes() {
	ceph -c "$conf" tell osd.0 perf dump 2>/dev/null |
		python3 -c 'import json,sys; d=json.load(sys.stdin)["osd"]; print(d["op_w"], d["op_w_latency"]["sum"])' 2>/dev/null || true
}

# osd_inflight WHAT BEFORE AFTER SECONDS: prints the writes osd.0 had in
# flight on average between two osd_writes (Little's law: the sum of
# their latencies over the time). With 32 in flight at the host, a low
# figure means the writes waited before the cluster, in the client.
osd_inflight() {
	[ -n "$2" ] && [ -n "$3" ] || return 0
	python3 -c 'import sys; a=sys.argv[2].split(); b=sys.argv[3].split(); t=float(sys.argv[4]); n=int(b[0])-int(a[0]); l=float(b[1])-float(a[1]); print(f"  {sys.argv[1]}: osd.0 wrote {n} times, {l/max(n,1)*1000:.2f} ms each, {l/t:.1f} in flight on average", file=sys.stderr)' "$@"
}

# librbd_bench [rbd option...]: one rbd bench run; prints its IOPS.
librbd_bench() {
	local line w1 w2 t1
	w1=$(osd_writes)
	t1=$(date +%s.%N)
	line=$("${on_clients[@]}" rbd -c "$conf" "$@" bench --io-type write --io-pattern rand --io-size 4K --io-threads 32 \
		--io-total "$io_total" "$image" | grep '^elapsed:')
	w2=$(osd_writes)
	echo "rbd bench $*: $line" >&2
	osd_inflight "rbd bench $*" "$w1" "$w2" "$(python3 -c 'import sys,time; print(time.time()-float(sys.argv[1]))' "$t1")"
	sed 's/.*ops\/sec: *\([0-9.]*\).*/\1/' <<<"$line"
}

echo "== rbd bench (librbd) before: randwrite 4k, 32 threads, $io_total; cache as rbd's default, then off"
lib1=$(librbd_bench)
off1=$(librbd_bench --rbd-cache=false)

echo "== bench through srpd ${procs[*]} --backend rbd: randwrite 4k QD32, $runtime"
w1=$(osd_writes)
t1=$(date +%s.%N)
"${on_clients[@]}" "$work/bin/bench" --target "$addr" --volume vol0 --rw randwrite --bs 4k --iodepth 32 \
	--runtime "$runtime" --ramp 2s --output-format json >"$work/bench.json" 2>"$work/bench.err"
t2=$(date +%s.%N)
gw=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(round(sum(x["write"]["iops"] for x in j["jobs"])))' "$work/bench.json")
echo "srpd: $gw IOPS"
w2=$(osd_writes)
osd_inflight srpd "$w1" "$w2" "$(python3 -c 'import sys; print(float(sys.argv[2])-float(sys.argv[1]))' "$t1" "$t2")"
echo "== rbd bench (librbd) after"
lib2=$(librbd_bench)
off2=$(librbd_bench --rbd-cache=false)
ratio() { python3 -c "import sys; g,a,b=map(float,sys.argv[2:]); l=(a+b)/2; print(f'ratio srpd/rbd bench {sys.argv[1]}: {g/l:.2f}x (srpd {g:.0f} IOPS, rbd bench {a:.0f} and {b:.0f})')" "$@"; }
ratio "(cache as rbd's default)" "$gw" "$lib1" "$lib2"
ratio "(cache off, as srpd)" "$gw" "$off1" "$off2"

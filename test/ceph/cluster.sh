#!/usr/bin/env bash
# A micro Ceph cluster for the ceph-tagged tests: one monitor and one OSD
# on 127.0.0.1, everything under DIR, no systemd and no fixed system path.
#
#	test/ceph/cluster.sh start DIR   # ready to serve when it returns 0
#	eval "$(test/ceph/cluster.sh env DIR)"   # exports CEPH_CONF
#	test/ceph/cluster.sh stop DIR    # stops the daemons it started, by PID
#	test/ceph/cluster.sh osd-start DIR   # starts the OSD again after a kill
#
# The OSD is bluestore on a sparse file (DIR/osd/block, 4 GiB apparent,
# only what is written takes space); the cluster runs with "auth none",
# pools of size 1 and no manager (nothing here needs one: pool creation,
# RBD and blocklisting are monitor commands, and readiness is probed by a
# real write instead of PG statistics, which the manager would report).
# An "rbd" pool is created and initialised. start fails with one line on
# stderr naming the reason (and the log to read) after CEPH_READY_TIMEOUT
# seconds (default 120). CEPH_ADDR binds the daemons to another local
# IPv4 address than 127.0.0.1 (a veth end, for a test that cuts a
# gateway in a network namespace off from the cluster). Packages:
# ceph-mon ceph-osd ceph-common.
set -euo pipefail

usage() { echo "usage: $0 start|stop|env|osd-start DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$2
starting=0
fail() {
	echo "test/ceph/cluster.sh: $*" >&2
	if [ "$starting" = 1 ]; then
		stop_one "$dir/run/osd.0.pid"
		stop_one "$dir/run/mon.a.pid"
	fi
	exit 1
}

conf_of() { echo "$1/ceph.conf"; }

# pid_alive PIDFILE reports whether the daemon recorded in PIDFILE still
# runs and is ours: its command line names our directory, so a PID the
# kernel reused for another process is never signalled.
pid_alive() {
	local pid
	[ -s "$1" ] || return 1
	pid=$(cat "$1")
	[ -r "/proc/$pid/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir/ceph.conf"
}

stop_one() { # PIDFILE
	local pidfile=$1 pid i
	pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
	pid=$(cat "$pidfile")
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 1 100); do
		pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$pidfile"
}

case "$cmd" in
env)
	dir=$(cd "$dir" && pwd)
	echo "CEPH_CONF=$(conf_of "$dir")"
	echo "export CEPH_CONF"
	exit 0
	;;
stop)
	[ -d "$dir" ] || exit 0
	dir=$(cd "$dir" && pwd)
	stop_one "$dir/run/osd.0.pid"
	stop_one "$dir/run/mon.a.pid"
	exit 0
	;;
start | osd-start) ;;
*) usage ;;
esac

timeout=${CEPH_READY_TIMEOUT:-120}
deadline=$((SECONDS + timeout))
remaining() { echo $((deadline - SECONDS)); }
log_tail() { tail -n 3 "$1" 2>/dev/null | tr '\n' ' '; }

# start_osd starts osd.0 in the foreground of a background job, so that
# $! is its PID.
start_osd() {
	ceph-osd -c "$conf" -i 0 -f >>"$dir/log/osd.out" 2>&1 &
	echo $! >"$dir/run/osd.0.pid"
}

# osd_ready waits until a client's write reaches the OSD: the monitor
# reports the OSD up only after it booted, and PG peering follows.
osd_ready() {
	until timeout 10 rados -c "$conf" -p rbd put ready-probe "$conf" >/dev/null 2>&1; do
		pid_alive "$dir/run/osd.0.pid" || fail "ceph-osd exited: $(log_tail "$dir/log/osd.out") (see $dir/log/osd.0.log)"
		[ "$(remaining)" -gt 0 ] || fail "no write reached the OSD after ${timeout}s (see $dir/log/osd.0.log)"
		sleep 0.5
	done
	rados -c "$conf" -p rbd rm ready-probe >/dev/null 2>&1 || true
}

if [ "$cmd" = osd-start ]; then
	# The OSD of a running cluster, again (a test killed it): a no-op
	# while it runs.
	[ -e "$dir/ceph.conf" ] || fail "no cluster in $dir"
	dir=$(cd "$dir" && pwd)
	conf=$(conf_of "$dir")
	pid_alive "$dir/run/osd.0.pid" || start_osd
	osd_ready
	echo "osd.0 ready in $SECONDS s"
	exit 0
fi

command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null && command -v ceph >/dev/null ||
	fail "ceph-mon, ceph-osd or ceph missing: apt-get install -y --no-install-recommends ceph-mon ceph-osd ceph-common"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
[ -e "$dir/ceph.conf" ] && fail "$dir already holds a cluster (stop it and remove the directory first)"
# A start that fails stops what it started: no daemon outlives the error.
starting=1
mkdir -p "$dir/mon" "$dir/osd" "$dir/log" "$dir/run"

# A free port pair for the monitor (msgr2 and msgr1): never a fixed port,
# so that two clusters (two helpers, a test and CI) do not meet.
in_use=$(ss -Hltn 2>/dev/null | awk '{print $4}' | sed 's/.*://' | sort -u)
port=0
for _ in $(seq 1 50); do
	p=$((20000 + RANDOM % 20000))
	if ! grep -qx "$p" <<<"$in_use" && ! grep -qx "$((p + 1))" <<<"$in_use"; then
		port=$p
		break
	fi
done
[ "$port" -ne 0 ] || fail "no free port pair for the monitor"
fsid=$(cat /proc/sys/kernel/random/uuid)
addr=${CEPH_ADDR:-127.0.0.1}
mon_addr="[v2:$addr:$port,v1:$addr:$((port + 1))]"

conf=$(conf_of "$dir")
cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = $mon_addr
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
run dir = $dir/run
public addr = $addr
cluster addr = $addr
ms bind ipv4 = true
ms bind ipv6 = false
[mon]
mon data = $dir/mon
mon data avail crit = 0
mon data avail warn = 0
mon allow pool delete = true
log file = $dir/log/\$name.log
[osd]
osd data = $dir/osd
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 4294967296
bluestore fsck on mount = false
osd memory target = 1073741824
osd max object name len = 256
osd max object namespace len = 64
osd class load list = *
osd class default list = *
log file = $dir/log/\$name.log
[client]
log to file = false
admin socket =
EOF


monmaptool --create --fsid "$fsid" --addv a "$mon_addr" "$dir/monmap" >/dev/null ||
	fail "monmaptool failed"
ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" >"$dir/log/mon-mkfs.out" 2>&1 ||
	fail "ceph-mon --mkfs failed: $(log_tail "$dir/log/mon-mkfs.out")"
# -f keeps the daemon in the foreground, so $! is its PID; stop kills it.
ceph-mon -c "$conf" -i a -f >"$dir/log/mon.out" 2>&1 &
echo $! >"$dir/run/mon.a.pid"

until timeout 5 ceph -c "$conf" --connect-timeout 5 mon stat >/dev/null 2>&1; do
	pid_alive "$dir/run/mon.a.pid" || fail "ceph-mon exited: $(log_tail "$dir/log/mon.out") (see $dir/log/mon.a.log)"
	[ "$(remaining)" -gt 0 ] || fail "monitor not answering after ${timeout}s (see $dir/log/mon.a.log)"
	sleep 0.5
done

osd_uuid=$(cat /proc/sys/kernel/random/uuid)
id=$(ceph -c "$conf" osd new "$osd_uuid") || fail "ceph osd new failed"
[ "$id" = 0 ] || fail "ceph osd new gave id $id, want 0"
ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd-mkfs.out" 2>&1 ||
	fail "ceph-osd --mkfs failed: $(log_tail "$dir/log/osd-mkfs.out")"
start_osd
ceph -c "$conf" osd pool create rbd 8 8 >/dev/null 2>&1 || fail "ceph osd pool create rbd failed"
osd_ready
timeout 30 rbd -c "$conf" pool init rbd || fail "rbd pool init rbd failed"
echo "ceph micro cluster ready in $SECONDS s: CEPH_CONF=$conf"

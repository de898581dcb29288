#!/bin/sh
# srp-guest.sh: runs INSIDE the srp guest (srp.sh). srpd serves a file
# volume (on a tmpfs) over rxe; the kernel's ib_srp logs in to it with
# the add_target line srpd status prints, and the volume must appear as
# a SCSI disk that takes writes and reads back what was written,
# discards, grows under the host, and survives srpd being SIGKILLed and
# restarted under a mounted ext4 (ib_srp reconnecting); a volume created
# under the logged-in host appears by a rescan, without a new login;
# each disk stays on its own volume when volumes are created and srpd
# restarts, and
# another initiator port's writes ride through the first's LUN reset.
# Then a pebble-backed srpd is SIGKILLed under ext4 with writes in
# flight, and the host must learn of the lost write cache; stopped with
# SIGTERM instead, it must report no loss and lose nothing. Leaves its
# logs in /mnt/out; exits non-zero on failure.
export PATH=/mnt:/usr/sbin:/usr/bin:/sbin:/bin
O=/mnt/out
mkdir -p $O
IP=10.0.2.15
PORT=4450
say() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*" | tee -a $O/steps.log; }
# DIAG, when set, is a command whose output a failure adds to the log.
fail() {
  say "FAIL: $*"
  [ -n "$DIAG" ] && eval "$DIAG" 2>&1 | tee -a $O/steps.log
  dmesg | grep -i -E "srp|scsi|sd " | tail -20 | tee -a $O/steps.log
  exit 1
}

GUID=$(tr -d : < /sys/class/infiniband/rxe0/node_guid)
# The store is the file backend on a tmpfs: it outlives srpd's process,
# deallocates (hole punching), and, unlike pebble, keeps no space
# reserve that a small guest file system cannot meet.
mkdir -m 700 -p /tmp/srpd
mount -t tmpfs -o size=768m,mode=700 tmpfs /tmp/srpd || fail "tmpfs for the store"
# serve LOG PORT FLAGS...: srpd listening on PORT with FLAGS (backend and
# store), the target port named by the node GUID, until it serves.
serve() {
  log=$1 port=$2
  shift 2
  srpd --provider ibverbs --listen $IP:$port --srp-id-ext $GUID --srp-ioc-guid "$(cat /sys/class/infiniband/rxe0/node_guid)" \
    --log-level debug "$@" > $log 2>&1 &
  SRPD=$!
  i=0
  until grep -q msg=serving $log 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 200 ] && fail "srpd not serving: $(tail -3 $log)"; sleep 0.3
  done
}
# relogged LOG WHAT: waits until ib_srp logged in to the srpd writing LOG
# and says how long it took.
relogged() {
  i=0
  until grep -q "msg=login " $1; do
    i=$((i + 1)); [ $i -gt 120 ] && fail "ib_srp did not reconnect $2"; sleep 0.5
  done
  say "ib_srp reconnected after $((i / 2)) s"
}
# start_srpd LOG: the file-backed srpd on the store in /tmp/srpd.
start_srpd() { serve $1 $PORT --backend file --data /tmp/srpd --default-volume-size 64MiB; }
start_srpd $O/srpd.log
say "srpd serving on $IP:$PORT"
# reconnect_delay: ib_srp logs in again by itself when srpd comes back;
# fast_io_fail_tmo and dev_loss_tmo leave the restart time to do so
# (module parameters, the defaults of each port's sysfs attributes).
modprobe ib_srp reconnect_delay=2 fast_io_fail_tmo=60 dev_loss_tmo=120 && modprobe sd_mod || fail "modprobe"
LINE=$(srpd status --data /tmp/srpd | sed -n 's/.*ib_srp add_target: //p')
[ "$LINE" = "id_ext=$GUID,ioc_guid=$GUID,dest=$IP:$PORT" ] || fail "srpd status add_target line '$LINE'"
echo "$LINE" > /sys/class/infiniband_srp/srp-rxe0-1/add_target || fail "add_target refused"
say "add_target: $LINE (from srpd status)"
i=0
while ! ls /sys/block | grep -q '^sd' && [ $i -lt 60 ]; do i=$((i + 1)); sleep 0.5; done
D=$(ls /sys/block | grep '^sd' | head -1)
[ -n "$D" ] || fail "no disk appeared"
say "disk /dev/$D: $(cat /sys/block/$D/size) sectors of $(cat /sys/block/$D/queue/logical_block_size) bytes; vendor '$(cat /sys/block/$D/device/vendor 2>/dev/null)' model '$(cat /sys/block/$D/device/model 2>/dev/null)'"
echo 15 > /sys/block/$D/device/timeout
if command -v sg_vpd > /dev/null; then
  { sg_inq /dev/$D; sg_vpd -p di /dev/$D; sg_vpd -p bl /dev/$D; sg_vpd -p lbpv /dev/$D; sg_readcap -l /dev/$D; } > $O/sg.log 2>&1 || fail "sg3-utils: $(tail -5 $O/sg.log)"
  grep -q 'LBPU): 1' $O/sg.log || fail "VPD 0xB2 does not offer UNMAP: $(grep -A8 'provisioning' $O/sg.log)"
  grep -q 'LBPME)=1' $O/sg.log || grep -q 'lbpme=1' $O/sg.log || fail "READ CAPACITY(16) without LBPME: $(tail -12 $O/sg.log)"
  say "sg_inq, sg_vpd di/bl/lbpv, sg_readcap: NAA $(grep -A1 'designator type: NAA' $O/sg.log | tail -1 | tr -d ' '); thin provisioning with UNMAP"
fi
# srpd polls its CQs adaptively by default (cmd/srpd): a waiter whose
# waits outlast 2 ms polls 50 us and sleeps. A logged-in host that sends
# nothing must therefore cost srpd next to no CPU: a poll that failed to
# back off would burn a vCPU (1000 ticks in these 10 s). The bound is
# 5% of a CPU; measured: 0 ticks in 20 s.
sleep 2
T0=$(awk '{print $14 + $15}' /proc/$SRPD/stat)
sleep 10
IDLE=$(( $(awk '{print $14 + $15}' /proc/$SRPD/stat) - T0 ))
[ $IDLE -le 50 ] || fail "srpd used $IDLE ticks of CPU in 10 s with its host idle (busy_poll=adaptive should sleep)"
say "srpd idle with ib_srp logged in: $IDLE ticks of CPU in 10 s"
# Persistent reservations, the kernel's and a gosrp host's on one volume:
# the kernel registers and reserves write-exclusive (sg_persist through
# ib_srp); the gosrp host (srpc over ibverbs) sees the reservation, and
# preempts the kernel's key with exclusive access, with abort, while fio
# writes through the kernel at QD16: that is the fence. The gosrp host
# then writes 8 MiB of its own over fio's region; fio must fail (its
# writes refused), and the region read back must be the gosrp host's
# bytes: a kernel write that landed after the preempt's answer would
# show. The kernel's next read must fail as a reservation conflict (the
# status, not an error dm-multipath would fail the path for); cleared,
# the kernel reads again.
if command -v sg_persist > /dev/null && [ -x /mnt/srpc ]; then
  PR="srpc reserve --provider ibverbs --target $IP:$PORT --name gosrp-pr"
  DIAG="cat $O/pr.log"
  sg_persist -n --out --register --param-sark=0xabc /dev/$D > $O/pr.log 2>&1 || fail "sg_persist register"
  sg_persist -n --out --reserve --param-rk=0xabc --prout-type=1 /dev/$D >> $O/pr.log 2>&1 || fail "sg_persist reserve"
  sg_persist -n --in --read-keys /dev/$D >> $O/pr.log 2>&1 || fail "sg_persist read keys"
  sg_persist -n --in --read-reservation /dev/$D >> $O/pr.log 2>&1 || fail "sg_persist read reservation"
  grep -q "Key=0xabc" $O/pr.log || fail "sg_persist reads no reservation of key 0xabc"
  $PR show vol0 >> $O/pr.log 2>&1 || fail "srpc reserve show"
  grep -q "write-exclusive by" $O/pr.log || fail "the gosrp host sees no reservation"
  $PR register vol0 0xb >> $O/pr.log 2>&1 || fail "srpc reserve register"
  # READ FULL STATUS names the kernel by its SRP initiator port, the
  # gosrp host by its name (scsi.NamedTransportID).
  sg_persist -n --in --read-full-status /dev/$D > $O/pr-full.log 2>&1 || fail "sg_persist read full status: $(cat $O/pr-full.log)"
  cat $O/pr-full.log >> $O/pr.log
  grep -q "Key=0xabc" $O/pr-full.log && grep -q "Key=0xb" $O/pr-full.log && grep -qi "reservation holder" $O/pr-full.log &&
    grep -qE "RDMA initiator port|SRP" $O/pr-full.log || fail "sg_persist --read-full-status: $(cat $O/pr-full.log)"
  fio --name=fenced --filename=/dev/$D --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=16 --size=8m \
    --time_based --runtime=120 > $O/fio-fenced.log 2>&1 &
  FIO=$!
  sleep 3
  kill -0 $FIO 2>/dev/null || fail "fio ended before the preempt: $(tail -5 $O/fio-fenced.log)"
  $PR preempt --key 0xb --victim 0xabc --type exclusive-access --abort vol0 >> $O/pr.log 2>&1 || fail "srpc reserve preempt"
  head -c 8M /dev/urandom > /tmp/fence.img
  CONN="--provider ibverbs --target $IP:$PORT --name gosrp-pr"
  srpc import $CONN vol0 /tmp/fence.img >> $O/pr.log 2>&1 || fail "the preempting host's import"
  if wait $FIO; then
    fail "fio wrote on through the preempt: $(tail -5 $O/fio-fenced.log)"
  fi
  srpc export $CONN --length 8MiB vol0 /tmp/fence.out >> $O/pr.log 2>&1 || fail "the preempting host's export"
  cmp /tmp/fence.img /tmp/fence.out >> $O/pr.log 2>&1 || fail "a write of the preempted kernel landed after the preempt: $(tail -2 $O/pr.log)"
  FENCED="fio's writes refused from the preempt on ($(grep -o -m1 'io_u error[^:]*: [^:]*' $O/fio-fenced.log)), the preempting host's 8 MiB intact"
  if dd if=/dev/$D of=/dev/null bs=4k count=1 iflag=direct >> $O/pr.log 2>&1; then
    fail "the kernel read through another host's exclusive-access reservation"
  fi
  dmesg | grep -q "reservation conflict" || fail "the kernel's refused read was no reservation conflict: $(dmesg | tail -5)"
  $PR clear --key 0xb vol0 >> $O/pr.log 2>&1 || fail "srpc reserve clear"
  dd if=/dev/$D of=/dev/null bs=4k count=1 iflag=direct >> $O/pr.log 2>&1 || fail "the kernel's read once the reservations were cleared"
  DIAG=
  say "persistent reservations: the kernel's (sg_persist) seen by a gosrp host, both in READ FULL STATUS; its preempt with abort fenced the kernel under QD16 writes: $FENCED; the kernel's read a reservation conflict; cleared, the kernel reads"
fi
# One request of each size first, so a failure says which size fails.
for bs in 4k 8k 64k 128k 256k 512k; do
  if timeout 60 dd if=/dev/urandom of=/dev/$D bs=$bs count=1 oflag=direct 2>/dev/null; then say "write of $bs: ok"; else say "write of $bs: FAILED"; fi
  if timeout 60 dd if=/dev/$D of=/dev/null bs=$bs count=1 iflag=direct 2>/dev/null; then say "read of $bs: ok"; else say "read of $bs: FAILED"; fi
done
head -c 4194304 /dev/urandom > /tmp/pattern
dd if=/tmp/pattern of=/dev/$D bs=1M oflag=direct 2>> $O/steps.log || fail "write"
sync
dd if=/dev/$D of=/tmp/back bs=1M count=4 iflag=direct 2>> $O/steps.log || fail "read"
cmp /tmp/pattern /tmp/back || fail "read back differs"
say "4 MiB written and read back equal through /dev/$D"
if command -v fio > /dev/null; then
  fio --name=verify --filename=/dev/$D --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=32 --size=32m --verify=crc32c --do_verify=1 > $O/fio-verify.log 2>&1 || fail "fio verify: $(tail -5 $O/fio-verify.log)"
  say "fio randwrite QD32 with crc32c verify: $(grep -o 'IOPS=[^,]*' $O/fio-verify.log | head -2 | tr '\n' ' ')"
fi

# Discard: the volume deallocates, so the kernel must offer discard, and
# a discarded range reads back as zeros while its neighbours keep their
# data.
DMAX=$(cat /sys/block/$D/queue/discard_max_bytes)
[ "$DMAX" -gt 0 ] || fail "no discard on /dev/$D (discard_max_bytes 0)"
dd if=/tmp/pattern of=/dev/$D bs=1M count=4 oflag=direct 2>> $O/steps.log || fail "write before discard"
blkdiscard -o 1048576 -l 2097152 /dev/$D || fail "blkdiscard"
head -c 2097152 /dev/zero > /tmp/zero2m
dd if=/dev/$D of=/tmp/back bs=1M count=4 iflag=direct 2>> $O/steps.log || fail "read after discard"
dd if=/tmp/back of=/tmp/mid bs=1M skip=1 count=2 2>/dev/null
cmp /tmp/mid /tmp/zero2m || fail "a discarded range does not read as zeros"
cmp -n 1048576 /tmp/back /tmp/pattern || fail "discard touched the MiB before the range"
dd if=/tmp/back of=/tmp/last bs=1M skip=3 count=1 2>/dev/null
dd if=/tmp/pattern of=/tmp/plast bs=1M skip=3 count=1 2>/dev/null
cmp /tmp/last /tmp/plast || fail "discard touched the MiB after the range"
say "blkdiscard of 2 MiB (discard_max_bytes $DMAX): reads back zeros, neighbours intact"

# Resize under the host: srpd grows the volume, the next command on the
# disk meets CAPACITY DATA HAS CHANGED, and a rescan gives the new size.
srpd volume resize --data /tmp/srpd --size 96MiB vol0 >> $O/steps.log 2>&1 || fail "srpd volume resize"
dd if=/dev/$D of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null
echo 1 > /sys/block/$D/device/rescan
i=0
while [ "$(cat /sys/block/$D/size)" != 196608 ] && [ $i -lt 20 ]; do i=$((i + 1)); sleep 0.5; done
[ "$(cat /sys/block/$D/size)" = 196608 ] || fail "after the resize the disk has $(cat /sys/block/$D/size) sectors, want 196608"
UA=no
dmesg | grep -qi "capacity data has changed" && UA=yes
say "volume resized to 96 MiB under the host: /dev/$D has $(cat /sys/block/$D/size) sectors after a rescan (unit attention logged: $UA)"
if command -v mkfs.ext4 > /dev/null; then
  mkfs.ext4 -q -F /dev/$D > $O/mkfs.log 2>&1 || fail "mkfs.ext4: $(tail -3 $O/mkfs.log)"
  modprobe ext4
  mkdir -p /tmp/m && mount /dev/$D /tmp/m || fail "mount"
  cp /tmp/pattern /tmp/m/file && sync || fail "file write"
  say "ext4 made and mounted, a file written and synced"
  # srpd SIGKILLed under the mounted filesystem and started again on the
  # same store: ib_srp reconnects (reconnect_delay) and the disk goes on.
  kill -9 $SRPD
  wait $SRPD 2>/dev/null
  say "srpd SIGKILLed"
  start_srpd $O/srpd-restarted.log
  say "srpd restarted"
  i=0
  until grep -qx running /sys/class/srp_remote_ports/*/state 2>/dev/null && grep -q "msg=login " $O/srpd-restarted.log; do
    i=$((i + 1)); [ $i -gt 120 ] && fail "ib_srp did not reconnect: rport $(cat /sys/class/srp_remote_ports/*/state 2>/dev/null)"; sleep 0.5
  done
  say "ib_srp reconnected after $((i / 2)) s: $(dmesg | grep -i reconnect | tail -1)"
  cp /tmp/pattern /tmp/m/file2 && sync || fail "write after the restart"
  echo 3 > /proc/sys/vm/drop_caches
  cmp /tmp/pattern /tmp/m/file || fail "the file synced before the kill differs after the restart"
  cmp /tmp/pattern /tmp/m/file2 || fail "the file written after the restart differs"
  umount /tmp/m || fail "umount"
  e2fsck -fn /dev/$D > $O/fsck.log 2>&1 || fail "e2fsck: $(tail -5 $O/fsck.log)"
  say "after the restart: both files intact, unmounted, e2fsck -fn clean"
fi

# Stable LUNs: a host keeps a SCSI disk per LUN number across
# reconnects, so a volume created since, even one whose name sorts
# first, must take a new number, and after srpd restarts each disk must
# still be its own volume (target.LUNStore, DATA/srp-luns.json). Before
# numbers were kept, LUN n was the n-th volume by name at each login, and
# this restart would have put the new, empty volume under LUN 0. vol5
# is created while the host is logged in: srpd adds it to the live
# session as LUN 1 (docs/srp.md, "Live LUN table") and raises REPORTED
# LUNS DATA HAS CHANGED on LUN 0, and a sysfs rescan (what udev does on
# that unit attention) finds it without a new login.
rescan() { for h in /sys/class/scsi_host/host*; do echo "- - -" > $h/scan; done; }
# disk_of LUN: the sd disk of LUN on the (only) SRP target, or nothing.
disk_of() {
  for b in /sys/block/sd*; do
    case "$(readlink $b/device)" in */[0-9]*:0:0:$1) basename $b; return ;; esac
  done
}
# ident DISK: its VPD 0x83 designators, one line.
ident() { sg_vpd -p di /dev/$1 2>/dev/null | grep -A1 designator | tr -s ' ' | tr '\n' ' '; }
# drop_ports: ib_srp forgets the target; its disks go.
drop_ports() {
  for p in /sys/class/srp_remote_ports/port-*; do echo 1 > $p/delete 2>/dev/null; done
  i=0
  while ls /sys/block | grep -q '^sd' && [ $i -lt 40 ]; do i=$((i + 1)); sleep 0.5; done
  ls /sys/block | grep -q '^sd' && fail "the SRP disks did not go away"
  # The target goes after its disks (srp_remove_work); until it has,
  # ib_srp refuses to add one of the same identity.
  i=0
  while ls /sys/class/srp_remote_ports/ 2>/dev/null | grep -q port && [ $i -lt 40 ]; do i=$((i + 1)); sleep 0.5; done
}
# add_target LINE: ib_srp logs in to the target LINE names, retried for
# a few seconds (a target of the same identity may still be going).
add_target() {
  i=0
  until echo "$1" 2> $O/add_target.err > /sys/class/infiniband_srp/srp-rxe0-1/add_target; do
    i=$((i + 1)); [ $i -gt 20 ] && fail "add_target $1: $(cat $O/add_target.err); $(dmesg | grep -i srp | tail -2)"; sleep 0.5
  done
}
# wait_lun LUN: waits (rescanning) until LUN has a disk.
wait_lun() {
  i=0
  while [ -z "$(disk_of $1)" ] && [ $i -lt 40 ]; do i=$((i + 1)); sleep 0.5; rescan; done
}
# logins: how many SRP logins srpd has logged, over its restarts.
logins() { cat $O/srpd*.log | grep -c "msg=login "; }
D=$(disk_of 0)
[ -n "$D" ] || fail "no disk for LUN 0 before vol5: $(ls -l /sys/block | grep sd)"
L0=$(logins) PORTS0=$(ls /sys/class/srp_remote_ports/)
srpd volume create --data /tmp/srpd --size 8MiB vol5 >> $O/steps.log 2>&1 || fail "srpd volume create vol5"
grep -q '"vol5": 1' /tmp/srpd/srp-luns.json || fail "srp-luns.json does not give vol5 LUN 1: $(cat /tmp/srpd/srp-luns.json)"
# A command on LUN 0 meets the unit attention (Linux logs it and retries).
i=0
until dmesg | grep -q "LUN assignments on this target have changed" || [ $i -ge 20 ]; do
  dd if=/dev/$D of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; i=$((i + 1)); sleep 0.2
done
UA=no
dmesg | grep -q "LUN assignments on this target have changed" && UA=yes
wait_lun 1
D1=$(disk_of 1)
[ -n "$D1" ] || fail "vol5 did not appear as LUN 1 after a rescan without a new login (unit attention logged: $UA): $(ls -l /sys/block | grep sd)"
[ "$(disk_of 0)" = "$D" ] || fail "LUN 0 moved from /dev/$D to /dev/$(disk_of 0)"
[ "$(logins)" = "$L0" ] && [ "$(ls /sys/class/srp_remote_ports/)" = "$PORTS0" ] ||
  fail "vol5 appeared through a new login ($L0 -> $(logins) logins, ports '$PORTS0' -> '$(ls /sys/class/srp_remote_ports/)')"
[ "$(cat /sys/block/$D1/size)" = 16384 ] || fail "LUN 1 (/dev/$D1) has $(cat /sys/block/$D1/size) sectors, want vol5's 16384"
e2fsck -fn /dev/$D > $O/fsck-lun0.log 2>&1 || fail "LUN 0 is not vol0's ext4 after vol5 came: $(tail -3 $O/fsck-lun0.log)"
dd if=/tmp/pattern of=/dev/$D1 bs=1M count=2 oflag=direct 2>> $O/steps.log || fail "write vol5"
dd if=/dev/$D1 of=/tmp/back bs=1M count=2 iflag=direct 2>> $O/steps.log || fail "read vol5"
cmp -n 2097152 /tmp/back /tmp/pattern || fail "/dev/$D1 (LUN 1) does not read back what was written to vol5"
SUM0=$(dd if=/dev/$D bs=1M count=4 iflag=direct 2>/dev/null | md5sum)
ID0=$(ident $D) ID1=$(ident $D1)
say "vol5 created under the logged-in host: LUN 1 (/dev/$D1) after a sysfs rescan, no new login, written and read back; vol0 stays LUN 0 (/dev/$D); REPORTED LUNS DATA HAS CHANGED logged: $UA"
# A volume whose name sorts before both, then a restart: ib_srp
# reconnects and keeps its disks, which must be the same volumes.
srpd volume create --data /tmp/srpd --size 4MiB aaa >> $O/steps.log 2>&1 || fail "srpd volume create aaa"
kill $SRPD
wait $SRPD 2>/dev/null
start_srpd $O/srpd-luns.log
relogged $O/srpd-luns.log "after the restart with a new first volume"
[ "$(disk_of 0)" = "$D" ] && [ "$(disk_of 1)" = "$D1" ] || fail "the disks moved: LUN 0 $(disk_of 0), LUN 1 $(disk_of 1)"
[ "$(dd if=/dev/$D bs=1M count=4 iflag=direct 2>/dev/null | md5sum)" = "$SUM0" ] || fail "/dev/$D (LUN 0) no longer reads as vol0 after the restart"
dd if=/dev/$D1 of=/tmp/back bs=1M count=2 iflag=direct 2>> $O/steps.log || fail "read vol5 after the restart"
cmp -n 2097152 /tmp/back /tmp/pattern || fail "/dev/$D1 (LUN 1) no longer reads as vol5 after the restart"
[ "$(ident $D)" = "$ID0" ] && [ "$(ident $D1)" = "$ID1" ] || fail "a disk's VPD 0x83 identity changed across the restart: $ID0 / $(ident $D)"
wait_lun 2
D2=$(disk_of 2)
[ -n "$D2" ] || fail "aaa did not appear as LUN 2 after a rescan"
[ "$(cat /sys/block/$D2/size)" = 8192 ] || fail "LUN 2 (/dev/$D2) has $(cat /sys/block/$D2/size) sectors, want aaa's 8192"
say "after a restart with aaa (sorting first) created: LUN 0 and 1 read as vol0 and vol5, same VPD 0x83 identities; aaa is LUN 2 (/dev/$D2)"

# Another host's LOGICAL UNIT RESET: a second initiator port (ib_srp's
# initiator_ext) logs in to the same target, a second I_T nexus with a
# SCSI host and disks of its own. While it writes vol5 with verification,
# the first host resets vol5's LUN (sg_reset -d: srp_reset_device sends
# SRP_TSK_LUN_RESET). srpd aborts the second nexus's commands of vol5
# too and answers them TASK ABORTED (SAM-5 6.3.3, TAS), which Linux
# retries (scsi_decide_disposition), and then reports the reset as a unit
# attention, which it retries too: the writer must finish without an
# error and verify what it wrote, and neither host may lose its
# connection.
H0=$(readlink /sys/block/$D1/device | sed -E 's|.*/([0-9]+):0:0:1$|\1|')
# lun1_elsewhere: the disk of LUN 1 on an SCSI host other than H0.
lun1_elsewhere() {
  for b in /sys/block/sd*; do
    case "$(readlink $b/device)" in */$H0:0:0:1) ;; */[0-9]*:0:0:1) basename $b; return ;; esac
  done
}
add_target "$LINE,initiator_ext=0000000000000002"
i=0
while [ -z "$(lun1_elsewhere)" ] && [ $i -lt 60 ]; do i=$((i + 1)); sleep 0.5; done
B1=$(lun1_elsewhere)
[ -n "$B1" ] || fail "the second initiator port's disk of vol5 did not appear: $(ls -l /sys/block | grep sd)"
echo 15 > /sys/block/$B1/device/timeout
RECONNECTS=$(dmesg | grep -c "reconnect succeeded")
fio --name=other-host --filename=/dev/$B1 --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=16 \
  --size=6m --loops=20 --verify=crc32c --do_verify=1 > $O/fio-other-host.log 2>&1 &
FIO=$!
sleep 2
# aborted_others: how many of the other nexus's commands srpd has
# aborted for resets so far (one log line per channel and reset).
aborted_others() {
  grep -o "msg=\"SRP commands aborted by another I_T nexus's task management; answered TASK ABORTED\" function=\"LOGICAL UNIT RESET\" volume=vol5 aborted=[0-9]*" $O/srpd-luns.log |
    sed 's/.*aborted=//' | awk '{ n += $1 } END { print n + 0 }'
}
# A command is abortable only while srpd holds it (its data being
# fetched, its job running), a small part of its life over rxe, and none
# while fio reads back to verify: reset again, up to 40 times, until one
# reset caught some, so that every run answers TASK ABORTED to Linux.
# Three runs needed 1, 3 and more than 10 resets (one in four or five
# catches some, under TCG): 40 leave a miss of every try to chance
# (below 1 in 10,000) rather than to the run.
RESETS=0
while [ "$(aborted_others)" = 0 ] && [ $RESETS -lt 40 ]; do
  kill -0 $FIO 2>/dev/null || fail "the second host's writer ended before a reset caught its commands ($RESETS resets): $(tail -5 $O/fio-other-host.log)"
  sg_reset -d /dev/$D1 > $O/sg-reset.log 2>&1 || fail "sg_reset -d /dev/$D1: $(cat $O/sg-reset.log)"
  RESETS=$((RESETS + 1))
  sleep 0.3
done
ABORTED=$(aborted_others)
[ "$ABORTED" -gt 0 ] || fail "$RESETS LOGICAL UNIT RESETs of vol5 aborted none of the other nexus's commands"
wait $FIO || fail "the second host's writer failed across the first host's LUN resets: $(grep -i -E 'err|verify|bad' $O/fio-other-host.log | head -5)"
[ "$(dmesg | grep -c 'reconnect succeeded')" = "$RECONNECTS" ] || fail "a host reconnected during the LUN resets: $(dmesg | grep -i srp | tail -3)"
[ "$(grep -c 'msg="SRP task management" function="LOGICAL UNIT RESET" lun=1 volume=vol5' $O/srpd-luns.log)" = $RESETS ] ||
  fail "srpd logged $(grep -c 'function="LOGICAL UNIT RESET" lun=1' $O/srpd-luns.log) LOGICAL UNIT RESETs of vol5, want $RESETS"
say "$RESETS LOGICAL UNIT RESETs of vol5 from /dev/$D1 during the other port's verified writes to /dev/$B1: srpd answered TASK ABORTED to $ABORTED of the other nexus's commands; the writer verified, $(grep -o 'IOPS=[^,]*' $O/fio-other-host.log | head -1), no reconnect"

# A reservation unit attention, as the kernel hears it (SPC-4 5.13.11):
# both initiator ports register on vol5, the second reserves it
# write-exclusive, and the first preempts it. The second port lost its
# registration, so its I_T nexus owes REGISTRATIONS PREEMPTED (2A/05):
# its next command (sg_turs, through the kernel's SG_IO) must be
# answered with it, and only that one. The preempting port cannot be the
# one to listen: after its LOGICAL UNIT RESETs the kernel expects a unit
# attention there (scsi_check_sense's expecting_cc_ua) and retries the
# first one it gets, so the tool would never see it. The preempted
# port's write must then fail as a reservation conflict; the preempting
# port clears all.
if command -v sg_persist > /dev/null; then
  DIAG="cat $O/pr-ua.log"
  sg_turs /dev/$D1 > $O/pr-ua.log 2>&1 || true # whatever either nexus was owed before
  sg_turs /dev/$B1 >> $O/pr-ua.log 2>&1 || true
  sg_persist -n --out --register --param-sark=0x1 /dev/$D1 >> $O/pr-ua.log 2>&1 || fail "sg_persist register on /dev/$D1"
  sg_persist -n --out --register --param-sark=0x2 /dev/$B1 >> $O/pr-ua.log 2>&1 || fail "sg_persist register on /dev/$B1"
  sg_persist -n --out --reserve --param-rk=0x2 --prout-type=1 /dev/$B1 >> $O/pr-ua.log 2>&1 || fail "sg_persist reserve on /dev/$B1"
  sg_turs /dev/$B1 >> $O/pr-ua.log 2>&1 || fail "the reservation holder owed a unit attention before the preempt"
  sg_persist -n --out --preempt --param-rk=0x1 --param-sark=0x2 --prout-type=1 /dev/$D1 >> $O/pr-ua.log 2>&1 || fail "sg_persist preempt from /dev/$D1"
  rc=0; sg_turs -v /dev/$B1 > $O/pr-ua-turs.log 2>&1 || rc=$?
  cat $O/pr-ua-turs.log >> $O/pr-ua.log
  # sg3_utils' exit status 6 is a unit attention (SG_LIB_CAT_UNIT_ATTENTION).
  [ $rc = 6 ] || fail "the preempted nexus's TEST UNIT READY: exit $rc, want 6 (a unit attention)"
  grep -qi "registrations preempted" $O/pr-ua-turs.log || fail "the preempted nexus's unit attention is not REGISTRATIONS PREEMPTED: $(cat $O/pr-ua-turs.log)"
  sg_turs /dev/$B1 >> $O/pr-ua.log 2>&1 || fail "the preempted nexus's unit attention was reported more than once"
  if dd if=/dev/zero of=/dev/$B1 bs=4k count=1 oflag=direct >> $O/pr-ua.log 2>&1; then
    fail "the preempted port wrote through the other port's write-exclusive reservation"
  fi
  sg_persist -n --out --clear --param-rk=0x1 /dev/$D1 >> $O/pr-ua.log 2>&1 || fail "sg_persist clear from /dev/$D1"
  dd if=/dev/zero of=/dev/$B1 bs=4k count=1 oflag=direct >> $O/pr-ua.log 2>&1 || fail "the preempted port's write once the reservations were cleared"
  DIAG=
  say "a preempt through /dev/$D1 answered the preempted port's next TEST UNIT READY (/dev/$B1) with $(grep -io -m1 'registrations preempted' $O/pr-ua-turs.log), once; its write then a reservation conflict; cleared, it writes"
fi

# SPEC_I_PT and REGISTER AND MOVE, as the kernel's sg_persist sends
# them (a TransportID on the command line makes its REGISTER set
# SPEC_I_PT): /dev/$D1's port registers itself and /dev/$B1's port with
# one REGISTER; B1, which sent no registration, reserves write-exclusive
# with that key; B1 moves the reservation to D1's port with a new key
# and UNREG. D1 then writes and B1 is refused. The ports' identifiers
# are srpd's registrants (srpd status) of one registration each, made
# and removed first. sg_persist's "srp," form wants 16 hex digits for a
# 16-byte identifier, so the TransportIDs are given byte by byte.
if command -v sg_persist > /dev/null; then
  DIAG="cat $O/pr-move.log"
  tid() { echo "04,0,0,0,0,0,0,0$(echo $1 | sed 's/../,&/g')"; }
  sg_persist -n --out --register --param-sark=0x7 /dev/$B1 > $O/pr-move.log 2>&1 || fail "sg_persist register on /dev/$B1"
  sg_persist -n --out --register --param-sark=0x8 /dev/$D1 >> $O/pr-move.log 2>&1 || fail "sg_persist register on /dev/$D1"
  REGS=$(srpd status --data /tmp/srpd | awk '/^RESERVED/ {r = 1; next} r && $1 == "vol5" {print $5; exit}')
  BPORT=${REGS%%,*} DPORT=${REGS##*,}
  echo "$BPORT $DPORT" | grep -qE '^[0-9a-f]{32} [0-9a-f]{32}$' || fail "srpd status names no two SRP ports of vol5: '$REGS'"
  sg_persist -n --out --register --param-rk=0x7 --param-sark=0 /dev/$B1 >> $O/pr-move.log 2>&1 || fail "sg_persist unregister on /dev/$B1"
  sg_persist -n --out --register --param-rk=0x8 --param-sark=0 /dev/$D1 >> $O/pr-move.log 2>&1 || fail "sg_persist unregister on /dev/$D1"
  sg_persist -n --out --register --param-sark=0xd1 --transport-id=$(tid $BPORT) /dev/$D1 >> $O/pr-move.log 2>&1 ||
    fail "sg_persist register with SPEC_I_PT on /dev/$D1 naming $BPORT"
  sg_persist -n --in --read-keys /dev/$B1 > $O/pr-keys.log 2>&1 || fail "sg_persist read keys on /dev/$B1"
  cat $O/pr-keys.log >> $O/pr-move.log
  [ "$(grep -c '0xd1$' $O/pr-keys.log)" = 2 ] || fail "after SPEC_I_PT, READ KEYS lists 0xd1 other than twice: $(cat $O/pr-keys.log)"
  sg_persist -n --out --reserve --param-rk=0xd1 --prout-type=1 /dev/$B1 >> $O/pr-move.log 2>&1 ||
    fail "/dev/$B1, registered by the other port's SPEC_I_PT, could not reserve with its key"
  if dd if=/dev/zero of=/dev/$D1 bs=4k count=1 oflag=direct >> $O/pr-move.log 2>&1; then
    fail "/dev/$D1 wrote through the other port's write-exclusive reservation"
  fi
  sg_persist -n --out --register-move --param-rk=0xd1 --param-sark=0xd2 --prout-type=1 --unreg --transport-id=$(tid $DPORT) /dev/$B1 >> $O/pr-move.log 2>&1 ||
    fail "sg_persist register-move on /dev/$B1 to $DPORT"
  sg_persist -n --in --read-reservation /dev/$D1 > $O/pr-res.log 2>&1 || fail "sg_persist read reservation on /dev/$D1"
  cat $O/pr-res.log >> $O/pr-move.log
  grep -q "Key=0xd2" $O/pr-res.log || fail "after the move, the reservation is not held with key 0xd2: $(cat $O/pr-res.log)"
  dd if=/dev/zero of=/dev/$D1 bs=4k count=1 oflag=direct >> $O/pr-move.log 2>&1 || fail "/dev/$D1, holding the moved reservation, could not write"
  if dd if=/dev/zero of=/dev/$B1 bs=4k count=1 oflag=direct >> $O/pr-move.log 2>&1; then
    fail "/dev/$B1 wrote after it moved the reservation away and unregistered"
  fi
  sg_persist -n --out --clear --param-rk=0xd2 /dev/$D1 >> $O/pr-move.log 2>&1 || fail "sg_persist clear from /dev/$D1"
  sg_turs /dev/$B1 > /dev/null 2>&1 || true # the clear's unit attention, if owed
  DIAG=
  say "SPEC_I_PT from /dev/$D1 registered /dev/$B1's port (READ KEYS: two keys 0xd1); /dev/$B1 reserved with it, then its REGISTER AND MOVE with UNREG handed the reservation to /dev/$D1's port (Key=0xd2): that one writes, the other is refused"
fi

# pebble under fire: srpd on the pebble backend SIGKILLed while ext4
# writes through ib_srp. pebble's WAL writer holds acknowledged writes
# in the process for moments, so the restarted srpd must report a lost
# write cache (docs/srp.md, Unit attentions): the host's next flush
# fails with WRITE ERROR, jbd2's commit sees it and ext4 stops
# writing, instead of going on over a hole. What was synced before the
# kill must read back after e2fsck.
drop_ports
kill $SRPD
wait $SRPD 2>/dev/null
umount /tmp/srpd
PPORT=4451
mkdir -m 700 -p /tmp/srpp
mount -t tmpfs -o size=640m,mode=700 tmpfs /tmp/srpp || fail "tmpfs for the pebble store"
start_pebble() { serve $1 $PPORT --backend pebble --data /tmp/srpp --space-reserve 32MiB --default-volume-size 128MiB; }
start_pebble $O/srpd-pebble.log
PLOG=$O/srpd-pebble.log
DIAG='df -k /tmp/srpp | tail -1; du -sk /tmp/srpp/* | tr "\n" " "; echo; grep -m1 MemTotal /proc/meminfo; grep MemAvailable /proc/meminfo; grep -E "level=(ERROR|WARN)" $PLOG | tail -5'
LINE=$(srpd status --data /tmp/srpp | sed -n 's/.*ib_srp add_target: //p')
add_target "$LINE"
i=0
while ! ls /sys/block | grep -q '^sd' && [ $i -lt 60 ]; do i=$((i + 1)); sleep 0.5; done
D=$(ls /sys/block | grep '^sd' | head -1)
[ -n "$D" ] || fail "the pebble volume did not appear"
echo 15 > /sys/block/$D/device/timeout
mkfs.ext4 -q -F /dev/$D > $O/mkfs-pebble.log 2>&1 || fail "mkfs.ext4 on pebble: $(tail -3 $O/mkfs-pebble.log)"
mount /dev/$D /tmp/m || fail "mount the pebble volume"
cp /tmp/pattern /tmp/m/synced && sync || fail "the synced file"
say "pebble volume /dev/$D: ext4 mounted, a file written and synced; store $(du -sk /tmp/srpp | cut -f1) KiB, tmpfs free $(df -k /tmp/srpp | awk 'END {print $4}') KiB"
DMESG0=$(dmesg | wc -l)
# Direct writes go out as plain WRITEs, acknowledged from pebble's
# memtable and WAL buffer: the volume is dirty when the kill comes.
dd if=/dev/urandom of=/tmp/m/hot bs=64k count=1500 oflag=direct > $O/hot.log 2>&1 &
DD=$!
sleep 1
# The kill comes once srpd has marked the volume dirty (a file under
# /tmp/srpp/dirty, named for the volume's SHA-256, written before the
# first write after a flush is acknowledged): a fixed sleep once let the
# kill land before any write of dd's had been acknowledged, and the
# restarted srpd rightly had nothing to warn of.
MARK=/tmp/srpp/dirty/$(printf vol0 | sha256sum | cut -d' ' -f1)
i=0
until [ -e $MARK ]; do
  i=$((i + 1)); [ $i -gt 100 ] && fail "vol0 never marked dirty under the writer: $(ls /tmp/srpp/dirty)"; sleep 0.1
done
kill -0 $DD 2>/dev/null || fail "the writer ended before the kill: $(cat $O/hot.log)"
kill -9 $SRPD
wait $SRPD 2>/dev/null
say "pebble srpd SIGKILLed with direct writes in flight"
start_pebble $O/srpd-pebble-restarted.log
PLOG=$O/srpd-pebble-restarted.log
grep -q "acknowledged writes not flushed" $O/srpd-pebble-restarted.log || fail "the restarted srpd did not warn of the lost write cache: $(grep -i dirty $O/srpd-pebble-restarted.log | tail -3)"
say "restarted srpd: $(grep -o 'msg="the previous run[^"]*" volume=[^ ]*' $O/srpd-pebble-restarted.log)"
relogged $O/srpd-pebble-restarted.log "to the pebble srpd"
wait $DD
say "the writer ended: $(tail -1 $O/hot.log)"
# A sync makes jbd2 commit: its flush meets the lost write cache.
sync
sleep 1
touch /tmp/m/after 2> $O/touch-after.log
dmesg | tail -n +$((DMESG0 + 1)) > $O/dmesg-pebble.log
if grep -q -E "Aborting journal|Detected aborted journal|Remounting filesystem read-only|I/O error while writing superblock" $O/dmesg-pebble.log; then
  say "ext4 learned of the loss: $(grep -m1 -o -E 'Aborting journal[^,]*|Detected aborted journal|Remounting filesystem read-only' $O/dmesg-pebble.log)"
else
  fail "ext4 went on as if nothing was lost: $(grep -i -E 'sd |ext4|jbd2|critical' $O/dmesg-pebble.log | tail -8)"
fi
say "sense the kernel logged: $(grep -i -E 'Sense Key|Add. Sense' $O/dmesg-pebble.log | sed -E 's/.*tag#[0-9]+ //' | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
umount /tmp/m 2>/dev/null || umount -l /tmp/m
e2fsck -fy /dev/$D > $O/fsck-pebble.log 2>&1
rc=$?
[ $rc -lt 4 ] || fail "e2fsck -fy could not repair the pebble volume (rc $rc): $(tail -5 $O/fsck-pebble.log)"
e2fsck -fn /dev/$D > $O/fsck-pebble-2.log 2>&1 || fail "e2fsck -fn after the repair: $(tail -5 $O/fsck-pebble-2.log)"
mount /dev/$D /tmp/m || fail "mount after the repair"
echo 3 > /proc/sys/vm/drop_caches
cmp /tmp/pattern /tmp/m/synced || fail "the file synced before the kill differs after the restart"
say "after e2fsck (rc $rc): the file synced before the kill intact"

# A graceful restart (SIGTERM, as an upgrade does) under the same kind
# of writes: srpd drains, flushes the store and removes its dirty marks,
# so the restarted srpd reports no loss and ext4 goes on without an
# error, every write of the writer landed.
DMESG1=$(dmesg | wc -l)
dd if=/dev/urandom of=/tmp/m/hot2 bs=64k count=400 oflag=direct > $O/hot2.log 2>&1 &
DD=$!
sleep 1
kill -0 $DD 2>/dev/null || fail "the second writer ended before the stop: $(cat $O/hot2.log)"
kill -TERM $SRPD
wait $SRPD
src=$?
[ $src = 0 ] || fail "srpd's exit status after SIGTERM: $src: $(tail -3 $O/srpd-pebble-restarted.log)"
say "pebble srpd stopped by SIGTERM with direct writes in flight: $(grep -o 'msg="stopped[^"]*"' $O/srpd-pebble-restarted.log)"
start_pebble $O/srpd-pebble-graceful.log
PLOG=$O/srpd-pebble-graceful.log
grep -q "acknowledged writes not flushed" $O/srpd-pebble-graceful.log && fail "after a clean stop srpd reports a lost write cache"
relogged $O/srpd-pebble-graceful.log "after the graceful restart"
wait $DD || fail "the writer failed across the graceful restart: $(tail -2 $O/hot2.log)"
sync || fail "sync after the graceful restart"
dmesg | tail -n +$((DMESG1 + 1)) > $O/dmesg-graceful.log
if grep -q -E "Aborting journal|I/O error|Hardware Error|Medium Error|EXT4-fs error" $O/dmesg-graceful.log; then
  fail "an error after a graceful restart: $(grep -E 'Aborting|error|Error' $O/dmesg-graceful.log | tail -4)"
fi
echo 3 > /proc/sys/vm/drop_caches
cmp /tmp/pattern /tmp/m/synced || fail "the synced file differs after the graceful restart"
[ "$(stat -c %s /tmp/m/hot2)" = 26214400 ] || fail "the writer's file has $(stat -c %s /tmp/m/hot2) bytes, want 26214400"
umount /tmp/m || fail "umount after the graceful restart"
e2fsck -fn /dev/$D > $O/fsck-graceful.log 2>&1 || fail "e2fsck -fn after the graceful restart: $(tail -5 $O/fsck-graceful.log)"
say "after the graceful restart: $(tail -1 $O/hot2.log | cut -d, -f1-2); no error in dmesg, e2fsck -fn clean"
kill $SRPD
say "PASS"

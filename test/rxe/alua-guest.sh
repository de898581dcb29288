#!/bin/sh
# alua-guest.sh: runs INSIDE the alua guest (alua.sh). gwpair serves vol0
# through two gateways over rxe; ib_srp logs in to both, and the kernel's
# scsi_dh_alua and dm-multipath must find the active and the standby
# path and move the volume with SET TARGET PORT GROUPS. Leaves its logs
# in /mnt/out; exits non-zero on failure.
export PATH=/mnt:/usr/sbin:/usr/bin:/sbin:/bin
O=/mnt/out
mkdir -p $O
IP=10.0.2.15
say() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*" | tee -a $O/steps.log; }
fail() {
  say "FAIL: $*"
  for d in $D1 $D2; do
    [ -n "$d" ] && say "$d: dh_state $(cat /sys/block/$d/device/dh_state 2>/dev/null), access_state $(cat /sys/block/$d/device/access_state 2>/dev/null)"
  done
  dmesg | grep -i -E "alua|srp|scsi|sd |device-mapper|multipath" | tail -30 | tee -a $O/steps.log
  dmesg > $O/dmesg-all.txt
  for d in $D1 $D2; do
    [ -n "$d" ] && { sg_vpd -p di /dev/$d; sg_rtpg -d /dev/$d; } >> $O/sg-fail.log 2>&1
  done
  tail -20 $O/gwpair.log >> $O/steps.log
  exit 1
}
# check FILE MIB WHAT: reads len(FILE) bytes at MIB MiB of the multipath
# device and compares them with FILE.
check() {
  dd if=$MP of=/tmp/back bs=1M skip=$2 count=$(($(stat -c %s $1) / 1048576)) iflag=direct status=none 2>> $O/steps.log || fail "read $3"
  cmp $1 /tmp/back || fail "read back $3 differs"
}
# put FILE MIB WHAT: writes 1 MiB of fresh data at MIB MiB (keeping it
# in FILE) and reads it back.
put() {
  head -c 1048576 /dev/urandom > $1
  dd if=$1 of=$MP bs=1M seek=$2 oflag=direct status=none 2>> $O/steps.log || fail "write $3"
  check $1 $2 "$3"
}
# turs DISK: two TEST UNIT READYs, so that scsi_dh_alua hears a unit
# attention and reads the port group again.
turs() { sg_turs /dev/$1 > /dev/null 2>&1; sg_turs /dev/$1 > /dev/null 2>&1; }
# state DISK: the ALUA access state scsi_dh_alua holds for DISK.
state() { cat /sys/block/$1/device/access_state 2>/dev/null; }
# wait_state DISK STATE WHAT: polls DISK's access state (10 s).
wait_state() {
  i=0
  until [ "$(state $1)" = "$2" ]; do
    i=$((i + 1)); [ $i -gt 40 ] && fail "$3: /dev/$1 is '$(state $1)', want '$2'"; sleep 0.25
  done
}

GUID=$(tr -d : < /sys/class/infiniband/rxe0/node_guid)
gwpair --provider ibverbs --addr $IP --ports 4460,4461 --ioc-guid $GUID > $O/gwpair.out 2> $O/gwpair.log &
GW=$!
i=0
until grep -q serving $O/gwpair.out 2>/dev/null; do
  i=$((i + 1)); [ $i -gt 100 ] && fail "gwpair not serving: $(tail -3 $O/gwpair.log)"; sleep 0.3
done
modprobe scsi_dh_alua && modprobe dm_multipath && modprobe dm_round_robin && modprobe ib_srp && modprobe sd_mod || fail "modprobe"
say "gwpair serving; scsi_dh_alua, dm_multipath, ib_srp loaded"

# add GATEWAY [OPTIONS]: ib_srp logs in to the gateway's target port
# (OPTIONS appended to its add_target line); prints the disk that
# appears.
add() {
  before=$(ls /sys/block | grep '^sd' | sort)
  line=$(sed -n "s/^gateway $1: add_target //p" $O/gwpair.out)$2
  echo "$line" > /sys/class/infiniband_srp/srp-rxe0-1/add_target || fail "add_target $line refused"
  i=0
  while :; do
    d=$(ls /sys/block | grep '^sd' | sort | grep -v -x -F "$before" | head -1)
    [ -n "$d" ] && break
    i=$((i + 1)); [ $i -gt 60 ] && fail "no disk from gateway $1"; sleep 0.5
  done
  echo $d
}
D1=$(add 1) || exit 1
D2=$(add 2) || exit 1
say "gateway 1: /dev/$D1, gateway 2: /dev/$D2"
sg_inq /dev/$D1 > $O/sg.log 2>&1
sg_vpd -p di /dev/$D1 >> $O/sg.log 2>&1
sg_rtpg -d /dev/$D1 >> $O/sg.log 2>&1
sg_rtpg -d /dev/$D2 >> $O/sg.log 2>&1
grep -q 'TPGS=3' $O/sg.log || fail "INQUIRY does not say TPGS=3: $(grep TPGS $O/sg.log)"
for d in $D1 $D2; do
  [ "$(cat /sys/block/$d/device/dh_state)" = alua ] || fail "/dev/$d: device handler '$(cat /sys/block/$d/device/dh_state)', want alua"
done
# The first login opened the volume on gateway 1, which took its lock.
wait_state $D1 active/optimized "at login"
wait_state $D2 standby "at login"
say "scsi_dh_alua attached to both; /dev/$D1 $(state $D1), /dev/$D2 $(state $D2)"
if dd if=/dev/$D2 of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; then fail "a read through the standby path succeeded"; fi
say "a read through the standby path fails, as it must"

SECTORS=$(cat /sys/block/$D1/size)
echo "0 $SECTORS multipath 0 1 alua 2 1 round-robin 0 1 1 /dev/$D1 1 round-robin 0 1 1 /dev/$D2 1" | dmsetup create mp || fail "dmsetup create"
# No udev here: the map is the dm-N node devtmpfs made.
MP=/dev/$(ls /sys/block | grep '^dm-' | head -1)
[ -b "$MP" ] || fail "no dm device node ($MP)"
say "dm-multipath $MP: group 1 /dev/$D1, group 2 /dev/$D2 (hardware handler alua): $(dmsetup status mp)"
head -c 4194304 /dev/urandom > /tmp/pattern
dd if=/tmp/pattern of=$MP bs=1M oflag=direct status=none 2>> $O/steps.log || fail "write through group 1"
check /tmp/pattern 0 "through group 1"
say "4 MiB written and read back through dm-multipath on gateway 1"

# Switch groups: dm-multipath initialises the standby path (pg_init),
# and scsi_dh_alua's alua_activate sends SET TARGET PORT GROUPS.
dmsetup message mp 0 switch_group 2 || fail "switch_group"
check /tmp/pattern 0 "through gateway 2 of what gateway 1 took"
wait_state $D2 active/optimized "after the switch"
grep -q "gateway=2.*state=active" $O/gwpair.log || fail "gateway 2 did not take the volume over"
say "switch_group 2: /dev/$D2 $(state $D2); the 4 MiB read back through gateway 2"
put /tmp/p2 4 "through gateway 2"
# Gateway 1 was fenced: its nexus is told ASYMMETRIC ACCESS STATE
# CHANGED, and scsi_dh_alua reads the port group again: standby, as the
# fenced gateway reconnected to the cluster at once (a new client for
# the volume, without the lock).
turs $D1
wait_state $D1 standby "after the takeover through gateway 2"
grep -q "gateway=1.*state=standby" $O/gwpair.log || fail "gateway 1 was not told standby after the takeover"
say "gateway 1's path now $(state $D1) (fenced, then reconnected); a write and read through gateway 2"
# Back to group 1, a failback asked for: gateway 1 takes the volume back
# with SET TARGET PORT GROUPS (breaking gateway 2's lock) and serves
# what gateway 2 took.
N=$(wc -l < $O/gwpair.log)
K=$(dmesg | wc -l)
dmsetup message mp 0 switch_group 1 || fail "switch_group 1"
check /tmp/pattern 0 "after the failback"
check /tmp/p2 4 "of gateway 2's write after the failback"
wait_state $D1 active/optimized "after the failback"
tail -n +$((N + 1)) $O/gwpair.log | grep -q "gateway=1.*state=active" || fail "gateway 1 did not take the volume back"
dmesg | tail -n +$((K + 1)) | grep -q 'alua: stpg failed' && fail "a SET TARGET PORT GROUPS failed during the failback"
put /tmp/p3 5 "through gateway 1 after the failback"
turs $D2
wait_state $D2 standby "gateway 2 after the failback"
say "switch_group 1: gateway 1 took the volume back, /dev/$D1 $(state $D1), /dev/$D2 $(state $D2); 6 MiB read back through it: $(dmsetup status mp)"
dmesg | grep -E 'alua|multipath' > $O/alua-dmesg.log
say "the kernel's ALUA log: $(grep -c 'state A' $O/alua-dmesg.log) active, $(grep -c 'state S' $O/alua-dmesg.log) standby and $(grep -c 'state U' $O/alua-dmesg.log) unavailable reports; last: $(tail -1 $O/alua-dmesg.log)"

# A reservation change's unit attention on the other gateway (SPC-4
# 5.13.11 owes it to every I_T nexus of the host, whichever target
# port). A second initiator port, B, logs in to both gateways
# (initiator_ext 2); this host's first port, A, registers through
# gateway 1, and B preempts it there. A's nexus on gateway 1 hears
# REGISTRATIONS PREEMPTED at once. Gateway 2, a standby, has not read
# the change: A's nexus there hears nothing, until B asks gateway 2 for
# the keys (a standby reads them from the volume's record, and raises
# the changes it had not seen). A's next command there is answered
# REGISTRATIONS PREEMPTED, once. SG_IO passes these unit attentions up:
# scsi_dh_alua's check_sense does not take 2A/05 (ASYMMETRIC ACCESS
# STATE CHANGED, 2A/06, it would retry on its own).
E1=$(add 1 ,initiator_ext=0000000000000002) || exit 1
E2=$(add 2 ,initiator_ext=0000000000000002) || exit 1
for d in $E1 $E2 $D1 $D2; do turs $d; done
sg_persist -n --out --register --param-sark=0xa /dev/$D1 > $O/pr.log 2>&1 || fail "A registers through gateway 1: $(cat $O/pr.log)"
sg_persist -n --out --register --param-sark=0xb /dev/$E1 >> $O/pr.log 2>&1 || fail "B registers through gateway 1: $(cat $O/pr.log)"
sg_persist -n --out --preempt --param-rk=0xb --param-sark=0xa --prout-type=1 /dev/$E1 >> $O/pr.log 2>&1 || fail "B preempts A through gateway 1: $(cat $O/pr.log)"
rc=0; sg_turs -v /dev/$D1 > $O/ua1.log 2>&1 || rc=$?
[ $rc = 6 ] && grep -qi "registrations preempted" $O/ua1.log || fail "A's nexus on gateway 1 after the preempt: exit $rc, $(cat $O/ua1.log)"
rc=0; sg_turs -v /dev/$D2 > $O/ua2.log 2>&1 || rc=$?
[ $rc = 6 ] && fail "A's nexus on gateway 2 heard a unit attention before gateway 2 read the change: $(cat $O/ua2.log)"
sg_persist -n --in --read-keys /dev/$E2 > $O/pr-keys.log 2>&1 || fail "B reads the keys through gateway 2: $(cat $O/pr-keys.log)"
grep -q "0xb" $O/pr-keys.log && ! grep -q "0xa$" $O/pr-keys.log || fail "gateway 2 reports keys other than B's alone: $(cat $O/pr-keys.log)"
rc=0; sg_turs -v /dev/$D2 > $O/ua2.log 2>&1 || rc=$?
[ $rc = 6 ] && grep -qi "registrations preempted" $O/ua2.log || fail "A's nexus on gateway 2 once gateway 2 read the change: exit $rc, $(cat $O/ua2.log)"
rc=0; sg_turs -v /dev/$D2 > $O/ua3.log 2>&1 || rc=$?
[ $rc = 6 ] && fail "A's nexus on gateway 2 heard a unit attention twice: $(cat $O/ua3.log)"
sg_persist -n --out --clear --param-rk=0xb /dev/$E1 >> $O/pr.log 2>&1 || fail "B clears: $(cat $O/pr.log)"
say "B's preempt of A through gateway 1: A's nexus there heard $(grep -io -m1 'registrations preempted' $O/ua1.log); on standby gateway 2 nothing, until B's READ KEYS there had gateway 2 read the record: then $(grep -io -m1 'registrations preempted' $O/ua2.log), once"

dmsetup remove mp || fail "dmsetup remove"
kill -TERM $GW
say "PASS"

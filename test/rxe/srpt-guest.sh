#!/bin/sh
# srpt-guest.sh: runs INSIDE the srpt guest (srpt.sh). The kernel's
# ib_srpt serves a 64 MiB LIO RAM disk as LUN 0 over rxe; srpc and bench
# log in to it with --protocol srp and must see the LUN, write it and
# read back what they wrote, also across the target port disabled and
# enabled under I/O. Leaves its logs in /mnt/out; exits non-zero on
# failure.
export PATH=/mnt:/usr/sbin:/usr/bin:/sbin:/bin
O=/mnt/out
mkdir -p $O
IP=10.0.2.15
PORT=5000
say() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*" | tee -a $O/steps.log; }
fail() { say "FAIL: $*"; dmesg > $O/dmesg-guest.txt; grep -i -E "srpt|target|rdma" $O/dmesg-guest.txt | grep -v "receiving failed" | tail -20 | tee -a $O/steps.log; exit 1; }

# LIO's RAM disk behind ib_srpt, as peers-guest.sh sets it up: ib_srpt
# listens on RDMA CM only once given a port, the target port is named by
# the port GID's interface id, and an RDMA-CM login's ACL name is the
# initiator's address.
# LIO keeps a registration made with APTPL (as srpc's and Linux's sd's
# are) in a file under its db root, /var/target when /etc/target is not
# there; without the directory the REGISTER fails.
mkdir -p /var/target/pr
modprobe configfs; modprobe target_core_mod && modprobe ib_srpt || fail "modprobe"
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
C=/sys/kernel/config/target
mkdir -p $C/core/rd_mcp_0/rd0 || fail "configfs"
echo rd_pages=16384 > $C/core/rd_mcp_0/rd0/control
echo 1 > $C/core/rd_mcp_0/rd0/enable || fail "rd_mcp enable"
mkdir -p $C/srpt
echo $PORT > $C/srpt/discovery_auth/rdma_cm_port
TP=$C/srpt/$(cut -d: -f5-8 /sys/class/infiniband/rxe0/ports/1/gids/0)
mkdir -p $TP/tpgt_1/lun/lun_0 $TP/tpgt_1/acls/$IP/lun_0 || fail "srpt target port"
ln -s $C/core/rd_mcp_0/rd0 $TP/tpgt_1/lun/lun_0/rd0
ln -s $TP/tpgt_1/lun/lun_0 $TP/tpgt_1/acls/$IP/lun_0/lun0
echo 1 > $TP/tpgt_1/enable || fail "tpg enable"
# ib_srpt's target port identifier is its service GUID (the node GUID)
# twice: id_ext and ioc_guid, as an ib_srp add_target line names them.
GUID=$(tr -d : < /sys/class/infiniband/rxe0/node_guid)
say "ib_srpt serving rd0 as LUN 0 on $IP:$PORT, target port $GUID,$GUID"

S="--provider ibverbs --protocol srp --target $IP:$PORT --srp-target-port $GUID,$GUID --name srpt-guest --timeout 30s"
srpc list $S > $O/list.txt 2>&1 || fail "srpc list: $(cat $O/list.txt)"
say "srpc list: $(tail -n +2 $O/list.txt | tr -s ' ')"
grep -q '^lun0 *64 MiB' $O/list.txt || fail "lun0 of 64 MiB not listed"
srpc info lun0 $S > $O/info.txt 2>&1 || fail "srpc info: $(cat $O/info.txt)"
say "srpc info: $(grep -E 'size|max transfer|access' $O/info.txt | tr -s ' ' | tr '\n' ';')"
head -c 16777216 /dev/urandom > /tmp/in
srpc import --progress never lun0 /tmp/in $S > $O/import.log 2>&1 || fail "srpc import: $(tail -3 $O/import.log)"
srpc export --length 16MiB lun0 /tmp/out $S > $O/export.log 2>&1 || fail "srpc export: $(tail -3 $O/export.log)"
a=$(sha256sum < /tmp/in | cut -c1-64); b=$(sha256sum < /tmp/out | cut -c1-64)
[ "$a" = "$b" ] || fail "exported image differs: $a vs $b"
say "16 MiB imported and exported back: sha256 $a on both"
# Persistent reservations against LIO's own (SPC-3) implementation:
# srpc reserve --protocol srp registers and reserves write-exclusive, and
# reads both back (READ KEYS, READ RESERVATION); a RESERVE with a key
# that is not registered and a REGISTER that does not give the current
# key are refused as reservation conflicts; released and unregistered,
# nothing is left. (A second srpc here would be the same initiator to
# LIO, not another: its ACL is the source address, and LIO keys a
# registration by the ACL's node; tried, the second port's write went
# through the first's reservation.)
srpc reserve register lun0 0xabc $S > $O/pr.log 2>&1 || fail "srpc reserve register: $(tail -3 $O/pr.log)"
srpc reserve reserve --key 0xabc lun0 $S >> $O/pr.log 2>&1 || fail "srpc reserve reserve: $(tail -3 $O/pr.log)"
srpc reserve show lun0 $S >> $O/pr.log 2>&1 || fail "srpc reserve show: $(tail -3 $O/pr.log)"
grep -q "write-exclusive by the host of key 0xabc" $O/pr.log || fail "srpc reserve show: $(cat $O/pr.log)"
if srpc reserve reserve --key 0x999 lun0 $S >> $O/pr.log 2>&1; then fail "LIO took a RESERVE with an unregistered key"; fi
if srpc reserve register lun0 0xdef $S >> $O/pr.log 2>&1; then fail "LIO took a REGISTER without the current key"; fi
[ "$(grep -c 'reservation conflict\|reserved by another host' $O/pr.log)" -ge 2 ] || fail "the refusals were not reservation conflicts: $(tail -4 $O/pr.log)"
srpc reserve release --key 0xabc lun0 $S >> $O/pr.log 2>&1 || fail "srpc reserve release: $(tail -3 $O/pr.log)"
srpc reserve register --key 0xabc lun0 0 $S >> $O/pr.log 2>&1 || fail "srpc reserve unregister: $(tail -3 $O/pr.log)"
srpc reserve show lun0 $S >> $O/pr.log 2>&1 || fail "srpc reserve show: $(tail -3 $O/pr.log)"
tail -3 $O/pr.log | grep -q "registrations: *none" || fail "registrations left: $(tail -4 $O/pr.log)"
say "persistent reservations against LIO: registered, reserved and read back by srpc --protocol srp; a wrong key refused as a reservation conflict twice; released and unregistered"
# 4 KiB random reads and writes past the imported region: unwritten
# blocks of the RAM disk read as zeros, which --verify accepts.
for qd in 1 16; do
  bench --provider ibverbs --target $IP:$PORT --protocol srp --srp-target-port $GUID,$GUID --name srpt-bench --volume lun0 \
    --rw randrw --bs 4k --iodepth $qd --runtime 5s --offset 32MiB --size 32MiB --verify > $O/bench-qd$qd.log 2>&1 || fail "bench QD$qd: $(tail -5 $O/bench-qd$qd.log)"
  grep -q ' 0 mismatches' $O/bench-qd$qd.log || fail "bench QD$qd: $(grep verify $O/bench-qd$qd.log)"
  say "bench --verify randrw 4k QD$qd: $(grep -o 'IOPS=[^,]*' $O/bench-qd$qd.log | tr '\n' ' ')$(grep -o 'verify: .*' $O/bench-qd$qd.log)"
done
# The target port disabled and enabled again under bench: ib_srpt ends
# its channels (srpt_set_enabled), refuses logins while disabled, and
# the initiator logs in again once the port is back and re-issues what
# was in flight with new registrations; every read must still verify.
logins() { dmesg | grep -c 'Received SRP_LOGIN_REQ'; }
n0=$(logins)
bench --provider ibverbs --target $IP:$PORT --protocol srp --srp-target-port $GUID,$GUID --name srpt-flap --volume lun0 \
  --rw randrw --bs 4k --iodepth 16 --runtime 15s --offset 32MiB --size 32MiB --verify > $O/bench-flap.log 2>&1 &
B=$!
# Under TCG bench takes seconds to start: flap only once it logged in.
i=0
until [ "$(logins)" -gt "$n0" ]; do
  i=$((i + 1)); [ $i -gt 240 ] && fail "bench never logged in: $(tail -3 $O/bench-flap.log)"; sleep 0.25
done
sleep 3
echo 0 > $TP/tpgt_1/enable || fail "tpg disable"
say "target port disabled under bench"
sleep 2
echo 1 > $TP/tpgt_1/enable || fail "tpg enable again"
say "target port enabled again"
wait $B || fail "bench across the target port flap: $(tail -5 $O/bench-flap.log)"
grep -q ' 0 mismatches' $O/bench-flap.log || fail "bench across the flap: $(grep verify $O/bench-flap.log)"
lost=$(sed -n 's/.*connections-lost=\([0-9]*\).*/\1/p' $O/bench-flap.log)
[ "${lost:-0}" -ge 1 ] || fail "bench saw no connection lost: the flap proved nothing ($(grep conn $O/bench-flap.log))"
say "bench --verify randrw 4k QD16 across the flap: $(grep -o 'IOPS=[^,]*' $O/bench-flap.log | tr '\n' ' ')$(grep -o 'connections-lost=.*' $O/bench-flap.log); $(grep -o 'verify: .*' $O/bench-flap.log)"
dmesg > $O/dmesg-guest.txt
say "PASS"

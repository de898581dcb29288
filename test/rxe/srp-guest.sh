#!/bin/sh
# srp-guest.sh: runs INSIDE the srp guest (srp.sh). srpd serves a memory
# volume over rxe; the kernel's ib_srp logs in to it with add_target and
# the volume must appear as a SCSI disk that takes writes and reads back
# what was written. Leaves its logs in /mnt/out; exits non-zero on failure.
export PATH=/mnt:/usr/sbin:/usr/bin:/sbin:/bin
O=/mnt/out
mkdir -p $O
IP=10.0.2.15
PORT=4450
say() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*" | tee -a $O/steps.log; }
fail() { say "FAIL: $*"; dmesg | grep -i -E "srp|scsi|sd " | tail -20 | tee -a $O/steps.log; exit 1; }

mkdir -m 700 -p /tmp/srpd
srpd --provider ibverbs --listen $IP:$PORT --backend memory --data /tmp/srpd --default-volume-size 64MiB --log-level debug > $O/srpd.log 2>&1 &
SRPD=$!
i=0
until grep -q msg=serving $O/srpd.log; do
  i=$((i + 1)); [ $i -gt 200 ] && fail "srpd not serving: $(tail -3 $O/srpd.log)"; sleep 0.3
done
say "srpd serving on $IP:$PORT"
modprobe ib_srp && modprobe sd_mod || fail "modprobe"
GUID=$(tr -d : < /sys/class/infiniband/rxe0/node_guid)
echo "id_ext=$GUID,ioc_guid=$GUID,dest=$IP:$PORT" > /sys/class/infiniband_srp/srp-rxe0-1/add_target || fail "add_target refused"
i=0
while ! ls /sys/block | grep -q '^sd' && [ $i -lt 60 ]; do i=$((i + 1)); sleep 0.5; done
D=$(ls /sys/block | grep '^sd' | head -1)
[ -n "$D" ] || fail "no disk appeared"
say "disk /dev/$D: $(cat /sys/block/$D/size) sectors of $(cat /sys/block/$D/queue/logical_block_size) bytes; vendor '$(cat /sys/block/$D/device/vendor 2>/dev/null)' model '$(cat /sys/block/$D/device/model 2>/dev/null)'"
echo 15 > /sys/block/$D/device/timeout
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
if command -v mkfs.ext4 > /dev/null; then
  mkfs.ext4 -q -F /dev/$D > $O/mkfs.log 2>&1 || fail "mkfs.ext4: $(tail -3 $O/mkfs.log)"
  modprobe ext4
  mkdir -p /tmp/m && mount /dev/$D /tmp/m || fail "mount"
  cp /tmp/pattern /tmp/m/file && sync && umount /tmp/m || fail "file write"
  e2fsck -fn /dev/$D > $O/fsck.log 2>&1 || fail "e2fsck: $(tail -5 $O/fsck.log)"
  say "ext4 made, a file written, unmounted, e2fsck -fn clean"
fi
kill $SRPD
say "PASS"

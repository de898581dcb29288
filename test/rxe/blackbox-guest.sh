#!/bin/sh
# blackbox-guest.sh: runs INSIDE the rxe VM (vm-exec.sh copies it in as
# test.bin, with srpd, srpc and bench beside it in /mnt). Logs go to
# /mnt/out; the exit status is the verdict: 0 only when every step passed.
export PATH=/mnt:/usr/sbin:/usr/bin:/sbin:/bin
O=/mnt/out
mkdir -p $O
T=10.0.2.15:4420
P="--provider ibverbs --target $T"
RT=${BB_RUNTIME:-5s}
fails=0
up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "$*" | tee -a $O/steps.log; }
bad() { say "FAIL: $*"; fails=$((fails + 1)); }
# step NAME CMD...: run it with its output in $O/NAME.log; non-zero fails.
step() {
  n=$1; shift
  t0=$(up)
  "$@" > $O/$n.log 2>&1
  rc=$?
  say "$n: rc=$rc in $(echo "$(up) $t0" | awk '{printf "%.1f", $1-$2}') s: $*"
  [ $rc = 0 ] || { bad "$n exited $rc"; tail -15 $O/$n.log; }
  return $rc
}
# clean NAME: the bench run's counters say nothing went wrong.
clean() {
  f=$O/$1.log
  grep -E "IOPS=|poll :|frmr :|conn :|verify:" $f | tee -a $O/steps.log
  # Over real verbs bench polls adaptively unless told otherwise (internal/cli.BusyPoll).
  grep -q "poll : busy_poll=adaptive" $f || bad "$1: bench's report names no busy_poll=adaptive"
  for c in qp-errors lost-completions deadlines bogus-inv connections-lost reconnects; do
    grep -q " $c=0" $f || bad "$1: $c not 0"
  done
  grep -q ", 0 mismatches" $f || bad "$1: verify mismatches"
}

say "kernel $(uname -r), nproc $(nproc), $(rdma link show | head -1)"
mkdir -m 700 -p /tmp/srpd-data
srpd --provider ibverbs --listen $T --backend memory --data /tmp/srpd-data > $O/srpd.log 2>&1 &
SRPD=$!
i=0
until grep -q 'msg=serving' $O/srpd.log 2>/dev/null; do
  i=$((i + 1))
  if [ $i -gt 240 ] || ! kill -0 $SRPD 2>/dev/null; then
    bad "srpd did not start"; cat $O/srpd.log; exit 1
  fi
  sleep 0.25
done
# srpd over real verbs polls adaptively unless told otherwise, and says so.
grep -q 'msg=serving.* busy_poll=adaptive' $O/srpd.log || { bad "srpd's serving line names no busy_poll=adaptive"; grep msg=serving $O/srpd.log; exit 1; }

step list srpc list $P
step info srpc info $P vol0
head -c 16M /dev/urandom > /tmp/img
step import srpc import $P vol0 /tmp/img
step export srpc export $P --length 16MiB vol0 /tmp/img.out
if cmp -s /tmp/img /tmp/img.out; then say "import/export: checksums equal"; else bad "import/export: the exported image differs"; fi

# Past the image, so its random bytes are not read as verify blocks.
R="--offset 64m --size 256m --runtime $RT --verify"
for rw in randwrite randread randrw; do
  for qd in 1 32; do
    step bench-$rw-qd$qd bench $P --rw $rw --bs 4k --iodepth $qd $R && clean bench-$rw-qd$qd
  done
done

# srpd's SRP personality as srpc and bench use it, over two channels:
# the first logs in with SINGLE, the second joins with MULTI
# (initiator/srp_fence.go), on the same rxe as the kernel's ib_srp.
S="$P --protocol srp --channels 2"
head -c 16M /dev/urandom > /tmp/img2
step import-srp srpc import $S lun0 /tmp/img2
step export-srp srpc export $S --length 16MiB lun0 /tmp/img2.out
if cmp -s /tmp/img2 /tmp/img2.out; then say "SRP import/export: checksums equal"; else bad "SRP import/export: the exported image differs"; fi
step bench-srp-randrw-qd32 bench $S --volume lun0 --rw randrw --bs 4k --iodepth 32 $R && clean bench-srp-randrw-qd32

kill -TERM $SRPD
i=0
while kill -0 $SRPD 2>/dev/null && [ $i -lt 120 ]; do i=$((i + 1)); sleep 0.25; done
wait $SRPD
rc=$?
say "srpd exited $rc after SIGTERM"
[ $rc = 0 ] || { bad "srpd exited $rc"; tail -20 $O/srpd.log; }
grep -E 'level=(WARN|ERROR)' $O/srpd.log | head -20 > $O/srpd-warnings.log
[ -s $O/srpd-warnings.log ] && { bad "srpd logged warnings or errors"; cat $O/srpd-warnings.log; }
for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
  v=$(cat $f 2>/dev/null) && [ "$v" != 0 ] && echo "$(basename $f)=$v"
done > $O/rxe-counters.txt
say "rxe counters: $(tr '\n' ' ' < $O/rxe-counters.txt)"
say "$fails failures"
[ $fails = 0 ]

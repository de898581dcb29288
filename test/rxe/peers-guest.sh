#!/bin/sh
# peers-guest.sh: runs INSIDE the peers guest (peers.sh). Sets up each
# target once, then runs every job against every target, ROUNDS times,
# interleaved so that a slow moment of the VM falls on all of them. Each
# job leaves its fio-shaped JSON in /mnt/out/ROUND-PEER-JOB.json and the
# guest's busy CPU time over the job in ROUND-PEER-JOB.cpu (jiffies of all
# CPUs from /proc/stat). A peer that cannot be set up is skipped and said.
export PATH=/mnt:/usr/sbin:/usr/bin:/sbin:/bin
O=/mnt/out
mkdir -p $O
IP=10.0.2.15
RT=${RUNTIME:-5}
RAMP=${RAMP:-1}
say() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*" | tee -a $O/steps.log; }
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
# The jobs: name, fio rw, block size, queue depth.
JOBS=${JOBS:-"rr32:randread:4k:32 rr1:randread:4k:1 rw32:randwrite:4k:32 rw1:randwrite:4k:1 sr128:read:128k:8"}

# measure ROUND PEER JOB CMD...: run one job with the CPU it cost.
# With a target process (TPID), its own CPU time over the job goes to
# ROUND-PEER-JOB.tcpu (jiffies, user + system).
pcpu() { [ -n "$1" ] && awk '{print $14 + $15}' /proc/$1/stat 2>/dev/null || echo 0; }
measure() {
  tag=$1-$2-$3; r1=$1; shift 3
  b0=$(busy) t0=$(pcpu "${TPID:-}")
  perf=
  if [ -n "${PERF:-}" ] && [ "$r1" = 1 ]; then
    # With PERF set (but to "stat"), where the whole guest's CPU goes
    # over each job of round 1 (every process, kernel included; a
    # software clock event, since TCG has no PMU). Sampling slows the
    # guest down by half or more: PERF=stat counts only.
    if [ "$PERF" != stat ]; then
      perf record -a -g -F 499 -o $O/$tag.perf -- sleep $((RT + RAMP)) > /dev/null 2>&1 &
      perf=$!
    fi
    # and how often tasks were woken, switched and CPUs interrupted
    # to reschedule or run a function for another (a cross-CPU
    # wake-up), the latency a QD1 job waits on.
    perf stat -a -x, -o $O/$tag.stat -e sched:sched_wakeup,sched:sched_switch,irq_vectors:reschedule_entry,irq_vectors:call_function_single_entry \
      -- sleep $((RT + RAMP)) > /dev/null 2>&1 &
    perf="$perf $!"
  fi
  timeout 120 "$@" > $O/$tag.log 2>&1
  rc=$?
  echo $(( $(busy) - b0 )) > $O/$tag.cpu
  [ -n "${TPID:-}" ] && echo $(( $(pcpu $TPID) - t0 )) > $O/$tag.tcpu
  if [ -n "$perf" ]; then
    wait $perf
    if [ -f $O/$tag.perf ]; then
      perf report -i $O/$tag.perf --no-children --sort comm,dso,sym --stdio 2>/dev/null | grep -v '^$' | head -400 > $O/$tag.perf.txt
      perf report -i $O/$tag.perf --no-children --sort comm --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' > $O/$tag.comm.txt
      rm -f $O/$tag.perf
    fi
  fi
  [ $rc = 0 ] || say "$tag exited $rc: $(tail -2 $O/$tag.log | tr '\n' ' ')"
}

# new_disk BEFORE: waits up to 30 s for an sd disk not in the list BEFORE
# (both SRP peers go through ib_srp, so each takes the disk its own
# add_target made) and prints its name.
new_disk() {
  i=0
  while [ $i -lt 60 ]; do
    for d in $(ls /sys/block | grep '^sd'); do
      case " $1 " in *" $d "*) ;; *) echo $d; return ;; esac
    done
    i=$((i + 1)); sleep 0.5
  done
}
sd_disks() { ls /sys/block | grep '^sd' | tr '\n' ' '; }

# srp_attach PEER LINE WHAT: logs ib_srp in with the add_target LINE; the
# disk that appears is PEER's (DEV_<PEER>), written once as the other
# peers' regions are.
srp_attach() {
  before=$(sd_disks)
  echo "$2" > /sys/class/infiniband_srp/srp-rxe0-1/add_target
  D=$(new_disk "$before")
  if [ -n "$D" ]; then
    eval "DEV_$1=/dev/$D"; live="$live $1"; say "$1: /dev/$D over ib_srp ($3)"
    fio --name=fill --filename=/dev/$D --ioengine=libaio --direct=1 --rw=write --bs=1m --iodepth=8 --size=256m > $O/$1-fill.log 2>&1
  else say "$1: no disk appeared: $(dmesg | grep -i srp | tail -3 | tr '\n' ' ')"; fi
}

say "kernel $(uname -r), $(nproc) CPUs; peers: $PEERS; $ROUNDS rounds of ${RT}s + ${RAMP}s"
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
GUID=$(tr -d : < /sys/class/infiniband/rxe0/node_guid)
live=""

for p in $PEERS; do
  case $p in
  gosrp*)
    # Each gosrp peer is its own srpd; OPTS_<peer> (comma-separated
    # KEY=VALUE) are provider options for both srpd and bench, so that two
    # settings of the ibverbs provider meet the same boot (peers.sh).
    port=$((4430 + ${ngosrp:-0})); ngosrp=$((${ngosrp:-0} + 1))
    eval "popts=\${OPTS_$p:-}"
    pflags=""
    for kv in $(echo "$popts" | tr , ' '); do pflags="$pflags --provider-option $kv"; done
    eval "PORT_$p=$port FLAGS_$p=\"$pflags\""
    mkdir -m 700 -p /tmp/srpd-$p
    srpd --provider ibverbs $pflags --listen $IP:$port --backend memory --data /tmp/srpd-$p > $O/srpd-$p.log 2>&1 &
    SRPDS="${SRPDS:-} $!"
    i=0
    until grep -q msg=serving $O/srpd-$p.log; do
      i=$((i + 1)); [ $i -gt 200 ] && break; sleep 0.3
    done
    # The region is written once, as for the kernel peers' devices.
    if bench --provider ibverbs $pflags --target $IP:$port --rw read --bs 1m --iodepth 8 --size 256m --runtime 1s --prefill > $O/$p-fill.log 2>&1; then
      live="$live $p"; say "$p: srpd on $IP:$port, provider options '${popts}'"
    else say "$p: not ready: $(tail -3 $O/srpd-$p.log | tr '\n' ' ')"; fi
    ;;
  nvme)
    # A 256 MiB RAM disk exported by the kernel's NVMe-oF target over
    # RDMA, and the kernel's NVMe-oF host connected to it.
    modprobe brd rd_nr=1 rd_size=262144 && modprobe nvmet-rdma && modprobe nvme-rdma
    N=/sys/kernel/config/nvmet
    SUB=$N/subsystems/gosrp-peer
    mkdir -p $SUB/namespaces/1 $N/ports/1
    echo 1 > $SUB/attr_allow_any_host
    echo -n /dev/ram0 > $SUB/namespaces/1/device_path
    echo 1 > $SUB/namespaces/1/enable
    echo rdma > $N/ports/1/addr_trtype
    echo ipv4 > $N/ports/1/addr_adrfam
    echo $IP > $N/ports/1/addr_traddr
    echo 4421 > $N/ports/1/addr_trsvcid
    ln -s $SUB $N/ports/1/subsystems/gosrp-peer
    mkdir -p /etc/nvme && nvme gen-hostnqn > /etc/nvme/hostnqn
    nvme connect -t rdma -a $IP -s 4421 -n gosrp-peer > $O/nvme-connect.log 2>&1
    i=0
    while [ ! -b /dev/nvme0n1 ] && [ $i -lt 60 ]; do i=$((i + 1)); sleep 0.5; done
    if [ -b /dev/nvme0n1 ]; then
      NVME=/dev/nvme0n1; live="$live nvme"; say "nvme: $NVME over nvme-rdma"
      fio --name=fill --filename=$NVME --ioengine=libaio --direct=1 --rw=write --bs=1m --iodepth=8 --size=256m > $O/nvme-fill.log 2>&1
    else say "nvme: no namespace appeared: $(cat $O/nvme-connect.log)"; fi
    ;;
  srp)
    # LIO's RAM disk behind ib_srpt, reached by ib_srp. ib_srpt listens on
    # RDMA CM only once given a port; the login's ACL name is the
    # initiator's address; add_target must name the node GUID twice.
    # There is no udev in the guest, so sd_mod is loaded by hand.
    modprobe target_core_mod && modprobe ib_srpt && modprobe ib_srp && modprobe sd_mod
    C=/sys/kernel/config/target
    mkdir -p $C/core/rd_mcp_0/rd0
    echo rd_pages=65536 > $C/core/rd_mcp_0/rd0/control
    echo 1 > $C/core/rd_mcp_0/rd0/enable
    mkdir -p $C/srpt
    echo 5000 > $C/srpt/discovery_auth/rdma_cm_port
    PORT=$C/srpt/$(cut -d: -f5-8 /sys/class/infiniband/rxe0/ports/1/gids/0)
    mkdir -p $PORT/tpgt_1/lun/lun_0 $PORT/tpgt_1/acls/$IP/lun_0
    ln -s $C/core/rd_mcp_0/rd0 $PORT/tpgt_1/lun/lun_0/rd0
    ln -s $PORT/tpgt_1/lun/lun_0 $PORT/tpgt_1/acls/$IP/lun_0/lun0
    echo 1 > $PORT/tpgt_1/enable
    srp_attach srp "id_ext=$GUID,ioc_guid=$GUID,dest=$IP:5000" "ib_srpt, LIO rd_mcp"
    ;;
  srpd*)
    # srpd's SRP personality (memory backend: a RAM volume, as LIO's
    # rd_mcp is for the srp peer) reached by the same kernel ib_srp, so
    # that ib_srp -> srpd and ib_srp -> ib_srpt differ by the target
    # only. Each PEERS word starting with srpd is its own srpd, with the
    # extra srpd flags SRPD_FLAGS_<peer> and the binary SRPD_BIN_<peer>
    # (a file PEERS_FILES brought in; peers.sh). ib_srp refuses a
    # second target port with another's id_ext and ioc_guid
    # (srp_conn_unique), so each srpd has an id_ext of its own.
    modprobe ib_srp && modprobe sd_mod
    n=${nsrpd:-0}; nsrpd=$((n + 1))
    port=$((4440 + n)) idext=$(printf %016x $((0x5d00 + n)))
    eval "sflags=\${SRPD_FLAGS_$p:-} sbin=\${SRPD_BIN_$p:-srpd}"
    [ -n "${PPROF:-}" ] && sflags="$sflags --metrics 127.0.0.1:$((9100 + n)) --pprof" && eval "PPROF_$p=127.0.0.1:$((9100 + n))"
    mkdir -m 700 -p /tmp/srpd-$p
    $sbin --provider ibverbs --listen $IP:$port --backend memory --data /tmp/srpd-$p \
      --srp-id-ext $idext --srp-ioc-guid $GUID $sflags > $O/srpd-$p.log 2>&1 &
    SRPDS="${SRPDS:-} $!"
    eval "TPID_$p=$!"
    i=0
    until grep -q msg=serving $O/srpd-$p.log; do
      i=$((i + 1)); [ $i -gt 200 ] && break; sleep 0.3
    done
    srp_attach $p "id_ext=$idext,ioc_guid=$GUID,dest=$IP:$port" "$sbin's SRP personality, memory backend, flags '$sflags'"
    ;;
  esac
done

r=1
while [ $r -le ${ROUNDS:-2} ]; do
  for p in $live; do
    for j in $JOBS; do
      IFS=: read name rw bs qd <<JOB
$j
JOB
      TPID=
      case $p in
      gosrp*)
        eval "port=\$PORT_$p pflags=\$FLAGS_$p"
        measure $r $p $name bench --provider ibverbs $pflags --target $IP:$port --rw $rw --bs $bs --iodepth $qd --size 256m \
          --runtime ${RT}s --ramp ${RAMP}s --output-format json --output $O/$r-$p-$name.json ;;
      nvme|srp|srpd*)
        [ $p = nvme ] && dev=$NVME || eval "dev=\$DEV_$p"
        eval "pp=\${PPROF_$p:-} TPID=\${TPID_$p:-}"
        if [ -n "$pp" ] && [ $r = 1 ]; then
          # With PPROF set, srpd's CPU profile over each job of round 1.
          python3 -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1]).read())' \
            "http://$pp/debug/pprof/profile?seconds=$((RT + RAMP))" $O/$r-$p-$name.pprof > /dev/null 2>&1 &
        fi
        measure $r $p $name fio ${FIO_FLAGS:-} --name=$p-$name --filename=$dev --ioengine=libaio --direct=1 --rw=$rw --bs=$bs \
          --iodepth=$qd --size=256m --runtime=$RT --ramp_time=$RAMP --time_based --output-format=json --output=$O/$r-$p-$name.json ;;
      esac
    done
  done
  say "round $r done"
  r=$((r + 1))
done

# The raw device: perftest's write and read bandwidth at 4 KiB, over RDMA CM.
for t in ib_write_bw ib_read_bw; do
  $t -d rxe0 -R -F -s 4096 -D $RT > $O/raw-$t-server.log 2>&1 &
  server=$!
  sleep 1
  timeout 60 $t -d rxe0 -R -F -s 4096 -D $RT $IP > $O/raw-$t.log 2>&1 || say "$t failed: $(tail -2 $O/raw-$t.log | tr '\n' ' ')"
  # Its own server only: srpd runs in the background too.
  wait $server
done
for pid in ${SRPDS:-}; do kill -TERM $pid && wait $pid; done
say "done"

#!/bin/bash
# vm-exec.sh BINARY [ARGS...]: run one binary as root inside a fresh rxe VM and
# exit with its exit status. Made for `go test -exec test/rxe/vm-exec.sh`:
# go test builds the test binary on the host (cgo against the host's
# libibverbs, the same suite as the guest) and hands it here.
#
# The binary is copied into a temporary directory shared with the guest over
# 9p (/mnt); the guest has rxe0 on eth0 = 10.0.2.15. Environment variables
# named GOSRP_* and those listed in VM_ENV (space-separated) are forwarded.
# One VM boot per binary (~15-25 s under TCG); run go test with -p 1.
# A kernel WARNING, BUG or oops in the guest's log fails the run even when the
# binary passed (VM_ALLOW_WARN=1 to allow it). VM_FILES (space-separated
# paths) are copied into the share beside the binary; whatever the guest
# writes to /mnt/out is copied to VM_OUT, with the guest's kernel log.
# Env: VM_SMP (2), VM_MEM (2048 MiB), VM_LIMIT (900 s wall for the whole VM),
# VM_KEEP=1 keeps the share directory for inspection, VM_APPEND adds
# kernel arguments (tsc=reliable: the TSC as clock, not the emulated HPET).
. "$(dirname "$0")/common.sh"
[ $# -ge 1 ] || { echo "usage: $0 BINARY [ARGS...]" >&2; exit 2; }
guest_ready || { echo "vm-exec: no guest image in $W; run test/rxe/build-guest.sh" >&2; exit 2; }
bin=$1; shift
SH=$(mktemp -d "${TMPDIR:-/tmp}/gosrp-rxe.XXXXXX")
[ "${VM_KEEP:-0}" = 1 ] && echo "vm-exec: share kept in $SH" >&2 || trap 'rm -rf "$SH"' EXIT
cp "$bin" "$SH/test.bin"
for f in ${VM_FILES:-}; do cp "$f" "$SH/"; done
mkdir -p "$SH/out"
{
  echo '#!/bin/sh'
  for v in $(compgen -e | grep '^GOSRP_' || true) ${VM_ENV:-}; do
    [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  printf 'cd /mnt && exec ./test.bin'; printf ' %q' "$@"; echo
} > "$SH/guest-test.sh"
chmod +x "$SH/guest-test.sh"
start=$SECONDS
timeout "${VM_LIMIT:-900}" qemu-system-x86_64 -M q35 -accel tcg -cpu max \
  -smp "${VM_SMP:-2}" -m "${VM_MEM:-2048}" \
  -kernel "$W/vmlinuz" -initrd "$W/initramfs.cpio" \
  -append "console=ttyS0 panic=-1 quiet ${VM_APPEND:-}" -nographic -no-reboot \
  -netdev user,id=n0 -device virtio-net-pci,netdev=n0 \
  -virtfs "local,path=$SH,mount_tag=hostshare,security_model=none,id=hs0" \
  </dev/null > "$SH/console.log" 2>&1
qrc=$?
[ -f "$SH/.out" ] && cat "$SH/.out"
if [ -n "${VM_OUT:-}" ]; then mkdir -p "$VM_OUT" && cp -r "$SH/out/." "$VM_OUT/" && cp "$SH/.dmesg" "$VM_OUT/dmesg.txt" 2>/dev/null; fi
if [ -s "$SH/.rc" ]; then
  rc=$(cat "$SH/.rc")
  # A kernel warning fails a run that passed: rxe warns where gosrp used it
  # wrong (a QP destroyed with windows still bound through it stalled ~50 s
  # and left one), and the tests alone would not notice. VM_ALLOW_WARN=1 for
  # runs that provoke the kernel on purpose.
  if [ "$rc" = 0 ] && [ "${VM_ALLOW_WARN:-0}" != 1 ] && grep -qE 'WARNING:|BUG:|Oops|Call Trace|general protection' "$SH/.dmesg" 2>/dev/null; then
    echo "vm-exec: the guest kernel warned during a passing run:" >&2
    rc=1
  fi
  if [ "$rc" != 0 ] && [ -s "$SH/.dmesg" ]; then echo "vm-exec: guest kernel log:" >&2; cat "$SH/.dmesg" >&2; fi
  echo "vm-exec: $(basename "$bin") rc=$rc in $((SECONDS - start)) s of VM wall time" >&2
  exit "$rc"
fi
# A guest that died (an oops, a panic) left its last words on the console:
# from the first oops line on when there is one, so that the call trace that
# names the culprit survives into CI's log, else the tail.
echo "vm-exec: no exit status from the VM (qemu rc=$qrc after $((SECONDS - start)) s); console:" >&2
tr -d '\r' < "$SH/console.log" > "$SH/console.txt"
first=$(grep -nE 'BUG:|Oops|WARNING:|general protection' "$SH/console.txt" | head -1 | cut -d: -f1)
if [ -n "$first" ]; then tail -n "+$first" "$SH/console.txt" | head -200 >&2; else tail -40 "$SH/console.txt" >&2; fi
exit 1

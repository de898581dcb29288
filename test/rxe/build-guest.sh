#!/bin/bash
# Builds the rxe test guest in $GOSRP_RXE_DIR (default /var/cache/gosrp-rxe):
#   1. host tools (qemu-system-x86, debootstrap, cpio) from apt;
#   2. Debian's own kernel (the package linux-image-amd64 depends on), unpacked, not installed;
#      it has CONFIG_RDMA_RXE=m; GOSRP_RXE_KERNEL_SUITE=bookworm-backports takes it from that
#      suite of the same mirror instead (a newer rxe beside the same userland; apt lists of
#      their own in $W, the host's apt configuration untouched);
#   3. a minbase userland of the host's Debian suite with rdma-core and librdmacm (debootstrap),
#      plus GOSRP_RXE_EXTRA_PKGS;
#   4. one uncompressed newc cpio = userland + the module closure of rdma_rxe and friends
#      (plus GOSRP_RXE_EXTRA_MODS) +
#      guest-init.sh as /init. The kernel unpacks it as its root: no disk image.
# Steps whose output exists are skipped; FORCE=1 rebuilds everything. Needs root.
. "$(dirname "$0")/common.sh"
mkdir -p "$W"
exec 9>"$W/.build.lock"
flock 9
[ "${FORCE:-0}" = 1 ] && rm -rf "$W/kernel" "$W/rootfs" "$W/image.stamp" "$W/vmlinuz" "$W/initramfs.cpio"
step() { echo "rxe: [$(date +%T)] $*"; }
T0=$SECONDS

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
  step "installing host tools: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The kernel is named by a suite and a package: a kernel image, or a
# metapackage that depends on one (linux-image-6.12-amd64 in
# bookworm-security is 6.12.118 on 2026-12-06).
KSTAMP="${GOSRP_RXE_KERNEL_SUITE:-} ${GOSRP_RXE_KERNEL_PKG:-linux-image-amd64}"
if [ "$(cat "$W/kernel.suite" 2>/dev/null)" != "$KSTAMP" ]; then
  rm -rf "$W/kernel"
fi
if [ ! -d "$W/kernel/lib/modules" ]; then
  step "downloading the Debian kernel"
  rm -rf "$W/kpkg" "$W/kernel.tmp"; mkdir -p "$W/kpkg"
  APT=()
  if [ -n "${GOSRP_RXE_KERNEL_SUITE:-}" ]; then
    mkdir -p "$W/apt/lists/partial"
    echo "deb $(mirror) $GOSRP_RXE_KERNEL_SUITE main" > "$W/apt/sources.list"
    APT=(-o "Dir::Etc::sourcelist=$W/apt/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$W/apt/lists")
    apt-get "${APT[@]}" update -qq
  fi
  PKG=${GOSRP_RXE_KERNEL_PKG:-linux-image-amd64}
  DEP=$(apt-cache "${APT[@]}" depends "$PKG" | awk '/Depends: linux-image-/{print $2; exit}')
  [ -n "$DEP" ] && PKG=$DEP
  apt-cache "${APT[@]}" show "$PKG" >/dev/null 2>&1 || { echo "rxe: no kernel package $PKG in the apt lists (apt-get update?)" >&2; exit 1; }
  ( cd "$W/kpkg" && apt-get "${APT[@]}" download "$PKG" 2>&1 | grep -v unsandboxed || true )
  dpkg -x "$W/kpkg/${PKG}"_*.deb "$W/kernel.tmp"
  grep -q '^CONFIG_RDMA_RXE=[ym]' "$W/kernel.tmp/boot/config-"* || { echo "rxe: $PKG has no CONFIG_RDMA_RXE" >&2; exit 1; }
  rm -rf "$W/kpkg"
  mv "$W/kernel.tmp" "$W/kernel"
  echo "$KSTAMP" > "$W/kernel.suite"
  step "kernel $PKG unpacked"
fi

PKGS=$(echo $GUEST_PKGS | tr ' ' ',')
if [ ! -x "$W/rootfs/usr/bin/ibv_devices" ] || [ "$(cat "$W/rootfs.pkgs" 2>/dev/null)" != "$PKGS" ]; then
  step "debootstrap $SUITE minbase (the long step)"
  rm -rf "$W/rootfs.tmp" "$W/rootfs"
  debootstrap --variant=minbase --include="$PKGS" \
    "$SUITE" "$W/rootfs.tmp" "$(mirror)" > "$W/debootstrap.log" 2>&1 \
    || { tail -20 "$W/debootstrap.log" >&2; exit 1; }
  mv "$W/rootfs.tmp" "$W/rootfs"
  echo "$PKGS" > "$W/rootfs.pkgs"
  step "userland ready ($(du -sh "$W/rootfs" | cut -f1))"
fi

if ! guest_ready; then
  step "packing the initramfs"
  KV=$(kver)
  S="$W/stage"
  rm -rf "$S"
  cp -a "$W/rootfs" "$S"
  rm -rf "$S"/usr/share/doc/* "$S"/usr/share/man/* "$S"/usr/share/locale/* \
         "$S"/var/cache/apt/* "$S"/var/lib/apt/lists/*
  # The module closure, computed with the guest's own kmod (the host needs none).
  mkdir -p "$S/tmp/kstage/lib/modules"
  cp -a "$W/kernel/lib/modules/$KV" "$S/tmp/kstage/lib/modules/"
  chroot "$S" depmod -b /tmp/kstage "$KV"
  for m in $GUEST_MODS; do chroot "$S" modprobe -d /tmp/kstage -S "$KV" --show-depends "$m"; done \
    | awk '$1=="insmod"{print $2}' | sort -u > "$W/modlist.txt"
  while read -r f; do
    rel=${f#/tmp/kstage}
    mkdir -p "$S$(dirname "$rel")"
    cp "$S$f" "$S$rel"
  done < "$W/modlist.txt"
  cp "$S/tmp/kstage/lib/modules/$KV"/modules.{order,builtin,builtin.modinfo} "$S/lib/modules/$KV/"
  rm -rf "$S/tmp/kstage"
  chroot "$S" depmod "$KV"
  install -m 755 "$RXE_SCRIPTS/guest-init.sh" "$S/init"
  mkdir -p "$S/mnt"
  # Uncompressed: decompression is slow under TCG.
  ( cd "$S" && find . -print0 | cpio --null -o -H newc --quiet ) > "$W/initramfs.cpio.tmp"
  mv "$W/initramfs.cpio.tmp" "$W/initramfs.cpio"
  cp "$W/kernel/boot/vmlinuz-$KV" "$W/vmlinuz"
  rm -rf "$S"
  guest_stamp > "$W/image.stamp"
  step "guest image ready: kernel $KV, $(wc -l < "$W/modlist.txt") modules, initramfs $(du -h "$W/initramfs.cpio" | cut -f1)"
fi
step "guest build done in $((SECONDS - T0)) s ($W)"

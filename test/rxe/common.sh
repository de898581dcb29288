# Shared settings for the rxe VM harness; sourced by the other scripts.
# The built guest lives outside the repository, in $GOSRP_RXE_DIR.
set -eu
W=${GOSRP_RXE_DIR:-/var/cache/gosrp-rxe}
RXE_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Debian suite of the guest userland. It must match the host's glibc and
# libibverbs, because test binaries are built on the host and run in the guest.
SUITE=${GOSRP_RXE_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}

# mirror prints the Debian mirror this host's apt uses (never hard-coded).
mirror() {
  local m
  m=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '$1=="deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$m" ] || { echo "rxe: no Debian mirror found in the apt configuration" >&2; exit 1; }
  echo "$m"
}

# kver prints the version of the unpacked guest kernel.
kver() { ls "$W/kernel/lib/modules" | head -1; }

# Extra Debian packages and kernel modules for a guest that needs more than
# rxe (peers.sh: fio, nvme-cli, perftest, the kernel's NVMe-oF and SRP).
GUEST_PKGS="rdma-core ibverbs-providers libibverbs1 librdmacm1 ibverbs-utils rdmacm-utils iproute2 kmod procps ${GOSRP_RXE_EXTRA_PKGS:-}"
GUEST_MODS="rdma_rxe ib_uverbs rdma_ucm ib_umad virtio_net virtio_pci crc32_generic 9pnet_virtio 9p ${GOSRP_RXE_EXTRA_MODS:-}"

# guest_stamp identifies the scripts and package and module lists the guest
# image was built from, so a change to any of them rebuilds the image.
guest_stamp() { { cat "$RXE_SCRIPTS/guest-init.sh" "$RXE_SCRIPTS/build-guest.sh"; echo "$GUEST_PKGS / $GUEST_MODS / ${GOSRP_RXE_KERNEL_SUITE:-} / ${GOSRP_RXE_KERNEL_PKG:-}"; } | sha256sum | cut -c1-16; }

# guest_ready succeeds when a bootable guest for the current scripts exists.
guest_ready() {
  [ -s "$W/vmlinuz" ] && [ -s "$W/initramfs.cpio" ] && [ "$(cat "$W/image.stamp" 2>/dev/null)" = "$(guest_stamp)" ]
}

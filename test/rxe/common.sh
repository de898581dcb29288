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

# guest_stamp identifies the scripts the guest image was built from, so a
# changed guest-init.sh or build-guest.sh triggers a rebuild of the image.
guest_stamp() { cat "$RXE_SCRIPTS/guest-init.sh" "$RXE_SCRIPTS/build-guest.sh" | sha256sum | cut -c1-16; }

# guest_ready succeeds when a bootable guest for the current scripts exists.
guest_ready() {
  [ -s "$W/vmlinuz" ] && [ -s "$W/initramfs.cpio" ] && [ "$(cat "$W/image.stamp" 2>/dev/null)" = "$(guest_stamp)" ]
}

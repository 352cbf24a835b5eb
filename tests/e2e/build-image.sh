#!/usr/bin/env bash
# Builds the end-to-end test's base image once and caches it; prints the cache
# directory on stdout. A warm call only checks that the directory is complete.
#
#   ${SPOTVISOR_CACHE_DIR:-/var/cache/spotvisor}/e2e-<hash>/
#     rootfs/       the debootstrapped tree; each run installs spotvisor on an overlay
#                   of it and makes the ext4 image with mke2fs -d (install-spotvisor.sh)
#     vmlinuz, initrd.img   the guest's kernel and initrd, for qemu -kernel/-initrd
#     packages.txt  what is installed (dpkg-query), for the record
#
# The key hashes this script and image-packages.txt: edit either and the next run
# builds a new image (old ones can be deleted by hand). Needs root (debootstrap,
# chroot) and the Debian archive.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache_root=${SPOTVISOR_CACHE_DIR:-/var/cache/spotvisor}
mirror=${SPOTVISOR_E2E_MIRROR:-http://deb.debian.org/debian}

key=$(cat "$here/build-image.sh" "$here/image-packages.txt" | sha256sum | cut -c1-16)
dir=$cache_root/e2e-$key
if [ -f "$dir/complete" ]; then
  echo "$dir"
  exit 0
fi

log() { echo "build-image: $*" >&2; }
mkdir -p "$cache_root"
# One builder at a time; a second caller waits and then finds the image done.
exec 9>"$cache_root/e2e-$key.lock"
flock 9
if [ -f "$dir/complete" ]; then
  echo "$dir"
  exit 0
fi

start=$(date +%s)
work=$(mktemp -d "$cache_root/e2e-$key.tmp.XXXXXX")
root=$work/rootfs
cleanup() {
  mountpoint -q "$root/proc" 2>/dev/null && umount "$root/proc"
  rm -rf "$work"
}
trap cleanup EXIT

packages=$(grep -v '^\s*#' "$here/image-packages.txt" | grep -v '^\s*$' | paste -sd, -)
log "debootstrap bookworm into $root (a few minutes)"
debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -30 "$work/debootstrap.log" >&2
  exit 1
}

log "configuring the guest"
echo spotvisor-e2e >"$root/etc/hostname"
cat >"$root/etc/hosts" <<'EOF'
127.0.0.1 localhost
127.0.1.1 spotvisor-e2e
# As on GCE: the metadata server by name.
169.254.169.254 metadata.google.internal metadata
EOF
# Root is given on the kernel command line (root=/dev/vda rw); no fsck of a mounted root.
echo '/dev/vda / ext4 rw,errors=remount-ro 0 0' >"$root/etc/fstab"
# A fixed machine-id: an empty one means "first boot", and systemd 252 then
# applies presets to every unit, which is not what a baked image sees.
echo 5b1c0e2e5b1c0e2e5b1c0e2e5b1c0e2e >"$root/etc/machine-id"

# Networking as on a GCE image: DHCP on the NIC, and network-online.target
# waits for it (spotvisor's unit is ordered after it).
mkdir -p "$root/etc/systemd/network"
cat >"$root/etc/systemd/network/80-e2e.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
EOF
chroot "$root" systemctl enable systemd-networkd.service systemd-networkd-wait-online.service >/dev/null 2>&1

# The journal on the serial console, so a failing run can be read from the
# serial log alone: spotvisor's JSON lines, the trainer's output, and systemd's
# own start/stop lines, interleaved with the kernel's.
mkdir -p "$root/etc/systemd/journald.conf.d"
cat >"$root/etc/systemd/journald.conf.d/e2e-console.conf" <<'EOF'
[Journal]
Storage=volatile
ForwardToConsole=yes
TTYPath=/dev/ttyS0
MaxLevelConsole=info
EOF
# A login prompt on the console would only add noise to the serial log.
chroot "$root" systemctl mask serial-getty@ttyS0.service getty@tty1.service >/dev/null 2>&1
# Timers and a boot-time scrub that would only compete for the two emulated CPUs.
chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
  fstrim.timer >/dev/null 2>&1 || true

# A small initrd boots faster under emulation: only what a GCE-like VM needs.
cat >"$root/etc/initramfs-tools/conf.d/e2e.conf" <<'EOF'
MODULES=list
EOF
cat >>"$root/etc/initramfs-tools/modules" <<'EOF'
virtio_pci
virtio_blk
virtio_scsi
virtio_net
ext4
EOF
mount -t proc proc "$root/proc"
chroot "$root" update-initramfs -u -k all >"$work/initramfs.log" 2>&1 || {
  cat "$work/initramfs.log" >&2
  exit 1
}
umount "$root/proc"

chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old "$root"/var/log/*.log
chroot "$root" dpkg-query -W -f='${Package} ${Version}\n' >"$work/packages.txt"

cp "$(readlink -f "$root/vmlinuz")" "$work/vmlinuz"
cp "$(readlink -f "$root/initrd.img")" "$work/initrd.img"

mv "$work" "$dir"
root=$dir/rootfs
trap - EXIT
touch "$dir/complete"
log "built $dir in $(( $(date +%s) - start ))s"
echo "$dir"

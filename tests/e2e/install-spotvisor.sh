#!/usr/bin/env bash
# Bakes one run's guest image: spotvisor installed into the cached base rootfs
# the way an image build would, then an ext4 image made with mke2fs -d.
#
#   install-spotvisor.sh --base DIR --out IMG --deb PATH [--file SRC:DEST:MODE]... [--unit-env KEY=VALUE]...
#   install-spotvisor.sh --base DIR --out IMG --binary PATH --unit PATH [--file ...] [--unit-env ...]
#
# --deb: `dpkg -i` inside a chroot of the base tree, so the package's Depends
#   are checked against the image and its maintainer scripts really run (they
#   create the user and enable the service). Services are not started in the
#   chroot (policy-rc.d, as in any image build).
# --binary/--unit: the stand-in until the package exists: the binary goes where
#   the unit's ExecStart says, the unit to /lib/systemd/system, `systemctl
#   enable` in the chroot; shared libraries the binary needs and the base image
#   lacks (libfmt.so.9, ...) are copied from this host (also Debian 12).
# --file: extra files for the test (the trainer), installed with MODE.
# --unit-env: an Environment= line in a drop-in for spotvisor.service
#   (/etc/systemd/system/spotvisor.service.d/e2e-endpoints.conf), the way an
#   image would point the service somewhere. The boot test passes the AWS
#   endpoint overrides (AWS_ENDPOINT_URL_S3, _EC2, _CLOUDWATCH_LOGS) at fixed
#   guest addresses, which each EC2 scenario forwards to its fakes (guest.py);
#   never the metadata endpoints: the EC2 scenario tests detection at the real
#   default address.
#
# The cached tree is never written: the install happens on an overlay of it
# (or, where overlayfs cannot be mounted, on a copy).
set -euo pipefail

base='' out='' deb='' binary='' unit=''
files=()
unit_env=()
while [ $# -gt 0 ]; do
  case $1 in
    --base) base=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --deb) deb=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    --unit) unit=$2; shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    --unit-env) unit_env+=("$2"); shift 2 ;;
    *) echo "install-spotvisor: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$base" ] || [ -z "$out" ] || { [ -z "$deb" ] && { [ -z "$binary" ] || [ -z "$unit" ]; }; }; then
  echo "usage: install-spotvisor.sh --base DIR --out IMG (--deb PATH | --binary PATH --unit PATH) [--file SRC:DEST:MODE]..." >&2
  exit 2
fi
log() { echo "install-spotvisor: $*" >&2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/spotvisor-e2e-install.XXXXXX")
root=$work/merged
mounted=()
cleanup() {
  local i
  for (( i=${#mounted[@]}-1; i>=0; i-- )); do umount "${mounted[$i]}" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/upper" "$work/ovl" "$root"
if mount -t overlay overlay -o "lowerdir=$base/rootfs,upperdir=$work/upper,workdir=$work/ovl" "$root" 2>/dev/null; then
  mounted+=("$root")
else
  log "overlayfs not available, copying the base tree"
  cp -a "$base/rootfs/." "$root/"
fi
mount -t proc proc "$root/proc"
mounted+=("$root/proc")

if [ -n "$deb" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  cp "$deb" "$root/tmp/spotvisor.deb"
  log "dpkg -i $(basename "$deb")"
  if ! chroot "$root" dpkg -i /tmp/spotvisor.deb >"$work/dpkg.log" 2>&1; then
    cat "$work/dpkg.log" >&2
    log "dpkg -i failed in the base image (unmet Depends? a failing maintainer script?)"
    exit 1
  fi
  sed 's/^/  dpkg: /' "$work/dpkg.log" >&2
  rm -f "$root/tmp/spotvisor.deb" "$root/usr/sbin/policy-rc.d"
  # shellcheck disable=SC2016  # dpkg-query's own ${field} syntax
  chroot "$root" dpkg-query -W -f='  installed ${Package} ${Version} (${Status})\n' spotvisor >&2 || true
else
  exec_path=$(sed -n 's/^ExecStart=[-@:+!]*\([^ ]*\).*/\1/p' "$unit" | head -1)
  [ -n "$exec_path" ] || { log "no ExecStart in $unit"; exit 1; }
  install -D -m 755 "$binary" "$root$exec_path"
  install -D -m 644 "$unit" "$root/lib/systemd/system/spotvisor.service"
  # Libraries the binary links that the image does not have (a stand-in for the
  # package's Depends).
  ldd "$binary" | awk '/=> \//{print $1, $3}' | while read -r soname path; do
    if ! ls "$root"/lib/x86_64-linux-gnu/"$soname" "$root"/usr/lib/x86_64-linux-gnu/"$soname" >/dev/null 2>&1; then
      log "copying $soname from the host (binary mode only)"
      install -D -m 644 "$(readlink -f "$path")" "$root/usr/lib/x86_64-linux-gnu/$soname"
    fi
  done
  chroot "$root" systemctl enable spotvisor.service >&2
  log "installed $exec_path and spotvisor.service (binary mode, no package scripts)"
fi

for spec in "${files[@]}"; do
  IFS=: read -r src dest mode <<<"$spec"
  install -D -m "${mode:-644}" "$src" "$root$dest"
done

if [ ${#unit_env[@]} -gt 0 ]; then
  dropin=$root/etc/systemd/system/spotvisor.service.d/e2e-endpoints.conf
  mkdir -p "$(dirname "$dropin")"
  {
    echo "# Written by tests/e2e/install-spotvisor.sh: the fakes' fixed guest-side endpoints."
    echo "[Service]"
    for kv in "${unit_env[@]}"; do
      if [[ ! $kv =~ ^[A-Z_][A-Z0-9_]*=[^[:space:]\"\'%\\]*$ ]]; then
        log "--unit-env $kv: expected KEY=VALUE without spaces, quotes, % or backslashes"
        exit 2
      fi
      echo "Environment=$kv"
    done
  } >"$dropin"
  log "drop-in $(basename "$dropin"): ${unit_env[*]}"
fi

umount "$root/proc"
unset 'mounted[${#mounted[@]}-1]'
# Room for checkpoints and the journal.
size_mb=$(( $(du -sm "$root" | cut -f1) + 512 ))
rm -f "$out"
mke2fs -q -t ext4 -L e2e-root -d "$root" "$out" "${size_mb}M" >/dev/null
log "image $out (${size_mb} MiB)"

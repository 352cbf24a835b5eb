#!/usr/bin/env bash
# The end-to-end test: the spotvisor package baked into a Debian 12 image and
# booted under QEMU (software emulation) against the fake metadata server, GCS
# and Cloud Logging (GCE), or the fake IMDS, S3 and EC2 API (the EC2 scenario).
# See tests/e2e/README.md.
#
#   tests/e2e/run.sh --deb PATH [TEST...]                # the package (CI)
#   tests/e2e/run.sh --binary PATH --unit PATH [TEST...] # a bare binary + unit, before packaging
#
# TEST: unittest names, e.g. BootTest.test_2_preemption_sigint_final_checkpoint_and_poweroff_within_30s.
# Exit status: 0 all passed, 1 a failure, 2 bad usage, 77 skipped (no QEMU).
# Environment: SPOTVISOR_CACHE_DIR (default /var/cache/spotvisor) holds the base
# image; SPOTVISOR_E2E_WORKDIR keeps serial logs there (default: a new /tmp dir);
# SPOTVISOR_E2E_KEEP_IMAGE=1 keeps the baked image to boot it by hand.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() {
  sed -n '7,8p' "$0" | sed 's/^#  */usage: /' >&2
  exit 2
}
deb='' binary='' unit=''
tests=()
while [ $# -gt 0 ]; do
  case $1 in
    --deb) [ $# -ge 2 ] || usage; deb=$(readlink -f "$2"); shift 2 ;;
    --binary) [ $# -ge 2 ] || usage; binary=$(readlink -f "$2"); shift 2 ;;
    --unit) [ $# -ge 2 ] || usage; unit=$(readlink -f "$2"); shift 2 ;;
    -h|--help) usage ;;
    -*) echo "run.sh: unknown option $1" >&2; usage ;;
    *) tests+=("$1"); shift ;;
  esac
done
if [ -n "$deb" ]; then
  [ -f "$deb" ] || { echo "run.sh: no package at $deb" >&2; exit 1; }
  export SPOTVISOR_E2E_DEB=$deb
elif [ -n "$binary" ] && [ -n "$unit" ]; then
  if [ ! -x "$binary" ] || [ ! -f "$unit" ]; then echo "run.sh: $binary or $unit missing" >&2; exit 1; fi
  export SPOTVISOR_E2E_BINARY=$binary SPOTVISOR_E2E_UNIT=$unit
else
  echo "run.sh: give the package to test (--deb PATH, from scripts/package.sh), or --binary PATH --unit PATH" >&2
  usage
fi

if ! command -v qemu-system-x86_64 >/dev/null || ! qemu-system-x86_64 -accel help 2>/dev/null | grep -qx tcg; then
  echo "run.sh: SKIP: qemu-system-x86_64 with TCG is not installed (apt-get install qemu-system-x86)" >&2
  exit 77
fi
missing=()
for tool in debootstrap socat mke2fs chroot g++; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=("libc6-dev (static libc for the trainer)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "run.sh: missing: ${missing[*]} (scripts/install-deps.sh installs them)" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "run.sh: must run as root (debootstrap, chroot and an overlay mount build the image)" >&2
  exit 1
fi

cd "$here/../.."
# Debian's interpreter: fake_gcs needs python3-crcmod, fake_s3 python3-crc32c.
exec env PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 "$here/test_boot.py" -v "${tests[@]}"

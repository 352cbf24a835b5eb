#!/usr/bin/env bash
# Installs what spotvisor needs to build, test and run its demo, from Debian
# 12's own packages. Safe to run again: it only installs what is missing.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libboost-dev libcurl4-openssl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libsystemd-dev libblkid-dev catch2
  python3 python3-crcmod rclone fuse3 e2fsprogs curl procps packer
  clang libclang-rt-dev  # the libFuzzer targets in fuzz/ (docs/fuzzing.md): clang, libFuzzer and the sanitizer runtimes
  # the .deb and its tests (tests/package), the boot test under QEMU (tests/e2e)
  dpkg-dev debootstrap gpg gpgv xz-utils systemd qemu-system-x86 socat
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root (or with sudo) to install them" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

#!/usr/bin/env bash
# Installs what spotvisor needs to build, test and run its demo, from Debian
# 12's own packages. Safe to run again: it only installs what is missing.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libboost-dev libcurl4-openssl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libsystemd-dev libblkid-dev libssl-dev catch2
  python3 python3-crcmod python3-crc32c rclone fuse3 e2fsprogs curl procps packer openssl
  etcd-server  # gangs (issue #16): the real etcd the client is tested against (tests/gang)
  openssh-client  # gangs: ssh-keygen makes and checks the per-generation key of gang-launch = leader (lib/gang/ssh_trust.cc)
  iproute2  # gangs: ip netns/veth/bridge and ss for the network-namespace harness (tests/integration/gang_netns.py)
  python3-torch  # gangs: the DDP example (examples/ddp_train.py) as a real distributed trainer (gloo, CPU)
  clang libclang-rt-dev  # the libFuzzer targets in fuzz/ (docs/fuzzing.md): clang, libFuzzer and the sanitizer runtimes
  # the .deb and its tests (tests/package), the boot test under QEMU (tests/e2e)
  dpkg-dev debootstrap gpg gpgv xz-utils systemd qemu-system-x86 socat
  awscli python3-boto3  # AWS's own clients (aws-cli 2, botocore) against the fake S3 and IMDS (tests/fakes)
)
# Node.js and npm run Google's own clients against the fakes (tests/fakes/node/). A machine
# that has node with npm already (NodeSource's nodejs bundles npm) keeps it; Debian's
# packages otherwise.
command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}; run as root (or with sudo) to install them" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Node clients, at the versions package-lock.json pins, from the npm registry. Without
# them the interop tests say they were skipped and why; nothing else needs them.
node_dir=tests/fakes/node
if [ ! -f "$node_dir/node_modules/.package-lock.json" ] || ! cmp -s "$node_dir/package-lock.json" "$node_dir/.installed-lock"; then
  if (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error >&2); then
    cp "$node_dir/package-lock.json" "$node_dir/.installed-lock"
  else
    echo "install-deps: WARNING: npm ci in $node_dir failed; the Node interop tests (Google's clients, s3rver) will be skipped" >&2
  fi
fi

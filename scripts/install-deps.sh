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
  openmpi-bin  # gangs: mpiexec for gang-launch = leader (tests/integration/test_gang_leader.py)
  python3-torch  # gangs: the DDP example (examples/ddp_train.py) as a real distributed trainer (gloo, CPU)
  clang libclang-rt-dev  # the libFuzzer targets in fuzz/ (docs/fuzzing.md): clang, libFuzzer and the sanitizer runtimes
  # the .deb and its tests (tests/package), the boot test under QEMU (tests/e2e)
  dpkg-dev debootstrap gpg gpgv xz-utils systemd qemu-system-x86 socat
  libisal2  # Intel's ISA-L: the fake GCS hashes big uploads with its CRC32C, off Python's GIL (tests/fakes/README.md)
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

# gangs: gang-launch = leader is tested with Debian's own sshd in the test's network namespaces
# (tests/integration/gang_netns.py looks here). Extracted from openssh-server's .deb, not installed:
# installing it would start and enable an sshd on this machine.
sshd_cache=/var/cache/spotvisor-test/openssh-server
if [ ! -x /usr/sbin/sshd ] && [ ! -x "$sshd_cache/usr/sbin/sshd" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: run as root to extract openssh-server's sshd into $sshd_cache (gang-launch = leader tests)" >&2
  else
    deb_dir=$(mktemp -d)
    chown _apt "$deb_dir" 2>/dev/null || true  # apt-get download fetches as _apt
    client=$(dpkg-query -W -f='${Version}' openssh-client)  # the same version as ssh, when the archive still has it
    if (cd "$deb_dir" && { apt-get download -qq "openssh-server=$client" 2>/dev/null || apt-get download -qq openssh-server; }) \
        && rm -rf "$sshd_cache.new" && mkdir -p "$sshd_cache.new" && dpkg -x "$deb_dir"/openssh-server_*.deb "$sshd_cache.new"; then
      rm -rf "$sshd_cache" && mv "$sshd_cache.new" "$sshd_cache"
      echo "install-deps: $("$sshd_cache/usr/sbin/sshd" -V 2>&1 | head -1) extracted to $sshd_cache"
    else
      echo "install-deps: WARNING: could not get openssh-server's sshd; the gang-launch = leader tests will be skipped" >&2
    fi
    rm -rf "$deb_dir"
  fi
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

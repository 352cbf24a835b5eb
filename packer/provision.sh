#!/bin/bash
# Turns a running Deep Learning VM into a spotvisor image: installs gcsfuse
# from Google's apt repository and the spotvisor .deb, makes sure the service
# is enabled for the VMs made from the image but has not run (or left
# anything behind) on this one, and clears what must not be baked in.
#
# Run as root on the VM being baked:
#   packer: spotvisor.pkr.hcl runs it (SPOTVISOR_DEB=/tmp/spotvisor.deb); so does
#           aws/spotvisor.pkr.hcl, with INSTALL_GCSFUSE=false.
#   by hand: sudo env SPOTVISOR_DEB=/tmp/spotvisor_VERSION-1_amd64.deb bash provision.sh
#            (docs/quickstart.md, "Bake the image without Packer").
# Environment:
#   SPOTVISOR_DEB   path of the .deb on this VM (required)
#   INSTALL_RCLONE  true: also install rclone (mount-driver = rclone); default false
#   INSTALL_MPI     true: also install sshd, ssh and Open MPI, what every member of a gang
#                   with gang-launch = leader needs (docs/gang.md); default false
#   INSTALL_GCSFUSE false: skip gcsfuse (AWS images: packer/aws/); default true
#   KEEP_MACHINE_ID true: do not reset /etc/machine-id; default false
#
# What it assumes about the package (built by scripts/package.sh): it installs
# /usr/bin/spotvisor, the unit spotvisor.service and /etc/spotvisor/spotvisor.conf,
# creates the user `spotvisor`, and its postinst enables the service. The
# package says it does not start it; nothing here relies on that (step 2).
set -euo pipefail

: "${SPOTVISOR_DEB:?set SPOTVISOR_DEB to the path of the spotvisor .deb on this VM}"
INSTALL_RCLONE="${INSTALL_RCLONE:-false}"
INSTALL_MPI="${INSTALL_MPI:-false}"
INSTALL_GCSFUSE="${INSTALL_GCSFUSE:-true}"
KEEP_MACHINE_ID="${KEEP_MACHINE_ID:-false}"

say() { printf '==> %s\n' "$*"; }
die() { printf 'provision.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (sudo)"
[ -f "$SPOTVISOR_DEB" ] || die "no such file: $SPOTVISOR_DEB"

export DEBIAN_FRONTEND=noninteractive
# A Deep Learning VM's first boot runs cloud-init and apt timers
# (unattended-upgrades) that hold the dpkg lock: wait for them instead of
# failing. DPkg::Lock::Timeout needs apt >= 1.9.11 (Ubuntu 22.04 has 2.4).
apt_get() {
  apt-get -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef \
    -o Dpkg::Options::=--force-confold "$@"
}
if command -v cloud-init >/dev/null 2>&1; then
  say "waiting for cloud-init to finish"
  cloud-init status --wait >/dev/null || true
fi

# 1. gcsfuse, from Google's repository (the distributions do not package it).
# Not on AWS images (INSTALL_GCSFUSE=false: bucket-mount is Cloud Storage only).
apt_get update
if [ "$INSTALL_GCSFUSE" != "true" ]; then
  say "not installing gcsfuse (INSTALL_GCSFUSE=$INSTALL_GCSFUSE)"
elif command -v gcsfuse >/dev/null 2>&1; then
  say "gcsfuse already installed: $(gcsfuse --version 2>&1 | head -n1)"
else
  say "adding Google's gcsfuse apt repository"
  apt_get update
  apt_get install -y --no-install-recommends ca-certificates curl lsb-release
  codename="$(lsb_release -c -s)"
  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg \
    -o /usr/share/keyrings/cloud.google.asc
  echo "deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-${codename} main" \
    >/etc/apt/sources.list.d/gcsfuse.list
fi
apt_get update
if [ "$INSTALL_GCSFUSE" = "true" ] && ! command -v gcsfuse >/dev/null 2>&1; then
  say "installing gcsfuse"
  apt_get install -y gcsfuse
fi
# spotvisor unmounts with `fusermount -u`; Debian's and Ubuntu's fuse3
# provide it as a link to fusermount3.
if ! command -v fusermount >/dev/null 2>&1 && ! command -v fusermount3 >/dev/null 2>&1; then
  say "installing fuse3 (fusermount)"
  apt_get install -y fuse3
fi
if [ "$INSTALL_RCLONE" = "true" ]; then
  say "installing rclone (from the distribution's archive)"
  apt_get install -y rclone
fi
if [ "$INSTALL_MPI" = "true" ]; then
  # gang-launch = leader: rank 0's mpiexec reaches the other members over
  # ssh, with a key spotvisor trusts for one generation at a time.
  say "installing openssh-server, openssh-client and openmpi-bin (gang-launch = leader)"
  apt_get install -y openssh-server openssh-client openmpi-bin
fi

# 2. spotvisor, with the service kept from starting on this VM.
# This VM boots without any spotvisor-command, so a started daemon would hit
# a configuration error, and a configuration error in daemon mode runs
# on-exit: it would power this VM off in the middle of the bake. And if the
# project's metadata sets spotvisor-command, it would start a real trainer
# here. So:
#  - policy-rc.d tells deb-systemd-invoke / invoke-rc.d (what maintainer
#    scripts use to start services) not to start anything during the install;
#  - the template gives this VM the instance attribute spotvisor-on-exit=none,
#    so even a daemon started some other way cannot power it off;
#  - step 3 stops the service if it runs all the same.
policy=/usr/sbin/policy-rc.d
policy_backup=""
if [ -e "$policy" ]; then
  policy_backup="$(mktemp)"
  cp -a "$policy" "$policy_backup"
fi
restore_policy() {
  if [ -n "$policy_backup" ]; then mv -f "$policy_backup" "$policy"; else rm -f "$policy"; fi
}
trap restore_policy EXIT
printf '#!/bin/sh\n# provision.sh: no service starts while the image is baked\nexit 101\n' >"$policy"
chmod 0755 "$policy"

say "installing $SPOTVISOR_DEB"
deb_abs="$(readlink -f "$SPOTVISOR_DEB")"
apt_get install -y "$deb_abs"   # a path: apt resolves the package's Depends
restore_policy
trap - EXIT

# 3. The image must boot with the service enabled, and carry nothing from this VM.
say "checking the installed package"
spotvisor version
spotvisor config --template >/dev/null   # runs on this distribution; reads no metadata
if systemctl is-active --quiet spotvisor.service; then
  say "spotvisor.service was started during the install: stopping it"
  systemctl stop spotvisor.service
fi
systemctl reset-failed spotvisor.service 2>/dev/null || true
systemctl enable spotvisor.service   # normally already done by the postinst
state="$(systemctl is-enabled spotvisor.service 2>&1 || true)"
[ "$state" = enabled ] || die "spotvisor.service is not enabled (systemctl is-enabled: $state)"
id spotvisor >/dev/null 2>&1 || say "warning: no user spotvisor (the package should create it)"

say "clearing state that must not be baked into the image"
# Checkpoints from a trainer started here would be restored by nothing and
# uploaded by the first sync of every VM made from the image.
if [ -d /var/lib/spotvisor ]; then
  find /var/lib/spotvisor -mindepth 2 -delete 2>/dev/null || true
fi
rm -rf /run/spotvisor/* 2>/dev/null || true
rm -f "$SPOTVISOR_DEB"
apt_get clean
# The journal would show this VM's boot (and any spotvisor lines) on every
# VM made from the image.
journalctl --rotate >/dev/null 2>&1 || true
journalctl --vacuum-time=1s >/dev/null 2>&1 || true
if [ "$KEEP_MACHINE_ID" != "true" ]; then
  # An empty machine-id makes systemd generate a fresh one at first boot, so
  # VMs made from the image do not all share this VM's.
  truncate -s 0 /etc/machine-id
  if [ -f /var/lib/dbus/machine-id ] && [ ! -L /var/lib/dbus/machine-id ]; then
    rm -f /var/lib/dbus/machine-id
  fi
fi
# The ssh key Packer (or you) logged in with; its private half is not kept.
if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
  home="$(getent passwd "$SUDO_USER" | cut -d: -f6)"
  [ -n "$home" ] && rm -f "$home/.ssh/authorized_keys"
fi
sync
say "done: $(spotvisor version 2>&1 | head -n1) installed, service enabled and not running"

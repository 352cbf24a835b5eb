#!/usr/bin/env bash
# The package's tests: is the .deb that scripts/package.sh builds portable, and does it
# install and run on distributions other than the Debian 12 it is built on?
#
#   bash tests/package/run.sh [DEB]
#
# Without DEB (or $SPOTVISOR_DEB) it builds one with scripts/package.sh. Checks:
#   glibc      the binary needs no GLIBC_ symbol version above 2.35 (objdump -T), and no
#              shared library but glibc's, libcurl.so.4 and libsystemd.so.0
#   control    Package, Version, Depends (at least what dpkg-shlibdeps computes), conffiles,
#              the files and the maintainer scripts (dpkg-deb -I/-c)
#   unit       systemd-analyze verify of the shipped unit, with the binary in place
#   DISTRO     for each of $SPOTVISOR_PACKAGE_DISTROS (default "trixie jammy noble bookworm"): a minbase
#              debootstrap root (cached), `dpkg -i` of the same .deb with its dependencies
#              from apt, then the user, dirs, conffile and enablement postinst made,
#              `systemd-analyze verify` with that distribution's own systemd,
#              `spotvisor version`, `config --template` and a short `spotvisor run` (in a
#              network namespace of its own: no metadata server, as off GCE), remove, purge
#
# Needs root (debootstrap, chroot, mounts in a private mount namespace) and, to build a root
# the first time, the network: deb.debian.org for Debian, archive.ubuntu.com for Ubuntu. Roots
# are cached under ${SPOTVISOR_CACHE_DIR:-/var/cache/spotvisor}/package-test, keyed by what
# they are built from; a warm run needs no network. Exits non-zero if any check fails; the
# last line is "N passed, N failed".
# shellcheck disable=SC2016  # the bash -c '...' snippets expand their own "$1"...
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
self=$repo/tests/package/run.sh

GLIBC_MAX=2.35
# What the binary may link against dynamically: glibc, libcurl (OpenSSL flavour), libcrypto
# (OpenSSL 3, which that libcurl needs anyway; RS256 for service-account keys), libsystemd,
# and libblkid (probing the disks spotvisor mounts; libblkid1 is Priority: required on Debian
# and Ubuntu, so always installed). Anything else must be linked statically.
ALLOWED_NEEDED="libc.so.6 libm.so.6 ld-linux-x86-64.so.2 libcurl.so.4 libcrypto.so.3 libsystemd.so.0 libblkid.so.1"
# Ubuntu Archive Automatic Signing Key (2018) <ftpmaster@ubuntu.com>: signs jammy's InRelease.
UBUNTU_ARCHIVE_KEY=F6ECB3762474EDA9D21B7022871920D1991BC93C
# Bump when the way roots are built changes, so cached roots are rebuilt.
ROOT_RECIPE=2
ROOT_INCLUDE=systemd

results=${SPOTVISOR_PACKAGE_RESULTS:-}
pass() { echo "ok   - $1"; echo "PASS $1" >>"$results"; }
fail() { echo "FAIL - $1: $2" >&2; echo "FAIL $1" >>"$results"; }
# check NAME COMMAND...: passes if COMMAND exits 0; otherwise fails with its output.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then pass "$name"; else fail "$name" "$(tail -n 20 <<<"$out")"; fi
}
die() { echo "package test: $*" >&2; exit 2; }
elapsed() { echo "$((SECONDS - $1))s"; }

# ---------------------------------------------------------------------------------------
# Inside one distribution's root, in a mount namespace of our own (see run_distro).
in_root() {
  local distro=$1 lower=$2 deb=$3 scratch=$4
  local r=$scratch/merged
  mkdir -p "$scratch"/upper "$scratch"/work "$r"
  # The cached root stays pristine: changes go to an overlay (or a copy if overlayfs is not
  # allowed here), both thrown away at the end.
  if ! mount -t overlay overlay -o "lowerdir=$lower,upperdir=$scratch/upper,workdir=$scratch/work" "$r" 2>/dev/null; then
    cp -a "$lower/." "$r/"
  fi
  mount -t proc proc "$r/proc"
  mount -t sysfs sysfs "$r/sys"
  mount -t tmpfs tmpfs "$r/run"
  mount --rbind /dev "$r/dev"
  mount --make-rslave "$r/dev"
  cp /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null || true
  cp "$deb" "$r/tmp/spotvisor.deb"
  local in="timeout 300 chroot $r"
  export DEBIAN_FRONTEND=noninteractive LC_ALL=C

  # dpkg -i alone stops at the missing dependencies; apt then brings them (from the root's
  # own archive cache when warm) and configures spotvisor.
  local out
  out=$($in dpkg -i /tmp/spotvisor.deb 2>&1)
  out+=$'\n'$($in apt-get -f install -y -q 2>&1)
  if [ "$($in dpkg-query -W -f='${Status}' spotvisor 2>/dev/null)" = "install ok installed" ]; then
    pass "$distro: dpkg -i + apt-get -f install"
  else
    fail "$distro: dpkg -i + apt-get -f install" "$(tail -n 25 <<<"$out")"
    return
  fi
  echo "     $distro: $($in dpkg-query -W -f='${Package} ${Version} ${db:Status-Status}\n' libc6 'libcurl4*' 'libssl3*' libsystemd0 libblkid1 |
    awk '$3 == "installed" {print $1, $2}' | paste -sd, | sed 's/,/, /g')"

  local pw
  pw=$($in getent passwd spotvisor)
  check "$distro: postinst made the spotvisor user (system, home /var/lib/spotvisor, nologin)" \
    bash -c '[[ $1 =~ ^spotvisor:x:([0-9]+):[0-9]+:[^:]*:/var/lib/spotvisor:(/usr/sbin/nologin|/bin/false)$ ]] && [ "${BASH_REMATCH[1]}" -lt 1000 ] || { echo "passwd: $1"; exit 1; }' _ "$pw"
  local groups want
  groups=$($in id -nG spotvisor)
  want=$(for g in video render; do $in getent group "$g" >/dev/null && echo "$g"; done | xargs)
  check "$distro: spotvisor is in the GPU groups that exist (${want:-none})" \
    bash -c 'for g in $2; do [[ " $1 " == *" $g "* ]] || { echo "groups: $1; missing $g"; exit 1; }; done' _ "$groups" "$want"
  check "$distro: /var/lib/spotvisor/checkpoints owned by spotvisor" \
    bash -c '[ "$(stat -c %U:%G "$1")" = spotvisor:spotvisor ] || stat -c "%n %U:%G" "$1"' _ "$r/var/lib/spotvisor/checkpoints"
  check "$distro: /etc/spotvisor/spotvisor.conf is a registered conffile" \
    bash -c '$1 dpkg-query -W -f="\${Conffiles}" spotvisor | grep -q "^ /etc/spotvisor/spotvisor.conf [0-9a-f]\{32\}$" && grep -qx "user = spotvisor" "$2"' _ "$in" "$r/etc/spotvisor/spotvisor.conf"
  check "$distro: the unit is enabled for multi-user.target" \
    test -L "$r/etc/systemd/system/multi-user.target.wants/spotvisor.service"

  # That distribution's own systemd (249 on jammy, 257 on trixie) must know every directive.
  # verify exits 0 on unknown keys and bad values, so any line about the unit fails too.
  out=$($in systemd-analyze verify /usr/lib/systemd/system/spotvisor.service 2>&1)
  local rc=$?
  if [ $rc -eq 0 ] && ! grep -q spotvisor <<<"$out"; then
    pass "$distro: systemd-analyze verify ($($in systemd-analyze --version | head -n1 | cut -d' ' -f1-2))"
  else
    fail "$distro: systemd-analyze verify" "rc=$rc $out"
  fi

  check "$distro: spotvisor version" bash -c 'v=$($1 spotvisor version) && grep -q "$2" <<<"$v" || { echo "$v"; exit 1; }' _ "$in" "$SPOTVISOR_VERSION"
  check "$distro: spotvisor config --template" bash -c '$1 spotvisor config --template --set user=spotvisor | cmp - "$2"' _ "$in" "$r/etc/spotvisor/spotvisor.conf"

  # A run off GCE: no network at all (a namespace with only a loopback that is down), so
  # the metadata probe fails and `run` goes on without it. The trainer must run as the
  # configured user (the conffile's user = spotvisor) and be able to write checkpoints.
  local net="timeout 60 unshare --net chroot $r"
  out=$($net /usr/bin/spotvisor run --set on-exit=none --set log-format=text -- /bin/sh -c \
    'test "$(id -un)" = spotvisor && touch "$SPOTVISOR_CHECKPOINT_DIR/written-by-trainer"' 2>&1)
  rc=$?
  if [ $rc -eq 0 ] && [ -f "$r/var/lib/spotvisor/checkpoints/written-by-trainer" ]; then
    pass "$distro: spotvisor run (as user spotvisor, writes checkpoint-dir) exits 0"
  else
    fail "$distro: spotvisor run" "rc=$rc $(tail -n 25 <<<"$out")"
  fi
  out=$($net /usr/bin/spotvisor run --set on-exit=none -- /bin/sh -c 'exit 3' 2>&1)
  rc=$?
  if [ $rc -eq 3 ]; then pass "$distro: spotvisor run passes on the trainer's exit code (3)"; else fail "$distro: spotvisor run exit code" "rc=$rc, want 3: $(tail -n 10 <<<"$out")"; fi
  check "$distro: spotvisor status after the run" bash -c '$1 spotvisor status | grep -q .' _ "$in"
  # The trainer helper (`import spotvisor`) is on the trainer's PYTHONPATH, whatever its interpreter.
  out=$($net /usr/bin/spotvisor run --set on-exit=none --set log-format=text -- /bin/sh -c \
    'case ":$PYTHONPATH:" in *:/usr/share/spotvisor/python:*) test -f /usr/share/spotvisor/python/spotvisor.py ;; *) echo "PYTHONPATH=$PYTHONPATH"; exit 9 ;; esac' 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then pass "$distro: the trainer's PYTHONPATH holds the helper (import spotvisor)"; else fail "$distro: helper on PYTHONPATH" "rc=$rc $(tail -n 10 <<<"$out")"; fi

  # remove keeps the user, the checkpoints and the config; purge removes the config only.
  out=$($in dpkg -r spotvisor 2>&1)
  check "$distro: dpkg -r keeps user, checkpoints and config" bash -c \
    '[ ! -e "$2/usr/bin/spotvisor" ] && $1 getent passwd spotvisor >/dev/null && [ -f "$2/var/lib/spotvisor/checkpoints/written-by-trainer" ] && [ -f "$2/etc/spotvisor/spotvisor.conf" ] || { echo "$3"; ls -la "$2/etc/spotvisor" "$2/var/lib/spotvisor"; exit 1; }' _ "$in" "$r" "$out"
  out=$($in dpkg -P spotvisor 2>&1)
  check "$distro: dpkg -P removes the config and the enablement, keeps user and data" bash -c \
    '[ ! -e "$2/etc/spotvisor" ] && [ ! -e "$2/etc/systemd/system/multi-user.target.wants/spotvisor.service" ] && $1 getent passwd spotvisor >/dev/null && [ -d "$2/var/lib/spotvisor/checkpoints" ] || { echo "$3"; ls -la "$2/etc/spotvisor" "$2/etc/systemd/system/multi-user.target.wants" 2>&1; exit 1; }' _ "$in" "$r" "$out"
}

# ---------------------------------------------------------------------------------------
# Roots.

cache_dir=${SPOTVISOR_CACHE_DIR:-/var/cache/spotvisor}/package-test

# jammy's signing key, verified by its fingerprint: Debian has no ubuntu-keyring package, so
# the key is taken from jammy's own ubuntu-keyring .deb and kept only if it is the key with
# the fingerprint above (a fingerprint cannot be forged); debootstrap then verifies the
# InRelease, the Packages index and every .deb against it.
ubuntu_keyring() {
  local mirror=$1 dest=$cache_dir/keys/ubuntu-archive-$UBUNTU_ARCHIVE_KEY.gpg
  if [ ! -s "$dest" ]; then
    local t
    t=$(mktemp -d)
    (
      set -e
      cd "$t"
      curl -fsS -m 120 "$mirror/dists/jammy/main/binary-amd64/Packages.xz" | xz -d >Packages
      file=$(awk '/^Package: ubuntu-keyring$/ {p = 1} p && /^Filename:/ {print $2; exit}' Packages)
      [ -n "$file" ] || { echo "no ubuntu-keyring in jammy's Packages" >&2; exit 1; }
      curl -fsS -m 120 -o keyring.deb "$mirror/$file"
      dpkg-deb --fsys-tarfile keyring.deb | tar -xO ./usr/share/keyrings/ubuntu-archive-keyring.gpg >all.gpg
      mkdir -m 700 gnupg
      gpg -q --homedir gnupg --import all.gpg 2>/dev/null
      gpg -q --homedir gnupg --export "$UBUNTU_ARCHIVE_KEY" >pinned.gpg
      [ "$(gpg --homedir gnupg --show-keys --with-colons pinned.gpg | awk -F: '/^fpr/ {print $10; exit}')" = "$UBUNTU_ARCHIVE_KEY" ]
      curl -fsS -m 120 -o InRelease "$mirror/dists/jammy/InRelease"
      gpgv --keyring "$t/pinned.gpg" InRelease 2>/dev/null
    ) >&2 || { rm -rf "$t"; return 1; }
    mkdir -p "$(dirname "$dest")"
    mv "$t/pinned.gpg" "$dest"
    rm -rf "$t"
  fi
  echo "$dest"
}

# root_for DISTRO DEB: prints the cached root's directory, building it if needed.
root_for() {
  local distro=$1 deb=$2 mirror keyring script
  case $distro in
    bookworm | trixie)
      mirror=http://deb.debian.org/debian
      keyring=/usr/share/keyrings/debian-archive-keyring.gpg
      script=/usr/share/debootstrap/scripts/sid ;;
    jammy | noble)
      mirror=http://archive.ubuntu.com/ubuntu
      keyring=$(ubuntu_keyring "$mirror") || {
        echo "cannot get Ubuntu's archive key $UBUNTU_ARCHIVE_KEY from $mirror (network?)" >&2; return 1; }
      # Debian 12's debootstrap has no script named noble; Ubuntu's are all the same one.
      script=/usr/share/debootstrap/scripts/gutsy ;;
    *) echo "unknown distribution $distro (known: bookworm trixie jammy noble)" >&2; return 1 ;;
  esac
  local key dir
  key=$(printf '%s\n' "$ROOT_RECIPE" "$distro" "$mirror" "$ROOT_INCLUDE" "$(dpkg-query -W -f='${Version}' debootstrap)" \
    "$(sha256sum <"$keyring")" | sha256sum | cut -c1-16)
  dir=$cache_dir/roots/$distro-$key
  mkdir -p "$cache_dir/roots"
  (
    flock 9
    [ -f "$dir/complete" ] && exit 0
    echo "package test: building the $distro root in $dir (once; a few minutes)" >&2
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    local start=$SECONDS
    if ! debootstrap --variant=minbase --include="$ROOT_INCLUDE" --keyring="$keyring" \
        "$distro" "$dir.tmp/root" "$mirror" "$script" >"$dir.tmp/debootstrap.log" 2>&1; then
      echo "debootstrap $distro failed; the end of $dir.tmp/debootstrap.log:" >&2
      tail -n 15 "$dir.tmp/debootstrap.log" >&2
      exit 1
    fi
    # Package lists for apt, and the .deb's dependencies downloaded (not installed) into the
    # root's archive cache, so that warm runs install them without the network.
    cp /etc/resolv.conf "$dir.tmp/root/etc/resolv.conf"
    cp "$deb" "$dir.tmp/root/tmp/spotvisor.deb"
    if ! { chroot "$dir.tmp/root" apt-get update -q && chroot "$dir.tmp/root" apt-get clean &&
           DEBIAN_FRONTEND=noninteractive chroot "$dir.tmp/root" apt-get install -y -q --download-only /tmp/spotvisor.deb; } \
        >>"$dir.tmp/debootstrap.log" 2>&1; then
      echo "apt in the $distro root failed; the end of $dir.tmp/debootstrap.log:" >&2
      tail -n 15 "$dir.tmp/debootstrap.log" >&2
      exit 1
    fi
    rm -f "$dir.tmp/root/tmp/spotvisor.deb"
    echo "package test: $distro root built in $(elapsed "$start"), $(du -sh "$dir.tmp/root" | cut -f1)" >&2
    rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/complete"
    # Roots of this distribution built from other inputs are stale now.
    find "$cache_dir/roots" -mindepth 1 -maxdepth 1 -name "$distro-*" ! -path "$dir" -exec rm -rf {} +
  ) 9>"$cache_dir/roots/.lock" || return 1
  echo "$dir/root"
}

run_distro() {
  local distro=$1 deb=$2 start=$SECONDS root scratch
  if ! root=$(root_for "$distro" "$deb"); then
    fail "$distro: root" "could not build a $distro root (needs the network the first time; see above)"
    return
  fi
  scratch=$(mktemp -d /tmp/spotvisor-pkgtest.XXXXXX)
  # Every mount is made in a private mount namespace and goes away with it.
  unshare --mount --propagation private bash "$self" --in-root "$distro" "$root" "$deb" "$scratch"
  rm -rf "$scratch"
  echo "     $distro: $(elapsed "$start")"
}

# ---------------------------------------------------------------------------------------

if [ "${1:-}" = --in-root ]; then
  shift
  in_root "$@"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mounts): run it as root or with sudo"
for tool in dpkg-deb objdump readelf systemd-analyze debootstrap unshare chroot curl gpg gpgv xz flock; do
  command -v "$tool" >/dev/null || die "$tool not found: run 'bash scripts/install-deps.sh' as root"
done
command -v dpkg-shlibdeps >/dev/null || die "dpkg-shlibdeps not found (dpkg-dev): run 'bash scripts/install-deps.sh' as root"

t0=$SECONDS
results=$(mktemp)
export SPOTVISOR_PACKAGE_RESULTS=$results
SPOTVISOR_VERSION=$(sed -n 's/^project(spotvisor VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
export SPOTVISOR_VERSION
[ -n "$SPOTVISOR_VERSION" ] || die "cannot read the project version from CMakeLists.txt"

deb=${1:-${SPOTVISOR_DEB:-}}
if [ -z "$deb" ]; then
  echo "package test: building the .deb (scripts/package.sh)" >&2
  deb=$(bash scripts/package.sh | tail -n 1) || die "scripts/package.sh failed"
fi
[ -f "$deb" ] || die "$deb: no such file"
deb=$(realpath "$deb")
echo "package test: $deb ($(du -h "$deb" | cut -f1))"

x=$(mktemp -d)
trap 'rm -rf "$x" "$results"' EXIT
dpkg-deb -x "$deb" "$x/root"
dpkg-deb -e "$deb" "$x/control"
bin=$x/root/usr/bin/spotvisor

# --- glibc and shared libraries
if highest=$(bash packaging/check-glibc.sh "$bin" "$GLIBC_MAX" 2>"$x/glibc.err"); then
  pass "glibc: highest symbol version $highest <= $GLIBC_MAX"
else
  fail "glibc: symbol versions <= $GLIBC_MAX" "$(cat "$x/glibc.err")"
  highest=GLIBC_99
fi
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
check "libraries: NEEDED only glibc, libcurl, libcrypto, libsystemd, libblkid ($needed)" \
  bash -c 'for n in $1; do [[ " $2 " == *" $n "* ]] || { echo "unexpected NEEDED $n"; exit 1; }; done' _ "$needed" "$ALLOWED_NEEDED"
check "libraries: libstdc++ and libgcc linked in (no libstdc++.so.6 / libgcc_s.so.1 / libfmt)" \
  bash -c '! grep -E "libstdc\+\+|libgcc_s|libfmt|libspdlog|libboost" <<<"$1"' _ "$needed"

# --- control data
field() { dpkg-deb -f "$deb" "$1"; }
check "control: Package spotvisor, Version $SPOTVISOR_VERSION-1, amd64" \
  test "$(field Package) $(field Version) $(field Architecture)" = "spotvisor $SPOTVISOR_VERSION-1 amd64"
depends=$(field Depends)
libc_min=$(sed -n 's/.*libc6 (>= \([0-9.]*\)).*/\1/p' <<<"$depends")
check "control: Depends libc6 (>= $libc_min) covers the binary's ${highest#GLIBC_} and is <= $GLIBC_MAX" \
  bash -c '[ -n "$1" ] && [ "$(printf "%s\n%s\n" "$1" "$2" | sort -V | tail -n1)" = "$1" ] && [ "$(printf "%s\n%s\n" "$1" "$3" | sort -V | tail -n1)" = "$3" ]' _ "$libc_min" "${highest#GLIBC_}" "$GLIBC_MAX"
check "control: Depends libcurl4 | libcurl4t64 and libsystemd0 ($depends)" \
  bash -c 'grep -Eq "(^|, )libcurl4 \(>= [0-9.]+\) \| libcurl4t64(,|$)" <<<"$1" && grep -Eq "(^|, )libsystemd0( \(|,|$)" <<<"$1"' _ "$depends"
# dpkg-shlibdeps computes the minimum versions from Debian 12's symbols files; ours must be
# at least as strict for every package it names.
mkdir -p "$x/shlibdeps/debian" && printf 'Source: spotvisor\n\nPackage: spotvisor\nArchitecture: any\n' >"$x/shlibdeps/debian/control"
shlibdeps=$(cd "$x/shlibdeps" && dpkg-shlibdeps -O "$bin" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
check "control: Depends at least what dpkg-shlibdeps computes ($shlibdeps)" python3 - "$shlibdeps" "$depends" <<'EOF'
import re, sys
def parse(s):
    out = {}
    for group in s.split(","):
        for alt in group.split("|"):
            m = re.match(r"\s*([a-z0-9.+-]+)(?:\s*\(>=\s*([^)]+)\))?", alt)
            if m:
                out.setdefault(m.group(1), m.group(2))
    return out
def ver(v): return [int(x) for x in re.findall(r"\d+", v or "0")]
need, have = parse(sys.argv[1]), parse(sys.argv[2])
bad = [f"{p} (>= {v})" for p, v in need.items() if p not in have or ver(have[p]) < ver(v)]
if not need or bad:
    sys.exit(f"not covered by Depends: {bad or 'dpkg-shlibdeps printed nothing'}")
EOF
check "control: Recommends fuse3, Suggests gcsfuse and rclone (mounts), openssh and openmpi (gang-launch = leader)" \
  test "$(field Recommends) / $(field Suggests)" = "fuse3 / gcsfuse, rclone, openssh-client, openssh-server, openmpi-bin"
check "control: conffiles is /etc/spotvisor/spotvisor.conf" \
  test "$(cat "$x/control/conffiles")" = /etc/spotvisor/spotvisor.conf
check "control: postinst, prerm, postrm executable, sh -n clean" \
  bash -c 'for s in postinst prerm postrm; do [ -x "$1/$s" ] && sh -n "$1/$s" || exit 1; done' _ "$x/control"
contents=$(dpkg-deb -c "$deb")
check "files: binary 0755, unit, conffile, docs" bash -c '
  grep -Eq "^-rwxr-xr-x root/root .* \./usr/bin/spotvisor$" <<<"$1" &&
  grep -Eq "^-rw-r--r-- root/root .* \./usr/lib/systemd/system/spotvisor\.service$" <<<"$1" &&
  grep -Eq "^-rw-r--r-- root/root .* \./etc/spotvisor/spotvisor\.conf$" <<<"$1" &&
  grep -Eq " \./usr/share/doc/spotvisor/packaging\.md$" <<<"$1" &&
  grep -Eq "^-rw-r--r-- root/root .* \./usr/share/spotvisor/python/spotvisor\.py$" <<<"$1" &&
  grep -Eq "^-rw-r--r-- root/root .* \./usr/lib/python3/dist-packages/spotvisor\.py$" <<<"$1" || { echo "$1"; exit 1; }' _ "$contents"
check "files: the trainer helper in the package is python/spotvisor.py" cmp "$x/root/usr/share/spotvisor/python/spotvisor.py" python/spotvisor.py
check "files: the unit in the package is systemd/spotvisor.service" cmp "$x/root/usr/lib/systemd/system/spotvisor.service" systemd/spotvisor.service
check "conffile: is the binary's own config --template --set user=spotvisor" \
  bash -c '"$1" config --template --set user=spotvisor | cmp - "$2"' _ "$bin" "$x/root/etc/spotvisor/spotvisor.conf"

# --- the unit, against this machine's systemd, with the binary where ExecStart says: the
# package's files plus a copy of this system's units (for sysinit.target and the rest)
# in a root of their own.
mkdir -p "$x/root/etc/systemd"
cp -an /usr/lib/systemd/system/. "$x/root/usr/lib/systemd/system/"  # never over the package's unit
out=$(systemd-analyze verify --root="$x/root" /usr/lib/systemd/system/spotvisor.service 2>&1)
rc=$?
if [ $rc -eq 0 ] && [ -z "$out" ]; then
  pass "unit: systemd-analyze verify ($(systemd-analyze --version | head -n1 | cut -d' ' -f1-2))"
else
  fail "unit: systemd-analyze verify" "rc=$rc $out"
fi

echo "     static checks: $(elapsed "$t0")"

# --- other distributions
for distro in ${SPOTVISOR_PACKAGE_DISTROS-trixie jammy noble bookworm}; do
  run_distro "$distro" "$deb"
done

passed=$(grep -c '^PASS' "$results")
failed=$(grep -c '^FAIL' "$results")
echo "package test: $(elapsed "$t0") in all"
if [ "$failed" -gt 0 ]; then
  echo "failed:" >&2
  sed -n 's/^FAIL /  /p' "$results" >&2
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

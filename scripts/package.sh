#!/usr/bin/env bash
# Builds the portable Release binary and the spotvisor .deb (docs/packaging.md).
#   bash scripts/package.sh [OUTDIR]      (default OUTDIR: build-pkg/dist)
# Progress goes to stderr; the last line of stdout is the path of the .deb.
# Environment: SPOTVISOR_PKG_BUILD_DIR (default build-pkg), SPOTVISOR_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${SPOTVISOR_PKG_BUILD_DIR:-build-pkg}
outdir=${1:-$build/dist}
jobs=${SPOTVISOR_JOBS:-$(nproc)}

bash scripts/install-deps.sh >&2

# Every option the package depends on is given explicitly, whatever an existing build dir
# has cached: Release, static libstdc++/libgcc + header-only fmt, no sanitizers, no tests,
# installed under /usr.
cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DSPOTVISOR_PORTABLE=ON -DSPOTVISOR_SANITIZE=OFF -DSPOTVISOR_WERROR=OFF -DBUILD_TESTING=OFF >&2
cmake --build "$build" --parallel "$jobs" >&2

# Refuse to package a binary that would not start on the oldest supported glibc.
echo "package: highest glibc symbol version: $(bash packaging/check-glibc.sh "$build/daemon/spotvisor")" >&2

rm -f "$build"/spotvisor_*.deb
(cd "$build" && cpack -G DEB >&2)
debs=("$build"/spotvisor_*.deb)
if [ ${#debs[@]} -ne 1 ] || [ ! -f "${debs[0]}" ]; then
  echo "package: expected one spotvisor_*.deb in $build, found: ${debs[*]}" >&2
  exit 1
fi
mkdir -p "$outdir"
out="$(cd "$outdir" && pwd)/$(basename "${debs[0]}")"
mv -f "${debs[0]}" "$out"
echo "package: $(du -h "$out" | cut -f1) $out" >&2
echo "$out"

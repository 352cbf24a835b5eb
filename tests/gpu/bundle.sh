#!/bin/bash
# Puts what the GPU check needs from this machine into .gpu-bundle/ (ignored by git
# through .git/info/exclude; the device tool carries it): a Release spotvisor, every
# shared library it loads but the C library's own (the GPU machine is not Debian),
# and the trainer helper where spotvisor looks for it (BIN/../share/spotvisor/python).
# See tests/gpu/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build-release}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
ninja -C "$build" spotvisor
rm -rf .gpu-bundle
mkdir -p .gpu-bundle/bin .gpu-bundle/lib .gpu-bundle/share/spotvisor/python
cp "$build/daemon/spotvisor" .gpu-bundle/bin/
cp python/spotvisor.py .gpu-bundle/share/spotvisor/python/
ldd .gpu-bundle/bin/spotvisor | awk '/=> \//{print $3}' |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv)\.so' | xargs -r cp -L -t .gpu-bundle/lib/
mkdir -p .git/info
grep -qsx '/.gpu-bundle/' .git/info/exclude || echo '/.gpu-bundle/' >> .git/info/exclude
LD_LIBRARY_PATH=$PWD/.gpu-bundle/lib .gpu-bundle/bin/spotvisor --version
du -sh .gpu-bundle

#!/usr/bin/env bash
# Builds spotvisor under AddressSanitizer + UndefinedBehaviorSanitizer and
# runs the whole suite (unit + integration) with ctest, then builds the .deb
# and runs the package and boot tests on it. This is the README's test
# command, and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

build=${SPOTVISOR_TEST_BUILD_DIR:-build-asan}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSPOTVISOR_SANITIZE=ON -DSPOTVISOR_WERROR=ON -DBUILD_TESTING=ON >/dev/null
cmake --build "$build" --parallel "$(nproc)"
# Sanitizer findings fail the test that hit them.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" "$@"

# Then the image-level tests, on the package as it ships (needs root; the first run
# builds cached roots and a base image from the Debian and Ubuntu archives):
# tests/package installs and runs the .deb on other distributions, tests/e2e boots it
# under QEMU. SPOTVISOR_TEST_IMAGE=0 skips both (quick iterations on the code).
if [ "${SPOTVISOR_TEST_IMAGE:-1}" = 1 ]; then
  deb=$(bash scripts/package.sh | tail -n 1)
  # Ubuntu 22.04 is the oldest glibc the package supports, Debian 13 the newest
  # libraries; noble and bookworm too with SPOTVISOR_PACKAGE_DISTROS="trixie jammy noble bookworm".
  SPOTVISOR_PACKAGE_DISTROS=${SPOTVISOR_PACKAGE_DISTROS:-trixie jammy} bash tests/package/run.sh "$deb"
  bash tests/e2e/run.sh --deb "$deb"
fi

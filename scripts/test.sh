#!/usr/bin/env bash
# Builds spotvisor under AddressSanitizer + UndefinedBehaviorSanitizer and
# runs the whole suite (unit + integration) with ctest. This is the README's
# test command, and what CI runs.
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

#!/usr/bin/env bash
# Builds spotvisor under AddressSanitizer + UndefinedBehaviorSanitizer and
# runs the whole suite (unit + integration) with ctest, then builds the .deb
# and runs the package and boot tests on it. This is the README's test
# command, and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
t_start=$SECONDS
phase() { echo "test.sh: $1 in $((SECONDS - t_phase))s (total $((SECONDS - t_start))s)"; t_phase=$SECONDS; }
t_phase=$SECONDS

# The boot test's base image (tests/e2e/build-image.sh: cached, built once per machine) is
# mostly debootstrap waiting on the archive: it is built in the background while the code
# compiles. If it fails here, tests/e2e/run.sh builds it again later and says why.
image_pid=
if [ "${SPOTVISOR_TEST_IMAGE:-1}" = 1 ] && [ "$(id -u)" -eq 0 ] && command -v debootstrap >/dev/null; then
  image_log=$(mktemp)
  bash tests/e2e/build-image.sh >"$image_log" 2>&1 &
  image_pid=$!
fi

build=${SPOTVISOR_TEST_BUILD_DIR:-build-asan}
# -g1 (line tables): sanitizer reports keep function names and lines, and the
# build is faster than with full debug info.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DSPOTVISOR_SANITIZE=ON \
  -DSPOTVISOR_WERROR=ON -DBUILD_TESTING=ON >/dev/null
cmake --build "$build" --parallel "$(nproc)"
phase "ASan build"
# Sanitizer findings fail the test that hit them.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Beside ctest, at the lowest CPU priority: the libFuzzer targets (built with clang, then
# 5 s each from their seed corpora; new inputs go to a scratch directory, not into the
# tree) and the release build of the .deb. ctest leaves the machine about three-quarters
# idle (its tests mostly wait on processes and sockets) and its processes always come
# first. Findings are reported after ctest. The fuzz targets are skipped, saying so, where
# clang++ cannot link a libFuzzer target (install-deps.sh installs it).
fuzz_probe='extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }'
fuzz=0
if command -v clang++ >/dev/null && echo "$fuzz_probe" | clang++ -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  fuzz=1
fi
fuzz_build=${SPOTVISOR_FUZZ_BUILD_DIR:-build-fuzz}
fuzz_one() {
  local t=$1 scratch
  scratch=$(mktemp -d)
  "$fuzz_build/fuzz/fuzz_$t" -max_total_time=5 -max_len=4096 -artifact_prefix="$fuzz_build/fuzz/$t-" \
    "$scratch" "fuzz/corpus/$t/" >"$fuzz_build/fuzz/$t.log" 2>&1
  echo $? >"$fuzz_build/fuzz/$t.rc"
  rm -rf "$scratch"
}
export -f fuzz_one
export fuzz_build
targets=()
for corpus in fuzz/corpus/*/; do targets+=("$(basename "$corpus")"); done
side_log=$(mktemp)
deb_file=$(mktemp)
set -m  # the side work gets its own process group, so a failed ctest can stop all of it
(
  set -euo pipefail
  renice -n 19 -p "$BASHPID" >/dev/null
  t0=$SECONDS
  if [ "$fuzz" = 1 ]; then
    CXX=clang++ cmake -S . -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPOTVISOR_FUZZ=ON \
      -DBUILD_TESTING=OFF >/dev/null
    cmake --build "$fuzz_build" --target fuzz_all --parallel "$(nproc)"
    echo "side: fuzz build done at $((SECONDS - t0))s"
    rm -f "$fuzz_build"/fuzz/*.rc
    # One target per core at a time (each is single-threaded).
    printf '%s\n' "${targets[@]}" | xargs -P "$(nproc)" -I{} bash -c 'fuzz_one "$1"' _ {}
    echo "side: fuzz runs done at $((SECONDS - t0))s"
  fi
  if [ "${SPOTVISOR_TEST_IMAGE:-1}" = 1 ]; then
    bash scripts/package.sh | tail -n 1 >"$deb_file"
    echo "side: package built at $((SECONDS - t0))s"
  fi
) >"$side_log" 2>&1 &
side_pid=$!
set +m
# If ctest fails, the side work is not wanted any more.
trap 'kill -- "-$side_pid" 2>/dev/null || true' EXIT

ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" "$@"
phase "ctest"
if ! wait "$side_pid"; then
  tail -n 80 "$side_log"
  echo "test.sh: the fuzz build or the package build failed (above)" >&2
  exit 1
fi
trap - EXIT
grep '^side: ' "$side_log" || true
phase "waiting for the fuzz targets and the package build beside ctest"

# Memory over syncs, on the Release build the package holds (issue #31: buffers that grew
# with every sync and stayed); ASan's own memory would hide the daemon's.
if [ "${SPOTVISOR_TEST_IMAGE:-1}" = 1 ] && [ -x build-pkg/daemon/spotvisor ]; then
  /usr/bin/python3 bench/memory.py --store gcs --syncs 10 --scale 0.3 --check \
    --spotvisor build-pkg/daemon/spotvisor --fake-trainer "$build/tests/fake_trainer"
  phase "memory check (Release build)"
fi
if [ "$fuzz" = 1 ]; then
  for t in "${targets[@]}"; do
    if [ "$(cat "$fuzz_build/fuzz/$t.rc" 2>/dev/null)" != 0 ]; then
      tail -n 60 "$fuzz_build/fuzz/$t.log"
      echo "test.sh: fuzz_$t found a crash; the input is in $fuzz_build/fuzz/ (docs/fuzzing.md)" >&2
      exit 1
    fi
    echo "fuzz_$t: $(grep -o 'Done [0-9]* runs' "$fuzz_build/fuzz/$t.log"), no finding"
  done
else
  echo "test.sh: SKIPPED the fuzz targets: clang++ with libFuzzer is missing (apt-get install clang libclang-rt-dev)" >&2
fi

# Then the image-level tests, on the package as it ships (needs root; the first run
# builds cached roots and a base image from the Debian and Ubuntu archives):
# tests/package installs and runs the .deb on other distributions, tests/e2e boots it
# under QEMU. SPOTVISOR_TEST_IMAGE=0 skips both (quick iterations on the code).
if [ "${SPOTVISOR_TEST_IMAGE:-1}" = 1 ]; then
  deb=$(cat "$deb_file")
  # Ubuntu 22.04 is the oldest glibc the package supports, Debian 13 the newest
  # libraries; noble and bookworm too with SPOTVISOR_PACKAGE_DISTROS="trixie jammy noble bookworm".
  SPOTVISOR_PACKAGE_DISTROS=${SPOTVISOR_PACKAGE_DISTROS:-trixie jammy} bash tests/package/run.sh "$deb"
  phase "package tests"
  if [ -n "$image_pid" ] && ! wait "$image_pid"; then
    echo "test.sh: building the boot test's image in the background failed; tests/e2e/run.sh tries again. Its log:" >&2
    tail -n 20 "$image_log" >&2
  fi
  bash tests/e2e/run.sh --deb "$deb"
  phase "boot tests"
fi

#!/usr/bin/env bash
# Builds spotvisor and the fake trainer in build-release (Release) and runs
# every benchmark with its defaults: preemption latency (100 flips each,
# spotvisor and the blog's bash script interleaved), behaviour in odd cases,
# and idle RSS/CPU over 60 s. Usage, from anywhere: bash bench/run.sh
# See docs/benchmarks.md for what the numbers mean.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1  # keep bench/ free of __pycache__

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/install-deps.sh
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON -DSPOTVISOR_WERROR=OFF >/dev/null
cmake --build build-release --target spotvisor fake_trainer crc32c_bench

echo
echo "== machine"
echo "nproc: $(nproc)"
echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "kernel: $(uname -srm)"
# shellcheck source=/dev/null
echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"

echo
echo "== preemption latency (bench/preempt_latency.py)"
python3 bench/preempt_latency.py
if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
  echo
  echo "== the same with state-dir on tmpfs (/dev/shm), as /run is on a GCE VM"
  python3 bench/preempt_latency.py --tmp /dev/shm
fi

echo
echo "== behaviour in odd cases (bench/semantics.py)"
python3 bench/semantics.py

echo
echo "== what a preemption costs, with and without the trainer helper (bench/preempt_cost.py)"
python3 bench/preempt_cost.py

echo
echo "== idle cost (bench/idle.py)"
python3 bench/idle.py
echo; echo "== crc32c, one chain vs three (bench/crc32c_bench.cc)"; for mib in 1 256; do build-release/bench/crc32c_bench "$mib" 20; done
echo; echo "== checkpoint sync vs rclone (bench/sync_vs_rclone.py)"; /usr/bin/python3 bench/sync_vs_rclone.py
echo; echo "== big checkpoints vs rclone, tuned (bench/big_checkpoint.py; ~10 GiB of RAM and disk)"; /usr/bin/python3 bench/big_checkpoint.py --repeat 1
/usr/bin/python3 bench/big_checkpoint.py --sink --only sink upload mixed --repeat 1 --no-tune
echo; echo "== trainer output forwarding (bench/log_forwarding.py)"; /usr/bin/python3 bench/log_forwarding.py --spotvisor build-release/daemon/spotvisor --fake-trainer build-release/tests/fake_trainer
echo; echo "== memory over many syncs, and CPU per GiB (bench/memory.py)"; /usr/bin/python3 bench/memory.py --store gcs --syncs 100 --scale 0.25
/usr/bin/python3 bench/memory.py --store s3 --syncs 10
echo; echo "== a late EC2 notice on a hanging store (bench/late_notice.py)"; /usr/bin/python3 bench/late_notice.py --left 5 12 20

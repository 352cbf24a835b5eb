#!/usr/bin/env python3
"""Thread count and virtual size of spotvisor over many syncs (issue #12).

Runs `spotvisor run` with a file:// bucket, rewrites the checkpoint and asks
for an on-demand sync (SIGUSR1) N times, waiting for each sync.complete, and
prints the process's Threads and VmSize at checkpoints. With --baseline, the
same against another binary (an older build), side by side: before the one
executor, every sync left a thread behind, each keeping an 8 MiB stack mapped.

  python3 bench/threads.py --syncs 1000
  python3 bench/threads.py --syncs 1000 --baseline /path/to/old/spotvisor
"""
import argparse
import os
import shutil
import tempfile

from benchlib import add_binary_flags, check_binaries, OnDemandDaemon, proc_status_kb


def run(binary, fake_trainer, syncs, points):
    tmp = tempfile.mkdtemp(prefix="spotvisor-bench-threads-")
    try:
        ckpt = os.path.join(tmp, "ckpt")
        os.makedirs(ckpt)
        args = [binary, "run", "--set", f"state-dir={tmp}/state", "--set", f"checkpoint-dir={ckpt}",
                "--set", f"bucket=file://{tmp}/bucket", "--set", "run-id=bench", "--set", "sync-settle=0s",
                "--set", "sync-interval=0", "--set", "log-format=json", "--", fake_trainer]
        env = dict(os.environ)
        env.pop("GCE_METADATA_HOST", None)
        d = OnDemandDaemon(args, env)
        rows = []
        for i in range(1, syncs + 1):
            with open(os.path.join(ckpt, "model"), "w") as f:
                f.write(f"step {i}")
            d.sync(what=f"sync {i}")
            if i in points:
                rows.append((i, proc_status_kb(d.pid, "Threads"), proc_status_kb(d.pid, "VmSize")))
        d.stop()
        return rows
    finally:
        shutil.rmtree(tmp, True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_binary_flags(ap)
    ap.add_argument("--syncs", type=int, default=1000)
    ap.add_argument("--baseline", help="another spotvisor binary to run the same way, side by side")
    args = ap.parse_args()
    check_binaries(args)
    points = sorted({1, 10, 100, args.syncs // 2, args.syncs} - {0})
    this = run(args.spotvisor, args.fake_trainer, args.syncs, points)
    base = run(args.baseline, args.fake_trainer, args.syncs, points) if args.baseline else None
    print(f"{'syncs':>6} {'threads':>8} {'VmSize MiB':>11}" + ("   baseline: threads  VmSize MiB  VmSize ratio" if base else ""))
    for k, (i, th, vsz) in enumerate(this):
        line = f"{i:>6} {th:>8} {vsz / 1024:>11.1f}"
        if base:
            _, bth, bvsz = base[k]
            line += f"   {bth:>17} {bvsz / 1024:>11.1f} {vsz / bvsz:>13.2f}"
        print(line)
    growth = (this[-1][2] - this[0][2]) / 1024
    print(f"VmSize growth from sync 1 to {args.syncs}: {growth:.1f} MiB; threads {this[0][1]} -> {this[-1][1]}")


if __name__ == "__main__":
    main()

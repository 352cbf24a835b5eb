#!/usr/bin/python3
"""spotvisor's memory over many syncs (issue #31 point 1): peak and idle RSS.

Runs `spotvisor run` beside a trainer that does nothing (`sleep`), against one
store (the fake Cloud Storage, the fake S3, or a file:// bucket). This script
plays the trainer's saves: it rewrites a PyTorch-shaped checkpoint (two files,
by default 153 MiB and 305 MiB; --scale shrinks them) and asks for an
on-demand sync (SIGUSR1, what `spotvisor sync` sends), N times, waiting for
each sync.complete. After 1, 10 and 100 syncs (and N) it waits for the daemon
to go idle (its RSS steady for 2 s) and prints, from /proc/PID/status:

  peak  VmHWM: the most resident memory so far
  idle  VmRSS once steady, at least 11 s after the sync (buffers are kept
        10 s for a sync that follows soon, then given back)
  idle anon  RssAnon then: the daemon's own memory (heap, stacks); the rest
        of idle is file-backed pages of the binary and its shared libraries

and the daemon's CPU (utime + stime) per GiB synced over the whole run.

Side by side with --baseline (another binary, e.g. an older build). The
docs promise buffers of about 2 x sync-parallelism x 16 MiB (128 MiB at the
default 4) on top of the idle daemon; idle should come back to the idle
daemon's own size.

  /usr/bin/python3 bench/memory.py --store gcs --syncs 100
  /usr/bin/python3 bench/memory.py --store s3 --syncs 100 --baseline /tmp/old/spotvisor
  /usr/bin/python3 bench/memory.py --store gcs --syncs 3 --scale 0.1   # the short form (seconds)
  /usr/bin/python3 bench/memory.py --store gcs --syncs 10 --scale 0.3 --check   # what CI runs

--check (for a Release build: ASan's own memory swamps the daemon's) fails (exit 1) when the
peak after the last sync is over the documented bound, or when the idle RSS after the last
sync is more than 8 MiB over the idle daemon's before any sync: memory that grows with every
sync and stays, the fault of issue #31.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

from benchlib import BOUND, OnDemandDaemon, add_binary_flags, build_type, check_binaries, machine, proc_status_kb

MiB = 1 << 20
BUCKET = "bench-memory"
AKID, SECRET = "AKIABENCHMARK000002", "bench/secret/memory0123456789abcdefghij"


def cpu_s(pid):
    """utime + stime of the process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


RELEASE_DELAY = 10.0  # Supervisor::kMemoryReleaseDelay: buffers are given back this long after a sync


def steady_rss(pid, hold=2.0, bound=BOUND, at_least=0.0):
    """VmRSS once it has not changed by more than 64 kB for `hold` seconds, and `at_least` seconds have passed."""
    start = time.monotonic()
    deadline = start + bound + at_least
    last, since = proc_status_kb(pid, "VmRSS"), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)  # sampling interval of a bounded wait
        now = proc_status_kb(pid, "VmRSS")
        if abs(now - last) > 64:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= hold and time.monotonic() - start >= at_least:
            return now
    return proc_status_kb(pid, "VmRSS")


def write_checkpoint(ckpt, sizes, step):
    """Rewrite every file (new bytes, so every sync uploads all of it), as torch.save would: a temp, then a rename."""
    for k, size in enumerate(sizes):
        name = os.path.join(ckpt, f"shard{k}.pt")
        block = (f"step {step} file {k} ".encode() * 4096)[: MiB]
        with open(name + ".tmp", "wb") as f:
            left = size
            while left > 0:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
        os.rename(name + ".tmp", name)


def run(binary, store, env, bucket, sizes, syncs, points, parallelism):
    tmp = tempfile.mkdtemp(prefix="spotvisor-bench-memory-")
    try:
        ckpt = os.path.join(tmp, "ckpt")
        os.makedirs(ckpt)
        args = [binary, "run", "--set", f"state-dir={tmp}/state", "--set", f"checkpoint-dir={ckpt}",
                "--set", f"bucket={bucket if store != 'file' else 'file://' + tmp + '/bucket'}",
                "--set", f"run-id=mem-{os.getpid()}-{time.monotonic_ns()}", "--set", "sync-settle=0s",
                "--set", "sync-interval=0", "--set", "log-format=json", "--set", f"sync-parallelism={parallelism}",
                "--", "/bin/sleep", "1d"]
        p = OnDemandDaemon(args, env)
        rows = [(0, proc_status_kb(p.pid, "VmHWM"), steady_rss(p.pid), proc_status_kb(p.pid, "RssAnon"))]
        cpu0 = cpu_s(p.pid)
        for i in range(1, syncs + 1):
            write_checkpoint(ckpt, sizes, i)
            p.sync(bound=BOUND * 6, what=f"sync {i}")
            if i in points:
                rows.append((i, proc_status_kb(p.pid, "VmHWM"), steady_rss(p.pid, at_least=RELEASE_DELAY + 1),
                             proc_status_kb(p.pid, "RssAnon")))
                print(f"  {os.path.basename(binary)} after {i} sync(s): peak {rows[-1][1] / 1024:.1f} MiB, "
                      f"idle {rows[-1][2] / 1024:.1f} MiB", file=sys.stderr, flush=True)
        cpu_per_gib = (cpu_s(p.pid) - cpu0) / (sum(sizes) * syncs / (1 << 30))  # idle waits cost ~nothing
        p.stop()
        return rows, cpu_per_gib
    finally:
        shutil.rmtree(tmp, True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_binary_flags(ap)
    ap.add_argument("--store", choices=["gcs", "s3", "file"], default="gcs")
    ap.add_argument("--syncs", type=int, default=100)
    ap.add_argument("--scale", type=float, default=1.0, help="checkpoint size factor (1: 153 + 305 MiB)")
    ap.add_argument("--parallelism", type=int, default=4, help="sync-parallelism (default 4, the default)")
    ap.add_argument("--baseline", help="another spotvisor binary to run the same way, side by side")
    ap.add_argument("--check", action="store_true", help="exit 1 if memory is over the bound or grows (see above)")
    args = ap.parse_args()
    check_binaries(args)
    sizes = [max(1, int(153 * MiB * args.scale)), max(1, int(305 * MiB * args.scale))]
    points = sorted({1, 10, 100, args.syncs} & set(range(1, args.syncs + 1)))
    env = dict(os.environ)
    env.pop("GCE_METADATA_HOST", None)
    server = None
    bucket = None
    if args.store == "gcs":
        from fake_gcs import FakeGcsServer
        server = FakeGcsServer(buckets=[BUCKET]).start()
        env["STORAGE_EMULATOR_HOST"] = f"127.0.0.1:{server.port}"
        bucket = f"gs://{BUCKET}/bench"
    elif args.store == "s3":
        from fake_s3 import FakeS3Server
        server = FakeS3Server(buckets=[BUCKET], credentials={AKID: SECRET}).start()
        env.update(AWS_ENDPOINT_URL_S3=server.endpoint, AWS_ACCESS_KEY_ID=AKID, AWS_SECRET_ACCESS_KEY=SECRET,
                   AWS_REGION="us-east-1")
        bucket = f"s3://{BUCKET}/bench"
    print(f"machine: {machine()}; spotvisor {build_type(args.spotvisor)}; store {args.store}; "
          f"checkpoint {sizes[0] / MiB:.0f} + {sizes[1] / MiB:.0f} MiB; sync-parallelism {args.parallelism}", flush=True)
    try:
        this, this_cpu = run(args.spotvisor, args.store, env, bucket, sizes, args.syncs, points, args.parallelism)
        base, base_cpu = (run(args.baseline, args.store, env, bucket, sizes, args.syncs, points, args.parallelism)
                          if args.baseline else (None, None))
    finally:
        if server:
            server.stop()
    # idle anon: the part of idle RSS that is the daemon's own (heap, stacks); the rest is
    # file-backed pages of the binary and its shared libraries, which the kernel can drop.
    head = f"{'syncs':>6} {'peak MiB':>9} {'idle MiB':>9} {'idle anon':>9}"
    if base:
        head += f"   {'baseline peak':>13} {'baseline idle':>13} {'peak ratio':>10} {'idle ratio':>10}"
    print(head)
    for k, (i, hwm, rss, anon) in enumerate(this):
        line = f"{i:>6} {hwm / 1024:>9.1f} {rss / 1024:>9.1f} {anon / 1024:>9.1f}"
        if base:
            _, bhwm, brss, _ = base[k]
            line += f"   {bhwm / 1024:>13.1f} {brss / 1024:>13.1f} {hwm / bhwm:>10.2f} {rss / brss:>10.2f}"
        print(line)
    print(f"CPU of the daemon per GiB synced: {this_cpu:.2f} s" +
          (f"; baseline {base_cpu:.2f} s, ratio {this_cpu / base_cpu:.2f}" if base else ""))
    bound = this[0][2] / 1024 + 2 * args.parallelism * 16
    print(f"documented bound: idle daemon + 2 x {args.parallelism} x 16 MiB = {bound:.0f} MiB; "
          f"peak {'within' if this[-1][1] / 1024 <= bound else 'OVER'} it")
    if args.check:
        problems = []
        if this[-1][1] / 1024 > bound:
            problems.append(f"the peak after {this[-1][0]} syncs, {this[-1][1] / 1024:.1f} MiB, is over the bound, {bound:.0f} MiB")
        if this[-1][2] / 1024 > this[0][2] / 1024 + 8:
            problems.append(f"idle after {this[-1][0]} syncs is {this[-1][2] / 1024:.1f} MiB, more than 8 MiB over "
                            f"the idle daemon before any sync ({this[0][2] / 1024:.1f} MiB): memory grows with the "
                            f"syncs and stays")
        for p in problems:
            print(f"memory.py --check: FAILED: {p}", file=sys.stderr)
        if problems:
            sys.exit(1)
        print("memory.py --check: passed")


if __name__ == "__main__":
    main()

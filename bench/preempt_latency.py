#!/usr/bin/env python3
"""Preemption latency: metadata flip -> the trainer's SIGINT handler.

For each flip, one supervisor (spotvisor, or the blog's bash script in
bench/baseline_bash.sh) starts the fake trainer against the fake metadata
server. Once the trainer has started and a long-poll on instance/preempted is
parked at the fake (its exact waiter count, not a sleep), t0 = time.time_ns()
is taken and instance/preempted is set to TRUE. The fake trainer records
CLOCK_REALTIME inside its SIGINT handler; latency = that - t0. Both clocks
are CLOCK_REALTIME on the same machine.

spotvisor and bash alternate flip by flip (spotvisor, bash, spotvisor, ...)
so that drift in machine load hits both alike. Between flips preempted is
reset to FALSE after the supervisor has exited.

usage: preempt_latency.py [--flips 100] [--warmup 2] [--json out.json]
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib as B

KINDS = ("spotvisor", "bash")


class Flip:
    __slots__ = ("kind", "index", "latency_ms", "exit_code", "problem",
                 "log", "stages")

    def __init__(self, kind, index):
        self.kind, self.index = kind, index
        self.latency_ms = None
        self.exit_code = None
        self.problem = None
        self.log = None
        self.stages = None


def command(kind, args, srv, marker, work):
    trainer = [args.fake_trainer, "--marker-file", marker,
               "--sigint-exit-delay", "0"]
    if kind == "spotvisor":
        return [args.spotvisor, "run",
                "--set", f"state-dir={work}/state",
                "--set", f"checkpoint-dir={work}/ckpt",
                "--set", "log-format=json", "--"] + trainer
    return ["bash", B.BASELINE, f"127.0.0.1:{srv.port}"] + trainer


def one_flip(kind, index, args, srv, work):
    flip = Flip(kind, index)
    marker = os.path.join(work, f"marker-{kind}-{index}")
    flip.log = os.path.join(work, f"{kind}-{index}.log")
    env = dict(os.environ, GCE_METADATA_HOST=f"127.0.0.1:{srv.port}")
    assert srv.waiters("instance/preempted") == 0
    with open(flip.log, "wb") as out:
        proc = subprocess.Popen(command(kind, args, srv, marker, work),
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    trainer_pid = None
    try:
        started = B.wait_until(lambda: B.read_marker(marker)["start"])
        if not started:
            flip.problem = "trainer never wrote its start line"
            return flip
        trainer_pid = started.get("pid")
        if not srv.wait_for_waiters("instance/preempted", 1, B.BOUND):
            flip.problem = "no long-poll parked on instance/preempted"
            return flip
        t0 = time.time_ns()
        srv.set("instance/preempted", "TRUE")
        try:
            flip.exit_code = proc.wait(timeout=B.BOUND)
        except subprocess.TimeoutExpired:
            flip.problem = f"still running {B.BOUND:.0f}s after the flip"
        sigint_ns = B.read_marker(marker)["sigint_ns"]
        if sigint_ns is None:
            flip.problem = flip.problem or "trainer never got SIGINT"
        else:
            flip.latency_ms = (sigint_ns - t0) / 1e6
            if kind == "spotvisor":
                flip.stages = stages(flip.log, t0, sigint_ns)
        if flip.problem is None and flip.exit_code != 130:
            flip.problem = f"exit code {flip.exit_code}, expected 130"
        return flip
    finally:
        if proc.poll() is None:
            B.kill_quietly(proc.pid, group=True)
            proc.wait()
        if trainer_pid and B.alive(trainer_pid):
            B.kill_quietly(trainer_pid)
        srv.set("instance/preempted", "FALSE")
        B.drop_stale_long_polls(srv)


def log_time_ns(text):
    """spotvisor's JSON "time" (UTC, 2026-01-02T03:04:05.123456789Z)."""
    day, _, frac = text.rstrip("Z").partition(".")
    whole = datetime.datetime.strptime(day, "%Y-%m-%dT%H:%M:%S").replace(
        tzinfo=datetime.timezone.utc)
    return int(whole.timestamp()) * 10**9 + int(frac.ljust(9, "0")[:9])


def stages(log, t0, sigint_ns):
    """Where spotvisor's time went, from its own log timestamps (ms)."""
    first = {}
    with open(log, errors="replace") as f:
        for line in f:
            try:
                e = json.loads(line)
                first.setdefault(e["event"], log_time_ns(e["time"]))
            except (ValueError, KeyError, TypeError):
                continue
    d, s = first.get("preemption.detected"), first.get("trainer.signal")
    if d is None or s is None:
        return None
    return ((d - t0) / 1e6, (s - d) / 1e6, (sigint_ns - s) / 1e6)


def stats(values):
    v = sorted(values)
    if not v:
        nan = float("nan")
        return dict(n=0, p50=nan, p99=nan, max=nan, mean=nan, min=nan)
    return dict(n=len(v), p50=B.percentile(v, 50), p99=B.percentile(v, 99),
                max=v[-1], mean=statistics.fmean(v), min=v[0])


NOTES = """\
Semantic differences (see bench/semantics.py for each one exercised):
  - bash signals on ANY end of its one curl: a 503 or other error body
    (curl -sS exits 0 on HTTP errors) is taken as a preemption; a dropped
    connection makes curl fail and `set -e` ends the script, leaving the
    trainer unsupervised. spotvisor retries errors and signals only on TRUE.
  - bash sends no last_etag: a flip that lands before curl is parked (or
    while it would reconnect) is never seen. spotvisor resumes from its ETag.
  - bash sends one SIGINT to the trainer's pid only; spotvisor signals the
    trainer's process group and escalates SIGINT -> SIGTERM -> SIGKILL.
  - bash starts the trainer with `&` in a non-interactive shell, which
    ignores SIGINT in it; a stock Python trainer then never raises
    KeyboardInterrupt, so the blog's SIGINT does nothing to `python train.py`
    (the fake trainer installs its own handler, so it is not affected here).
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flips", type=int, default=100,
                    help="measured flips per supervisor (default 100)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="unmeasured flips per supervisor first (default 2)")
    ap.add_argument("--json", help="also write every sample to this file")
    ap.add_argument("--tmp", default="/tmp",
                    help="parent of the temp dir holding state-dir, "
                         "checkpoint-dir, markers and logs (default /tmp)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temp dir with logs and markers")
    B.add_binary_flags(ap)
    args = ap.parse_args()
    B.check_binaries(args)

    work = tempfile.mkdtemp(prefix="spotvisor-bench-latency-", dir=args.tmp)
    srv = B.FakeMetadataServer().start()
    flips = {k: [] for k in KINDS}
    failed = []
    print(f"machine: {B.machine()}")
    print(f"spotvisor: {args.spotvisor} (CMAKE_BUILD_TYPE="
          f"{B.build_type(args.spotvisor)})")
    print(f"baseline: bash {B.BASELINE}")
    print(f"state-dir, checkpoint-dir, markers: {work} "
          f"({B.fs_type(work)})")
    print(f"flips: {args.warmup} warm-up + {args.flips} measured per "
          f"supervisor, interleaved; fake metadata on 127.0.0.1:{srv.port}")
    sys.stdout.flush()
    try:
        total = args.warmup + args.flips
        for i in range(total):
            for kind in KINDS:
                f = one_flip(kind, i, args, srv, work)
                if f.problem:
                    failed.append(f)
                    print(f"  flip {i} {kind}: PROBLEM: {f.problem} "
                          f"(log {f.log})", flush=True)
                if i >= args.warmup:
                    flips[kind].append(f)
            if (i + 1) % 25 == 0:
                print(f"  {i + 1}/{total} flip pairs", flush=True)
    finally:
        srv.stop()

    results = {k: stats([f.latency_ms for f in flips[k]
                         if f.latency_ms is not None]) for k in KINDS}
    misses = {k: sum(1 for f in flips[k] if f.latency_ms is None)
              for k in KINDS}
    print()
    print("Preemption latency, metadata flip -> trainer SIGINT handler (ms)")
    print(f"{'':10} {'n':>4} {'p50':>8} {'p99':>8} {'max':>8} {'mean':>8} "
          f"{'min':>8} {'missed':>6}")
    for k in KINDS:
        r = results[k]
        print(f"{k:10} {r['n']:>4} {r['p50']:8.2f} {r['p99']:8.2f} "
              f"{r['max']:8.2f} {r['mean']:8.2f} {r['min']:8.2f} "
              f"{misses[k]:>6}")
    s, b = results["spotvisor"], results["bash"]
    print(f"ratio spotvisor/bash: p50 {B.fmt_ratio(s['p50'], b['p50'])}, "
          f"p99 {B.fmt_ratio(s['p99'], b['p99'])} (below 1 = spotvisor "
          f"faster)")
    print("percentiles are nearest-rank; p99 of 100 samples is the "
          "second largest")
    st = [f.stages for f in flips["spotvisor"] if f.stages]
    if st:
        names = ("flip -> preemption.detected logged",
                 "-> trainer.signal logged",
                 "-> trainer's SIGINT handler (incl. killpg)")
        print(f"spotvisor stages from its log timestamps (ms, n={len(st)}):"
              f" {'p50':>6} {'p99':>6}")
        for i, name in enumerate(names):
            v = sorted(x[i] for x in st)
            print(f"  {name:44} {B.percentile(v, 50):6.2f} "
                  f"{B.percentile(v, 99):6.2f}")
    print(f"problems: {len(failed)}" + ("" if not failed else " (above)"))
    print()
    print(NOTES, end="")

    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": B.machine(), "flips": args.flips,
                       "warmup": args.warmup, "stats": results,
                       "missed": misses,
                       "samples_ms": {k: [f.latency_ms for f in flips[k]]
                                      for k in KINDS},
                       "spotvisor_stages_ms": [f.stages for f in
                                               flips["spotvisor"]],
                       "problems": [{"kind": f.kind, "flip": f.index,
                                     "problem": f.problem, "log": f.log}
                                    for f in failed]}, out, indent=1)
    if args.keep or failed:
        print(f"logs and markers kept in {work}")
    else:
        shutil.rmtree(work, True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

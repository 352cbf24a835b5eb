#!/usr/bin/env python3
"""What a preemption costs a trainer, with and without spotvisor's helper
(python/spotvisor.py, issue #29).

For each framework's stand-in (tests/integration/framework_standins.py: the
Hugging Face Trainer, Lightning, DeepSpeed, DCP, Orbax, Keras and plain torch.save, each
saving exactly as the framework does; the transformers and Lightning loops
for the helper are tests/fakes/frameworks/), each run boots a "VM"
(`spotvisor run` against the fake metadata server, a file:// bucket), lets
the trainer run to a random step between two saves, preempts it, then boots
a second VM that restores the commit and resumes as the framework's own
"resume from latest" does. It prints, per framework and mode:

  lost     steps trained on the first VM that the second one does not have
           (the last "step N" logged minus the step resumed from)
  stall    how long the save after the preemption took (helper: the save at
           the end of the step; without it there is none: the trainer dies)
  exit     seconds from the preemption to spotvisor's exit (the final sync included)
  broken   resumes that found a torn or mixed checkpoint (must be 0)

With `--trainer tests/gpu/real_trainers.py` (and `--python` an interpreter
that has them) it drives the real transformers.Trainer and Lightning instead,
on CUDA where there is one: the lent GPU machine's check, tests/gpu/README.md.

usage: preempt_cost.py [--runs 10] [--save-every 20] [--step-time 0.05] [--seed 1]
                       [--frameworks hf lightning ...] [--spotvisor BIN]
                       [--trainer PATH] [--python PYTHON]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib as B

STANDINS = os.path.join(B.ROOT, "tests", "integration", "framework_standins.py")
PYTHON = "/usr/bin/python3"
FRAMEWORKS = ("hf", "lightning", "deepspeed", "dcp", "orbax", "keras", "plain")


def log_lines(path):
    try:
        with open(path) as f:
            return [l.strip() for l in f if l.strip()]
    except FileNotFoundError:
        return []


def last_step(lines):
    steps = [int(l.split()[1]) for l in lines if l.startswith("step ")]
    return max(steps) if steps else 0


def boot(args, srv, work, name, framework, extra, ckpt):
    log = os.path.join(work, f"{name}.log")
    cmd = [args.spotvisor, "run", "--set", f"bucket=file://{work}/bucket", "--set", "run-id=run",
           "--set", f"checkpoint-dir={ckpt}", "--set", f"state-dir={ckpt}.state", "--set", "sync-interval=0",
           "--set", "sync-settle=2s", "--set", "stop-timeout=20s", "--set", "log-format=json", "--",
           args.python, args.trainer, "--framework", framework, "--log", log, "--size", str(args.size),
           "--step-time", str(args.step_time), "--save-every", str(args.save_every)] + extra
    env = dict(os.environ, GCE_METADATA_HOST=f"127.0.0.1:{srv.port}")
    out = open(os.path.join(work, f"{name}.spotvisor.log"), "wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env), log


def one_run(args, rng, framework, helper):
    work = tempfile.mkdtemp(prefix="preempt-cost-")
    srv = B.FakeMetadataServer().start()
    try:
        srv.set("instance/preempted", "FALSE")
        # A random moment between two saves, after the first one.
        target = args.save_every + 1 + rng.randrange(args.save_every)
        p, log = boot(args, srv, work, "vm1", framework, ["--helper"] if helper else [], os.path.join(work, "ckpt1"))
        B.wait_until(lambda: last_step(log_lines(log)) >= target, timeout=60)
        B.wait_until(lambda: srv.wait_for_waiters("instance/preempted", 1, 0.05), timeout=10)
        lines_before = len(log_lines(log))
        t0 = time.monotonic()
        srv.set("instance/preempted", "TRUE")
        p.wait(timeout=60)
        exit_s = time.monotonic() - t0
        lines = log_lines(log)
        trained = last_step(lines)
        stall = None
        for l in lines[lines_before:]:
            if l.startswith("saved ") and " in " in l:
                stall = float(l.rsplit(" ", 1)[1].rstrip("s"))
        srv.set("instance/preempted", "FALSE")
        p2, log2 = boot(args, srv, work, "vm2", framework, ["--resume-only"], os.path.join(work, "ckpt2"))
        rc = p2.wait(timeout=60)
        first = (log_lines(log2) or ["resumed BROKEN (no output)"])[0]
        broken = rc != 0 or "BROKEN" in first
        resumed = 0 if broken or first == "resumed none" else int(first.split()[1])
        return {"lost": trained - resumed, "stall": stall, "exit": exit_s, "broken": broken, "trained": trained}
    finally:
        srv.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="preemptions per framework and mode")
    ap.add_argument("--save-every", type=int, default=20, help="steps between saves")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds a step takes")
    ap.add_argument("--size", type=int, default=4 << 20, help="bytes of the biggest file of a save")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    ap.add_argument("--json", action="store_true", help="one JSON object per framework and mode too")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    ap.add_argument("--spotvisor", default=B.DEFAULT_SPOTVISOR)
    ap.add_argument("--trainer", default=STANDINS, help="the trainers' script (default: the stand-ins)")
    ap.add_argument("--python", default=PYTHON, help="the interpreter that runs it")
    args = ap.parse_args()
    if not os.access(args.spotvisor, os.X_OK):
        sys.exit(f"preempt_cost: {args.spotvisor} is missing; build it first")
    real = os.path.abspath(args.trainer) != os.path.abspath(STANDINS)
    for lib in ("transformers", "lightning"):
        found = subprocess.run([args.python, "-c", f"import {lib}; print({lib}.__version__)"], capture_output=True, text=True)
        version = found.stdout.strip() if found.returncode == 0 else None
        print(f"# {lib}: " + (f"{version}, driven" if real and version else
                              f"{version} installed (not driven here: the stand-in is)" if version else
                              "not installed" + ("" if real else ": its stand-in")))
    print(f"# trainer: {args.trainer} ({args.python})")
    print(f"# {B.machine()}; spotvisor {args.spotvisor}; {args.runs} run(s) each, save every {args.save_every} "
          f"steps of {args.step_time}s, biggest file {args.size >> 10} KiB, seed {args.seed}")
    print(f"{'framework':<10} {'helper':<6} {'runs':>4} {'lost mean':>9} {'lost max':>8} {'stall s':>8} "
          f"{'exit s':>7} {'broken':>6}")
    rng = random.Random(args.seed)
    failed = False
    for framework in args.frameworks:
        for helper in (False, True):
            results = [one_run(args, rng, framework, helper) for _ in range(args.runs)]
            lost = [r["lost"] for r in results]
            stalls = [r["stall"] for r in results if r["stall"] is not None]
            broken = sum(r["broken"] for r in results)
            failed |= broken > 0
            row = {"framework": framework, "helper": helper, "runs": len(results),
                   "lost_mean": statistics.mean(lost), "lost_max": max(lost),
                   "stall_median_s": statistics.median(stalls) if stalls else None,
                   "exit_median_s": statistics.median(r["exit"] for r in results), "broken": broken}
            stall = f"{row['stall_median_s']:.3f}" if stalls else "-"
            print(f"{framework:<10} {'yes' if helper else 'no':<6} {row['runs']:>4} {row['lost_mean']:>9.1f} "
                  f"{row['lost_max']:>8} {stall:>8} {row['exit_median_s']:>7.2f} {broken:>6}", flush=True)
            if args.json:
                print(json.dumps(row))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

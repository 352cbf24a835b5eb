#!/usr/bin/env python3
"""Behaviour, not speed: what the blog's bash script and spotvisor each do
when the preemption path meets something other than a clean flip.

Each scenario runs the bash baseline (bench/baseline_bash.sh) and
`spotvisor run` against a fresh fake metadata server and prints what was
observed: SIGINT/SIGTERM lines in the trainer's marker file, exit codes,
processes left running. Where the point is that nothing happens, the
scenario watches for --window seconds (an observation window, not a
latency bound). Nothing here is asserted; it is printed.

usage: semantics.py [--window 2]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import benchlib as B

# A trainer with no SIGINT handler of its own, like most `train.py`s: it
# relies on Python's default KeyboardInterrupt (here caught to leave a mark,
# as a trainer that saves a checkpoint on Ctrl-C does).
PY_TRAINER = r"""
import os, sys, time
marker = open(sys.argv[1], "a", buffering=1)
marker.write(f"start pid={os.getpid()} pgid={os.getpgrp()}\n")
try:
    time.sleep(3600)
except KeyboardInterrupt:
    marker.write(f"sigint realtime_ns={time.time_ns()}\n")
    sys.exit(130)
"""


class Run:
    """One supervisor + trainer under observation."""

    def __init__(self, kind, scenario, ctx, trainer, sets=()):
        self.kind, self.ctx = kind, ctx
        base = os.path.join(ctx.work, f"{scenario}-{kind}")
        self.marker, self.log, self.pids = base + ".marker", base + ".log", \
            base + ".pids"
        argv = [a.replace("{marker}", self.marker).replace("{pids}", self.pids)
                for a in trainer]
        if kind == "spotvisor":
            cmd = [ctx.args.spotvisor, "run",
                   "--set", f"state-dir={base}.state",
                   "--set", f"checkpoint-dir={base}.ckpt",
                   "--set", "log-format=json"]
            for s in sets:
                cmd += ["--set", s]
            cmd += ["--"] + argv
        else:
            cmd = ["bash", B.BASELINE, f"127.0.0.1:{ctx.srv.port}"] + argv
        env = dict(os.environ, GCE_METADATA_HOST=f"127.0.0.1:{ctx.srv.port}")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        self.trainer = None

    def started(self):
        s = B.wait_until(lambda: B.read_marker(self.marker)["start"])
        self.trainer = s
        return bool(s)

    def marks(self, word):
        return [l for l in B.read_marker(self.marker)["lines"]
                if l.startswith(word + " ")]

    def trainer_alive(self):
        return bool(self.trainer) and B.alive(self.trainer["pid"])

    def descendants(self):
        try:
            with open(self.pids) as f:
                return [int(l) for l in f if l.strip()]
        except FileNotFoundError:
            return []

    def exit_code(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def summary(self, code):
        sigint, sigterm = len(self.marks("sigint")), len(self.marks("sigterm"))
        parts = [f"SIGINT x{sigint}"]
        if sigterm:
            parts.append(f"SIGTERM x{sigterm}")
        who = "spotvisor" if self.kind == "spotvisor" else "script"
        parts.append(f"{who} running" if code is None
                     else f"{who} exit {code}")
        if self.trainer is None:
            parts.append("trainer never started")
        elif self.trainer_alive():
            parts.append("trainer STILL RUNNING")
        else:
            parts.append("trainer gone")
        return ", ".join(parts)

    def cleanup(self):
        if self.proc.poll() is None:
            B.kill_quietly(self.proc.pid, group=True)
        if self.trainer:
            B.kill_quietly(self.trainer.get("pgid", 0), group=True)
            B.kill_quietly(self.trainer["pid"])
        for p in self.descendants():
            B.kill_quietly(p)
        self.proc.wait()


class Ctx:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.srv = None


def flip_and_watch(ctx, run, window):
    """Set preempted=TRUE; return the supervisor's exit code (or None)."""
    ctx.srv.set("instance/preempted", "TRUE")
    return run.exit_code(window)


# ------------------------------------------------------------ scenarios
# Each takes (ctx, kind) and returns one line of what was observed.

def dropped_connection(ctx, kind):
    """The parked long-poll's connection is dropped, then the VM is preempted."""
    r = Run(kind, "drop", ctx, [ctx.args.fake_trainer, "--marker-file",
                                "{marker}"])
    try:
        if not (r.started() and
                ctx.srv.wait_for_waiters("instance/preempted", 1, B.BOUND)):
            return "did not start/park: see " + r.log
        ctx.srv.fault("refuse")   # every connection closed, connects refused
        gone = r.exit_code(ctx.args.window)  # does the drop end it?
        ctx.srv.fault("none")
        note = "" if gone is None else f"script ended ({gone}) at the drop; "
        if gone is None and kind == "spotvisor":
            ctx.srv.wait_for_waiters("instance/preempted", 1, B.BOUND)
        ctx.srv.set("instance/preempted", "TRUE")
        if gone is None:
            code = r.exit_code(ctx.args.window)
        else:
            code = gone
            B.wait_until(lambda: r.marks("sigint"), ctx.args.window)
        return note + "after the flip: " + r.summary(code)
    finally:
        r.cleanup()


def error_answer(ctx, kind):
    """The metadata server answers the preempted poll with HTTP 503."""
    sets = ["metadata-watch-timeout=1s"]  # so its parked poll ends soon
    if kind == "bash":
        # A fault applies when a request arrives; curl sends one request.
        ctx.srv.fault("status", code=503, count=1,
                      path_prefix="instance/preempted")
    r = Run(kind, "503", ctx, [ctx.args.fake_trainer, "--marker-file",
                               "{marker}"], sets)
    try:
        if not r.started():
            return "trainer did not start: see " + r.log
        if kind == "spotvisor":
            srv = ctx.srv
            srv.wait_for_waiters("instance/preempted", 1, B.BOUND)
            srv.reset_log()
            srv.fault("status", code=503, count=2,
                      path_prefix="instance/preempted")
            srv.wait_for_hits("instance/preempted", 3, B.BOUND)
            srv.wait_for_waiters("instance/preempted", 1, B.BOUND)
            answered = [e["status"] for e in srv.log()
                        if e["path"] == "instance/preempted"]
            before = (f"polls answered {answered}, then parked again; "
                      f"before any flip: {r.summary(r.proc.poll())}; ")
            code = flip_and_watch(ctx, r, ctx.args.window)
            return before + "after a real flip: " + r.summary(code)
        code = r.exit_code(ctx.args.window)
        return "no flip at all: " + r.summary(code)
    finally:
        ctx.srv.fault("none")
        r.cleanup()


def already_true(ctx, kind):
    """preempted is TRUE before the watch starts (no last_etag to catch it)."""
    ctx.srv.set("instance/preempted", "TRUE")
    r = Run(kind, "true", ctx, [ctx.args.fake_trainer, "--marker-file",
                                "{marker}"])
    try:
        code = r.exit_code(ctx.args.window)
        if code is None:
            r.started()
        return (f"watched {ctx.args.window:g}s: " if code is None else "") + \
            r.summary(code)
    finally:
        r.cleanup()


def ignores_sigint(ctx, kind):
    """The trainer does not stop on SIGINT (hung in I/O, or ignores it)."""
    r = Run(kind, "ignore", ctx,
            [ctx.args.fake_trainer, "--marker-file", "{marker}",
             "--ignore-sigint"], ["stop-timeout=1s"])
    try:
        if not (r.started() and
                ctx.srv.wait_for_waiters("instance/preempted", 1, B.BOUND)):
            return "did not start/park: see " + r.log
        code = flip_and_watch(ctx, r, 1.0 + ctx.args.window)
        return f"{1 + ctx.args.window:g}s after the flip: " + r.summary(code)
    finally:
        r.cleanup()


def workers(ctx, kind):
    """The trainer has worker processes (e.g. DataLoader workers)."""
    r = Run(kind, "workers", ctx,
            [ctx.args.fake_trainer, "--marker-file", "{marker}",
             "--spawn-grandchildren", "2", "--pid-file", "{pids}"])
    try:
        if not (r.started() and B.wait_until(r.descendants) and
                ctx.srv.wait_for_waiters("instance/preempted", 1, B.BOUND)):
            return "did not start/park: see " + r.log
        code = flip_and_watch(ctx, r, ctx.args.window)
        kids = r.descendants()
        if code is not None:
            B.wait_until(lambda: not any(B.alive(p) for p in kids), 1.0)
        left = sum(1 for p in kids if B.alive(p))
        return r.summary(code) + f", workers left running: {left}/{len(kids)}"
    finally:
        r.cleanup()


def python_trainer(ctx, kind):
    """A Python trainer relying on the default KeyboardInterrupt."""
    r = Run(kind, "python", ctx, [sys.executable, "-c", PY_TRAINER,
                                  "{marker}"])
    try:
        if not (r.started() and
                ctx.srv.wait_for_waiters("instance/preempted", 1, B.BOUND)):
            return "did not start/park: see " + r.log
        code = flip_and_watch(ctx, r, ctx.args.window)
        return r.summary(code)
    finally:
        r.cleanup()


SCENARIOS = [
    ("connection dropped while parked, then preempted", dropped_connection),
    ("metadata answers the poll with HTTP 503", error_answer),
    ("preempted already TRUE when the watch starts", already_true),
    ("trainer ignores SIGINT", ignores_sigint),
    ("trainer has 2 worker processes", workers),
    ("python trainer, default SIGINT handling", python_trainer),
]


def main():
    ap = argparse.ArgumentParser(description="bash baseline vs spotvisor: "
                                             "behaviour in odd cases")
    ap.add_argument("--window", type=float, default=2.0,
                    help="seconds to watch for something (not) to happen")
    B.add_binary_flags(ap)
    args = ap.parse_args()
    B.check_binaries(args)
    work = tempfile.mkdtemp(prefix="spotvisor-bench-semantics-")
    ctx = Ctx(args, work)
    print("Behaviour in odd cases (observed now, against the fake):")
    for title, fn in SCENARIOS:
        print(f"- {title}")
        for kind in ("bash", "spotvisor"):
            ctx.srv = B.FakeMetadataServer().start()
            try:
                line = fn(ctx, kind)
            finally:
                ctx.srv.stop()
            print(f"    {kind:9} {line}", flush=True)
    print("(spotvisor runs with stop-timeout=1s in the SIGINT case and "
          "metadata-watch-timeout=1s in the 503 case, to keep them short)")
    shutil.rmtree(work, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

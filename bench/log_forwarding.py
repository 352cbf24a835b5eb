#!/usr/bin/env python3
"""Trainer output forwarding: what spotvisor costs a trainer that prints a lot.

(a) stdout: the fake trainer's `--flood N` (N short lines as fast as it can)
    under `spotvisor run`, spotvisor's stdout a pipe this script drains in
    1 MiB reads (lines counted with bytes.count, never JSON-parsed; log.dropped
    counts found with a regex only in chunks that mention it). Baseline: the
    same trainer with its stdout straight to the same drain. Runs alternate.
(b) the same flood with --set log-to=api against the fake Cloud Logging API
    (tests/fakes/fake_logging.py, no delay), in this process: entries it got,
    log.dropped counts in its "spotvisor" log, requests (batching).
(c) `--progress N`, a tqdm-like \\r bar, N updates 1 ms apart: how many
    trainer.output lines reach stdout and the API.

spotvisor's own CPU is read from /proc/PID/stat while it is a zombie (waitid
WNOWAIT), so the trainer's CPU (its reaped child) is separate.

usage: log_forwarding.py [--runs 3] [--lines 1000000] [--progress 10000]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib as B
from fake_logging import FakeLoggingServer  # benchlib put tests/fakes on the path

TICK = os.sysconf("SC_CLK_TCK")
DROPPED = re.compile(rb'"event":"log\.dropped"[^\n]*?"dropped":(\d+)')
OUTPUT = b'"event":"trainer.output"'
PROJECT = "bench-project"


class Drain:
    """Reads a pipe to EOF as fast as it can; counts lines, output, drops."""

    def __init__(self, fd):
        self.fd, self.lines, self.output, self.dropped, self.bytes = fd, 0, 0, 0, 0

    def run(self):
        tail = b""
        while True:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                break
            self.bytes += len(chunk)
            self.lines += chunk.count(b"\n")
            data = tail + chunk
            cut = data.rfind(b"\n") + 1
            whole, tail = data[:cut], data[cut:]
            self.output += whole.count(OUTPUT)
            if b"log.dropped" in whole:
                self.dropped += sum(int(n) for n in DROPPED.findall(whole))
        os.close(self.fd)


def run_drained(argv, env):
    """Runs argv with stdout to a pipe drained here; returns a result dict."""
    r, w = os.pipe()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=w,
                            stderr=subprocess.DEVNULL, env=env)
    os.close(w)
    d = Drain(r)
    d.run()  # EOF: every writer (spotvisor, trainer) has closed stdout
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    wall = time.monotonic() - t0
    with open(f"/proc/{proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / TICK     # utime + stime
    kids = (int(fields[13]) + int(fields[14])) / TICK    # cutime + cstime
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return dict(wall=wall, cpu=own, child_cpu=kids,
                cpu_ru=ru.ru_utime + ru.ru_stime, code=proc.returncode,
                lines=d.lines, output=d.output, dropped=d.dropped,
                bytes=d.bytes)


def spotvisor_argv(args, work, trainer, api=None):
    argv = [args.spotvisor, "run",
            "--set", f"state-dir={work}/state",
            "--set", f"checkpoint-dir={work}/ckpt"]
    if api:
        argv += ["--set", "log-to=api", "--set", f"logging-endpoint={api}"]
    return argv + ["--", args.fake_trainer] + trainer


def one(kind, args, md, work, trainer):
    env = dict(os.environ, GCE_METADATA_HOST=f"127.0.0.1:{md.port}")
    if kind == "direct":
        res = run_drained([args.fake_trainer] + trainer, env)
        res["cpu"], res["child_cpu"] = res["cpu_ru"], 0.0
        return res
    if kind == "stdout":
        return run_drained(spotvisor_argv(args, work, trainer), env)
    fake = FakeLoggingServer(PROJECT).start()
    try:
        res = run_drained(spotvisor_argv(args, work, trainer, fake.endpoint),
                          env)
        res["api_entries"] = len(fake.entries("spotvisor-trainer"))
        events = [e["jsonPayload"] for e in fake.entries("spotvisor")]
        res["api_dropped"] = sum(e.get("dropped", 0) for e in events
                                 if e.get("event") == "log.dropped")
        res["api_run_end"] = any(e.get("event") == "run.end" for e in events)
        res["requests"] = len(fake.requests())
    finally:
        fake.stop()
    return res


def med(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lines", type=int, default=1000000)
    ap.add_argument("--progress", type=int, default=10000)
    B.add_binary_flags(ap)
    args = ap.parse_args()
    B.check_binaries(args)

    work = tempfile.mkdtemp(prefix="spotvisor-bench-logging-")
    md = B.FakeMetadataServer().start()
    md.set("project/project-id", PROJECT)
    flood = ["--flood", str(args.lines), "--run-for", "10"]
    progress = ["--progress", str(args.progress), "--run-for", "10"]
    printed = args.lines + 2  # plus the fake trainer's started/exiting lines
    print(f"machine: {B.machine()}")
    print(f"spotvisor: {args.spotvisor} (CMAKE_BUILD_TYPE="
          f"{B.build_type(args.spotvisor)})")
    print(f"runs: {args.runs} of each, interleaved; medians shown", flush=True)
    rows = {k: [] for k in ("direct", "stdout", "api", "p-stdout", "p-api")}
    try:
        for i in range(args.runs):
            for kind in ("direct", "stdout", "api"):
                r = one(kind, args, md, work, flood)
                rows[kind].append(r)
                print(f"  run {i} flood {kind}: wall {r['wall']:.2f}s "
                      f"lines {r['lines']} dropped {r['dropped']} "
                      f"cpu {r['cpu']:.2f}s trainer {r['child_cpu']:.2f}s "
                      f"code {r['code']}"
                      + (f" api {r['api_entries']} api-dropped "
                         f"{r['api_dropped']} requests {r['requests']}"
                         if kind == "api" else ""), flush=True)
            for kind, api in (("p-stdout", "stdout"), ("p-api", "api")):
                r = one(api, args, md, work, progress)
                rows[kind].append(r)
                print(f"  run {i} progress {api}: wall {r['wall']:.2f}s "
                      f"stdout trainer.output {r['output']} cpu "
                      f"{r['cpu']:.2f}s"
                      + (f" api {r['api_entries']}" if api == "api" else ""),
                      flush=True)
    finally:
        md.stop()

    d, s, a = rows["direct"], rows["stdout"], rows["api"]
    for r in s + a:
        r["fwd"] = r["output"]  # trainer.output lines that reached stdout
    for r in d:
        r["fwd"] = r["lines"]
    for r in s + a:
        r["fwd_lps"] = r["output"] / r["wall"]
        r["us_line"] = r["cpu"] / printed * 1e6
    for r in d:
        r["fwd_lps"] = r["lines"] / r["wall"]
        r["us_line"] = r["cpu"] / printed * 1e6
    print()
    print(f"(a)/(b) --flood {args.lines} ({printed} lines printed), "
          f"medians of {args.runs}")
    hdr = ("", "wall s", "lines/s out", "lines out", "dropped",
           "sup CPU s", "CPU us/line", "trainer CPU s")
    print("%-22s %8s %12s %10s %10s %10s %11s %13s" % hdr)
    for name, rs in (("direct (no supervisor)", d), ("spotvisor stdout", s),
                     ("spotvisor log-to=api", a)):
        sup = name != "direct (no supervisor)"
        print("%-22s %8.2f %12.0f %10.0f %10s %10s %11s %13.2f" % (
            name, med(rs, "wall"), med(rs, "fwd_lps"), med(rs, "fwd"),
            f"{med(rs, 'dropped'):.0f}" if sup else "-",
            f"{med(rs, 'cpu'):.2f}" if sup else "-",
            f"{med(rs, 'us_line'):.2f}" if sup else "-",
            med(rs, "child_cpu") if sup else med(rs, "cpu")))
    print(f"ratio direct/spotvisor-stdout: lines/s "
          f"{B.fmt_ratio(med(d, 'fwd_lps'), med(s, 'fwd_lps'))}x; "
          f"spotvisor-stdout/direct wall "
          f"{B.fmt_ratio(med(s, 'wall'), med(d, 'wall'))}x; share of lines "
          f"forwarded {med(s, 'fwd') / printed:.1%} (stdout), "
          f"{med(a, 'fwd') / printed:.1%} (stdout with log-to=api)")
    print(f"(b) API: entries received {med(a, 'api_entries'):.0f}, "
          f"dropped (log.dropped) {med(a, 'api_dropped'):.0f}, requests "
          f"{med(a, 'requests'):.0f}, entries/request "
          f"{B.fmt_ratio(med(a, 'api_entries'), med(a, 'requests'))}, "
          f"received+dropped per run "
          f"{[r['api_entries'] + r['api_dropped'] for r in a]} "
          f"(printed {printed}); run.end delivered "
          f"{[r['api_run_end'] for r in a]}")
    ps, pa = rows["p-stdout"], rows["p-api"]
    print(f"(c) --progress {args.progress}: trainer.output lines on stdout "
          f"{med(ps, 'output'):.0f} (log-to=stdout), "
          f"{med(pa, 'output'):.0f} (log-to=api); API entries "
          f"{med(pa, 'api_entries'):.0f}; wall {med(ps, 'wall'):.1f}s; "
          f"spotvisor CPU {med(ps, 'cpu'):.2f}s / {med(pa, 'cpu'):.2f}s "
          f"(includes the 2 started/exiting lines)")


if __name__ == "__main__":
    main()

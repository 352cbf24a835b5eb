#!/usr/bin/env python3
"""Gang training (issue #16): stop together, start together, idle etcd load.

Real spotvisors (one per "VM": member vm-K at 127.0.0.(K+2) with its own fake
metadata server) form a gang through a real etcd on loopback, with the pieces
of tests/integration/test_gang.py (its Etcd helper and GangTestCase's
start_member) and the harness's Spotvisor class, which parses each JSON log
line as it arrives. The trainer is a small script of this file's own: it
installs its SIGINT handler, writes time.time() to OUT/start-vm-K (with the
RANK it was given), sleeps, and on SIGINT writes time.time() to
OUT/sigint-vm-K and exits 130. All clocks are CLOCK_REALTIME on one machine.

stop: for each iteration a fresh gang (name g-<i>, so no earlier key in etcd
  is in its way; one etcd for all iterations) of --nodes members is started
  with on-exit none and metadata-watch-timeout 60s. Once every trainer has
  started and the preempted member's long-poll on instance/preempted is
  parked at its fake metadata server, t0 = time.time() and that member's
  instance/preempted is set to TRUE (the member preempted rotates: vm-(i mod
  N)). Measured:
   (1) flip -> SIGINT in every trainer: max over members of the SIGINT
       handler's time - t0, and the spread (max - min) across members;
   (2) last gang.joined -> every trainer started: the last member's
       gang.joined (the "time" field spotvisor's JSON line carries) to the
       last trainer's own start time.
  Then every spotvisor must exit 130 (run.end preempted for the preempted
  member, gang-ended for the others).
idle: one gang of --idle-nodes, formed and training; etcd's Prometheus
  counters (/metrics: grpc_server_started_total, grpc_server_handled_total,
  grpc_server_msg_received_total by grpc_method) are read before and after
  --idle-seconds and diffed: requests per minute per node as etcd saw them
  (the JSON gateway turns every HTTP call into a gRPC call). Then one member
  is preempted and every spotvisor must exit 130.

Numbers never fail the run; a missed SIGINT, a gang that never formed, a
wrong exit code or run.end reason do (exit 1).

usage: gang_bench.py [stop|idle|all] [--flips 50] [--warmup 1] [--nodes 4]
                     [--idle-nodes 8] [--idle-seconds 60] [--lease-ttl 10]
                     [--short] [--json FILE] [--spotvisor PATH] [--keep]
--short (for CI): 3 flips with 3 nodes, an idle gang of 3 for 10 s.
"""
import argparse
import json
import mmap
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
for d in (os.path.join(ROOT, "tests", "fakes"), os.path.join(ROOT, "tests", "integration")):
    sys.path.insert(0, d)

import benchlib as B  # noqa: E402
import harness  # noqa: E402
from preempt_latency import log_time_ns  # noqa: E402
from test_gang import GangTestCase  # noqa: E402

RELEASE = os.path.join(ROOT, "build-release", "daemon", "spotvisor")
ASAN = os.path.join(ROOT, "build-asan", "daemon", "spotvisor")
BOUND = 30.0  # seconds for any one condition; only a failure waits this long

TRAINER = r'''
import json, os, signal, time
out, member = os.environ["GANG_OUT"], os.environ["MEMBER"]
def put(name, value):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.rename(tmp, os.path.join(out, name))
def on_int(signum, frame):
    put(f"sigint-{member}", {"t": time.time()})
    os._exit(130)
signal.signal(signal.SIGINT, on_int)
put(f"start-{member}", {"t": time.time(), "rank": os.environ.get("RANK"),
                        "world": os.environ.get("WORLD_SIZE"), "gang": os.environ.get("SPOTVISOR_GANG")})
while True:
    time.sleep(3600)
'''


# ------------------------------------------------------------------ helpers
def is_asan(binary):
    """True if the binary carries AddressSanitizer's runtime."""
    try:
        with open(binary, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b"__asan_init") >= 0
    except (OSError, ValueError):
        return False


def git_head():
    """The checkout's commit (and whether it has changes): the binary may be older."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def event_time(proc, name):
    """Wall time (s) of a spotvisor's first `name` event, from its "time" field."""
    found = proc.find(name)
    if not found or "time" not in found[0]:
        return None
    return log_time_ns(found[0]["time"]) / 1e9


def stats(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        nan = float("nan")
        return dict(n=0, p50=nan, p99=nan, max=nan, mean=nan, min=nan)
    return dict(n=len(v), p50=B.percentile(v, 50), p99=B.percentile(v, 99),
                max=v[-1], mean=statistics.fmean(v), min=v[0])


def stat_line(label, values, width=50):
    s = stats(values)
    return (f"  {label:{width}} {s['n']:>4} {s['p50']:8.1f} {s['p99']:8.1f} "
            f"{s['max']:8.1f} {s['mean']:8.1f} {s['min']:8.1f}")


def stat_header(width=50):
    return f"  {'(ms)':{width}} {'n':>4} {'p50':>8} {'p99':>8} {'max':>8} {'mean':>8} {'min':>8}"


def cpu_seconds(pid):
    """utime + stime of a process, in seconds (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Gangs(GangTestCase):
    """test_gang's harness (real etcd, start_member), driven by hand.

    Used outside unittest: setUp() starts etcd; close() runs the cleanups.
    Each gang gets its own name, output dir and per-member dirs under
    work/<name>/, so state and checkpoint dirs are never shared.
    """

    def __init__(self, keep):
        super().__init__()  # methodName "runTest" may be missing: allowed
        self.keep = keep
        self.tmp, self.members = None, {}  # until setUp

    def setUp(self):
        super().setUp()
        self.trainer = os.path.join(self.tmp, "gang_bench_trainer.py")
        with open(self.trainer, "w") as f:
            f.write(TRAINER)
        if self.keep:  # keep the dir with logs: drop the rmtree cleanup
            self._cleanups = [c for c in self._cleanups if c[0] is not shutil.rmtree]
        return self

    def close(self):
        self.doCleanups()

    def start_gang(self, name, n, lease_ttl):
        self.NAME = name
        base = os.path.join(self.tmp, name)
        self.out = os.path.join(base, "out")
        os.makedirs(self.out)
        self.members = {}
        procs = []
        for k in range(n):
            procs.append(self.start_member(
                k, size=n, **{"on-exit": "none", "metadata-watch-timeout": "60s",
                              "gang-lease-ttl": f"{lease_ttl}s", "log-format": "json",
                              "checkpoint-dir": os.path.join(base, f"ckpt-{k}"),
                              "state-dir": os.path.join(base, f"state-{k}")}))
        return procs

    def trainers_started(self, procs, timeout=BOUND):
        """{member: start record} once every trainer wrote one; None on
        timeout or as soon as a spotvisor has exited."""
        n = len(procs)

        def all_there():
            if any(p.proc.poll() is not None for p in procs):
                return "exited"
            got = {}
            for k in range(n):
                rec = read_json(os.path.join(self.out, f"start-vm-{k}"))
                if rec is None:
                    return None
                got[f"vm-{k}"] = rec
            return got
        got = B.wait_until(all_there, timeout, interval=0.01)
        return None if got == "exited" else got

    def sigint_times(self, n, timeout=BOUND):
        """{member: SIGINT handler time}; members never signalled are missing."""
        deadline = time.monotonic() + timeout
        got = {}
        while len(got) < n and time.monotonic() < deadline:
            for k in range(n):
                m = f"vm-{k}"
                if m not in got:
                    rec = read_json(os.path.join(self.out, f"sigint-{m}"))
                    if rec is not None:
                        got[m] = rec["t"]
            if len(got) < n:
                time.sleep(0.01)  # bounded poll for files, not a fixed wait
        return got

    def end_gang(self, procs, victim, flipped=True):
        """Wait for every spotvisor to exit (after a flip; else kill them);
        returns the problems seen."""
        problems = []
        for k, p in enumerate(procs):
            if not flipped:
                p.kill()
                continue
            try:
                code = p.proc.wait(BOUND)
            except Exception:  # subprocess.TimeoutExpired
                problems.append(f"vm-{k}: spotvisor still running {BOUND:.0f}s after the flip")
                p.kill()
                continue
            p._out.join(5)
            ends = p.find("run.end")
            reason = ends[0].get("reason") if ends else None
            want = "preempted" if k == victim else "gang-ended"
            if code != 130:
                problems.append(f"vm-{k}: exit code {code}, expected 130")
            if reason != want:
                problems.append(f"vm-{k}: run.end reason {reason!r}, expected {want!r}")
        for k, p in enumerate(procs):
            with open(os.path.join(self.tmp, self.NAME, f"log-vm-{k}.jsonl"), "w") as f:
                f.write("".join(p.raw))
                if p.stderr:
                    f.write("--- stderr\n" + p.stderr)
        for m in self.members.values():
            m["metadata"].stop()
        self.kill_leftover_trainers()
        return problems

    def kill_leftover_trainers(self):
        for m in self.members.values():
            m["proc"].kill()
        for k in range(len(self.members)):
            st = read_json(os.path.join(self.tmp, self.NAME, f"state-{k}", "status.json")) or {}
            if st.get("trainer_pid") and B.alive(st["trainer_pid"]):
                B.kill_quietly(st["trainer_pid"], group=True)

    def metrics(self):
        with urllib.request.urlopen(f"{self.etcd.url}/metrics", timeout=10) as r:
            return r.read().decode()


def not_started(g, procs):
    """Why not every trainer of a gang is running, for the report."""
    missing = [f"vm-{k}" for k in range(len(procs)) if not os.path.exists(os.path.join(g.out, f"start-vm-{k}"))]
    formed = [f"vm-{k}" for k, p in enumerate(procs) if p.find("gang.formed")]
    why = f"trainers of {missing} not running (gang.formed on {formed or 'none'})"
    for k, p in enumerate(procs):
        if p.proc.poll() is not None:
            ends = p.find("run.end")
            why += (f"; vm-{k}'s spotvisor exited {p.proc.returncode}"
                    f" ({ends[0].get('message') if ends else 'no run.end'})")
    return why


# ------------------------------------------------------------------ stop
def one_gang(g, i, n, lease_ttl):
    """One iteration: form, flip one member, collect. Returns a record."""
    rec = {"iteration": i, "gang": f"g-{i}", "nodes": n, "victim": f"vm-{i % n}",
           "stop_ms": None, "spread_ms": None, "start_ms": None, "problems": []}
    victim = i % n
    flipped, started, sig, t0 = False, None, {}, None
    t_launch = time.time()
    procs = g.start_gang(f"g-{i}", n, lease_ttl)
    try:
        started = g.trainers_started(procs)
        if not started:
            rec["problems"].append(not_started(g, procs))
            return rec
        ranks = sorted(str(s.get("rank")) for s in started.values())
        if ranks != [str(r) for r in range(n)] or any(s.get("world") != str(n) for s in started.values()):
            rec["problems"].append(f"ranks/world sizes wrong: {started}")
        # (1) one member preempted -> SIGINT everywhere.
        srv = g.members[f"vm-{victim}"]["metadata"]
        if not srv.wait_for_waiters("instance/preempted", 1, BOUND):
            rec["problems"].append(f"vm-{victim}: no long-poll parked on instance/preempted")
            return rec
        t0 = time.time()
        srv.set("instance/preempted", "TRUE")
        flipped = True
        sig = g.sigint_times(n)
        for k in range(n):
            if f"vm-{k}" not in sig:
                rec["problems"].append(f"vm-{k}: trainer never got SIGINT within {BOUND:.0f}s of the flip")
        if sig:
            rec["per_member_ms"] = {m: (t - t0) * 1e3 for m, t in sorted(sig.items())}
        if len(sig) == n:
            rec["stop_ms"] = (max(sig.values()) - t0) * 1e3
            rec["spread_ms"] = (max(sig.values()) - min(sig.values())) * 1e3
        return rec
    finally:
        rec["problems"] += g.end_gang(procs, victim, flipped)
        rec["seconds"] = time.time() - t_launch
        # From the logs once every spotvisor has exited (a line is parsed by
        # the harness's reader thread, which may lag the trainer's files).
        if started:
            start_stages(rec, procs, started, t_launch)
        if flipped and len(sig) == n:
            det = event_time(procs[victim], "preemption.detected")
            ended = [event_time(p, "gang.ended") for k, p in enumerate(procs) if k != victim]
            if det is None or None in ended:
                rec["problems"].append("preemption.detected or a gang.ended missing from the logs")
            elif ended:  # a gang of 1 has nobody else
                rec["stop_stages_ms"] = [(det - t0) * 1e3, (max(ended) - det) * 1e3,
                                         (max(sig.values()) - max(ended)) * 1e3]


def start_stages(rec, procs, started, t_launch):
    """(2): last gang.joined -> last trainer running, and where it went."""
    joined = [event_time(p, "gang.joined") for p in procs]
    formed = [event_time(p, "gang.formed") for p in procs]
    tstart = [event_time(p, "trainer.start") for p in procs]
    if None in joined or None in formed or None in tstart:
        rec["problems"].append("a member's gang.joined/gang.formed/trainer.start is missing or has no time field")
        return
    last_join = max(joined)
    last_run = max(s["t"] for s in started.values())
    rec["start_ms"] = (last_run - last_join) * 1e3
    rec["start_stages_ms"] = [(max(formed) - last_join) * 1e3, (max(tstart) - max(formed)) * 1e3,
                              (last_run - max(tstart)) * 1e3]
    rec["launch_to_last_join_ms"] = (last_join - t_launch) * 1e3


def run_stop(args, report):
    g = Gangs(args.keep)
    recs, problems = [], []
    t = time.monotonic()
    try:
        g.setUp()
        print(f"stop/start: {args.warmup} warm-up + {args.flips} measured gangs of {args.nodes}, "
              f"gang-lease-ttl {args.lease_ttl}s, etcd {g.etcd.url}, work {g.tmp} ({B.fs_type(g.tmp)})", flush=True)
        for i in range(args.warmup + args.flips):
            r = one_gang(g, i, args.nodes, args.lease_ttl)
            r["warmup"] = i < args.warmup
            recs.append(r)
            for p in r["problems"]:
                problems.append(f"g-{i}: {p}")
                print(f"  g-{i}: PROBLEM: {p}", flush=True)
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{args.warmup + args.flips} gangs", flush=True)
    finally:
        elapsed = time.monotonic() - t
        if problems:
            g._cleanups = [c for c in g._cleanups if c[0] is not shutil.rmtree]
            print(f"  logs kept in {g.tmp}")
        g.close()
    m = [r for r in recs if not r["warmup"]]
    print()
    print(f"(1) one member preempted -> SIGINT in every member's trainer, {args.nodes} nodes")
    print(stat_header())
    print(stat_line("flip -> last trainer's SIGINT handler", [r["stop_ms"] for r in m]))
    print(stat_line("spread across members (last - first)", [r["spread_ms"] for r in m]))
    print(stat_line("flip -> the preempted member's own SIGINT",
                    [r.get("per_member_ms", {}).get(r["victim"]) for r in m]))
    st = [r["stop_stages_ms"] for r in m if r.get("stop_stages_ms")]
    if st:
        print(f"  stages, from spotvisor's log times (n={len(st)}):")
        for j, name in enumerate(("flip -> preemption.detected (preempted member)",
                                  "-> last gang.ended (other members)",
                                  "-> last trainer's SIGINT handler")):
            print(stat_line("  " + name, [x[j] for x in st]))
    missed = sum(1 for r in m if r["stop_ms"] is None)
    print(f"  aim: p99 < 50 ms; gangs with a member not signalled: {missed}")
    print()
    print(f"(2) last member's gang.joined -> every trainer started, {args.nodes} nodes")
    print(stat_header())
    print(stat_line("last gang.joined -> last trainer running", [r["start_ms"] for r in m]))
    ss = [r["start_stages_ms"] for r in m if r.get("start_stages_ms")]
    if ss:
        print(f"  stages, from spotvisor's log times and the trainer's own (n={len(ss)}):")
        for j, name in enumerate(("last gang.joined -> last gang.formed",
                                  "-> last trainer.start logged",
                                  "-> last trainer's first line (python up)")):
            print(stat_line("  " + name, [x[j] for x in ss]))
    print(stat_line("(launch of the N spotvisors -> last gang.joined)",
                    [r.get("launch_to_last_join_ms") for r in m]))
    print("  aim: < 1000 ms (p99)")
    print(f"  wall time of the stop/start part: {elapsed:.1f}s "
          f"({elapsed / max(1, len(recs)):.2f}s per gang)")
    print(f"  problems: {len(problems)}")
    report["stop"] = {"nodes": args.nodes, "flips": args.flips, "warmup": args.warmup,
                      "lease_ttl_s": args.lease_ttl, "seconds": elapsed,
                      "stop_ms": stats([r["stop_ms"] for r in m]),
                      "spread_ms": stats([r["spread_ms"] for r in m]),
                      "start_ms": stats([r["start_ms"] for r in m]),
                      "iterations": recs, "problems": problems}
    return problems


# ------------------------------------------------------------------ idle
METRIC = re.compile(r'^(grpc_server_(?:started|handled|msg_received|msg_sent)_total)\{([^}]*)\}\s+(\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
GAUGES = ("etcd_debugging_mvcc_watch_stream_total", "etcd_debugging_mvcc_watcher_total")


def parse_metrics(text):
    """{(family, method, code): value} for the grpc server counters, and gauges."""
    out, gauges = {}, {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m:
            labels = dict(LABEL.findall(m.group(2)))
            key = (m.group(1), labels.get("grpc_method", "?"), labels.get("grpc_code", ""))
            out[key] = out.get(key, 0.0) + float(m.group(3))
            continue
        for gname in GAUGES:
            if line.startswith(gname + " "):
                gauges[gname] = float(line.split()[1])
    return out, gauges


def run_idle(args, report):
    n, window = args.idle_nodes, args.idle_seconds
    g = Gangs(args.keep)
    problems, procs, result, flipped = [], [], {}, False
    t_all = time.monotonic()
    try:
        g.setUp()
        print(f"idle: a gang of {n}, gang-lease-ttl {args.lease_ttl}s, window {window:.0f}s, "
              f"etcd {g.etcd.url}, work {g.tmp} ({B.fs_type(g.tmp)})", flush=True)
        procs = g.start_gang("idle", n, args.lease_ttl)
        if not g.trainers_started(procs, timeout=max(BOUND, 5.0 * n)):
            problems.append(not_started(g, procs))
            return problems
        # Settle: every member's end-watch in place (one watcher per member),
        # then a moment for the last forming calls to be answered.
        watchers = B.wait_until(lambda: parse_metrics(g.metrics())[1].get(GAUGES[1]) == n, BOUND, interval=0.1)
        if not watchers:
            print(f"  note: etcd's watcher gauge never read {n} "
                  f"({parse_metrics(g.metrics())[1]}); measuring anyway", flush=True)
        time.sleep(1.0)  # the last formation answers in flight; not a condition wait
        before, gauges_before = parse_metrics(g.metrics())
        cpu_before = [cpu_seconds(p.proc.pid) for p in procs]
        cpu_etcd_before = cpu_seconds(g.etcd.proc.pid)
        t0 = time.monotonic()
        time.sleep(window)  # the measurement window itself
        span = time.monotonic() - t0
        after, gauges_after = parse_metrics(g.metrics())
        cpu_after = [cpu_seconds(p.proc.pid) for p in procs]
        cpu_etcd_after = cpu_seconds(g.etcd.proc.pid)
        for k, p in enumerate(procs):
            if p.proc.poll() is not None:
                problems.append(f"vm-{k}: spotvisor exited ({p.proc.returncode}) while the gang was idle")
            if os.path.exists(os.path.join(g.out, f"sigint-vm-{k}")):
                problems.append(f"vm-{k}: trainer got SIGINT while the gang was idle")
            for e in ("gang.etcd_unavailable", "gang.lease_lost", "gang.ended"):
                if p.find(e):
                    problems.append(f"vm-{k}: {e} while the gang was idle")
        # Diff by (family, method), codes summed; handled also by code.
        per = {}
        for key in set(before) | set(after):
            fam, method, code = key
            d = after.get(key, 0.0) - before.get(key, 0.0)
            if d == 0:
                continue
            row = per.setdefault(method, {"started": 0, "handled": 0, "msg_received": 0, "msg_sent": 0, "codes": {}})
            short = fam[len("grpc_server_"):-len("_total")]
            row[short] += d
            if short == "handled":
                row["codes"][code] = row["codes"].get(code, 0) + d
        minutes = span / 60.0
        print()
        print(f"(3) etcd load of an idle gang of {n} over {span:.1f}s, as etcd counts it "
              f"(grpc_server_*_total deltas; per min per node = delta / {minutes:.3f} min / {n})")
        print(f"  {'grpc_method':16} {'started':>8} {'handled':>8} {'msg_recv':>8} {'msg_sent':>8}  "
              f"{'started/min/node':>16} {'recv/min/node':>14}  codes (handled)")
        for method in sorted(per):
            r = per[method]
            codes = ", ".join(f"{c}:{v:.0f}" for c, v in sorted(r["codes"].items()))
            print(f"  {method:16} {r['started']:8.0f} {r['handled']:8.0f} {r['msg_received']:8.0f} "
                  f"{r['msg_sent']:8.0f}  {r['started'] / minutes / n:16.2f} "
                  f"{r['msg_received'] / minutes / n:14.2f}  {codes}")
        if not per:
            print("  (no gRPC calls at all in the window)")
        total = sum(r["started"] for r in per.values())
        expect_ka = 60.0 / max(0.5, args.lease_ttl / 3.0)
        ka = per.get("LeaseKeepAlive", {}).get("started", 0) / minutes / n
        rng = per.get("Range", {}).get("started", 0) / minutes / n
        wat = per.get("Watch", {}).get("started", 0) / minutes / n
        print(f"  all calls: {total:.0f} in the window = {total / minutes / n:.2f} per minute per node")
        print(f"  watch streams open (gauge) before/after: "
              f"{gauges_before.get(GAUGES[0], float('nan')):.0f}/{gauges_after.get(GAUGES[0], float('nan')):.0f}, "
              f"watchers {gauges_before.get(GAUGES[1], float('nan')):.0f}/{gauges_after.get(GAUGES[1], float('nan')):.0f}")
        print(f"  reading: LeaseKeepAlive {ka:.2f}/min/node (one per gang-lease-ttl/3 = {args.lease_ttl / 3:.2f}s "
              f"would be {expect_ka:.1f}); Watch {wat:.2f}/min/node and Range {rng:.2f}/min/node "
              f"(a member renews its watch once per watch window, 60 s in gang.h, from the revision it "
              f"had, without reading again: about {span / 60:.2f} Watch and 0 Range per node in this "
              f"window; Range calls would be polling)")
        cpu = [(a - b) for a, b in zip(cpu_after, cpu_before) if a is not None and b is not None]
        if cpu:
            print(f"  CPU while idle: spotvisor {1e3 * statistics.fmean(cpu) / span:.2f} ms/s per node "
                  f"(mean of {len(cpu)}), etcd {1e3 * (cpu_etcd_after - cpu_etcd_before) / span:.2f} ms/s "
                  f"(/proc utime+stime, {1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms ticks)")
        result = {"nodes": n, "window_s": span, "lease_ttl_s": args.lease_ttl,
                  "per_method": per, "per_min_per_node": {m: {k: per[m][k] / minutes / n for k in
                                                              ("started", "handled", "msg_received")}
                                                          for m in per},
                  "gauges_before": gauges_before, "gauges_after": gauges_after,
                  "cpu_ms_per_s_per_node": [1e3 * c / span for c in cpu],
                  "etcd_cpu_ms_per_s": 1e3 * (cpu_etcd_after - cpu_etcd_before) / span}
        # End: preempt vm-0; everyone must stop.
        srv = g.members["vm-0"]["metadata"]
        if srv.wait_for_waiters("instance/preempted", 1, BOUND):
            srv.set("instance/preempted", "TRUE")
            flipped = True
            sig = g.sigint_times(n)
            for k in range(n):
                if f"vm-{k}" not in sig:
                    problems.append(f"vm-{k}: trainer never got SIGINT after vm-0's preemption (end of idle)")
        else:
            problems.append("vm-0: no long-poll parked on instance/preempted at the end of the idle window")
        return problems
    finally:
        problems += g.end_gang(procs, 0, flipped)
        elapsed = time.monotonic() - t_all
        result["seconds"] = elapsed
        result["problems"] = problems
        report["idle"] = result
        for p in problems:
            print(f"  PROBLEM: {p}", flush=True)
        print(f"  wall time of the idle part: {elapsed:.1f}s; problems: {len(problems)}")
        if problems:
            g._cleanups = [c for c in g._cleanups if c[0] is not shutil.rmtree]
            print(f"  logs kept in {g.tmp}")
        g.close()


# ------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", nargs="?", choices=("stop", "idle", "all"), default="all",
                    help="stop: numbers (1) and (2); idle: number (3); all (default): both")
    ap.add_argument("--flips", type=int, default=50, help="measured gangs/flips (default 50)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured gangs first (default 1)")
    ap.add_argument("--nodes", type=int, default=4, help="members per gang for stop/start (default 4)")
    ap.add_argument("--idle-nodes", type=int, default=8, help="members of the idle gang (default 8)")
    ap.add_argument("--idle-seconds", type=float, default=60.0, help="idle window (default 60)")
    ap.add_argument("--lease-ttl", type=int, default=10, help="gang-lease-ttl in seconds (default 10, "
                    "spotvisor's default)")
    ap.add_argument("--short", action="store_true",
                    help="CI form: 3 flips with 3 nodes, no warm-up, an idle gang of 3 for 10 s")
    ap.add_argument("--json", help="also write every sample to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, etcd data)")
    ap.add_argument("--spotvisor", default=RELEASE if os.access(RELEASE, os.X_OK) else ASAN,
                    help="spotvisor binary (default: build-release if built, else build-asan)")
    args = ap.parse_args()
    if args.short:
        args.flips, args.nodes, args.warmup, args.idle_nodes, args.idle_seconds = 3, 3, 0, 3, 10.0
    if not os.access(args.spotvisor, os.X_OK):
        sys.exit(f"gang_bench: {args.spotvisor} is missing; build it first")
    if not (shutil.which("etcd") or os.access("/usr/bin/etcd", os.X_OK)):
        print("gang_bench: etcd is not installed (Debian: apt-get install etcd-server); skipped")
        return 77
    if not 2 <= args.lease_ttl <= 300:
        sys.exit("gang_bench: --lease-ttl is 2 to 300 seconds (as gang-lease-ttl)")
    if not (2 <= args.nodes <= 200 and 2 <= args.idle_nodes <= 200):
        sys.exit("gang_bench: 2 to 200 nodes (gang-size is at least 2; 127.0.0.2 upwards)")
    harness.SPOTVISOR = os.path.abspath(args.spotvisor)
    # SIGTERM (a CI timeout) unwinds like Ctrl-C: the finally blocks stop
    # every spotvisor, trainer and etcd this run started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    asan = is_asan(args.spotvisor)
    kind = (f"ASan+UBSan build (CMAKE_BUILD_TYPE={B.build_type(args.spotvisor)}): numbers are SLOWER "
            f"than a release build's" if asan else f"CMAKE_BUILD_TYPE={B.build_type(args.spotvisor)}, no ASan")
    print(f"machine: {B.machine()}")
    built = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(os.stat(args.spotvisor).st_mtime))
    print(f"spotvisor: {args.spotvisor} ({kind}); built {built}; source tree HEAD {git_head()}")
    print(f"etcd: {shutil.which('etcd') or '/usr/bin/etcd'}; trainer: python3 {sys.version.split()[0]}")
    print("percentiles are nearest-rank: p99 of fewer than 100 samples is the max", flush=True)
    report = {"machine": B.machine(), "spotvisor": args.spotvisor, "asan": asan, "built": built,
              "head": git_head(),
              "build_type": B.build_type(args.spotvisor), "short": args.short}
    problems = []
    t = time.monotonic()
    if args.what in ("stop", "all"):
        problems += run_stop(args, report)
        print()
    if args.what in ("idle", "all"):
        problems += run_idle(args, report)
    report["seconds"] = time.monotonic() - t
    print(f"\ntotal wall time: {report['seconds']:.1f}s; problems: {len(problems)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

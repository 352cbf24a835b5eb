#!/usr/bin/env python3
"""Idle cost of supervising: RSS and CPU while nothing happens.

Starts `spotvisor run` and the blog's bash script (bench/baseline_bash.sh)
side by side, each with a fake trainer that just waits, against one fake
metadata server. Once their long-polls are parked at the fake (spotvisor's
on instance/preempted and instance/maintenance-event, curl's on
instance/preempted), samples every --interval seconds for --seconds:
VmRSS from /proc/PID/status, utime+stime from /proc/PID/stat, and CPU ns
and context switches from each thread's schedstat and status, of the
supervisor's processes only, never the trainer's (for the baseline: bash
plus its curl). At the end also VmHWM and Pss (/proc/PID/smaps_rollup,
which splits shared library pages between the processes that map them).

usage: idle.py [--seconds 60] [--interval 1]
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import benchlib as B

TICK = os.sysconf("SC_CLK_TCK")


def status_kb(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def sched(pid):
    """(CPU ns, context switches) summed over the process's threads, from
    /proc/PID/task/TID/schedstat (run time in ns: finer than clock ticks) and
    .../status (voluntary + involuntary switches: each is a wakeup)."""
    ns = switches = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        switches += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return ns, switches


class Subject:
    """One supervisor under measurement and the pids that make it up."""

    def __init__(self, name, proc, marker):
        self.name, self.proc, self.marker = name, proc, marker
        self.pids = []
        self.trainer_pid = None
        self.rss_max_kb = 0
        self.cpu_start = self.cpu_end = 0
        self.samples = 0

    def sample(self):
        rss = sum(status_kb(p, "VmRSS") for p in self.pids)
        self.rss_max_kb = max(self.rss_max_kb, rss)
        self.samples += 1

    def cpu(self):
        return sum(cpu_ticks(p) for p in self.pids)

    def sched(self):
        pairs = [sched(p) for p in self.pids]
        return sum(a for a, _ in pairs), sum(b for _, b in pairs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="length of the measured window (default 60)")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="seconds between RSS samples (default 1)")
    B.add_binary_flags(ap)
    args = ap.parse_args()
    B.check_binaries(args)

    work = tempfile.mkdtemp(prefix="spotvisor-bench-idle-")
    srv = B.FakeMetadataServer().start()
    env = dict(os.environ, GCE_METADATA_HOST=f"127.0.0.1:{srv.port}")
    subjects = []

    def start(name, argv, marker):
        log = open(os.path.join(work, f"{name}.log"), "wb")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        log.close()
        s = Subject(name, proc, marker)
        subjects.append(s)
        return s

    def trainer(marker):
        return [args.fake_trainer, "--marker-file", marker]

    print(f"machine: {B.machine()}")
    print(f"spotvisor: {args.spotvisor} (CMAKE_BUILD_TYPE="
          f"{B.build_type(args.spotvisor)})")
    sys.stdout.flush()
    try:
        m1 = os.path.join(work, "marker-spotvisor")
        sv = start("spotvisor",
                   [args.spotvisor, "run",
                    "--set", f"state-dir={work}/state",
                    "--set", f"checkpoint-dir={work}/ckpt",
                    "--set", "log-format=json", "--"] + trainer(m1), m1)
        m2 = os.path.join(work, "marker-bash")
        sh = start("bash", ["bash", B.BASELINE, f"127.0.0.1:{srv.port}"]
                   + trainer(m2), m2)
        for s in subjects:
            started = B.wait_until(lambda: B.read_marker(s.marker)["start"])
            if not started:
                sys.exit(f"idle: {s.name}'s trainer never started; "
                         f"see {work}/{s.name}.log")
            s.trainer_pid = started["pid"]
        parked = (srv.wait_for_waiters("instance/preempted", 2, B.BOUND)
                  and srv.wait_for_waiters("instance/maintenance-event", 1,
                                           B.BOUND))
        if not parked:
            sys.exit("idle: long-polls never parked at the fake")
        sv.pids = [sv.proc.pid]
        curls = [p for p in B.children_of(sh.proc.pid)
                 if p != sh.trainer_pid]
        sh.pids = [sh.proc.pid] + curls
        names = ", ".join(f"{B.comm(p)}[{p}]" for p in sh.pids)
        print(f"measuring spotvisor[{sv.proc.pid}] and {names}; trainers "
              f"excluded; {args.seconds:.0f} s, RSS every "
              f"{args.interval:g} s", flush=True)

        srv.reset_log()
        for s in subjects:
            s.cpu_start = s.cpu()
            s.sched_start = s.sched()
            s.sample()
        t_start = time.monotonic()
        deadline = t_start + args.seconds
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            time.sleep(min(args.interval, deadline - now))
            for s in subjects:
                if s.proc.poll() is not None:
                    sys.exit(f"idle: {s.name} exited early "
                             f"(code {s.proc.returncode}); see "
                             f"{work}/{s.name}.log")
                s.sample()
        elapsed = time.monotonic() - t_start
        for s in subjects:
            s.cpu_end = s.cpu()
            s.sched_end = s.sched()
        requests = {}
        for e in srv.log():
            who = ("bash" if e["headers"].get("User-Agent", "")
                   .startswith("curl/") else "spotvisor")
            requests[who] = requests.get(who, 0) + 1

        print()
        print(f"Idle over {elapsed:.1f} s, long-polls parked "
              f"({sv.samples} RSS samples each; MiB = 2^20 bytes)")
        print(f"{'':26} {'max RSS':>8} {'VmHWM':>8} {'RssAnon':>8} "
              f"{'RssFile':>8} {'Pss':>8} {'CPU s':>7} {'avg CPU %':>9} "
              f"{'requests':>8}")
        rows = {}
        for s in subjects:
            hwm = sum(status_kb(p, "VmHWM") for p in s.pids)
            pss = sum(pss_kb(p) for p in s.pids)
            cpu_s = (s.cpu_end - s.cpu_start) / TICK
            label = ("spotvisor" if s is sv else
                     "bash baseline (" + "+".join(B.comm(p) for p in s.pids)
                     + ")")
            rows[s.name] = (s.rss_max_kb, cpu_s)
            anon = sum(status_kb(p, "RssAnon") for p in s.pids)
            fil = sum(status_kb(p, "RssFile") + status_kb(p, "RssShmem")
                      for p in s.pids)
            print(f"{label:26} {s.rss_max_kb / 1024:8.2f} {hwm / 1024:8.2f} "
                  f"{anon / 1024:8.2f} {fil / 1024:8.2f} "
                  f"{pss / 1024:8.2f} {cpu_s:7.2f} "
                  f"{100 * cpu_s / elapsed:9.3f} "
                  f"{requests.get(s.name, 0):>8}")
        if len(sh.pids) > 1:
            for p in sh.pids:
                fil = status_kb(p, "RssFile") + status_kb(p, "RssShmem")
                print(f"  {B.comm(p) + f'[{p}]':24} "
                      f"{status_kb(p, 'VmRSS') / 1024:8.2f} "
                      f"{status_kb(p, 'VmHWM') / 1024:8.2f} "
                      f"{status_kb(p, 'RssAnon') / 1024:8.2f} "
                      f"{fil / 1024:8.2f} {pss_kb(p) / 1024:8.2f}")
        print(f"ratio spotvisor/bash: max RSS "
              f"{B.fmt_ratio(rows['spotvisor'][0], rows['bash'][0])}")
        print("RssAnon = heap/stacks; RssFile = mapped files, mostly shared "
              "libraries; Pss splits shared pages among their users")
        print(f"CPU is counted in clock ticks of 1/{TICK} s: "
              f"0.00 means under one tick in the window")
        for s in subjects:
            ns = s.sched_end[0] - s.sched_start[0]
            wakes = s.sched_end[1] - s.sched_start[1]
            print(f"{s.name:10} schedstat: {ns / 1e6:8.2f} ms CPU, {wakes} context switches "
                  f"({60 * wakes / elapsed:.0f} a minute; each is a wakeup)")
        print(f"spotvisor threads: {status_kb(sv.proc.pid, 'Threads')}; "
              f"requests = metadata requests seen by the fake in the window")
    finally:
        if subjects:
            teardown(subjects)
        srv.stop()
    shutil.rmtree(work, True)
    return 0


def teardown(subjects):
    for s in subjects:
        if s.name == "spotvisor":
            B.kill_quietly(s.proc.pid, signal.SIGTERM)  # stops its trainer
        else:
            B.kill_quietly(s.proc.pid, signal.SIGKILL, group=True)
    for s in subjects:
        try:
            s.proc.wait(timeout=B.BOUND)
        except subprocess.TimeoutExpired:
            B.kill_quietly(s.proc.pid, group=True)
            s.proc.wait()
        if s.trainer_pid and B.alive(s.trainer_pid):
            B.kill_quietly(s.trainer_pid)


if __name__ == "__main__":
    sys.exit(main())

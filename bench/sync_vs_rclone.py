#!/usr/bin/python3
"""Checkpoint sync: spotvisor against rclone, on the same fake Cloud Storage.

One fake GCS JSON API server (tests/fakes/fake_gcs.py) runs in this process;
both tools talk to it over 127.0.0.1 and read or write the same local files.
Four measurements, each run --repeat times with the two tools alternating
which goes first, medians reported:

  (1) first upload of a 1 GiB set: one 512 MiB file + 512 x 1 MiB files
      spotvisor: `spotvisor run ... -- true` on a new run-id; its final sync
      rclone:    `rclone sync DIR fakegcs:BUCKET/rclone/NAME`
  (2) no-op sync of 10,000 unchanged 4 KiB files, already uploaded
      spotvisor: SIGUSR1 (= `spotvisor sync`) to the daemon that uploaded them
      rclone:    a second `rclone sync` of the unchanged dir
  (3) sync of a 1 GiB set (2 x 256 MiB + 512 x 1 MiB) where one 256 MiB file
      was rewritten; same as (2) otherwise
  (4) restore of set (1) into an empty dir
      spotvisor: `spotvisor run ... -- true` with an empty checkpoint-dir
      rclone:    `rclone copy fakegcs:BUCKET/rclone/NAME DIR`

rclone runs with its defaults (--transfers 4, --checkers 8, no --fast-list)
and its default comparison, size + modtime, which is what spotvisor compares
too (--checksum would make rclone read and MD5 every local file each time).

Needs Debian's /usr/bin/python3 with python3-crcmod (the fake hashes every
byte with it) and rclone on PATH.

(2b) repeats (2) through the `spotvisor sync` CLI; (2a), the first upload of
the small files that (2) needs, is reported once.

usage: /usr/bin/python3 bench/sync_vs_rclone.py [--scale 1] [--repeat 3]
       [--only upload changed noop] [--tmp /tmp] [--json out.json] [--keep]
       [--spotvisor P] [--fake-trainer P] [--rclone P]
"""
import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib as B

try:
    from fake_gcs import FakeGcsServer
except ImportError as e:
    sys.exit(f"bench: {e}")

MiB = 1 << 20
BUCKET = "bench-ckpt"
PREFIX = "bench"                      # spotvisor: bucket=gs://BUCKET/PREFIX
TOOLS = ("spotvisor", "rclone")
BASELINE_OF = {"noop-cli": "noop"}   # rows with no rclone run of their own


def titles(sizes):
    """Row titles, with the sizes actually used (--scale changes them)."""
    def size(b):
        return f"{b / 2**30:g} GiB" if b >= 2**30 else f"{b / MiB:g} MiB"
    one = size(sizes["big"] + sizes["small_count"] * MiB)
    n = f"{sizes['noop_count']:,}"
    return {
        "upload": f"(1) first upload, {one} set",
        "noop-setup": f"(2a) first upload of the {n} files, once",
        "noop": f"(2) no-op sync, {n} unchanged files",
        "noop-cli": "(2b) the same, asked with `spotvisor sync`",
        "changed": f"(3) sync, one {size(sizes['changed'])} file changed",
        "restore": f"(4) restore {one} set into an empty dir",
    }


# ---------------------------------------------------------------- data
def write_random(path, size, block=16 * MiB):
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(block, left)
            f.write(os.urandom(n))
            left -= n


def make_set(d, big_sizes, small_count, small_size, link_small_from=None):
    """big-N.bin files of the given sizes + small/shard-NNNN files."""
    os.makedirs(os.path.join(d, "small"), exist_ok=True)
    for i, size in enumerate(big_sizes):
        write_random(os.path.join(d, f"big-{i}.bin"), size)
    for i in range(small_count):
        dst = os.path.join(d, "small", f"shard-{i:05d}")
        if link_small_from:
            os.link(os.path.join(link_small_from, "small", f"shard-{i:05d}"),
                    dst)
        else:
            write_random(dst, small_size)


def tree(d):
    """{relative path: size} of the regular files under d."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = os.path.getsize(p)
    return out


def same_tree(a, b):
    ta, tb = tree(a), tree(b)
    if ta != tb:
        return f"{len(ta)} vs {len(tb)} files, or sizes differ"
    for rel in ta:
        with open(os.path.join(a, rel), "rb") as x, \
                open(os.path.join(b, rel), "rb") as y:
            while True:
                p, q = x.read(MiB), y.read(MiB)
                if p != q:
                    return f"{rel} differs"
                if not p:
                    break
    return None


def warm(d):
    """Read every file once so both tools start with the set in page cache."""
    for rel in tree(d):
        with open(os.path.join(d, rel), "rb") as f:
            while f.read(16 * MiB):
                pass


# ---------------------------------------------------------------- observing
class Sample:
    """One measurement of one tool."""

    def __init__(self, tool, scenario, rep):
        self.tool, self.scenario, self.rep = tool, scenario, rep
        self.wall_s = None        # what the comparison uses
        self.own_s = None         # spotvisor's duration_s from its log
        self.payload = 0          # bytes the scenario is about
        self.hits = {}            # requests the fake saw, by kind
        self.up = self.down = 0   # request body bytes in, object bytes out
        self.fake_cpu = self.client_cpu = None
        self.problem = None
        self.partial = False      # the fake's log (10,000 entries) overflowed
        self.log = None

    def requests(self):
        return sum(self.hits.values())

    def as_dict(self):
        return {k: getattr(self, k) for k in (
            "tool", "scenario", "rep", "wall_s", "own_s", "payload", "hits",
            "up", "down", "fake_cpu", "client_cpu", "problem", "partial",
            "log")}


class FakeWatch:
    """What the fake saw and spent during one measurement.

    The fake runs in this process, so this process's CPU time during a
    measurement is the fake's (the driver only waits)."""

    def __init__(self, srv):
        self.srv = srv

    def __enter__(self):
        self.srv.reset_log()
        self.cpu0 = time.process_time()
        return self

    def finish(self, sample):
        self.srv.wait_idle(timeout=B.BOUND)
        sample.fake_cpu = time.process_time() - self.cpu0
        sample.hits = self.srv.hits_by_kind()
        log = self.srv.log()
        # Only the newest 10,000 requests are logged (counts stay exact):
        # then the byte counts cover only those.
        sample.partial = len(log) < sample.requests()
        sizes = {}
        for e in log:
            sample.up += e.get("body_size") or 0
            if e["kind"] == "download" and e.get("status") in (200, 206):
                sample.down += self.download_bytes(e, sizes)

    def download_bytes(self, e, sizes):
        key = (e["bucket"], e["object"])
        if key not in sizes:
            try:
                sizes[key] = int(self.srv.object_resource(*key)["size"])
            except Exception:  # deleted meanwhile: count nothing
                sizes[key] = 0
        size = sizes[key]
        rng = (e["headers"].get("range") or "").strip()
        if e["status"] != 206 or not rng.startswith("bytes="):
            return size
        first, _, last = rng[6:].partition("-")
        if not first:
            return min(int(last), size)
        last = int(last) if last else size - 1
        return min(last, size - 1) - int(first) + 1

    def __exit__(self, *exc):
        return False


def proc_cpu(pid):
    """utime + stime of a live process, seconds (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class EventLog:
    """spotvisor's JSON log lines, read as they are appended."""

    def __init__(self, path):
        self.path, self.offset, self.events, self.partial = path, 0, [], ""

    def poll(self):
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return self.events
        lines = (self.partial + data).split("\n")
        self.partial = lines.pop()
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and "event" in e:
                self.events.append(e)
        return self.events

    def find(self, name, **match):
        return [e for e in self.poll() if e["event"] == name and all(
            e.get(k) == v for k, v in match.items())]


def log_time_s(text):
    import datetime
    day, _, frac = text.rstrip("Z").partition(".")
    whole = datetime.datetime.strptime(day, "%Y-%m-%dT%H:%M:%S").replace(
        tzinfo=datetime.timezone.utc)
    return whole.timestamp() + int(frac.ljust(9, "0")[:9]) / 1e9


# ---------------------------------------------------------------- tools
class Bench:
    def __init__(self, args, work, gcs, md):
        self.args, self.work, self.gcs, self.md = args, work, gcs, md
        self.env = dict(os.environ,
                        STORAGE_EMULATOR_HOST=f"127.0.0.1:{gcs.port}",
                        GCE_METADATA_HOST=f"127.0.0.1:{md.port}")
        home = os.path.join(work, "rclone-home")
        os.makedirs(home)
        conf = os.path.join(home, "rclone.conf")
        open(conf, "w").close()
        self.renv = dict(os.environ, HOME=home, RCLONE_CONFIG=conf,
                         RCLONE_CONFIG_FAKEGCS_TYPE="google cloud storage",
                         RCLONE_CONFIG_FAKEGCS_ENDPOINT=
                         f"http://127.0.0.1:{gcs.port}/storage/v1/",
                         RCLONE_CONFIG_FAKEGCS_ANONYMOUS="true",
                         RCLONE_CONFIG_FAKEGCS_BUCKET_POLICY_ONLY="true")
        self.count = 0
        # Called after sync(2), right before each tool's timed process
        # starts (untimed): big_checkpoint.py warms memory with it.
        self.before_run = None

    def logfile(self, name):
        self.count += 1
        return os.path.join(self.work, "logs", f"{self.count:03d}-{name}.log")

    def spotvisor_argv(self, run_id, ckpt, state, command):
        return [self.args.spotvisor, "run",
                "--set", f"bucket=gs://{BUCKET}/{PREFIX}",
                "--set", f"run-id={run_id}",
                "--set", f"checkpoint-dir={ckpt}",
                "--set", f"state-dir={state}",
                "--set", "sync-interval=0", "--set", "sync-settle=0s",
                "--set", "log-format=json", "--"] + command

    # One `spotvisor run -- true`: (1) its final sync, (4) its restore.
    def spotvisor_once(self, sample, run_id, ckpt, event, **match):
        sample.log = self.logfile(f"spotvisor-{sample.scenario}-{run_id}")
        state = tempfile.mkdtemp(prefix="state-", dir=self.work)
        os.sync()
        if self.before_run:
            self.before_run()
        with FakeWatch(self.gcs) as fw, open(sample.log, "wb") as out:
            cpu0 = children_cpu()
            t0 = time.monotonic()
            code = subprocess.call(
                self.spotvisor_argv(run_id, ckpt, state, ["true"]),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.env, timeout=600)
            sample.wall_s = time.monotonic() - t0
            sample.client_cpu = children_cpu() - cpu0
            fw.finish(sample)
        B.drop_stale_long_polls(self.md)
        shutil.rmtree(state, True)
        if code != 0:
            sample.problem = f"spotvisor run exited {code}"
        found = EventLog(sample.log).find(event, **match)
        if not found:
            sample.problem = sample.problem or f"no {event} in its log"
            return None
        sample.own_s = found[-1].get("duration_s")
        return found[-1]

    def rclone(self, sample, argv):
        sample.log = self.logfile(f"rclone-{sample.scenario}")
        os.sync()
        if self.before_run:
            self.before_run()
        with FakeWatch(self.gcs) as fw, open(sample.log, "wb") as out:
            cpu0 = children_cpu()
            t0 = time.monotonic()
            code = subprocess.call([self.args.rclone] + argv + ["-v"],
                                   stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=self.renv,
                                   timeout=600)
            sample.wall_s = time.monotonic() - t0
            sample.client_cpu = children_cpu() - cpu0
            fw.finish(sample)
        if code != 0:
            sample.problem = f"rclone exited {code}"

    def remote(self, name):
        return f"fakegcs:{BUCKET}/rclone/{name}"

    def delete_prefix(self, prefix):
        for o in self.gcs.objects(BUCKET, prefix):
            self.gcs.delete_object(BUCKET, o["name"])


class Daemon:
    """A running `spotvisor run -- sleep` whose syncs are asked for with
    SIGUSR1 (what `spotvisor sync` sends). Its wall time is from the signal
    to the `time` of its sync.complete event (both CLOCK_REALTIME)."""

    def __init__(self, bench, run_id, ckpt):
        self.bench = bench
        self.state = tempfile.mkdtemp(prefix="state-", dir=bench.work)
        self.log = bench.logfile(f"spotvisor-daemon-{run_id}")
        self.events = EventLog(self.log)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                bench.spotvisor_argv(run_id, ckpt, self.state,
                                     ["sleep", "100000"]),
                stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env=bench.env,
                start_new_session=True)
        if not B.wait_until(lambda: self.events.find("trainer.start")
                            or self.proc.poll() is not None):
            raise RuntimeError(f"spotvisor did not start its trainer "
                               f"(log {self.log})")
        if self.proc.poll() is not None:
            raise RuntimeError(f"spotvisor exited {self.proc.returncode} "
                               f"(log {self.log})")

    def sync(self, sample, cli=False):
        """cli: run `spotvisor sync` and time that process instead."""
        sample.log = self.log
        def ended():
            return len(self.events.find("sync.complete", kind="on-demand")) \
                + len(self.events.find("sync.failed"))
        n = ended()
        os.sync()
        with FakeWatch(self.bench.gcs) as fw:
            cpu0 = proc_cpu(self.proc.pid)
            t0 = time.time()
            if cli:
                out = subprocess.run(
                    [self.bench.args.spotvisor, "sync", "--state-dir",
                     self.state], capture_output=True, text=True, timeout=600)
                cli_wall = time.time() - t0
                if out.returncode != 0:
                    sample.problem = (f"spotvisor sync exited "
                                      f"{out.returncode}: {out.stderr}")
            else:
                os.kill(self.proc.pid, signal.SIGUSR1)
            done = B.wait_until(lambda: ended() > n, timeout=600,
                                interval=0.002)
            sample.client_cpu = proc_cpu(self.proc.pid) - cpu0
            fw.finish(sample)
        if not done:
            sample.problem = "no sync.complete within 600 s"
            return None
        failed = self.events.find("sync.failed")
        if failed:
            sample.problem = f"sync.failed: {failed[-1].get('error')}"
            return None
        e = self.events.find("sync.complete", kind="on-demand")[-1]
        sample.wall_s = cli_wall if cli else log_time_s(e["time"]) - t0
        sample.own_s = e.get("duration_s")
        return e

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                B.kill_quietly(self.proc.pid, group=True)
                self.proc.wait()
        B.drop_stale_long_polls(self.bench.md)
        shutil.rmtree(self.state, True)


# ---------------------------------------------------------------- scenarios
def order(rep):
    return TOOLS if rep % 2 == 0 else TOOLS[::-1]


def report_sample(s):
    own = f", own {s.own_s:.3f} s" if s.own_s is not None else ""
    wall = f"{s.wall_s:.3f} s" if s.wall_s is not None else "-"
    print(f"  {s.scenario:10} rep {s.rep} {s.tool:9} {wall}{own}, "
          f"{s.requests()} requests, up {s.up / MiB:.1f} MiB, "
          f"down {s.down / MiB:.1f} MiB, fake CPU {s.fake_cpu:.2f} s, "
          f"client CPU {s.client_cpu:.2f} s"
          + (" (bytes: the fake logged only the last 10,000 requests)"
             if s.partial else "")
          + (f"  PROBLEM: {s.problem} (log {s.log})" if s.problem else ""),
          flush=True)


def upload_and_restore(b, sizes, samples):
    """(1) first upload of set 1, then (4) restore of it."""
    a = b.args
    src = os.path.join(b.work, "set1")
    make_set(src, [sizes["big"]], sizes["small_count"], MiB)
    payload = sum(tree(src).values())
    warm(src)
    last = a.repeat - 1
    for rep in range(a.repeat):
        for tool in order(rep):
            s = Sample(tool, "upload", rep)
            s.payload = payload
            if tool == "spotvisor":
                e = b.spotvisor_once(s, f"up-{rep}", src, "sync.complete",
                                     kind="final")
                if e and e.get("bytes") != payload:
                    s.problem = f"final sync moved {e.get('bytes')} bytes"
            else:
                b.rclone(s, ["sync", src, b.remote(f"up-{rep}")])
            samples.append(s)
            report_sample(s)
        if rep != last:   # keep the fake's memory to one copy per tool
            b.delete_prefix(f"{PREFIX}/up-{rep}/")
            b.delete_prefix(f"rclone/up-{rep}/")

    run_id = f"up-{last}"
    for rep in range(a.repeat):
        for tool in order(rep):
            s = Sample(tool, "restore", rep)
            s.payload = payload
            dst = os.path.join(b.work, f"restore-{tool}-{rep}")
            os.makedirs(dst)
            if tool == "spotvisor":
                # The upload run ended with exit 0, so it wrote DONE, which
                # would skip the restore.
                try:
                    b.gcs.delete_object(BUCKET, f"{PREFIX}/{run_id}/DONE")
                except Exception:
                    pass
                e = b.spotvisor_once(s, run_id, dst, "restore.complete")
                if e and e.get("bytes") != payload:
                    s.problem = f"restore moved {e.get('bytes')} bytes"
            else:
                b.rclone(s, ["copy", b.remote(run_id), dst])
            if not s.problem:
                diff = same_tree(src, dst)
                if diff:
                    s.problem = f"restored tree differs: {diff}"
            samples.append(s)
            report_sample(s)
            shutil.rmtree(dst, True)
    b.delete_prefix(f"{PREFIX}/")
    b.delete_prefix("rclone/")
    shutil.rmtree(src, True)


def changed_file(b, sizes, samples):
    """(3) set 3 uploaded once; then per rep one 256 MiB file rewritten
    (same size, new bytes and mtime) and both tools sync it."""
    a = b.args
    src = os.path.join(b.work, "set3")
    make_set(src, [sizes["changed"], sizes["changed"]], sizes["small_count"],
             MiB)
    warm(src)
    d = Daemon(b, "changed", src)
    try:
        setup = Sample("spotvisor", "changed-setup", 0)
        d.sync(setup)
        setup_r = Sample("rclone", "changed-setup", 0)
        b.rclone(setup_r, ["sync", src, b.remote("changed")])
        for s in (setup, setup_r):
            report_sample(s)
            if s.problem:
                samples.append(s)
        for rep in range(a.repeat):
            write_random(os.path.join(src, "big-1.bin"), sizes["changed"])
            warm(src)
            for tool in order(rep):
                s = Sample(tool, "changed", rep)
                s.payload = sizes["changed"]
                if tool == "spotvisor":
                    e = d.sync(s)
                    if e and (e.get("files_uploaded"), e.get("bytes")) != \
                            (1, sizes["changed"]):
                        s.problem = (f"uploaded {e.get('files_uploaded')} "
                                     f"files, {e.get('bytes')} bytes")
                else:
                    b.rclone(s, ["sync", src, b.remote("changed")])
                samples.append(s)
                report_sample(s)
    finally:
        d.stop()
    b.delete_prefix(f"{PREFIX}/")
    b.delete_prefix("rclone/")
    shutil.rmtree(src, True)


def noop(b, sizes, samples):
    """(2a) the small files uploaded once by each, then (2) no-op syncs."""
    a = b.args
    src = os.path.join(b.work, "noop")
    make_set(src, [], sizes["noop_count"], sizes["noop_size"])
    payload = sum(tree(src).values())
    warm(src)
    d = Daemon(b, "noop", src)
    try:
        for tool in TOOLS:
            s = Sample(tool, "noop-setup", 0)
            s.payload = payload
            if tool == "spotvisor":
                d.sync(s)
            else:
                b.rclone(s, ["sync", src, b.remote("noop")])
            samples.append(s)
            report_sample(s)
        for rep in range(a.repeat):
            for tool in order(rep):
                s = Sample(tool, "noop", rep)
                if tool == "spotvisor":
                    e = d.sync(s)
                    if e and e.get("files_uploaded") != 0:
                        s.problem = f"uploaded {e.get('files_uploaded')}"
                else:
                    b.rclone(s, ["sync", src, b.remote("noop")])
                    if s.hits.get("multipart") or s.hits.get("resumable"):
                        s.problem = "rclone uploaded something"
                samples.append(s)
                report_sample(s)
        for rep in range(a.repeat):
            s = Sample("spotvisor", "noop-cli", rep)
            d.sync(s, cli=True)
            samples.append(s)
            report_sample(s)
    finally:
        d.stop()
    b.delete_prefix(f"{PREFIX}/")
    b.delete_prefix("rclone/")
    shutil.rmtree(src, True)


# ---------------------------------------------------------------- report
def med(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def summarize(samples, sizes):
    rows = []
    for key, title in titles(sizes).items():
        per = {t: [s for s in samples if s.scenario == key and s.tool == t
                   and not s.problem] for t in TOOLS}
        if key in BASELINE_OF:
            per["rclone"] = []
        if not any(per.values()):
            continue
        row = {"scenario": key, "title": title}
        for t in TOOLS:
            ss = per[t]
            if not ss:
                row[t] = None
                continue
            wall = med(s.wall_s for s in ss)
            payload = ss[0].payload
            row[t] = {
                "n": len(ss), "wall_s": wall,
                "wall_min": min(s.wall_s for s in ss),
                "wall_max": max(s.wall_s for s in ss),
                "own_s": med(s.own_s for s in ss),
                "mib_s": payload / MiB / wall if payload and wall else None,
                "payload": payload,
                "requests": med(s.requests() for s in ss),
                "hits": ss[-1].hits,
                "partial": any(s.partial for s in ss),
                "up_mib": med(s.up for s in ss) / MiB,
                "down_mib": med(s.down for s in ss) / MiB,
                "fake_cpu": med(s.fake_cpu for s in ss),
                "client_cpu": med(s.client_cpu for s in ss),
            }
        sv, rc = row["spotvisor"], row["rclone"]
        if key in BASELINE_OF:
            rc = next((r["rclone"] for r in rows
                       if r["scenario"] == BASELINE_OF[key]), None)
        row["ratio"] = (sv["wall_s"] / rc["wall_s"]
                        if sv and rc and rc["wall_s"] else None)
        rows.append(row)
    return rows


def print_table(rows):
    print()
    print("Medians (MiB = 2^20 bytes; MiB/s = the scenario's payload / wall;"
          " up = request bodies, down = object bytes served)")
    head = (f"{'':44} {'tool':9} {'n':>2} {'wall s':>8} {'(min-max)':>15} "
            f"{'own s':>7} {'MiB/s':>7} {'reqs':>6} {'up MiB':>8} "
            f"{'down MiB':>8} {'fake CPU':>8} {'tool CPU':>8}")
    print(head)
    for row in rows:
        for i, t in enumerate(TOOLS):
            r = row[t]
            title = row["title"] if i == 0 else ""
            if r is None:
                base = BASELINE_OF.get(row["scenario"])
                print(f"{title:44} {t:9} " + (f"(ratio against {base})"
                                              if base else "no valid sample"))
                continue
            span = f"({r['wall_min']:.3f}-{r['wall_max']:.3f})"
            star = "*" if r["partial"] else " "
            print(f"{title:44} {t:9} {r['n']:>2} {r['wall_s']:8.3f} "
                  f"{span:>15} {fmt(r['own_s'], '7.3f'):>7} "
                  f"{fmt(r['mib_s'], '7.1f'):>7} {r['requests']:>6.0f} "
                  f"{r['up_mib']:7.1f}{star} {r['down_mib']:8.1f} "
                  f"{r['fake_cpu']:8.2f} {r['client_cpu']:8.2f}")
        ratio = row["ratio"]
        print(f"{'':44} {'ratio spotvisor/rclone (wall):':>30} "
              f"{fmt(ratio)}" + ("" if ratio is None else
                                 f"  (rclone/spotvisor {1 / ratio:.1f}x)"))
    if any(row[t] and row[t]["partial"] for row in rows for t in TOOLS):
        print("* the fake logs only the newest 10,000 requests: bytes of "
              "those only (request counts are exact)")
    print()
    print("Requests by kind (last sample):")
    for row in rows:
        for t in TOOLS:
            if row[t]:
                kinds = ", ".join(f"{k} {v}" for k, v in
                                  sorted(row[t]["hits"].items())) or "none"
                print(f"  {row['scenario']:10} {t:9} {kinds}")


NOTES = """\
Notes:
  - wall: spotvisor (1) and (4) = the whole `spotvisor run -- true` process
    (restore check, trainer, final sync, DONE); (2), (3) = SIGUSR1 to the
    running daemon -> the time field of its sync.complete event; (2b) = the
    `spotvisor sync` process, which polls status.json every 100 ms; rclone =
    the whole rclone process. own = duration_s that spotvisor logs
    (sync.complete or restore.complete).
  - fake CPU = this process's CPU time during the measurement (the fake
    GCS runs in it: Python + crcmod CRC32C + MD5 of every byte); tool CPU =
    spotvisor's or rclone's. On 2 vCPUs the fake and the tool compete.
  - rclone defaults: --transfers 4 --checkers 8, size+modtime comparison,
    multi-thread downloads over 250 MiB (the 512 MiB file: 2 ranges);
    spotvisor: sync-parallelism 4.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0,
                    help="shrink every size and count (e.g. 0.25)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="measured runs per tool and scenario (default 3)")
    ap.add_argument("--only", nargs="+", choices=("upload", "changed", "noop"),
                    help="run only these groups (upload includes restore)")
    ap.add_argument("--rclone", default=shutil.which("rclone") or "rclone")
    ap.add_argument("--tmp", default="/tmp",
                    help="parent of the temp dir holding the data sets")
    ap.add_argument("--json", help="also write every sample to this file")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temp dir's logs (the data is removed)")
    B.add_binary_flags(ap)
    args = ap.parse_args()
    B.check_binaries(args)
    if not shutil.which(args.rclone):
        sys.exit(f"bench: {args.rclone} not found (Debian: apt install "
                 f"rclone)")

    def scaled(n, lo=1):
        return max(lo, round(n * args.scale))
    sizes = {"big": scaled(512) * MiB, "small_count": scaled(512),
             "changed": scaled(256) * MiB, "noop_count": scaled(10000),
             "noop_size": 4096}

    work = tempfile.mkdtemp(prefix="spotvisor-bench-sync-", dir=args.tmp)
    os.makedirs(os.path.join(work, "logs"))
    need = (sizes["big"] + 2 * sizes["small_count"] * MiB) * 3
    free = shutil.disk_usage(work).free
    if free < need:
        sys.exit(f"bench: {work} has {free / 2**30:.1f} GiB free, "
                 f"needs {need / 2**30:.1f}")
    rversion = subprocess.run([args.rclone, "version"], capture_output=True,
                              text=True).stdout.split("\n")[0]
    gcs = FakeGcsServer(buckets=[BUCKET]).start()
    md = B.FakeMetadataServer().start()
    b = Bench(args, work, gcs, md)
    print(f"machine: {B.machine()}")
    print(f"spotvisor: {args.spotvisor} (CMAKE_BUILD_TYPE="
          f"{B.build_type(args.spotvisor)}), sync-parallelism default")
    print(f"rclone: {args.rclone} ({rversion}), defaults")
    print(f"data in {work} ({B.fs_type(work)}); fake GCS on "
          f"127.0.0.1:{gcs.port}, fake metadata on 127.0.0.1:{md.port}")
    print(f"sets: (1)/(4) {sizes['big'] // MiB} MiB + {sizes['small_count']}"
          f" x 1 MiB; (3) 2 x {sizes['changed'] // MiB} MiB + "
          f"{sizes['small_count']} x 1 MiB; (2) {sizes['noop_count']} x "
          f"{sizes['noop_size']} B; {args.repeat} runs each, alternating "
          f"which tool goes first", flush=True)

    samples = []
    groups = args.only or ("upload", "changed", "noop")
    try:
        if "upload" in groups:
            upload_and_restore(b, sizes, samples)
        if "changed" in groups:
            changed_file(b, sizes, samples)
        if "noop" in groups:
            noop(b, sizes, samples)
    finally:
        gcs.stop()
        md.stop()

    rows = summarize(samples, sizes)
    print_table(rows)
    problems = [s for s in samples if s.problem]
    print(f"problems: {len(problems)}" + ("" if not problems else " (above)"))
    print()
    print(NOTES, end="")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": B.machine(), "rclone": rversion,
                       "scale": args.scale, "sizes": sizes, "rows": rows,
                       "samples": [s.as_dict() for s in samples]},
                      out, indent=1)
    if args.keep or problems:
        for name in os.listdir(work):
            if name != "logs":
                shutil.rmtree(os.path.join(work, name), True)
        print(f"logs kept in {work}/logs")
    else:
        shutil.rmtree(work, True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

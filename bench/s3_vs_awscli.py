#!/usr/bin/python3
"""Checkpoint sync to S3: spotvisor against `aws s3 sync` (Debian's aws-cli 2), on the same fake S3.

One fake S3 server (tests/fakes/fake_s3.py: SigV4 verified, checksums checked) runs in this
process; both tools talk to it over 127.0.0.1 with the same keys and read or write the same local
files. Three measurements (issue #13), each run --repeat times with the two tools alternating
which goes first, medians reported:

  (1) first upload of a 1 GiB set: one 512 MiB file + 512 x 1 MiB files
      spotvisor: `spotvisor run ... -- true` on a new run-id; its final sync
      aws:       `aws s3 sync DIR s3://BUCKET/aws/NAME`
  (2) no-op sync of 10,000 unchanged 4 KiB files, already uploaded
      spotvisor: SIGUSR1 (= `spotvisor sync`) to the daemon that uploaded them
      aws:       a second `aws s3 sync` of the unchanged dir
  (3) restore of set (1) into an empty dir
      spotvisor: `spotvisor run ... -- true` with an empty checkpoint-dir
      aws:       `aws s3 sync s3://BUCKET/aws/NAME DIR`

spotvisor's "own" time is the duration_s of its sync.complete / restore.complete event (the
transfer alone); "wall" is the whole process (spotvisor: start, restore check, trainer, sync,
DONE) or, for (2), SIGUSR1 to the event. aws-cli runs with its defaults (10 concurrent requests,
8 MiB multipart threshold and parts) and its default comparison, size + modification time.
The fake is Python: at these sizes it is often the bottleneck for both tools; its CPU is shown.

usage: /usr/bin/python3 bench/s3_vs_awscli.py [--scale 1] [--repeat 3] [--only upload noop restore]
       [--tmp /tmp] [--spotvisor P] [--fake-trainer P] [--aws /usr/bin/aws] [--json out.json]
--scale 0.02 is the short form (seconds).
"""
import argparse
import json
import resource
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fakes"))
import benchlib as B  # noqa: E402

try:
    from fake_s3 import FakeS3Server  # noqa: E402
    from fake_metadata import FakeMetadataServer  # noqa: E402
except ImportError as e:
    sys.exit(f"bench: {e}")

GiB = 1 << 30
MiB = 1 << 20
BUCKET = "bench-ckpt"
AKID, SECRET = "AKIABENCHMARK000001", "bench/secret/0123456789abcdefghijklmnop"
TOOLS = ("spotvisor", "aws")


def children_cpu():
    """CPU seconds (user + system) of the waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# aws-cli's s3 settings tried on the upload set before the measured runs (--tune, on by
# default): max_concurrent_requests x multipart_chunksize (and threshold), the fastest kept.
AWS_CANDIDATES = ((10, 8), (32, 8), (32, 32), (64, 16))


def aws_config(home, concurrency, chunk_mb):
    """An AWS config file with those s3 settings; its path."""
    path = os.path.join(home, f"config-{concurrency}x{chunk_mb}")
    with open(path, "w") as f:
        f.write(f"[default]\ns3 =\n  max_concurrent_requests = {concurrency}\n"
                f"  multipart_chunksize = {chunk_mb}MB\n  multipart_threshold = {chunk_mb}MB\n")
    return path


def make_set(root, big_sizes, small_count, small_size):
    os.makedirs(root, exist_ok=True)
    for i, size in enumerate(big_sizes):
        with open(os.path.join(root, f"big-{i}.bin"), "wb") as f:
            left = size
            while left:
                n = min(left, 8 * MiB)
                f.write(os.urandom(n))
                left -= n
    for i in range(small_count):
        d = os.path.join(root, f"d{i // 1000:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
            f.write(os.urandom(small_size))


def payload(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def events(path):
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and "event" in e:
                    out.append(e)
    except FileNotFoundError:
        pass
    return out


def log_time_s(text):
    import datetime
    day, _, frac = text.rstrip("Z").partition(".")
    whole = datetime.datetime.strptime(day, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return whole.timestamp() + int(frac.ljust(9, "0")[:9]) / 1e9


class Bench:
    def __init__(self, args, work, s3, md):
        self.args, self.work, self.s3 = args, work, s3
        home = os.path.join(work, "home")
        os.makedirs(home)
        common = {"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
                  "AWS_DEFAULT_REGION": "us-east-1", "HOME": home}
        self.env = dict(os.environ, AWS_ENDPOINT_URL_S3=s3.endpoint, GCE_METADATA_HOST=f"127.0.0.1:{md.port}",
                        **common)
        self.aenv = dict(os.environ, AWS_CONFIG_FILE=os.path.join(home, "none"),
                         AWS_SHARED_CREDENTIALS_FILE=os.path.join(home, "none"), AWS_PAGER="", **common)
        self.count = 0

    def logfile(self, name):
        self.count += 1
        os.makedirs(os.path.join(self.work, "logs"), exist_ok=True)
        return os.path.join(self.work, "logs", f"{self.count:03d}-{name}.log")

    def argv(self, run_id, ckpt, state, command):
        return [self.args.spotvisor, "run", "--set", f"bucket=s3://{BUCKET}/sv", "--set", f"run-id={run_id}",
                "--set", f"checkpoint-dir={ckpt}", "--set", f"state-dir={state}", "--set", "sync-interval=0",
                "--set", "sync-settle=0s", "--set", "log-format=json", "--"] + command

    def spotvisor_once(self, run_id, ckpt, event, **match):
        log = self.logfile(f"spotvisor-{run_id}")
        state = tempfile.mkdtemp(prefix="state-", dir=self.work)
        os.sync()
        cpu0 = children_cpu()
        t0 = time.monotonic()
        with open(log, "wb") as out:
            code = subprocess.call(self.argv(run_id, ckpt, state, ["true"]), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=self.env, timeout=1800)
        wall = time.monotonic() - t0
        cpu = children_cpu() - cpu0
        shutil.rmtree(state, True)
        found = [e for e in events(log) if e["event"] == event and all(e.get(k) == v for k, v in match.items())]
        if code != 0 or not found:
            raise RuntimeError(f"spotvisor exited {code}, {event}: {bool(found)} (log {log})")
        return wall, found[-1].get("duration_s"), cpu

    def aws(self, *argv):
        log = self.logfile("aws")
        os.sync()
        cpu0 = children_cpu()
        t0 = time.monotonic()
        with open(log, "wb") as out:
            code = subprocess.call([self.args.aws, "--endpoint-url", self.s3.endpoint, "--no-progress", "s3"]
                                   + list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   env=self.aenv, timeout=1800)
        wall = time.monotonic() - t0
        cpu = children_cpu() - cpu0
        if code != 0:
            raise RuntimeError(f"aws exited {code} (log {log})")
        return wall, None, cpu

    def delete_prefix(self, prefix):
        for key in list(self.s3.objects(BUCKET, prefix)):
            self.s3.delete_object(BUCKET, key)


class Daemon:
    """`spotvisor run -- sleep` whose syncs are asked for with SIGUSR1."""

    def __init__(self, bench, run_id, ckpt):
        self.state = tempfile.mkdtemp(prefix="state-", dir=bench.work)
        self.log = bench.logfile(f"spotvisor-daemon-{run_id}")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(bench.argv(run_id, ckpt, self.state, ["sleep", "100000"]),
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=bench.env, start_new_session=True)
        if not B.wait_until(lambda: self.find("trainer.start") or self.proc.poll() is not None):
            raise RuntimeError(f"spotvisor did not start (log {self.log})")

    def find(self, name, **match):
        return [e for e in events(self.log) if e["event"] == name and all(e.get(k) == v for k, v in match.items())]

    def sync(self):
        n = len(self.find("sync.complete", kind="on-demand"))
        os.sync()
        t0 = time.time()
        os.kill(self.proc.pid, signal.SIGUSR1)
        if not B.wait_until(lambda: len(self.find("sync.complete", kind="on-demand")) > n or self.find("sync.failed"),
                            timeout=1800, interval=0.002):
            raise RuntimeError(f"no sync.complete (log {self.log})")
        if self.find("sync.failed"):
            raise RuntimeError(f"sync.failed (log {self.log})")
        e = self.find("sync.complete", kind="on-demand")[-1]
        return log_time_s(e["time"]) - t0, e.get("duration_s"), None

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                B.kill_quietly(self.proc.pid, group=True)
                self.proc.wait()
        shutil.rmtree(self.state, True)


def order(rep):
    return TOOLS if rep % 2 == 0 else TOOLS[::-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="+", choices=("upload", "noop", "restore"), default=("upload", "noop", "restore"))
    ap.add_argument("--tmp", default=tempfile.gettempdir())
    ap.add_argument("--aws", default="/usr/bin/aws")
    ap.add_argument("--json")
    ap.add_argument("--no-tune", dest="tune", action="store_false",
                    help="run aws-cli with its defaults (10 requests, 8 MiB parts) instead of the best of "
                         + ", ".join(f"{c}x{m}MB" for c, m in AWS_CANDIDATES))
    B.add_binary_flags(ap)
    args = ap.parse_args()
    B.check_binaries(args)
    if not os.access(args.aws, os.X_OK):
        print(f"bench: {args.aws} not found (Debian's awscli; scripts/install-deps.sh installs it)", file=sys.stderr)
        sys.exit(77)  # ctest: skipped
    big = max(1, int(512 * MiB * args.scale))
    small_count = max(4, int(512 * args.scale))
    noop_count = max(20, int(10000 * args.scale))
    rows = {}
    cpus = {}
    size = 0
    work = tempfile.mkdtemp(prefix="bench-s3-", dir=args.tmp)
    s3 = FakeS3Server(buckets=[BUCKET], credentials={AKID: SECRET}).start()
    md = FakeMetadataServer(host="127.0.0.1", port=0).start()
    b = Bench(args, work, s3, md)
    aws_version = subprocess.run([args.aws, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"machine: {B.machine()}; spotvisor {B.build_type(args.spotvisor)}; {aws_version}; scale {args.scale}",
          flush=True)

    def record(scenario, tool, wall, own, cpu=None):
        rows.setdefault(scenario, {}).setdefault(tool, []).append((wall, own))
        if cpu is not None:
            cpus.setdefault(scenario, {}).setdefault(tool, []).append(cpu)
        extra = f", own {own:.3f} s" if own is not None else ""
        extra += f", CPU {cpu:.2f} s" if cpu is not None else ""
        print(f"  {scenario:8} {tool:9} wall {wall:.3f} s{extra}", flush=True)

    try:
        if "upload" in args.only or "restore" in args.only:
            src = os.path.join(work, "set1")
            make_set(src, [big], small_count, MiB)
            size = payload(src)
            print(f"set 1: {size / MiB:.0f} MiB in {small_count + 1} files", flush=True)
            if args.tune:
                best = None
                for c, m in AWS_CANDIDATES:
                    b.aenv["AWS_CONFIG_FILE"] = aws_config(os.path.join(work, "home"), c, m)
                    wall, _, cpu = b.aws("sync", src, f"s3://{BUCKET}/aws/tune-{c}x{m}")
                    b.delete_prefix(f"aws/tune-{c}x{m}/")
                    print(f"  tune     aws {c:>2} requests x {m:>2} MB parts: wall {wall:.3f} s, CPU {cpu:.2f} s",
                          flush=True)
                    if best is None or wall < best[0]:
                        best = (wall, c, m)
                b.aenv["AWS_CONFIG_FILE"] = aws_config(os.path.join(work, "home"), best[1], best[2])
                print(f"  aws-cli tuned: {best[1]} requests x {best[2]} MB parts", flush=True)
            for rep in range(args.repeat):
                for tool in order(rep):
                    if tool == "spotvisor":
                        record("upload", tool, *b.spotvisor_once(f"up-{rep}", src, "sync.complete", kind="final"))
                    else:
                        record("upload", tool, *b.aws("sync", src, f"s3://{BUCKET}/aws/up-{rep}"))
                if rep != args.repeat - 1:
                    b.delete_prefix(f"sv/up-{rep}/")
                    b.delete_prefix(f"aws/up-{rep}/")
            last = args.repeat - 1
            if "restore" in args.only:
                s3.delete_object(BUCKET, f"sv/up-{last}/DONE")
                for rep in range(args.repeat):
                    for tool in order(rep):
                        dst = os.path.join(work, f"restore-{tool}-{rep}")
                        if tool == "spotvisor":
                            record("restore", tool, *b.spotvisor_once(f"up-{last}", dst, "restore.complete"))
                            s3.delete_object(BUCKET, f"sv/up-{last}/DONE")
                        else:
                            record("restore", tool, *b.aws("sync", f"s3://{BUCKET}/aws/up-{last}", dst))
                        if payload(dst) != size:
                            raise RuntimeError(f"{tool} restored {payload(dst)} bytes of {size}")
                        shutil.rmtree(dst)
            shutil.rmtree(src)
        if "noop" in args.only:
            src = os.path.join(work, "set2")
            make_set(src, [], noop_count, 4096)
            print(f"set 2: {noop_count} files of 4 KiB", flush=True)
            d = Daemon(b, "noop", src)
            try:
                d.sync()  # the first upload, not measured
                b.aws("sync", src, f"s3://{BUCKET}/aws/noop")
                for rep in range(args.repeat):
                    for tool in order(rep):
                        n0 = s3.hits()
                        wall, own, _ = d.sync() if tool == "spotvisor" else b.aws("sync", src, f"s3://{BUCKET}/aws/noop")
                        record("noop", tool, wall, own)
                        print(f"           ({s3.hits() - n0} requests)", flush=True)
            finally:
                d.stop()
    finally:
        s3.stop()
        md.stop()
        shutil.rmtree(work, True)

    print("\nmedians (wall; spotvisor's own transfer time in brackets); ratio = aws / spotvisor wall")
    out = {}
    for scenario, tools in rows.items():
        sv = statistics.median(w for w, _ in tools.get("spotvisor", [(float("nan"), None)]))
        own = [o for _, o in tools.get("spotvisor", []) if o is not None]
        aw = statistics.median(w for w, _ in tools.get("aws", [(float("nan"), None)]))
        own_s = f" [{statistics.median(own):.3f}]" if own else ""
        print(f"  {scenario:8} spotvisor {sv:8.3f} s{own_s}   aws {aw:8.3f} s   ratio {aw / sv:5.2f}x")
        out[scenario] = {"spotvisor_wall_s": sv, "spotvisor_own_s": statistics.median(own) if own else None,
                         "aws_wall_s": aw}
    if cpus and size:
        # The processes' own CPU (user + system, children included: aws-cli's
        # Python, spotvisor's threads), per GiB moved: what a trainer beside
        # them loses.
        print("CPU per GiB moved (medians; ratio = aws / spotvisor)")
        for scenario, tools in cpus.items():
            sv = statistics.median(tools.get("spotvisor", [float("nan")])) / (size / GiB)
            aw = statistics.median(tools.get("aws", [float("nan")])) / (size / GiB)
            print(f"  {scenario:8} spotvisor {sv:6.2f} s/GiB   aws {aw:6.2f} s/GiB   ratio {aw / sv:5.2f}x")
            out.setdefault(scenario, {}).update({"spotvisor_cpu_s_per_gib": sv, "aws_cpu_s_per_gib": aw})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scale": args.scale, "repeat": args.repeat, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()

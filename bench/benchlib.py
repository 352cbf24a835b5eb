"""Shared helpers for the spotvisor benchmarks (python3 stdlib only).

The benchmarks drive the real binaries as black boxes against the fake
metadata server from tests/fakes/, run in-process so that a flip is a direct
method call and not another HTTP round trip. They wait on conditions with a
bound, never on fixed sleeps.
"""
import math
import os
import platform
import re
import signal
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))

from fake_metadata import FakeMetadataServer  # noqa: E402,F401

BUILD = os.path.join(ROOT, "build-release")
DEFAULT_SPOTVISOR = os.path.join(BUILD, "daemon", "spotvisor")
DEFAULT_FAKE_TRAINER = os.path.join(BUILD, "tests", "fake_trainer")
BASELINE = os.path.join(BENCH, "baseline_bash.sh")
BOUND = 20.0  # seconds; only a failure ever waits this long


def add_binary_flags(parser):
    parser.add_argument("--spotvisor", default=DEFAULT_SPOTVISOR,
                        help="spotvisor binary (default: build-release)")
    parser.add_argument("--fake-trainer", default=DEFAULT_FAKE_TRAINER,
                        help="fake trainer binary (default: build-release)")


def check_binaries(args):
    for path in (args.spotvisor, args.fake_trainer):
        if not os.access(path, os.X_OK):
            sys.exit(f"bench: {path} is missing; build it first "
                     f"(bash bench/run.sh does)")


def build_type(binary):
    """CMAKE_BUILD_TYPE of the build tree a binary came from, if known."""
    d = os.path.dirname(os.path.abspath(binary))
    for _ in range(4):
        cache = os.path.join(d, "CMakeCache.txt")
        if os.path.exists(cache):
            with open(cache) as f:
                m = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", f.read(), re.M)
            return m.group(1) if m and m.group(1) else "(none)"
        d = os.path.dirname(d)
    return "unknown"


def machine():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs, {model}, Linux {platform.release()}"


def fs_type(path):
    """Filesystem type holding path, from /proc/self/mounts."""
    best, kind = "", "unknown"
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            mnt = fields[1].replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) \
                    and len(mnt) >= len(best):
                best, kind = mnt, fields[2]
    return kind


def wait_until(predicate, timeout=BOUND, interval=0.005):
    """Poll a condition with a bound; returns its value or None."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def read_marker(path):
    """The fake trainer's marker file: {'start': {...}, 'sigint_ns': N}."""
    out = {"start": None, "sigint_ns": None, "lines": []}
    try:
        with open(path) as f:
            lines = [l.strip() for l in f if l.strip()]
    except FileNotFoundError:
        return out
    out["lines"] = lines
    for line in lines:
        word, _, rest = line.partition(" ")
        fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
        if word == "start" and out["start"] is None:
            out["start"] = {k: int(v) for k, v in fields.items()
                            if v.lstrip("-").isdigit()}
        elif word == "sigint" and out["sigint_ns"] is None \
                and "realtime_ns" in fields:
            out["sigint_ns"] = int(fields["realtime_ns"])
    return out


def alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_quietly(pid, sig=signal.SIGKILL, group=False):
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def drop_stale_long_polls(srv):
    """Wake long-polls whose client is gone.

    The fake cannot see a client hang up while its request is parked, so a
    dead client's poll (spotvisor also watches instance/maintenance-event)
    stays parked and is woken by every later set(): the fake's own work per
    flip would grow with the flip count. A brief 'refuse' drops every
    connection; only call this when no client under test is running.
    """
    if srv.waiters() or srv.hung():
        srv.fault("refuse")
        srv.fault("none")
        wait_until(lambda: srv.waiters() == 0, timeout=5)


def percentile(sorted_values, p):
    """Nearest-rank percentile (p in 0..100) of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def fmt_ratio(a, b):
    if not b or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{a / b:.2f}"


def children_of(pid):
    """Direct children of pid, from /proc (no CONFIG_PROC_CHILDREN needed)."""
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(name))
    return kids


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"



def proc_status_kb(pid, key):
    """A number from /proc/PID/status (VmRSS, VmHWM, VmSize: kB; Threads: a count); 0 if absent."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class OnDemandDaemon:
    """`spotvisor run ...` whose syncs are asked for with SIGUSR1 (what `spotvisor sync`
    sends), its JSON lines read as they come: for benchmarks that count what N syncs cost."""

    def __init__(self, argv, env=None):
        import json
        import subprocess
        import threading
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, env=env)
        self.pid = self.proc.pid
        self._done = 0
        self._started = threading.Event()
        self._cv = threading.Condition()

        def reader():
            for line in self.proc.stdout:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                with self._cv:
                    if e.get("event") == "trainer.start":
                        self._started.set()
                    elif e.get("event") == "sync.complete" and e.get("kind") == "on-demand":
                        self._done += 1
                    elif e.get("event") == "sync.failed":
                        print(f"bench: {e.get('message')}", file=sys.stderr)
                    self._cv.notify_all()

        threading.Thread(target=reader, daemon=True).start()
        if not self._started.wait(BOUND):
            self.stop()
            sys.exit("bench: the trainer never started")

    def sync(self, bound=BOUND, what="sync"):
        """Asks for one on-demand sync and waits for its sync.complete."""
        with self._cv:
            before = self._done
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + bound
        with self._cv:
            while self._done <= before:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.stop()
                    sys.exit(f"bench: {what} never completed")
                self._cv.wait(left)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(BOUND)
            except Exception:  # noqa: BLE001 - a benchmark's cleanup must not hide the result
                kill_quietly(self.proc.pid)

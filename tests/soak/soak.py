"""Randomised soak of checkpoint integrity (issue #11).

    /usr/bin/python3 tests/soak/soak.py [--runs N] [--seed S] [--bin PATH]
                                        [--store gcs|file|both] [--jobs J] [--quick]
                                        [--keep | --keep-failed] [--json FILE] [-v]

Each run is one run-id taken through several "boots" of spotvisor, mixing at
random: a trainer layout (layouts.py) with or without the completion marker,
save intervals (also faster than sync-settle), preemptions, SIGTERM, kill -9
of spotvisor at chosen moments (mid-restore, mid-upload, mid-commit,
mid-delete, mid final sync, at a random time), same-VM restarts and new VMs,
two VMs on one run-id at once, store faults on the fake GCS (503/429 bursts,
resets, lost answers on uploads and on the manifest commit, slow requests)
and a fake GCS or a file:// bucket. The bucket is read directly, every
commit as it appears and the end state after each boot, and the invariants
listed in tests/soak/README.md are checked. Run i uses seed S+i, so
`--seed S+i --runs 1` replays it (the same choices; the timing is the
machine's).

Exit status: 0 if no invariant broke, 1 otherwise (each violation is listed
with its run's seed), 2 on a usage error.
"""
import argparse
import base64
import collections
import concurrent.futures
import datetime
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))

try:
    import crcmod.predefined  # Debian's python3-crcmod, as the fake GCS needs
except ImportError:
    sys.exit("soak: no crcmod here: run it with Debian's /usr/bin/python3 (package python3-crcmod)")

import harness  # noqa: E402
import layouts  # noqa: E402
from fake_gcs import FakeError, FakeGcsServer  # noqa: E402
from fake_metadata import FakeMetadataServer  # noqa: E402

PYTHON = "/usr/bin/python3"  # Debian's: the trainer needs crcmod too
TRAINER = os.path.join(HERE, "trainer.py")
BUCKET = "soak-bucket"
PREFIX = "soak"
MANIFEST = "manifest.json"
DONE = "DONE"
OBJECTS = "checkpoints/"
POLL = 0.05            # the bucket watcher's polling interval (a bounded wait, not a sync)
STEP_WAIT = 10.0       # bound for a trigger (an event, a request) to show up
EXIT_WAIT = 60.0       # bound for a spotvisor to exit once nothing disturbs it any more (a hang else)
RUN_WAIT = 600.0       # bound for a whole run
KILL_WAIT = 10.0       # bound for killed processes to be gone

crc32c = crcmod.predefined.mkPredefinedCrcFun("crc-32c")


def duration_ms(text):
    """spotvisor's durations as the soak writes them: 0, 250ms, 1s."""
    if text.endswith("ms"):
        return float(text[:-2])
    if text.endswith("s"):
        return float(text[:-1]) * 1000
    return float(text)


def crc_b64(data):
    return base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()


# ------------------------------------------------------------------ the plan
# Everything random is drawn here, from the run's seed, before anything runs:
# a replay makes the same choices.

FAULT_KINDS = ("503", "429", "reset_before", "reset_mid_body", "lost_upload_answer",
               "lost_commit_answer", "lost_delete_answer", "slow")
KILL_TRIGGERS = ("time", "restore", "upload", "commit", "delete", "final_sync")


def plan_run(seed, store, quick=False):
    """The whole run, drawn from its seed. quick: the short form's scale
    (shorter training, fewer boots, shorter fault bursts), for ctest."""
    rng = random.Random(seed)
    coin = rng.random()
    if store == "both":
        store = "gcs" if coin < 0.7 else "file"
    layout = rng.choice(layouts.LAYOUTS)
    # Sizes: mostly small files; some runs have one file of a few MiB, a few
    # one above 8 MiB (resumable uploads), fewer saves then.
    profile = rng.choices(["small", "medium", "big"], [0.6, 0.35, 0.05] if quick else [0.55, 0.35, 0.10])[0]
    names = {"single": ["latest.ckpt"], "pair": ["model.pt", "optimizer.pt"],
             "hf": list(layouts.HF_FILES), "rename": ["model.bin", "state.json"]}[layout]
    sizes = {n: rng.randint(100, 64 * 1024) for n in names}
    if profile != "small":
        sizes[names[0]] = rng.randint(1 << 20, 4 << 20) if profile == "medium" else rng.randint(8 << 20, 11 << 20)
    speed = rng.choice(["fast", "medium", "slow"])
    interval = {"fast": [10, 60], "medium": [60, 250], "slow": [250, 600]}[speed]
    if profile == "big":
        interval = [max(interval[0], 300), max(interval[1], 700)]
    mean = sum(interval) / 2
    total_steps = max(4, min(60, int(rng.uniform(*((800, 2000) if quick else (1500, 3500))) / mean)))
    trainer = {"layout": layout, "marker": rng.random() < 0.5, "content_seed": f"{seed:x}",
               "sizes": sizes, "total_steps": total_steps, "interval_ms": interval,
               "gap_ms": rng.choice([0, 5, 30, 100])}
    settle = rng.choice(["0s", "0s", "50ms", "200ms", "500ms", "1s"])
    sync_interval = rng.choice(["0", "100ms", "200ms", "300ms", "500ms", "1s"])
    boots = []
    for _ in range(rng.randint(1, 2 if quick else 3)):
        if rng.random() < 0.12:
            boots.append([plan_vm(rng, store, vm, True, quick) for vm in ("same", "new")])
        else:
            boots.append([plan_vm(rng, store, rng.choice(["same", "new"]), False, quick)])
    # The last boot lets the trainer finish: the end state is checked, leaks counted.
    last = plan_vm(rng, store, rng.choice(["same", "new"]), False, quick)
    last["disruption"] = {"kind": "finish"}
    last["crash"] = None
    boots.append([last])
    return {"seed": seed, "store": store, "run_id": f"soak-{seed:x}", "trainer": trainer, "quick": quick,
            "sync_interval": sync_interval, "sync_settle": settle, "boots": boots}


def plan_vm(rng, store, vm, pair, quick):
    """One spotvisor on one VM for one boot: what disturbs it, which faults
    the store injects meanwhile, how its trainer exits."""
    kind = rng.choices(["finish", "preempt", "sigterm", "kill9"], [0.15, 0.3, 0.2, 0.35])[0]
    d = {"kind": kind, "after_s": round(rng.uniform(0.1, 2.0), 3)}
    if kind == "kill9":
        triggers = KILL_TRIGGERS if store == "gcs" else ("time", "restore", "upload", "final_sync")
        d["trigger"] = rng.choice(triggers)
        d["delay_s"] = round(rng.uniform(0, 0.15), 3)
        d["slow_ms"] = rng.randint(200, 900)
    faults = []
    if store == "gcs":
        for _ in range(rng.choices([0, 1, 2, 3], [0.4, 0.4, 0.2, 0] if quick else [0.3, 0.35, 0.2, 0.15])[0]):
            faults.append(plan_fault(rng, 2 if quick else 3))
    crash = None
    if not pair and kind == "finish" and rng.random() < 0.3:
        crash = {"after_saves": rng.randint(1, 6), "mid_save": rng.random() < 0.5}
    return {"vm": vm, "disruption": d, "faults": faults, "crash": crash,
            "signal_exit": rng.choice([0, 0, 1, 130, 143]), "rng_seed": rng.getrandbits(32),
            "stagger_s": round(rng.uniform(0, 0.5), 3) if pair else 0}


def plan_fault(rng, burst):
    """One fault rule on the fake GCS; `burst` bounds how many requests in a
    row a 503/429 hits (the client backs off 0.5 s, 1 s, 2 s, ...)."""
    kind = rng.choice(FAULT_KINDS)
    where = rng.choice([{}, {"upload_type": "multipart"}, {"upload_type": "chunk"}, {"kind": "list"},
                        {"kind": "download"}, {"kind": "delete"}, {"object": MANIFEST}, {"object": OBJECTS}])
    rule = {"kind": kind, "at_s": rng.choice([0, 0, round(rng.uniform(0, 2.5), 3)])}
    if kind in ("503", "429"):
        rule.update(mode="status", code=int(kind), count=rng.randint(1, burst), where=where)
    elif kind in ("reset_before", "reset_mid_body"):
        rule.update(mode=kind, count=rng.randint(1, 2), where=where)
    elif kind == "lost_upload_answer":
        rule.update(mode="reset_after", count=1, where={"upload_type": "multipart", "object": OBJECTS})
    elif kind == "lost_commit_answer":
        rule.update(mode="reset_after", count=1, where={"upload_type": "multipart", "object": MANIFEST})
    elif kind == "lost_delete_answer":
        rule.update(mode="reset_after", count=1, where={"kind": "delete"})
    else:
        rule.update(mode="slow", delay_ms=rng.randint(100, 800), count=rng.randint(1, 3), where=where)
    return rule


def describe(plan):
    t = plan["trainer"]
    big = max(t["sizes"].values())
    boots = []
    for b in plan["boots"]:
        vms = []
        for v in b:
            d = v["disruption"]
            what = d["kind"] + (f"@{d['trigger']}" if d["kind"] == "kill9" else "")
            if v["crash"]:
                what += "+crash" + ("-mid-save" if v["crash"]["mid_save"] else "")
            vms.append(f"{v['vm']}:{what}" + (f"[{','.join(f['kind'] for f in v['faults'])}]" if v["faults"] else ""))
        boots.append("+".join(vms))
    return (f"{plan['store']} layout={t['layout']} marker={'yes' if t['marker'] else 'no'} "
            f"steps={t['total_steps']} every={t['interval_ms'][0]}-{t['interval_ms'][1]}ms "
            f"biggest={big // 1024}KiB sync-interval={plan['sync_interval']} settle={plan['sync_settle']} "
            f"boots: {' | '.join(boots)}")


# ----------------------------------------------------------------- the store

class GcsBucket:
    """The fake GCS, in this process; read directly, never through spotvisor."""
    kind = "gcs"

    def __init__(self, tmp):
        self.srv = FakeGcsServer(buckets=[BUCKET]).start()
        self.url = f"gs://{BUCKET}/{PREFIX}"
        self.env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.srv.port}"}

    def name(self, run_id, rel):
        return f"{PREFIX}/{run_id}/{rel}"

    def read(self, run_id, rel):
        try:
            return self.srv.get_object_bytes(BUCKET, self.name(run_id, rel))
        except FakeError as e:
            if e.code == 404:
                return None
            raise

    def list(self, run_id, sub):
        root = self.name(run_id, "")
        return [o["name"][len(root):] for o in self.srv.objects(BUCKET, root + sub)]

    def temp_files(self, run_id):
        return []

    def stop(self):
        self.srv.stop()


class FileBucket:
    """A file:// bucket: a directory of this run."""
    kind = "file"

    def __init__(self, tmp):
        self.root = os.path.join(tmp, "bucket")
        self.url = f"file://{self.root}"
        self.env = {}

    def read(self, run_id, rel):
        try:
            with open(os.path.join(self.root, run_id, rel), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def _walk(self, run_id, sub):
        top = os.path.join(self.root, run_id)
        out = []
        for d, _, files in os.walk(os.path.join(top, sub)):
            for f in files:
                out.append(os.path.relpath(os.path.join(d, f), top))
        return sorted(out)

    def list(self, run_id, sub):
        return [n for n in self._walk(run_id, sub) if ".spotvisor-tmp." not in n]

    def temp_files(self, run_id):
        """Half-written objects of a killed upload (the file store's temp names)."""
        return [n for n in self._walk(run_id, OBJECTS) if ".spotvisor-tmp." in n]

    def stop(self):
        pass


# --------------------------------------------------------------- the checker

FENCED = "VMs fenced off by another's commit"


def event_time(e):
    """An event's "time" (RFC 3339, nanoseconds) as a Unix time, or None."""
    t = e.get("time")
    if not isinstance(t, str):
        return None
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$", t)
    if not m:
        return None
    base = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return base.timestamp() + (float("0" + m.group(2)) if m.group(2) else 0.0)


def manifest_says_marker(raw):
    try:
        return json.loads(raw).get("marker") is True
    except (ValueError, AttributeError, TypeError):
        return False


class Commit:
    """One manifest seen in the bucket, judged: step is the trainer's step it
    holds (None: no checkpoint files at all, -1: files but no usable step)."""

    def __init__(self, raw, sequence, step):
        self.raw, self.sequence, self.step = raw, sequence, step


class Watcher:
    """Judges every distinct manifest the bucket holds, as soon as it shows
    up: (1) every object it names is there with its size and crc32c, (2) the
    files are one state the trainer produced, (3) sequence and step never go
    back. A background thread polls; check() is also called at each boot's
    edges."""

    def __init__(self, run):
        self.run = run
        self.bucket = run.bucket
        self.run_id = run.plan["run_id"]
        self.judge = run.judge
        self.lock = threading.Lock()
        self.commits = []
        self.last_raw = None
        self.max_step = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-watcher", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(30)

    def _loop(self):
        deadline = time.monotonic() + RUN_WAIT
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                self.check()
            except Exception as e:  # the watcher must not die silently
                self.run.violation("checker-error", f"{type(e).__name__}: {e}")
                return
            self._stop.wait(POLL)

    def check(self):
        """Judges the manifest now in the bucket if it is new; returns the
        newest commit judged (None: there never was one)."""
        with self.lock:
            for _ in range(20):  # a manifest replaced while we read its objects is read again
                raw = self.bucket.read(self.run_id, MANIFEST)
                if raw is None or raw == self.last_raw:
                    break
                commit = self._judge(raw)
                if commit is not None:
                    self._record(commit)
                    break
            return self.commits[-1] if self.commits else None

    def _judge(self, raw):
        try:
            m = json.loads(raw)
            files = m["files"]
            sequence = int(m["sequence"])
        except (ValueError, KeyError, TypeError) as e:
            self.last_raw = raw
            self.run.violation("restore-mismatch", f"manifest is not readable: {e}: {raw[:200]!r}")
            return None
        judged, broken = {}, []
        for f in files:
            path, obj = f.get("path"), f.get("object")
            data = self.bucket.read(self.run_id, obj) if isinstance(obj, str) else None
            if data is None:
                if self.bucket.read(self.run_id, MANIFEST) != raw:
                    return None  # superseded while we read: its objects may be gone, rightly
                broken.append(f"{path}: object {obj} is missing")
                continue
            crc = crc_b64(data)
            if len(data) != f.get("size") or crc != f.get("crc32c"):
                broken.append(f"{path}: object {obj} has {len(data)} bytes crc32c {crc}, "
                              f"the manifest says {f.get('size')} bytes crc32c {f.get('crc32c')}")
            judged[path] = self.judge.file_step(path, len(data), crc32c(data), data[:layouts.HEADER_MAX])
        step, problems = self.judge.state(judged)
        for why in broken:
            self.run.violation("restore-mismatch", f"commit #{sequence}: {why}")
        for why in problems:
            self.run.violation("inconsistent-checkpoint", f"commit #{sequence}: {why}", when=time.time(),
                               sequence=sequence)
        return Commit(raw, sequence, step)

    def _record(self, c):
        self.last_raw = c.raw
        prev = self.commits[-1] if self.commits else None
        self.commits.append(c)
        self.run.stats["commits seen"] += 1
        if prev is not None and c.sequence <= prev.sequence:
            self.run.violation("commit-regressed", f"manifest sequence {prev.sequence} -> {c.sequence}")
        if self.max_step is not None and (c.step is None or 0 <= c.step < self.max_step):
            self.run.violation("commit-regressed",
                               f"commit #{c.sequence} holds step {c.step}, an earlier commit held step {self.max_step}")
        if c.step is not None and c.step >= 0:
            self.max_step = max(self.max_step or 0, c.step)


# ------------------------------------------------------------------- the VMs

class Vm:
    """A VM's disk: its checkpoint dir and state-dir survive a restart of the
    same VM; a new VM starts with empty ones."""

    def __init__(self, tmp, index):
        self.name = f"soak-vm-{index}"
        self.dir = os.path.join(tmp, self.name)
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.state = os.path.join(self.dir, "state")
        self.busy = False
        self.boots = 0
        # Another VM's commit fenced this one off: what its disk holds since
        # is a branch the run abandoned (docs/checkpoints.md), not work a
        # restart must keep.
        self.fenced = False
        os.makedirs(self.dir)


class Launch:
    """One spotvisor on one VM for one boot, and what is known about it."""

    def __init__(self, vm, vplan, boot):
        self.vm, self.plan, self.boot = vm, vplan, boot
        self.proc = None
        self.metadata = None
        self.killed = False
        self.hung = False
        self.exit_code = None
        self.committed_at_launch = None
        self.local_complete = None
        self.over = threading.Event()  # the boot is over: no more faults for it
        self.faulter = None
        self.log = os.path.join(vm.dir, f"trainer-{boot}.log")
        self.config = os.path.join(vm.dir, f"trainer-{boot}.json")

    def trainer_log(self):
        try:
            with open(self.log) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def event(self, name, timeout, **fields):
        try:
            return self.proc.wait_event(name, timeout, **fields)
        except AssertionError:
            return None


def proc_cmdlines():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out[int(pid)] = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            pass
    return out


def processes_of(token):
    """Live (not zombie) processes whose command line mentions token."""
    me = {os.getpid(), os.getppid()}
    return sorted(pid for pid, cmd in proc_cmdlines().items()
                  if token in cmd and pid not in me and harness.pid_alive(pid))


def kill_all(token):
    """SIGKILLs every process that mentions token, until none is left (bounded)."""
    deadline = time.monotonic() + KILL_WAIT
    while time.monotonic() < deadline:
        pids = processes_of(token)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)  # polling interval of a bounded wait
    return not processes_of(token)


# ------------------------------------------------------------------- one run

class Run:
    def __init__(self, plan, binary, keep, verbose):
        self.plan, self.binary, self.keep, self.verbose = plan, binary, keep, verbose
        self.seed = plan["seed"]
        self.stats = collections.Counter()
        self.violations = []
        self.candidates = []    # inconsistent states, classified at the end
        self.unprotected = []   # ... that spotvisor could not have recognised
        self.first_mark = None  # wall time of the trainer's first complete save (any VM)
        self.first_mark_by_vm = {}  # the same, per VM: what that VM's spotvisor could have seen
        self.torn_since = None  # wall time a save was first cut off on a VM's disk
        self._vlock = threading.Lock()
        self.judge = layouts.Judge(plan["trainer"], crc32c)
        self.tmp = tempfile.mkdtemp(prefix=f"spotvisor-soak-{self.seed}-")
        self.bucket = GcsBucket(self.tmp) if plan["store"] == "gcs" else FileBucket(self.tmp)
        self.watcher = Watcher(self)
        self.vms = []
        self.launches = []
        self.current_boot = 0

    def say(self, text):
        if self.verbose:
            print(f"  [{self.seed}] {text}", flush=True)

    def violation(self, kind, detail, boot=None, when=None, sequence=None):
        """Records a broken invariant. An inconsistent state (`when` given: the
        wall time it was seen) is only a candidate until the run's end:
        classify() decides whether spotvisor could have known better."""
        with self._vlock:
            v = {"kind": kind, "seed": self.seed, "boot": self.current_boot if boot is None else boot,
                 "detail": detail, "store": self.plan["store"], "layout": self.plan["trainer"]["layout"],
                 "marker": self.plan["trainer"]["marker"]}
            if when is not None:
                v["when"], v["sequence"] = when, sequence
                self.candidates.append(v)
            elif v["detail"] not in [x["detail"] for x in self.violations if x["kind"] == kind]:
                self.violations.append(v)
                self.say(f"VIOLATION {kind}: {detail}")

    def torn_possible(self, when):
        """From `when` on, a VM's disk may hold a save cut off half-way (its
        trainer was killed or crashed mid-save)."""
        with self._vlock:
            self.torn_since = when if self.torn_since is None else min(self.torn_since, when)

    def classify(self):
        """An inconsistent commit or resume is spotvisor's fault when it could
        tell the save was not complete: the trainer uses the completion marker
        and had touched it by then (a second of slack for the first save), or
        sync-settle is longer than any pause the trainer makes inside a save
        and no save was cut off by a kill or crash before. Otherwise (no
        marker yet, settle shorter than the trainer's pauses, a torn save on a
        VM's disk without a marker) nobody could tell, and it is reported
        apart, not counted."""
        t = self.plan["trainer"]
        settle_ms = duration_ms(self.plan["sync_settle"])
        committed_by = {}  # sequence -> how spotvisor says it judged that commit (sync.complete)
        committed_vm = {}  # sequence -> the VM whose spotvisor made it
        sync_started = {}  # sequence -> when the sync that made it began (its tree was judged after)
        for l in (l for l in self.launches if l.proc):
            for e in l.proc.find("sync.complete"):
                if e.get("files_uploaded") or e.get("files_deleted"):
                    committed_vm[e.get("sequence")] = l.vm.name
                    started = event_time(e)
                    if started is not None and isinstance(e.get("duration_s"), (int, float)):
                        sync_started[e.get("sequence")] = started - e["duration_s"]
                    how = [f"{e.get('kind')} sync by {l.vm.name}"]
                    if e.get("judged_by"):
                        how.append(f"complete by {e['judged_by']}" + (", staged" if e.get("staged") else ""))
                    committed_by[e.get("sequence")] = ", ".join(how)
        for v in self.candidates:
            when, seq = v.pop("when"), v.pop("sequence")
            if seq in committed_by:
                v["detail"] += f" [{committed_by[seq]}]"
            # The marker counts from the first save the committing VM's own
            # trainer marked (another VM's disk is not there to see), or
            # once an earlier manifest said the trainer uses it.
            by_manifest = any(c.sequence < (seq or 0) and manifest_says_marker(c.raw) for c in self.watcher.commits)
            vm = committed_vm.get(seq)
            mark = self.first_mark_by_vm.get(vm) if vm else self.first_mark
            # When the tree was judged: the sync's start if known (a big
            # upload can take seconds), else when the commit was seen, less
            # a second of slack.
            judged = sync_started.get(seq, when - 1.0)
            marked = t["marker"] and (by_manifest or (mark is not None and judged > mark))
            settled = settle_ms >= t["gap_ms"] + 150 and (self.torn_since is None or when < self.torn_since)
            if marked or settled:
                if v["detail"] not in [x["detail"] for x in self.violations if x["kind"] == v["kind"]]:
                    self.violations.append(v)
                    self.say(f"VIOLATION {v['kind']}: {v['detail']}")
            else:
                v["why_not_counted"] = ("no marker yet" if t["marker"] else "no marker") + (
                    f", sync-settle {self.plan['sync_settle']} < the trainer's pauses ({t['gap_ms']} ms)"
                    if settle_ms < t["gap_ms"] + 150 else ", a save was cut off by a kill or crash before")
                self.unprotected.append(v)

    # ------------------------------------------------------------ lifecycle
    def execute(self):
        harness.SPOTVISOR = self.binary
        self.watcher.start()
        deadline = time.monotonic() + RUN_WAIT
        last = None
        try:
            for i, boot in enumerate(self.plan["boots"]):
                if time.monotonic() > deadline:
                    self.violation("run-timeout", f"the run took more than {RUN_WAIT:.0f}s; boots left out")
                    break
                if self.bucket.read(self.plan["run_id"], DONE) is not None:
                    self.stats["boots after DONE (skipped)"] += len(self.plan["boots"]) - i
                    break
                self.current_boot = i
                last = self.boot(i, boot)
            self.finish(last)
            self.classify()
        except Exception:  # a bug of the soak: said, and the run ends, the others go on
            self.violation("checker-error", traceback.format_exc()[-1500:])
        finally:
            self.watcher.stop()
            kill_all(self.tmp)
            self.bucket.stop()
            kept = self.keep == "all" or (self.keep == "failed" and self.violations)
            if not kept:
                shutil.rmtree(self.tmp, ignore_errors=True)
        return {"seed": self.seed, "plan": describe(self.plan), "stats": dict(self.stats),
                "violations": self.violations, "unprotected": self.unprotected, "tmp": self.tmp if kept else None}

    def pick_vm(self, which):
        free = [v for v in self.vms if not v.busy]
        if which == "same" and free:
            vm = free[-1]
        else:
            vm = Vm(self.tmp, len(self.vms))
            self.vms.append(vm)
            self.stats["new VMs"] += 1
        vm.busy = True
        return vm

    def boot(self, i, vplans):
        if self.bucket.kind == "gcs":
            self.bucket.srv.reset_log()
        started = time.monotonic()
        launches = [Launch(self.pick_vm(v["vm"]), v, i) for v in vplans]
        self.launches += launches
        self.stats["boots"] += 1
        self.stats["two VMs at once"] += len(launches) > 1
        threads = []
        for n, l in enumerate(launches):
            if n:
                time.sleep(l.plan["stagger_s"])  # a random stagger, not a synchronisation
            self.start(l)
            t = threading.Thread(target=self.drive, args=(l,), name=f"soak-drive-{l.vm.name}", daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(EXIT_WAIT + 4 * STEP_WAIT)
        self.after_boot(launches)
        self.say(f"boot {i} took {time.monotonic() - started:.1f}s: " + ", ".join(
            f"{l.vm.name} {'killed' if l.killed else f'exit {l.exit_code}'}" for l in launches))
        return launches

    def start(self, l):
        """Boots spotvisor on l.vm with its trainer; notes what the bucket
        and the VM's own disk hold at that moment, for invariant (4)."""
        p, t = l.plan, self.plan["trainer"]
        vm = l.vm
        if l.plan["vm"] == "same" and vm.boots:
            self.stats["same-VM restarts"] += 1
            l.local_complete = None if vm.fenced else self.local_complete(vm)
        vm.boots += 1
        committed = self.watcher.check()
        l.committed_at_launch = committed.step if committed else None
        crash = None
        if p["crash"]:
            crash = {"after_saves": p["crash"]["after_saves"], "mid_save": p["crash"]["mid_save"]}
        config = dict(t, signal_exit=p["signal_exit"], rng_seed=p["rng_seed"], log=l.log, crash=crash)
        with open(l.config, "w") as f:
            json.dump(config, f)
        l.metadata = FakeMetadataServer(instance_name=vm.name).start()
        sets = {"bucket": self.bucket.url, "run-id": self.plan["run_id"], "checkpoint-dir": vm.ckpt,
                "state-dir": vm.state, "sync-interval": self.plan["sync_interval"],
                "sync-settle": self.plan["sync_settle"], "stop-timeout": "5s", "kill-timeout": "2s",
                "metadata-watch-timeout": "5s"}
        args = ["run"]
        for k, v in sets.items():
            args += ["--set", f"{k}={v}"]
        args += ["--", PYTHON, TRAINER, l.config]
        env = {"GCE_METADATA_HOST": f"127.0.0.1:{l.metadata.port}", "PYTHONDONTWRITEBYTECODE": "1",
               "STORAGE_EMULATOR_HOST": ""}
        env.update(self.bucket.env)
        for f in p["faults"]:
            if f["at_s"] == 0:
                self.inject(f)
        l.proc = harness.Spotvisor(args, env)

    def local_complete(self, vm):
        """The newest save on the VM's own disk that the trainer completed and
        marked (marker layouts only: without the marker spotvisor cannot know
        a save is complete), or None."""
        if not self.plan["trainer"]["marker"] or not os.path.isdir(vm.ckpt):
            return None
        step, problems, newest = layouts.read_local(self.judge, vm.ckpt)
        if step is None or step < 0 or (problems and self.plan["trainer"]["layout"] != "hf"):
            return None
        try:
            marked = os.stat(os.path.join(vm.ckpt, layouts.MARKER_NAME)).st_mtime_ns
        except FileNotFoundError:
            return None
        return step if marked >= newest else None

    # ------------------------------------------------------------- faults
    def inject(self, f):
        if self.bucket.kind != "gcs":
            return
        rule = {"mode": f["mode"], "count": f["count"], "add": True}
        for k in ("code", "delay_ms"):
            if k in f:
                rule[k] = f[k]
        for k, v in f["where"].items():
            if k == "object":
                rule["object_prefix"] = self.bucket.name(self.plan["run_id"], v)
            else:
                rule[k] = v
        self.bucket.srv.fault(rule)
        self.stats[f"fault {f['kind']}"] += 1

    def delayed_faults(self, l):
        """Injects the faults planned for later in the boot (bounded by the boot)."""
        start = time.monotonic()
        for f in sorted((f for f in l.plan["faults"] if f["at_s"] > 0), key=lambda f: f["at_s"]):
            # A random fault time, not a synchronisation; cut short when the boot is over.
            if l.over.wait(max(0.0, f["at_s"] - (time.monotonic() - start))) or l.proc.proc.poll() is not None:
                return
            self.inject(f)

    # ----------------------------------------------------------- disruption
    def drive(self, l):
        """Disturbs one spotvisor as planned, then waits for it to end."""
        try:
            l.faulter = threading.Thread(target=self.delayed_faults, args=(l,), daemon=True)
            l.faulter.start()
            d = l.plan["disruption"]
            kind = d["kind"]
            if kind in ("preempt", "sigterm") and self.trainer_ready(l):
                self.pause(l, d["after_s"])
                self.stop_vm(l, kind)
            elif kind == "kill9":
                self.kill_at(l, d)
            self.wait_exit(l)
        except Exception as e:
            self.violation("checker-error", f"{l.vm.name}: {type(e).__name__}: {e}")
            self.kill9(l)

    def trainer_ready(self, l):
        """True once the trainer has installed its signal handlers (its
        'started' line); False if spotvisor ended without starting it."""
        deadline = time.monotonic() + STEP_WAIT
        while time.monotonic() < deadline:
            if l.proc.find("trainer.output") and any("soak trainer started" in e.get("message", "")
                                                      for e in l.proc.find("trainer.output")):
                return True
            if l.proc.proc.poll() is not None:
                return False
            time.sleep(0.01)  # polling interval of a bounded wait
        return False

    def pause(self, l, seconds):
        """A random delay before a disruption, cut short if spotvisor exits."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and l.proc.proc.poll() is None:
            time.sleep(0.01)

    def stop_vm(self, l, kind):
        if l.proc.proc.poll() is not None:
            return
        if kind == "preempt":
            if l.metadata.wait_for_waiters("instance/preempted", 1, STEP_WAIT):
                l.metadata.set("instance/preempted", "TRUE")
                self.stats["preemptions"] += 1
        else:
            l.proc.signal(signal.SIGTERM)
            self.stats["SIGTERMs"] += 1

    def kill_at(self, l, d):
        """kill -9 of spotvisor at the planned moment."""
        trig, gcs = d["trigger"], self.bucket.kind == "gcs"
        run_id = self.plan["run_id"]
        t0 = time.time()
        hit = True
        if trig == "restore":
            if gcs:  # a slow download keeps the restore going long enough to be cut
                self.bucket.srv.fault({"mode": "slow", "delay_ms": d["slow_ms"], "kind": "download",
                                       "count": 2, "add": True})
            hit = l.event("restore.start", STEP_WAIT) is not None
        elif trig == "upload":
            if gcs:
                obj = self.bucket.name(run_id, OBJECTS)
                hit = self.wait_request(l, t0, lambda e: e["kind"] in ("multipart", "media", "resumable", "chunk")
                                        and (e.get("object") or "").startswith(obj))
            else:
                hit = self.trainer_ready(l) and self.wait_log(l, "saved")
        elif trig in ("commit", "delete"):
            manifest = self.bucket.name(run_id, MANIFEST)
            if trig == "commit":
                rule = {"upload_type": "multipart", "object_prefix": manifest}

                def pred(e):
                    return e["kind"] == "multipart" and e.get("object") == manifest
            else:
                rule = {"kind": "delete"}

                def pred(e):
                    return e["kind"] == "delete"
            self.bucket.srv.fault(dict(rule, mode="slow", delay_ms=d["slow_ms"], count=1, add=True))
            hit = self.wait_request(l, t0, pred)
        elif trig == "final_sync":
            if self.trainer_ready(l):
                self.pause(l, d["after_s"])
                self.stop_vm(l, "preempt")
            hit = l.event("trainer.exit", STEP_WAIT) is not None
        else:
            hit = self.trainer_ready(l)
            self.pause(l, d["after_s"])
        if not hit and l.proc.proc.poll() is not None:
            return  # it ended before the moment came
        self.pause(l, d["delay_s"])
        self.stats[f"kill -9 ({trig if hit else 'late'})"] += 1
        self.kill9(l)

    def wait_log(self, l, ev):
        deadline = time.monotonic() + STEP_WAIT
        while time.monotonic() < deadline:
            if any(e["ev"] == ev for e in l.trainer_log()):
                return True
            if l.proc.proc.poll() is not None:
                return False
            time.sleep(0.01)  # polling interval of a bounded wait
        return False

    def wait_request(self, l, since, pred):
        """Waits (bounded) until the fake GCS has received a request that
        pred accepts, after `since`."""
        deadline = time.monotonic() + STEP_WAIT
        while time.monotonic() < deadline:
            if any(e["time"] >= since and pred(e) for e in self.bucket.srv.log()):
                return True
            if l.proc.proc.poll() is not None:
                return False
            time.sleep(0.01)  # polling interval of a bounded wait
        return False

    def kill9(self, l):
        """kill -9 of spotvisor, then of its trainer: nobody else would."""
        l.killed = True
        l.proc.kill()
        log = l.trainer_log()
        if any(e["ev"] == "start" for e in log) and not any(e["ev"] == "exit" for e in log):
            self.torn_possible(time.time())
        if not kill_all(l.vm.dir):
            self.violation("stray-process", f"{l.vm.name}: processes survive SIGKILL: {processes_of(l.vm.dir)}")

    def wait_exit(self, l):
        if l.killed:
            return
        try:
            l.exit_code = l.proc.wait_exit(EXIT_WAIT)
        except AssertionError:
            l.hung = True
            last = [f"{e.get('event')}: {e.get('message', '')[:150]}" for e in l.proc.events[-3:]]
            self.violation("hang", f"{l.vm.name}: spotvisor did not exit within {EXIT_WAIT:.0f}s; its last events: "
                           + " / ".join(last))
            self.kill9(l)

    # --------------------------------------------------------------- checks
    def after_boot(self, launches):
        for l in launches:
            l.over.set()
            if l.faulter:
                l.faulter.join(STEP_WAIT)
        if self.bucket.kind == "gcs":
            srv = self.bucket.srv
            log = srv.log()
            if self.keep:
                with open(os.path.join(self.tmp, f"gcs-{self.current_boot}.json"), "w") as f:
                    json.dump(log, f, indent=0)
            for e in log:
                if e.get("fault"):
                    self.stats[f"fault hit: {e['fault']}"] += 1
            srv.fault("none")  # releases slow requests: an in-flight write lands now, not in the next boot
            if not srv.wait_idle(STEP_WAIT):
                self.violation("checker-error", "the fake GCS did not go idle after the boot")
        for l in launches:
            self.check_launch(l, single=len(launches) == 1)
            l.metadata.stop()
            l.vm.busy = False
        self.watcher.check()

    def check_launch(self, l, single):
        name = l.vm.name
        p = l.proc
        p._out.join(5)  # the pipes close once spotvisor (and, after a kill, its trainer) is gone
        p._err.join(5)
        with open(os.path.join(l.vm.dir, f"spotvisor-{l.boot}.log"), "w") as f:
            f.write("".join(p.raw) + (p.stderr or ""))  # for --keep
        stderr = p.stderr or ""
        for needle in ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer"):
            if needle in stderr:
                self.violation("sanitizer", f"{name}: {stderr[stderr.index(needle):][:600]}")
        if not l.killed:
            left = processes_of(l.vm.dir)
            if left:
                self.violation("stray-process", f"{name}: still running after spotvisor exited: {left}")
                kill_all(l.vm.dir)
        for e in p.find("restore.failed"):
            self.violation("restore-failed", f"{name}: {e.get('error') or e.get('message')}")
        for e in p.find("restore.complete"):
            self.stats["restores"] += 1
        if p.find("run.already_done"):
            self.stats["boots that found DONE"] += 1
        # Only this boot decides: a later boot that restored and committed
        # makes the disk's work the run's again.
        l.vm.fenced = bool(p.find("sync.fenced")) and not single
        for e in p.find("sync.fenced"):
            if single:
                self.violation("sync-failed", f"{name}: fenced though alone on the run-id: {e.get('message')}")
            else:
                self.stats[FENCED] += 1
        stopping = False
        for e in list(p.events):
            if e.get("event") in ("preemption.detected", "signal.received", "trainer.signal", "trainer.exit"):
                stopping = True
            if e.get("event") != "sync.failed":
                continue
            err = e.get("error") or e.get("message", "")
            if not single and ("another VM" in err or "changed since" in err):
                self.stats["commits refused to the second VM"] += 1
            elif stopping and e.get("kind") in ("periodic", "on-demand") and "cancelled" in err:
                self.stats["periodic syncs cancelled by the stop"] += 1
            else:
                self.violation("sync-failed", f"{name}: {e.get('kind')} sync failed: {err}")
        log = l.trainer_log()
        saves = [e["step"] for e in log if e["ev"] == "saved"]
        if saves:
            first = min(e["time"] for e in log if e["ev"] == "saved")
            self.first_mark = first if self.first_mark is None else min(self.first_mark, first)
            mine = self.first_mark_by_vm.get(l.vm.name)
            self.first_mark_by_vm[l.vm.name] = first if mine is None else min(mine, first)
        for e in log:
            if e["ev"] == "crash" and e.get("mid_save"):
                self.torn_possible(e["time"])
        ex = p.find("trainer.exit")
        if ex and ex[0].get("signal") in ("SIGKILL", 9):
            self.torn_possible(time.time() - 1)  # the ladder's SIGKILL: its save may be torn
        self.stats["trainer saves"] += len(saves)
        self.stats["trainer crashes"] += any(e["ev"] == "crash" for e in log)
        self.check_resume(l, log)
        if single and not l.killed and not l.hung:
            self.check_final(l, log, saves)

    def check_resume(self, l, log):
        """(4) the trainer never starts from a state older than the newest
        committed one, nor older than a newer complete state on its own disk
        (unless another VM's commit had fenced this VM off: its work since is
        the branch the run abandoned)."""
        start = [e for e in log if e["ev"] in ("resume", "fresh")]
        if not start:
            return
        e = start[0]
        step = e.get("step") if e["ev"] == "resume" else None
        got = step if step is not None and step >= 0 else 0
        what = f"resumed from step {step}" if e["ev"] == "resume" else "started from scratch (SPOTVISOR_RESUMED=0)"
        if e["ev"] == "resume":
            self.stats["trainer resumes"] += 1
            if e.get("problems") and self.plan["trainer"]["layout"] != "hf":
                self.violation("resumed-inconsistent", f"{l.vm.name}: {what}, the files it found: "
                               + "; ".join(e["problems"]), when=e["time"])
        if l.committed_at_launch is not None and l.committed_at_launch >= 0 and got < l.committed_at_launch:
            self.violation("resumed-older", f"{l.vm.name}: {what}, the bucket held step "
                           f"{l.committed_at_launch} when it booted")
        if l.local_complete is not None and got < l.local_complete:
            self.violation("resume-discarded-local",
                           f"{l.vm.name} (same-VM restart): {what}, its disk held the complete, marked save of "
                           f"step {l.local_complete} (the bucket: step {l.committed_at_launch})")

    def check_final(self, l, log, saves):
        """A spotvisor that ended by itself, alone on the run-id, has committed
        the trainer's last complete save (and DONE after a clean exit)."""
        p = l.proc
        ex = p.find("trainer.exit")
        if not ex:
            return
        if ex[0].get("signal") == "SIGKILL" or ex[0].get("signal") == 9:
            return  # the stop ladder's SIGKILL: the save may be torn, spotvisor's right
        if any(e["ev"] == "crash" and e.get("mid_save") for e in log):
            return  # a torn save on disk: invariant (2) judges what got committed
        resumed = [e for e in log if e["ev"] == "resume"]
        want = saves[-1] if saves else (resumed[0]["step"] if resumed else None)
        if want is None or want < 0:
            return
        latest = self.watcher.check()
        have = latest.step if latest else None
        if have != want:
            self.violation("final-save-lost", f"{l.vm.name}: the trainer's last save was step {want}, the bucket "
                           f"holds step {have} after spotvisor exited {l.exit_code}")
        end = p.find("run.end")
        if end and end[0].get("reason") == "completed" and self.bucket.read(self.plan["run_id"], DONE) is None:
            self.violation("final-save-lost", f"{l.vm.name}: the run completed (the trainer exited 0 by itself) "
                           "but there is no DONE")

    def finish(self, last):
        """End of the run: (1)(2) once more on the final commit, and (5): after
        a clean boot alone on the run-id with a successful final sync, no
        object under checkpoints/ that the manifest does not name."""
        run_id = self.plan["run_id"]
        final = self.watcher.check()
        if final is not None:
            self.stats["final step"] = max(final.step or 0, 0)
            self.stats["final sequence"] = final.sequence
        if self.bucket.read(run_id, DONE) is not None:
            self.stats["runs finished (DONE)"] += 1
        if last and len(last) == 1 and not last[0].killed and not last[0].hung \
                and last[0].proc.find("sync.complete", kind="final"):
            raw = self.bucket.read(run_id, MANIFEST)
            named = {f["object"] for f in json.loads(raw)["files"]} if raw else set()
            orphans = [n for n in self.bucket.list(run_id, OBJECTS) if n not in named]
            if orphans:
                self.violation("leaked-objects", f"{len(orphans)} object(s) under checkpoints/ that the manifest "
                               f"does not name after the last clean run: {orphans[:5]}")
            temps = self.bucket.temp_files(run_id)
            if temps:
                self.violation("leaked-temp-files", f"{len(temps)} half-written upload(s) left in the file "
                               f"bucket: {temps[:5]}")
        left = processes_of(self.tmp)
        if left:
            self.violation("stray-process", f"processes of the run still running at its end: {left}")


def run_one(seed, store, binary, keep, verbose, quick):
    plan = plan_run(seed, store, quick)
    if verbose:
        print(f"run seed={seed}: {describe(plan)}", flush=True)
    start = time.monotonic()
    result = Run(plan, binary, keep, verbose).execute()
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


# ------------------------------------------------------------------- summary

def summarise(results, seconds, store, quick=False, verbose=False):
    stats = collections.Counter()
    violations, unprotected = [], []
    for r in results:
        stats.update(r["stats"])
        violations += r["violations"]
        unprotected += r["unprotected"]
    stats.pop("final step", None)
    stats.pop("final sequence", None)
    lines = [f"soak: {len(results)} run(s) in {seconds:.0f}s",
             f"  boots {stats['boots']}, new VMs {stats['new VMs']}, same-VM restarts {stats['same-VM restarts']}, "
             f"two VMs at once {stats['two VMs at once']}",
             f"  preemptions {stats['preemptions']}, SIGTERMs {stats['SIGTERMs']}, "
             f"kill -9 {sum(v for k, v in stats.items() if k.startswith('kill -9'))} ("
             + ", ".join(f"{k[9:-1]} {v}" for k, v in sorted(stats.items()) if k.startswith("kill -9")) + "), "
             f"trainer crashes {stats['trainer crashes']}",
             "  faults injected: " + (", ".join(f"{k[6:]} {v}" for k, v in sorted(stats.items())
                                                if k.startswith("fault ") and not k.startswith("fault hit")) or "none")
             + "; requests hit: " + (", ".join(f"{k[11:]} {v}" for k, v in sorted(stats.items())
                                               if k.startswith("fault hit: ")) or "none"),
             f"  trainer saves {stats['trainer saves']}, checkpoints committed {stats['commits seen']} "
             f"(distinct manifests seen), restores {stats['restores']}, resumes {stats['trainer resumes']}, "
             f"runs finished {stats['runs finished (DONE)']}, second-VM commits refused "
             f"{stats['commits refused to the second VM']}, VMs fenced off {stats[FENCED]}",
             f"  checkpoints lost (invariant violations): {len(violations)}",
             f"  not counted: {len(unprotected)} inconsistent state(s) spotvisor could not have recognised "
             "(no completion marker yet, sync-settle shorter than the trainer's pauses inside a save, "
             "or a save cut off by a kill or crash)"]
    by_kind = collections.Counter(v["kind"] for v in violations)
    if violations:
        lines.append("  by kind: " + ", ".join(f"{k} {n}" for k, n in by_kind.most_common()))
        lines.append("violations:")
        for v in violations:
            lines.append(f"  seed {v['seed']} boot {v['boot']} [{v['store']}, {v['layout']}, "
                         f"marker {'on' if v['marker'] else 'off'}] {v['kind']}: {v['detail']}")
        if verbose and unprotected:
            lines.append("not counted:")
            for v in unprotected:
                lines.append(f"  seed {v['seed']} boot {v['boot']} [{v['layout']}, {v['why_not_counted']}] "
                             f"{v['kind']}: {v['detail']}")
        seeds = sorted({v["seed"] for v in violations})
        lines.append("replay one with: /usr/bin/python3 tests/soak/soak.py --runs 1 --store "
                     f"{store}{' --quick' if quick else ''} -v --keep --seed SEED   "
                     f"(seeds: {' '.join(map(str, seeds))})")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="how many runs (default 200)")
    ap.add_argument("--seed", type=int, default=None, help="first run's seed (default: random); run i uses seed+i")
    ap.add_argument("--bin", default=os.environ.get("SPOTVISOR_BIN")
                    or os.path.join(ROOT, "build-asan", "daemon", "spotvisor"),
                    help="spotvisor (default $SPOTVISOR_BIN, else build-asan/daemon/spotvisor)")
    ap.add_argument("--store", choices=["gcs", "file", "both"], default="both",
                    help="the fake GCS, a file:// bucket, or either, drawn per run (default)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each in its own process)")
    ap.add_argument("--keep", action="store_true", help="keep every run's temp dir (logs, checkpoint dirs)")
    ap.add_argument("--keep-failed", action="store_true", help="keep the temp dirs of runs with violations")
    ap.add_argument("--quick", action="store_true",
                    help="the short form's scale: shorter training, fewer boots, shorter fault bursts")
    ap.add_argument("--json", help="also write every run's result to this file")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="each run's plan, violations as they happen, boot timings, what is not counted")
    args = ap.parse_args(argv)
    if not os.access(args.bin, os.X_OK):
        print(f"soak: {args.bin} is not an executable spotvisor (--bin, SPOTVISOR_BIN)", file=sys.stderr)
        return 2
    if not os.access(PYTHON, os.X_OK):
        print(f"soak: the trainer needs {PYTHON} (Debian's, with python3-crcmod)", file=sys.stderr)
        return 2
    keep = "all" if args.keep else "failed" if args.keep_failed else None
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"soak: {args.runs} run(s) from seed {seed}, store {args.store}, {args.bin}", flush=True)
    start = time.monotonic()
    results = []
    seeds = [seed + i for i in range(args.runs)]

    def report(r):
        results.append(r)
        status = "ok" if not r["violations"] else f"{len(r['violations'])} violation(s): " + ", ".join(
            sorted({v["kind"] for v in r["violations"]}))
        print(f"run {len(results)}/{args.runs} seed {r['seed']} ({r['seconds']}s) {r['plan']} -> {status}"
              + (f" [kept {r['tmp']}]" if r["tmp"] else ""), flush=True)

    if args.jobs <= 1:
        for s in seeds:
            report(run_one(s, args.store, args.bin, keep, args.verbose, args.quick))
    else:
        ctx = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            futures = [pool.submit(run_one, s, args.store, args.bin, keep, args.verbose, args.quick) for s in seeds]
            for f in concurrent.futures.as_completed(futures):
                report(f.result())
    results.sort(key=lambda r: r["seed"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(summarise(results, time.monotonic() - start, args.store, args.quick, args.verbose), flush=True)
    return 1 if any(r["violations"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

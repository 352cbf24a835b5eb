"""Runs the real spotvisor binary as a black box against the fakes.

Tests wait on conditions (an event logged, a process gone) with a bound,
never on fixed sleeps.
"""
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))

from fake_metadata import FakeMetadataServer  # noqa: E402

SPOTVISOR = os.environ.get("SPOTVISOR_BIN", os.path.join(ROOT, "build", "daemon", "spotvisor"))
FAKE_TRAINER = os.environ.get("FAKE_TRAINER_BIN", os.path.join(ROOT, "build", "tests", "fake_trainer"))
WAIT = 20.0  # generous bound for any single condition; only failures hit it


def rfc3339(seconds_from_now):
    """An RFC 3339 UTC time that far from now (what GCE's metadata server writes)."""
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds_from_now)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def wait_until(predicate, timeout=WAIT, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)  # polling interval of a bounded wait, not a fixed sleep
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Spotvisor:
    """One spotvisor process; its JSON log lines are parsed as they arrive."""

    def __init__(self, args, env=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen([SPOTVISOR] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=full_env)
        self.events = []
        self.raw = []
        self.stderr = ""
        self._cv = threading.Condition()
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._err = threading.Thread(target=self._read_stderr, daemon=True)
        self._out.start()
        self._err.start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            text = line.decode("utf-8", "replace")
            with self._cv:
                self.raw.append(text)
                try:
                    self.events.append(json.loads(text))
                except json.JSONDecodeError:
                    self.events.append({"event": "<not json>", "message": text})
                self._cv.notify_all()

    def _read_stderr(self):
        data = self.proc.stderr.read()
        self.stderr = data.decode("utf-8", "replace")

    def find(self, name, **fields):
        with self._cv:
            return [e for e in self.events if e.get("event") == name
                    and all(e.get(k) == v for k, v in fields.items())]

    def wait_event(self, name, timeout=WAIT, **fields):
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                found = [e for e in self.events if e.get("event") == name
                         and all(e.get(k) == v for k, v in fields.items())]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._out.is_alive()):
                    raise AssertionError(f"no {name} {fields} event; log:\n" + "".join(self.raw[-40:]) + self.stderr)
                self._cv.wait(min(left, 0.2))

    def wait_trainer_ready(self, timeout=WAIT):
        """The fake trainer prints its 'started' line after installing its
        signal handlers; a signal sent before that would just kill it."""
        self.wait_event("trainer.start", timeout)
        deadline = time.monotonic() + timeout
        with self._cv:
            while not any(e.get("event") == "trainer.output" and e.get("message", "").startswith("fake_trainer started")
                          for e in self.events):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError("the fake trainer never said it started; log:\n" + "".join(self.raw[-40:]))
                self._cv.wait(min(left, 0.2))

    def wait_exit(self, timeout=WAIT):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("spotvisor did not exit; log:\n" + "".join(self.raw[-40:]))
        self._out.join(5)
        self._err.join(5)
        return code

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class SpotvisorTestCase(unittest.TestCase):
    """A temp dir, a fake metadata server and helpers to run spotvisor."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spotvisor-it-")
        self.metadata = FakeMetadataServer().start()
        self.addCleanup(self.metadata.stop)
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.procs = []
        self.addCleanup(self._kill_all)

    def _kill_all(self):
        for p in self.procs:
            p.kill()

    def path(self, name):
        return os.path.join(self.tmp, name)

    def base_sets(self, **overrides):
        sets = {"state-dir": self.path("state"), "checkpoint-dir": self.path("ckpt"),
                "stop-timeout": "5s", "kill-timeout": "2s", "metadata-watch-timeout": "5s"}
        sets.update(overrides)
        out = []
        for k, v in sets.items():
            out += ["--set", f"{k}={v}"]
        return out

    def env(self, metadata=True):
        env = {}
        if metadata:
            env["GCE_METADATA_HOST"] = f"127.0.0.1:{self.metadata.port}"
        return env

    def start(self, args, metadata=True, env=None):
        e = self.env(metadata)
        e.update(env or {})
        p = Spotvisor(args, e)
        self.procs.append(p)
        return p

    def run_trainer(self, trainer_args, sets=None, metadata=True, env=None, config=None):
        args = ["run"]
        if config is not None:
            args += ["--config", config]
        args += self.base_sets(**(sets or {})) + ["--", FAKE_TRAINER] + trainer_args
        return self.start(args, metadata, env)

    def write_config(self, text, name="spotvisor.conf"):
        p = self.path(name)
        with open(p, "w") as f:
            f.write(text)
        return p

    def read(self, name):
        with open(self.path(name)) as f:
            return f.read()

    def marker_lines(self, name="marker"):
        try:
            with open(self.path(name)) as f:
                return [l.strip() for l in f if l.strip()]
        except FileNotFoundError:
            return []

    def wait_parked(self, path="instance/preempted"):
        """The watcher's long-poll is parked at the fake: a flip now is seen by it."""
        self.assertTrue(self.metadata.wait_for_waiters(path, 1, WAIT), f"no long-poll parked on {path}")

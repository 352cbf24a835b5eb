"""The checkpoint-integrity soak (tests/soak/soak.py, issue #11) in its short
form: 12 runs from a fixed seed at the quick scale, two at a time. Fails if
any invariant breaks; the soak's report (each violation with its run's seed,
and how to replay it) is the failure message.

The seed was picked because its 12 runs cover every layout, with and without
the completion marker, both stores, kill -9 at every trigger (mid-restore,
-upload, -commit, -delete, -final sync, at a random time), preemptions,
SIGTERM, two VMs on one run-id, a trainer crash mid-save, 503/429 bursts,
slow requests and lost answers on uploads, deletes and the manifest commit.
About 50 s on 2 cores with the ASan build.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from harness import ROOT, SPOTVISOR, pid_alive

SEED = 2232
RUNS = 12
BOUND = 240  # seconds; ctest gives the test 300


def processes_mentioning(token):
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read() and int(pid) != os.getpid() and pid_alive(int(pid)):
                    out.append(int(pid))
        except (OSError, ValueError):
            pass
    return out


class SoakShortTest(unittest.TestCase):
    def setUp(self):
        # Every run's files (and so every process's command line) are under
        # this directory: what is left of a soak cut short is found by it.
        self.tmp = tempfile.mkdtemp(prefix="spotvisor-soak-short-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.addCleanup(self.kill_leftovers)

    def kill_leftovers(self):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = processes_mentioning(self.tmp)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)  # polling interval of a bounded wait

    def test_checkpoint_integrity_soak(self):
        cmd = ["/usr/bin/python3", os.path.join(ROOT, "tests", "soak", "soak.py"), "--runs", str(RUNS),
               "--seed", str(SEED), "--quick", "--jobs", "2", "--store", "both", "--bin", SPOTVISOR]
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TMPDIR=self.tmp)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            self.fail(f"the soak did not finish within {BOUND}s:\n{out}")
        self.assertEqual(proc.returncode, 0, "the soak found broken invariants:\n" + out)
        sys.stdout.write(out[-2000:])  # the summary, for the ctest log


if __name__ == "__main__":
    unittest.main()

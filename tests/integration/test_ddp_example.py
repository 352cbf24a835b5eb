"""examples/ddp_train.py in a gang of three ranks on 127.0.0.1, started by hand as spotvisor would.

No spotvisor here: the test sets the gang environment spotvisor gives each member (env:// names
for one process per node, SPOTVISOR_GANG_*, a checkpoint dir per member), sends SIGINT to every
member as spotvisor does when any one is preempted, and plays spotvisor's restore by copying
rank 0's checkpoint into every member's dir. The data are seeded per (step, rank), so the
resumed gang must end with exactly the weights of a gang that never stopped. Needs PyTorch in Debian's /usr/bin/python3
(apt-get install python3-torch); skipped without it. Every wait is bounded; a rank still
running at the end is killed.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_train.py")
PYTHON = "/usr/bin/python3"  # the example's shebang: the interpreter that has Debian's torch
WAIT = 30.0  # bound for any single condition (torch's import alone takes seconds on a busy machine)
WORLD = 3
STEPS = 60
STEP_TIME = "0.03"


def has_torch():
    if not os.access(PYTHON, os.X_OK):
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    return subprocess.run([PYTHON, "-c", probe], stdin=subprocess.DEVNULL).returncode == 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    """One trainer process; its output lines (stdout and stderr) are collected as they arrive."""

    def __init__(self, rank, env, args):
        self.rank = rank
        self.lines = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen([PYTHON, EXAMPLE] + args, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def output(self):
        with self.cond:
            return "\n".join(self.lines)

    def wait_line(self, pattern, timeout=WAIT):
        """The first match of pattern in this rank's output, waiting for it at most timeout."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    m = regex.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    raise AssertionError(f"rank {self.rank}: no line matching {pattern!r} within {timeout}s; "
                                         f"output:\n" + "\n".join(self.lines[-30:]))
                self.cond.wait(min(left, 0.2))

    def matches(self, pattern):
        regex = re.compile(pattern)
        with self.cond:
            return [m for m in (regex.search(l) for l in self.lines) if m]

    def wait_exit(self, timeout=WAIT):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rank {self.rank} still running after {timeout}s; output:\n{self.output()}")
        self.reader.join(WAIT)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(WAIT)
        self.proc.stdout.close()


@unittest.skipUnless(has_torch(), f"needs PyTorch in {PYTHON} (apt-get install python3-torch)")
class DdpExampleTest(unittest.TestCase):
    through = None  # the weights checksum of the uninterrupted run, shared by tests a and b

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spotvisor-ddp-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.ranks = []
        self.addCleanup(self._kill_all)

    def _kill_all(self):
        for r in self.ranks:
            r.kill()

    def ckpt_dir(self, name, rank):
        return os.path.join(self.tmp, name, f"rank{rank}", "checkpoints")

    def env(self, rank, name, port, generation=1, resumed=False, **overrides):
        """What spotvisor sets for gang member `rank` (plus overrides; None removes a name)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SPOTVISOR_") and k not in
               ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NNODES", "NODE_RANK")}
        hosts = ["127.0.0.1"] * WORLD
        hostfile = os.path.join(self.tmp, "hostfile")
        with open(hostfile, "w") as f:
            f.writelines(f"{h} slots=1\n" for h in hosts)
        env.update({
            "SPOTVISOR_GANG": "ddp-test", "SPOTVISOR_GANG_RANK": str(rank), "SPOTVISOR_GANG_SIZE": str(WORLD),
            "SPOTVISOR_GANG_GENERATION": str(generation), "SPOTVISOR_GANG_HOSTS": ",".join(hosts),
            "SPOTVISOR_GANG_HOSTFILE": hostfile,
            "MASTER_ADDR": hosts[0], "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(WORLD),
            "LOCAL_RANK": "0", "NNODES": str(WORLD), "NODE_RANK": str(rank),
            "SPOTVISOR_CHECKPOINT_DIR": self.ckpt_dir(name, rank),
            "SPOTVISOR_RESUMED": "1" if resumed else "0", "SPOTVISOR_RUN_ID": name,
            "OMP_NUM_THREADS": "1",  # three ranks on a 2-core machine
            "PYTHONDONTWRITEBYTECODE": "1",
        })
        for k, v in overrides.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def start_gang(self, name, generation=1, resumed=False):
        port = free_port()
        args = ["--steps", str(STEPS), "--step-time", STEP_TIME, "--save-every", "10"]
        gang = []
        for rank in range(WORLD):
            os.makedirs(self.ckpt_dir(name, rank), exist_ok=True)
            gang.append(Rank(rank, self.env(rank, name, port, generation, resumed), args))
            gang[-1].port = port
        self.ranks.extend(gang)
        return gang

    def assert_start(self, gang, generation, resumed, start_step):
        for r in gang:
            m = r.wait_line(r"^ddp: rank=(\d+) world=(\d+) generation=(\d+) master=([\d.]+):(\d+) "
                            r"resumed=(\d) start_step=(\d+)")
            self.assertEqual(m.groups(), (str(r.rank), str(WORLD), str(generation), "127.0.0.1", str(r.port),
                                          str(int(resumed)), str(start_step)), m.group(0))

    def assert_finished(self, gang, name):
        """All ranks exit 0 at STEPS with the same weights, rank 0's final checkpoint saved; returns the checksum."""
        sums = set()
        for r in gang:
            self.assertEqual(r.wait_exit(), 0, r.output())
            m = r.wait_line(r"^ddp: rank=\d+ done step=(\d+) loss=\S+ checksum=(\S+)$", timeout=0)
            self.assertEqual(int(m.group(1)), STEPS)
            sums.add(m.group(2))
        self.assertEqual(len(sums), 1, f"DDP keeps every rank's weights equal: {sums}")
        saved = [int(m.group(1)) for m in gang[0].matches(r"^ddp: rank=0 saved step=(\d+) ")]
        self.assertEqual(saved[-1], STEPS, gang[0].output())
        self.assertTrue(os.path.exists(os.path.join(self.ckpt_dir(name, 0), "ddp.ckpt")))
        return sums.pop()

    def run_through(self):
        """The uninterrupted run, once per class: its checksum is what a resumed run must end with."""
        if DdpExampleTest.through is None:
            gang = self.start_gang("through")
            self.assert_start(gang, generation=1, resumed=False, start_step=0)
            DdpExampleTest.through = self.assert_finished(gang, "through")
        return DdpExampleTest.through

    def test_a_training_to_the_end_exits_0_on_every_rank(self):
        self.run_through()

    def test_b_sigint_stops_every_rank_after_the_same_step_and_the_gang_resumes_there(self):
        gang = self.start_gang("preempted")
        self.assert_start(gang, generation=1, resumed=False, start_step=0)
        for r in gang:  # every rank is training (not still importing torch)
            r.wait_line(r"^ddp: rank=\d+ step=3 ")
        for r in gang:  # spotvisor signals every member at about the same time
            r.proc.send_signal(signal.SIGINT)
        stopped = set()
        for r in gang:
            self.assertEqual(r.wait_exit(), 130, r.output())
            stopped.add(int(r.wait_line(r"^ddp: rank=\d+ stopped step=(\d+) exit=130$", timeout=0).group(1)))
        self.assertEqual(len(stopped), 1, f"every rank stops after the same step: {stopped}")
        step = stopped.pop()
        self.assertTrue(3 <= step < STEPS, step)
        for r in gang:
            last = max(int(m.group(1)) for m in r.matches(r"^ddp: rank=\d+ step=(\d+) "))
            self.assertEqual(last, step, f"rank {r.rank} trained no step past the one all stopped after")
        saved = [int(m.group(1)) for m in gang[0].matches(r"^ddp: rank=0 saved step=(\d+) ")]
        self.assertEqual(saved[-1], step, gang[0].output())
        ckpt = os.path.join(self.ckpt_dir("preempted", 0), "ddp.ckpt")
        self.assertTrue(os.path.exists(ckpt))
        self.assertFalse(os.path.exists(ckpt + ".tmp"))
        for rank in range(1, WORLD):
            self.assertEqual(os.listdir(self.ckpt_dir("preempted", rank)), [], "only rank 0 saves")

        # spotvisor's restore: rank 0's checkpoint into every member's dir, then generation 2.
        for rank in range(1, WORLD):
            shutil.copy2(ckpt, self.ckpt_dir("preempted", rank))
        gang = self.start_gang("preempted", generation=2, resumed=True)
        self.assert_start(gang, generation=2, resumed=True, start_step=step)
        for r in gang:
            self.assertEqual(int(r.wait_line(r"^ddp: rank=\d+ step=(\d+) ").group(1)), step + 1,
                             "the first step after the resume is the one after the saved step")
        checksum = self.assert_finished(gang, "preempted")
        self.assertEqual(checksum, self.run_through(),
                         "model and optimizer state resume exactly: the same weights as a run that never stopped")

    def test_c_wrong_environment_exits_2_saying_what_is_wrong(self):
        cases = {
            "RANK differs": ({"RANK": "1"}, "ranks differ: RANK=1, SPOTVISOR_GANG_RANK=0, NODE_RANK=0"),
            "NNODES differs": ({"NNODES": "2"}, "sizes differ: WORLD_SIZE=3, SPOTVISOR_GANG_SIZE=3, NNODES=2"),
            "LOCAL_RANK": ({"LOCAL_RANK": "1"}, "LOCAL_RANK=1, expected 0"),
            "MASTER_ADDR": ({"MASTER_ADDR": "127.0.0.2"}, "MASTER_ADDR=127.0.0.2 is not the first of"),
        }
        for what, (overrides, message) in cases.items():
            with self.subTest(what):
                out = subprocess.run([PYTHON, EXAMPLE, "--steps", "1"], env=self.env(0, "wrong", free_port(), **overrides),
                                     stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT)
                self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
                self.assertIn("ddp: environment error: " + message, out.stderr)
                self.assertNotIn("start_step", out.stdout, "it fails before joining the gang")


if __name__ == "__main__":
    unittest.main()

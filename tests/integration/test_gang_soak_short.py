"""The gang soak (tests/soak/gang_soak.py, issue #28) in its short form: 5
runs from a fixed seed at the quick scale. Fails if any invariant breaks; the
soak's report (each violation with its run's seed, and how to replay it) is
the failure message.

The seed was picked because its 5 runs cover both checkpoint modes (all,
leader) and every fault: a preemption, kill -9 of a member, kill -9 of rank 0
during its final sync, kill -9 of a member during its restore on the way back,
a spotvisor restart on the same boot, etcd restarted
and wiped, a resize, and gc and pull beside the live gang. About 60 s on 2
cores with the ASan build.
"""
import os
import shutil
import subprocess
import sys
import unittest

from harness import ROOT, SPOTVISOR

SEED = 114
RUNS = 5


@unittest.skipUnless(shutil.which("etcd") or os.path.exists("/usr/bin/etcd"), "needs etcd (Debian's etcd-server)")
class GangSoakShort(unittest.TestCase):
    def test_short_gang_soak_finds_no_violation(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "soak", "gang_soak.py"), "--runs", str(RUNS),
                            "--seed", str(SEED), "--quick", "--bin", SPOTVISOR],
                           capture_output=True, text=True, timeout=280)
        self.assertEqual(r.returncode, 0, r.stdout[-6000:] + r.stderr[-3000:])
        self.assertIn(f"gang soak: {RUNS} run(s)", r.stdout)
        self.assertIn("0 run(s) with violations", r.stdout)


if __name__ == "__main__":
    unittest.main()

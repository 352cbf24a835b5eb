"""Runs that finish by themselves (issue #30): a VM in a managed instance group
or an Auto Scaling group leaves it when the run is over, a failed boot within
max-failed-boots is handed back to the group for another try, and a run that
fails at every boot is marked failed in the bucket and ends at once after.

The cloud side is the project's fakes (tests/fakes/fake_compute.py,
fake_autoscaling.py, fake_metadata.py, fake_imds.py); spotvisor finds them
through its documented overrides (GCE_METADATA_HOST, compute-endpoint,
AWS_ENDPOINT_URL_AUTO_SCALING)."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))
from harness import SpotvisorTestCase  # noqa: E402


class BudgetTest(SpotvisorTestCase):
    """max-failed-boots, counted from the run's boot records in the bucket."""

    def boot(self, trainer, **sets):
        base = {"bucket": "file://" + self.path("bucket"), "run-id": "run1", "on-exit": "poweroff",
                "shutdown-command": f"echo off >> {self.path('off')}", "on-exit-timeout": "6s"}
        base.update(sets)
        p = self.run_trainer(trainer, sets=base)
        return p, p.wait_exit()

    def failed_marker(self):
        path = self.path("bucket/run1/FAILED")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def test_a_run_that_fails_at_every_boot_is_marked_failed_and_later_boots_end_at_once(self):
        for n in (1, 2):
            p, code = self.boot(["--run-for", "10", "--exit-code", "3"])
            self.assertEqual(code, 3)
            w = p.wait_event("run.failed_boot")
            self.assertEqual((w["failed_in_a_row"], w["max_failed_boots"]), (n, 3))
            self.assertIsNone(self.failed_marker())
        p, code = self.boot(["--run-for", "10", "--exit-code", "3"])
        self.assertEqual(code, 3)
        marked = p.wait_event("run.marked_failed")
        self.assertEqual(marked["failed_in_a_row"], 3)
        marker = self.failed_marker()
        self.assertIsNotNone(marker, "RUN_ID/FAILED written beside DONE")
        self.assertEqual(len(marker["failed_boots"]), 3)
        self.assertEqual(marker["reason"], "failed")
        # Every later boot: no trainer, run-failed, exit 76, on-exit (failure).
        p, code = self.boot(["--run-for", "10", "--marker-file", self.path("marker")])
        self.assertEqual(code, 76)
        self.assertEqual(p.wait_event("run.end")["reason"], "run-failed")
        self.assertIn("FAILED", p.wait_event("run.marked_failed")["message"])
        self.assertEqual(self.marker_lines(), [], "the trainer never ran")
        self.assertEqual(self.read("off").count("off"), 4, "each boot powered off (no group here)")
        self.assertEqual(self.failed_marker(), marker, "the marker is written once")

    def test_a_good_ending_resets_the_count_and_a_preemption_does_not(self):
        self.boot(["--run-for", "10", "--exit-code", "3"])
        # Ends as max-runtime: a good ending, the count starts again.
        self.boot(["--run-for", "60000"], **{"max-runtime": "1s"})
        self.boot(["--run-for", "10", "--exit-code", "3"])
        # A preempted boot neither counts nor resets.
        p = self.run_trainer(["--run-for", "60000", "--marker-file", self.path("marker")],
                             sets={"bucket": "file://" + self.path("bucket"), "run-id": "run1"})
        p.wait_trainer_ready()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_exit()
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
        self.metadata.set("instance/preempted", "FALSE")
        p, _ = self.boot(["--run-for", "10", "--exit-code", "3"])
        self.assertEqual(p.wait_event("run.failed_boot")["failed_in_a_row"], 2)
        self.assertIsNone(self.failed_marker())
        p, _ = self.boot(["--run-for", "10", "--exit-code", "3"])
        p.wait_event("run.marked_failed")
        self.assertEqual(len(self.failed_marker()["failed_boots"]), 3)

    def test_max_failed_boots_0_never_marks_the_run(self):
        for _ in range(2):
            p, _ = self.boot(["--run-for", "10", "--exit-code", "3"], **{"max-failed-boots": "1"} if _ else {"max-failed-boots": "0"})
        # The second boot, with a limit of 1, uses it up at once.
        p.wait_event("run.marked_failed")
        os.remove(self.path("bucket/run1/FAILED"))
        p, code = self.boot(["--run-for", "10", "--exit-code", "3"], **{"max-failed-boots": "0"})
        self.assertEqual(code, 3)
        self.assertEqual(p.wait_event("run.failed_boot")["max_failed_boots"], 0)
        self.assertIsNone(self.failed_marker())


if __name__ == "__main__":
    unittest.main()

"""GCE's own limits (issue #14): a preemption notice gives the final sync the
notice plus the window, from preemption-notice or from instance/scheduling/;
--termination-time / --max-run-duration there make spotvisor say which
max-runtime lets the trainer stop with a save first."""
import unittest

from harness import SpotvisorTestCase, rfc3339


class GceLimitsTest(SpotvisorTestCase):
    def vm(self, trainer_args, **sets):
        base = {"bucket": f"file://{self.path('bucket')}", "run-id": "run1", "sync-interval": "0",
                "sync-settle": "0s"}
        base.update(sets)
        return self.run_trainer(trainer_args, sets=base)

    def final_sync_deadline(self, **sets):
        """Preempt a running trainer; the seconds the final sync was given."""
        p = self.vm(["--checkpoint-every", "100"], **sets)
        p.wait_trainer_ready()
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        sig = p.wait_event("trainer.signal")
        self.assertEqual(sig["signal"], "SIGINT")  # at once, notice or not
        p.wait_exit()
        syncing = [e for e in p.find("supervisor.state") if e.get("to") == "syncing"]
        self.assertEqual(len(syncing), 1)
        return p, syncing[0]["deadline_s"]

    def test_without_a_notice_the_final_sync_has_the_30s_window(self):
        _, left = self.final_sync_deadline()
        self.assertGreater(left, 20)
        self.assertLessEqual(left, 27)

    def test_preemption_notice_gives_the_final_sync_the_notice_plus_the_window(self):
        p, left = self.final_sync_deadline(**{"preemption-notice": "20s"})
        self.assertGreater(left, 40)
        self.assertLessEqual(left, 47)  # 20 s + 30 s - 3 s
        self.assertEqual(p.wait_event("preemption.detected")["notice_s"], 20)

    def test_the_notice_is_read_from_instance_scheduling_when_the_server_gives_it(self):
        self.metadata.set("instance/scheduling/preemption-notice-duration", "20s")
        p, left = self.final_sync_deadline()
        self.assertGreater(left, 40)
        self.assertLessEqual(left, 47)
        limits = p.wait_event("scheduling.limits")
        self.assertEqual(limits["preemption_notice_s"], 20)

    def test_a_termination_time_without_max_runtime_is_a_warning_naming_the_value_to_set(self):
        end = rfc3339(6 * 3600)
        self.metadata.set("instance/scheduling/termination-time", end)
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        self.assertEqual(p.wait_event("scheduling.limits")["termination_time"], end)
        warnings = [e["message"] for e in p.find("config.warning") if "GCE ends this VM" in e["message"]]
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("max-runtime is not set", warnings[0])
        self.assertRegex(warnings[0], r"set spotvisor-max-runtime to at most 5h5\dm")
        # A max-runtime that stops the trainer in time: no warning.
        q = self.vm(["--run-for", "10"], **{"max-runtime": "5h"})
        self.assertEqual(q.wait_exit(), 0)
        self.assertFalse([e for e in q.find("config.warning") if "GCE ends this VM" in e["message"]])


if __name__ == "__main__":
    unittest.main()

"""instance/upcoming-maintenance (issue #14): every way a server says nothing
is scheduled is quiet; a window for a maintenance that will stop the VM makes
spotvisor sync at once and stop the trainer maintenance-stop-before it."""
import json
import os
import signal
import time
import unittest

from harness import SpotvisorTestCase, rfc3339, wait_until

PATH = "instance/upcoming-maintenance"



class UpcomingMaintenanceTest(SpotvisorTestCase):
    def vm(self, trainer_args, **sets):
        base = {"bucket": f"file://{self.path('bucket')}", "run-id": "run1", "sync-interval": "0",
                "sync-settle": "0s"}
        base.update(sets)
        return self.run_trainer(trainer_args, sets=base)

    def test_each_way_of_saying_nothing_is_scheduled_is_quiet(self):
        for form in ("404", "503", "NONE"):  # the key is absent for the first two
            with self.subTest(form=form):
                if form == "NONE":
                    self.metadata.set(PATH, "NONE")
                else:
                    self.metadata.set_no_maintenance_answer(form)
                before = self.metadata.hits(PATH)
                # The trainer runs until the watcher has asked (a run that ends first never needs to:
                # a fixed 1.5 s run was shorter than a loaded machine's start-up, a flaky test).
                p = self.vm(["--run-for", "60000"])
                wait_until(lambda: self.metadata.hits(PATH) > before, what="upcoming-maintenance to be asked")
                p.signal(signal.SIGTERM)
                p.wait_exit()
                self.assertFalse([e for e in p.find("metadata.unavailable") if PATH in e.get("path", "")])
                self.assertFalse(p.find("maintenance.scheduled"))
                self.assertFalse(p.find("maintenance.unreadable"))

    def test_a_window_syncs_now_and_stops_the_trainer_before_it_opens(self):
        self.metadata.set(PATH, "NONE")
        p = self.vm(["--checkpoint-every", "200"], **{"maintenance-stop-before": "3s"})
        p.wait_trainer_ready()
        self.assertTrue(self.metadata.wait_for_waiters(PATH, 1, 20), "no long-poll parked on upcoming-maintenance")
        window_start = rfc3339(5)
        self.metadata.set(PATH, json.dumps({
            "type": "SCHEDULED", "maintenanceStatus": "PENDING", "canReschedule": True,
            "windowStartTime": window_start, "windowEndTime": rfc3339(3600),
            "maintenanceReasons": ["FAILURE_GPU_XID"]}))
        announced = time.monotonic()
        ev = p.wait_event("maintenance.scheduled")
        self.assertEqual(ev["severity"], "NOTICE")
        self.assertEqual(ev["reasons"], ["FAILURE_GPU_XID"])
        self.assertEqual(ev["window_start"], window_start)
        self.assertTrue(ev["can_reschedule"])
        self.assertGreater(ev["stop_in_s"], 0.5)
        self.assertLess(ev["stop_in_s"], 3)
        self.assertIn("FAILURE_GPU_XID", ev["message"])
        # Synced at once, while the trainer keeps training.
        p.wait_event("sync.complete", kind="maintenance")
        sig = p.wait_event("trainer.signal")
        self.assertEqual(sig["signal"], "SIGINT")
        # Not an hour early, not at the window: maintenance-stop-before it.
        self.assertGreater(time.monotonic() - announced, 1.0)
        p.wait_exit()
        self.assertEqual(p.wait_event("run.end")["reason"], "maintenance")
        p.wait_event("sync.complete", kind="final")

    def test_a_live_migration_is_only_logged(self):
        self.metadata.set("instance/scheduling/on-host-maintenance", "MIGRATE")
        self.metadata.set(PATH, json.dumps({"type": "SCHEDULED", "maintenanceStatus": "PENDING",
                                            "windowStartTime": rfc3339(1), "windowEndTime": rfc3339(3600)}))
        p = self.vm(["--run-for", "2500"])
        ev = p.wait_event("maintenance.scheduled")
        self.assertIn("live-migrated", ev["message"])
        self.assertEqual(ev["on_host_maintenance"], "MIGRATE")
        self.assertEqual(p.wait_exit(), 0)
        self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        self.assertFalse(p.find("trainer.signal"))

    def test_an_unreadable_answer_is_a_warning_and_nothing_else(self):
        self.metadata.set(PATH, "{not json")
        p = self.vm(["--run-for", "1500"])
        w = p.wait_event("maintenance.unreadable")
        self.assertIn("upcoming-maintenance", w["message"])
        self.assertEqual(p.wait_exit(), 0)


if __name__ == "__main__":
    unittest.main()

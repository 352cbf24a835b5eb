"""Preemption reaches the trainer as SIGINT, however the metadata server behaves."""
import os
import time
import unittest

from harness import SpotvisorTestCase, FAKE_TRAINER, wait_until


class PreemptionTest(SpotvisorTestCase):
    def start_trainer(self, **sets):
        # The real 60s poll timeout: a watcher that lost track of the ETag
        # would only notice a flip when its poll times out, well after WAIT.
        sets.setdefault("metadata-watch-timeout", "60s")
        p = self.run_trainer(["--marker-file", self.path("marker"), "--sigint-exit-delay", "100"], sets=sets)
        p.wait_trainer_ready()
        return p

    def end_parked_poll(self):
        """Deleting the key answers the parked long-poll with 404 at once."""
        self.metadata.delete("instance/preempted")

    def assert_preempted(self, p):
        code = p.wait_exit()
        self.assertEqual(code, 130, "the trainer's own SIGINT exit code is passed through")
        self.assertTrue(any(l.startswith("sigint ") for l in self.marker_lines()), self.marker_lines())
        sig = p.wait_event("trainer.signal")
        self.assertEqual(sig["signal"], "SIGINT")
        end = p.wait_event("run.end")
        self.assertEqual(end["reason"], "preempted")
        self.assertEqual(end["exit_code"], 130)
        self.assertFalse(p.find("trainer.signal", signal="SIGTERM"), "a trainer that stops on SIGINT is not escalated")

    def test_preemption_sends_sigint_to_the_trainer(self):
        p = self.start_trainer()
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_event("preemption.detected")
        self.assert_preempted(p)
        # The watcher sent last_etag: that is what makes a missed change impossible.
        polls = [e for e in self.metadata.log() if e["path"].endswith("instance/preempted")
                 and e["query"].get("wait_for_change") == "true"]
        self.assertTrue(polls and all("last_etag" in e["query"] for e in polls), polls[:3])

    def test_change_while_the_watcher_is_between_polls_after_503s(self):
        # With every poll answered 503, the watcher sits in backoff between
        # requests when the flip happens: no long-poll is parked to see it.
        # Only last_etag makes the next poll answer at once.
        p = self.start_trainer()
        self.wait_parked()
        self.metadata.fault("status", code=503, path_prefix="instance/preempted")
        self.metadata.reset_log()
        self.end_parked_poll()
        self.assertTrue(self.metadata.wait_for_hits("instance/preempted", 3, 20))
        self.assertEqual(self.metadata.waiters("instance/preempted"), 0)
        self.metadata.set("instance/preempted", "TRUE")
        self.metadata.fault("none")
        self.assert_preempted(p)
        p.wait_event("metadata.unavailable", path="instance/preempted")
        self.assertEqual(len(p.find("metadata.unavailable", path="instance/preempted")), 1,
                         "logged once per failure streak, not once per retry")
        p.wait_event("metadata.recovered", path="instance/preempted")

    def test_preemption_during_refused_connections(self):
        p = self.start_trainer()
        self.wait_parked()
        self.metadata.fault("refuse")  # also drops the parked long-poll
        self.metadata.set("instance/preempted", "TRUE")
        self.assertTrue(p.wait_event("metadata.unavailable", path="instance/preempted"))
        self.metadata.fault("none")
        self.assert_preempted(p)

    def test_preemption_while_the_server_hangs(self):
        # metadata-watch-timeout=1s gives an HTTP timeout of 2s: a hung server
        # is abandoned and the watcher reconnects with its old ETag.
        p = self.start_trainer(**{"metadata-watch-timeout": "1s"})
        self.wait_parked()
        self.metadata.fault("hang")
        self.assertTrue(self.metadata.wait_for_hung("instance/preempted", 1, 20))
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_event("metadata.unavailable", path="instance/preempted")
        self.metadata.fault("none")
        self.assert_preempted(p)

    def test_preemption_with_resets(self):
        p = self.start_trainer()
        self.wait_parked()
        self.metadata.fault("reset")
        self.end_parked_poll()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_event("metadata.unavailable", path="instance/preempted")
        self.metadata.fault("none")
        self.assert_preempted(p)

    def test_responses_without_metadata_flavor_are_not_believed(self):
        p = self.start_trainer()
        self.wait_parked()
        self.metadata.fault("no-flavor")  # answers from now on lack the header
        self.end_parked_poll()
        e = p.wait_event("metadata.unavailable", path="instance/preempted")
        self.assertIn("Metadata-Flavor", e["error"])
        self.metadata.set("instance/preempted", "TRUE")
        self.metadata.fault("none")
        self.assert_preempted(p)

    def test_a_trainer_flooding_its_output_is_still_stopped(self):
        p = self.run_trainer(["--marker-file", self.path("marker"), "--flood", "3000000"])
        p.wait_event("trainer.output")
        self.wait_parked()
        flipped_ns = time.time_ns()
        self.metadata.set("instance/preempted", "TRUE")
        # The fake trainer keeps flooding until it is done (then it would exit
        # 130), so it may well be SIGKILLed; what matters is that the flood
        # did not keep spotvisor from delivering SIGINT well inside the ladder.
        self.assertIn(p.wait_exit(), (130, 137))
        sigint = [l for l in self.marker_lines() if l.startswith("sigint ")]
        self.assertTrue(sigint, self.marker_lines())
        handled_ns = int(sigint[0].split("realtime_ns=")[1].split()[0])
        self.assertLess((handled_ns - flipped_ns) / 1e9, 5.0, "SIGINT arrived after stop-timeout")

    def test_already_preempted_at_startup_never_starts_the_trainer(self):
        self.metadata.set("instance/preempted", "TRUE")
        p = self.run_trainer(["--marker-file", self.path("marker")])
        self.assertEqual(p.wait_exit(), 75)
        self.assertFalse(p.find("trainer.start"))
        self.assertEqual(self.marker_lines(), [])
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")

    def test_terminate_maintenance_stops_the_trainer_and_migrate_does_not(self):
        p = self.start_trainer()
        self.wait_parked("instance/maintenance-event")
        self.metadata.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        p.wait_event("maintenance.event")
        self.wait_parked("instance/maintenance-event")
        self.assertIsNone(p.proc.poll())
        self.assertEqual(self.marker_lines()[1:], [], "MIGRATE does not signal the trainer")
        self.metadata.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        self.assertEqual(p.wait_exit(), 130)
        self.assertEqual(p.wait_event("run.end")["reason"], "maintenance")

    def test_sigterm_to_spotvisor_stops_the_trainer_and_skips_on_exit(self):
        import signal
        p = self.start_trainer(**{"on-exit": "poweroff", "shutdown-command": f"echo ran >> {self.path('shutdown')}"})
        p.signal(signal.SIGTERM)
        self.assertEqual(p.wait_exit(), 130)
        self.assertTrue(any(l.startswith("sigint ") for l in self.marker_lines()))
        self.assertEqual(p.wait_event("run.end")["reason"], "stopped")
        p.wait_event("shutdown.skipped")
        self.assertFalse(os.path.exists(self.path("shutdown")))


if __name__ == "__main__":
    unittest.main()

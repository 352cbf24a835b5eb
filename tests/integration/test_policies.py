"""Run policies through the real binary: restarts, max-runtime, maintenance notices (issue #7)."""
import os
import unittest

from harness import SpotvisorTestCase


class PolicyTest(SpotvisorTestCase):
    def test_a_crashing_trainer_is_restarted_until_max_restarts(self):
        p = self.run_trainer(["--print-env", "--run-for", "10", "--exit-code", "3"],
                             sets={"restart": "on-failure", "max-restarts": "2", "restart-delay": "100ms"})
        self.assertEqual(p.wait_exit(), 3)
        starts = p.find("trainer.start")
        self.assertEqual([s["restart_count"] for s in starts], [0, 1, 2])
        counts = [e["message"] for e in p.find("trainer.output") if e["message"].startswith("SPOTVISOR_RESTART_COUNT=")]
        self.assertEqual(counts, ["SPOTVISOR_RESTART_COUNT=0", "SPOTVISOR_RESTART_COUNT=1", "SPOTVISOR_RESTART_COUNT=2"])
        resumed = [e["message"] for e in p.find("trainer.output") if e["message"].startswith("SPOTVISOR_RESUMED=")]
        self.assertEqual(resumed, ["SPOTVISOR_RESUMED=0", "SPOTVISOR_RESUMED=1", "SPOTVISOR_RESUMED=1"])
        scheduled = p.find("restart.scheduled")
        self.assertEqual([s["delay_s"] for s in scheduled], [0.1, 0.2], "quick crashes double the delay")
        p.wait_event("restart.exhausted")
        self.assertEqual(p.wait_event("run.end")["reason"], "failed")

    def test_restarts_sync_first_and_a_clean_exit_ends_the_run(self):
        # The trainer fails the first time and succeeds the second (it checks for
        # the checkpoint it left behind).
        script = ('if [ -e "$SPOTVISOR_CHECKPOINT_DIR/first" ]; then echo second; exit 0; fi; '
                  'echo x > "$SPOTVISOR_CHECKPOINT_DIR/first"; exit 5')
        p = self.start(["run"] + self.base_sets(**{"restart": "on-failure", "restart-delay": "100ms",
                                                   "bucket": f"file://{self.path('bucket')}", "run-id": "r",
                                                   "sync-settle": "1h", "sync-interval": "0"})
                       + ["--", "/bin/sh", "-c", script])
        self.assertEqual(p.wait_exit(), 0)
        sync = p.wait_event("sync.complete", kind="restart")
        self.assertEqual(sync["files_uploaded"], 1, "the crashed trainer's checkpoint is synced before the restart")
        self.assertEqual(sync["files_deferred"], 0, "sync-settle does not hold back a dead trainer's checkpoint")
        names = [e["event"] for e in p.events]
        self.assertLess(names.index("sync.complete"), [i for i, n in enumerate(names) if n == "trainer.start"][1])
        self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        self.assertTrue(os.path.exists(self.path("bucket/r/DONE")))

    def test_max_runtime_stops_the_trainer_gracefully(self):
        p = self.run_trainer(["--marker-file", self.path("marker"), "--checkpoint-every", "100"], sets={
            "max-runtime": "1s", "bucket": f"file://{self.path('bucket')}", "run-id": "r", "sync-interval": "0"})
        self.assertEqual(p.wait_exit(), 130)
        final = p.wait_event("sync.complete", kind="final")
        self.assertGreaterEqual(final["files"], 1, "the final sync ran after the max-runtime stop")
        self.assertFalse(os.path.exists(self.path("bucket/r/DONE")), "stopped by max-runtime: not done")
        p.wait_event("run.max_runtime")
        self.assertTrue(any(l.startswith("sigint ") for l in self.marker_lines()))
        self.assertEqual(p.wait_event("run.end")["reason"], "max-runtime")

    def test_a_maintenance_notice_syncs_now_and_stops_at_the_lead_time(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w")
        p = self.run_trainer(["--marker-file", self.path("marker")], sets={
            "maintenance-stop-lead": "1500ms", "bucket": f"file://{self.path('bucket')}", "run-id": "r",
            "sync-settle": "0s", "sync-interval": "0"})
        p.wait_trainer_ready()
        self.wait_parked("instance/maintenance-event")
        self.metadata.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        sync = p.wait_event("sync.complete", kind="maintenance")
        self.assertEqual(sync["files_uploaded"], 1)
        self.assertFalse(any(l.startswith("sigint ") for l in self.marker_lines()), "not stopped yet: the lead")
        self.assertEqual(p.wait_exit(), 130)
        self.assertEqual(p.wait_event("run.end")["reason"], "maintenance")

    def test_a_legacy_preemptible_vm_without_max_runtime_gets_a_warning(self):
        self.metadata.set("instance/scheduling/preemptible", "TRUE")
        self.metadata.set("instance/scheduling/provisioning-model", "STANDARD")
        p = self.run_trainer(["--run-for", "10"])
        p.wait_exit()
        warned = [w for w in p.find("config.warning") if "max-runtime" in w["message"]]
        self.assertTrue(warned)
        self.assertIn("legacy preemptible VM (provisioning model STANDARD", warned[0]["message"])
        p2 = self.run_trainer(["--run-for", "10"], sets={"max-runtime": "23h30m"})
        p2.wait_exit()
        self.assertFalse([w for w in p2.find("config.warning") if "max-runtime" in w["message"]])
        self.metadata.set("instance/scheduling/preemptible", "FALSE")
        p3 = self.run_trainer(["--run-for", "10"])
        p3.wait_exit()
        self.assertFalse([w for w in p3.find("config.warning") if "max-runtime" in w["message"]])

    def test_a_spot_vm_is_not_warned_about_the_24h_limit_of_legacy_preemptible_vms(self):
        # Issue #32: Spot VMs report scheduling/preemptible=TRUE too, and every
        # Spot run began with a warning that did not apply to it.
        self.metadata.set("instance/scheduling/preemptible", "TRUE")
        self.metadata.set("instance/scheduling/provisioning-model", "SPOT")
        p = self.run_trainer(["--run-for", "10"])
        p.wait_exit()
        self.assertFalse([w for w in p.find("config.warning") if "24h" in w["message"]])



class OnExitApiTest(SpotvisorTestCase):
    """on-exit stop | delete through a fake Compute Engine API that checks method, path and token."""

    def setUp(self):
        super().setUp()
        from fake_compute import FakeComputeServer
        self.metadata.set("project/project-id", "my-project")
        self.metadata.set("instance/zone", "projects/123/zones/us-central1-a")
        self.metadata.set("instance/name", "trainer-7")
        self.compute = FakeComputeServer("my-project", "us-central1-a", "trainer-7",
                                         token_ok=lambda t: t.startswith("fake-token-")).start()
        self.addCleanup(self.compute.stop)

    def run_with(self, trainer, **sets):
        base = {"compute-endpoint": self.compute.endpoint, "shutdown-command": f"echo off >> {self.path('off')}"}
        base.update(sets)
        p = self.run_trainer(trainer, sets=base)
        return p, p.wait_exit()

    def off_count(self):
        return self.read("off").count("off") if os.path.exists(self.path("off")) else 0

    def test_stop(self):
        p, code = self.run_with(["--run-for", "10"], **{"on-exit": "stop"})
        self.assertEqual(code, 0)
        calls = [(e["method"], e["path"]) for e in self.compute.log()]
        self.assertEqual(calls, [("POST", "/compute/v1/projects/my-project/zones/us-central1-a/instances/trainer-7/stop")])
        self.assertEqual(self.compute.status, "STOPPING")
        p.wait_event("shutdown.api_done")
        self.assertEqual(self.off_count(), 0, "no poweroff when the API call worked")
        self.assertNotIn("fake-token", "".join(p.raw))

    def test_delete_after_success_poweroff_after_failure(self):
        _, code = self.run_with(["--run-for", "10"], **{"on-exit-success": "delete", "on-exit-failure": "poweroff"})
        self.assertEqual(code, 0)
        self.assertEqual([e["method"] for e in self.compute.log()], ["DELETE"])
        self.assertEqual(self.compute.status, "DELETED")
        _, code = self.run_with(["--run-for", "10", "--exit-code", "2"],
                                **{"on-exit-success": "delete", "on-exit-failure": "poweroff"})
        self.assertEqual(code, 2)
        self.assertEqual(len(self.compute.log()), 1, "a failed run does not call the API here")
        self.assertEqual(self.off_count(), 1)

    def test_permission_denied_falls_back_to_poweroff_and_names_the_permission(self):
        self.compute.deny("compute.instances.stop")
        p, code = self.run_with(["--run-for", "10"], **{"on-exit": "stop"})
        self.assertEqual(code, 0)
        failed = p.wait_event("shutdown.api_failed")
        self.assertIn("compute.instances.stop", failed["message"])
        self.assertIn("roles/compute.instanceAdmin.v1", failed["message"])
        self.assertEqual(self.off_count(), 1, "never left running: powered off instead, once")

    def test_on_exit_none_for_failures_keeps_the_vm(self):
        p, code = self.run_with(["--run-for", "10", "--exit-code", "1"], **{"on-exit": "stop", "on-exit-failure": "none"})
        self.assertEqual(code, 1)
        self.assertEqual(self.compute.log(), [])
        self.assertEqual(self.off_count(), 0)
        p.wait_event("shutdown.skipped")


class HoldTest(SpotvisorTestCase):
    def test_a_failed_run_holds_the_vm_until_released(self):
        import subprocess
        from harness import SPOTVISOR
        p = self.run_trainer(["--run-for", "10", "--exit-code", "4"], sets={
            "on-failure-hold": "30m", "on-exit": "poweroff", "shutdown-command": f"echo off >> {self.path('off')}"})
        hold = p.wait_event("run.hold")
        self.assertIn("spotvisor release", hold["message"])
        status = subprocess.run([SPOTVISOR, "status", "--state-dir", self.path("state")], capture_output=True, text=True)
        self.assertIn("phase:       holding", status.stdout)
        self.assertIn("deadline:", status.stdout)
        self.assertFalse(os.path.exists(self.path("off")), "held: not powered off yet")
        out = subprocess.run([SPOTVISOR, "release", "--state-dir", self.path("state")], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(p.wait_exit(), 4)
        p.wait_event("run.released")
        self.assertEqual(self.read("off"), "off\n")
        again = subprocess.run([SPOTVISOR, "release", "--state-dir", self.path("state")], capture_output=True, text=True)
        self.assertEqual(again.returncode, 3)


class IdleTest(SpotvisorTestCase):
    def test_a_quiet_trainer_ends_the_run_as_idle(self):
        p = self.run_trainer(["--marker-file", self.path("marker")], sets={"idle-timeout": "1s"})
        self.assertEqual(p.wait_exit(), 130)
        e = p.wait_event("idle.detected")
        self.assertGreaterEqual(e["idle_s"], 1.0)
        self.assertEqual(p.wait_event("run.end")["reason"], "idle")
        self.assertTrue(any(l.startswith("sigint ") for l in self.marker_lines()))
        p.wait_event("idle.gpu_unavailable")  # no NVIDIA driver on this machine: said once

    def test_a_busy_gpu_keeps_a_quiet_trainer_alive(self):
        from harness import ROOT
        nvml_dir = os.environ.get("FAKE_NVML_DIR", os.path.join(ROOT, "build", "tests", "fake_nvml"))
        util = self.path("gpu_util")
        with open(util, "w") as f:
            f.write("80")
        p = self.run_trainer(["--marker-file", self.path("marker")], sets={"idle-timeout": "1s"},
                             env={"LD_LIBRARY_PATH": nvml_dir, "FAKE_NVML_UTIL_FILE": util})
        p.wait_trainer_ready()
        import time
        deadline = time.monotonic() + 3  # three idle-timeouts with the GPU at 80%
        while time.monotonic() < deadline:
            self.assertIsNone(p.proc.poll(), "ended while the GPU was busy")
            time.sleep(0.1)
        self.assertFalse(p.find("idle.gpu_unavailable"), "NVML was loaded")
        with open(util, "w") as f:
            f.write("0")
        self.assertEqual(p.wait_exit(), 130)
        self.assertEqual(p.wait_event("run.end")["reason"], "idle")

    def test_a_busy_trainer_is_not_idle(self):
        # Burns CPU for 3 s (three idle-timeouts), then exits 0 by itself.
        p = self.start(["run"] + self.base_sets(**{"idle-timeout": "1s"})
                       + ["--", "/bin/sh", "-c", "end=$(($(date +%s) + 3)); while [ $(date +%s) -lt $end ]; do :; done"])
        self.assertEqual(p.wait_exit(), 0)
        self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        self.assertFalse(p.find("idle.detected"))

    def test_a_client_connected_to_the_trainer_keeps_it_alive(self):
        import socket
        import subprocess
        # A quiet "notebook server" on a free port, with a client connected to it for 3 s.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = (f"import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                  f"s.bind(('127.0.0.1',{port})); s.listen(); c,_=s.accept(); c.recv(1); time.sleep(600)")
        p = self.start(["run"] + self.base_sets(**{"idle-timeout": "1s"}) + ["--", "/usr/bin/python3", "-c", server])
        p.wait_event("trainer.start")
        client = None
        for _ in range(200):
            try:
                client = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                import time
                time.sleep(0.02)  # bounded retry while the server starts
        self.assertIsNotNone(client)
        import time
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            self.assertIsNone(p.proc.poll(), "ended while a client was connected")
            time.sleep(0.1)
        client.close()
        p.wait_event("idle.detected")  # once the client is gone, the quiet server is idle
        p.wait_exit()
        self.assertEqual(p.wait_event("run.end")["reason"], "idle")


if __name__ == "__main__":
    unittest.main()

"""The stop ladder, exit codes, leftovers and the on-exit action."""
import datetime
import os
import signal
import unittest

from harness import SpotvisorTestCase, FAKE_TRAINER, pid_alive, wait_until


def ts(event):
    return datetime.datetime.fromisoformat(event["time"][:26]).timestamp()


class LadderTest(SpotvisorTestCase):
    def preempt(self, p):
        p.wait_trainer_ready()
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")

    def test_a_trainer_that_ignores_sigint_gets_sigterm_after_stop_timeout(self):
        p = self.run_trainer(["--ignore-sigint", "--marker-file", self.path("marker")],
                             sets={"stop-timeout": "1s", "kill-timeout": "1s"})
        self.preempt(p)
        self.assertEqual(p.wait_exit(), 143)
        sigint = p.wait_event("trainer.signal", signal="SIGINT")
        sigterm = p.wait_event("trainer.signal", signal="SIGTERM")
        gap = ts(sigterm) - ts(sigint)
        # Timestamps are taken when each line is logged, a hair after the
        # deadline was computed: allow 50 ms, far below a real early escalation.
        self.assertGreaterEqual(gap, 0.95, "escalated before stop-timeout")
        self.assertLess(gap, 3.0, "escalation far later than stop-timeout")
        self.assertFalse(p.find("trainer.signal", signal="SIGKILL"))

    def test_a_trainer_that_ignores_both_is_killed_after_kill_timeout(self):
        p = self.run_trainer(["--ignore-sigint", "--ignore-sigterm"], sets={"stop-timeout": "1s", "kill-timeout": "1s"})
        self.preempt(p)
        self.assertEqual(p.wait_exit(), 137)
        sigterm = p.wait_event("trainer.signal", signal="SIGTERM")
        sigkill = p.wait_event("trainer.signal", signal="SIGKILL")
        self.assertGreaterEqual(ts(sigkill) - ts(sigterm), 0.95)
        self.assertEqual(p.wait_event("trainer.exit")["signal"], "SIGKILL")
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")

    def test_grandchildren_and_escapees_are_gone_when_spotvisor_exits(self):
        pidfile = self.path("pids")
        p = self.run_trainer(["--spawn-grandchildren", "2", "--spawn-escapee", "--pid-file", pidfile, "--run-for", "300"])
        self.assertEqual(p.wait_exit(), 0)
        pids = [int(x) for x in self.read(pidfile).split()]
        self.assertEqual(len(pids), 3)
        for pid in pids:
            self.assertFalse(pid_alive(pid), f"descendant {pid} outlived spotvisor")
        left = p.wait_event("trainer.leftovers")
        self.assertEqual(sorted(left["pids"]) if len(left["pids"]) == 3 else None, sorted(pids))

    def test_exit_codes_are_passed_through(self):
        for args, want in ((["--exit-code", "3", "--run-for", "10"], 3), (["--run-for", "10"], 0)):
            p = self.run_trainer(args)
            self.assertEqual(p.wait_exit(), want, args)
            self.assertEqual(p.wait_event("run.end")["exit_code"], want)
        p = self.start(["run"] + self.base_sets() + ["--", "/bin/sh", "-c", "kill -SEGV $$"])
        self.assertEqual(p.wait_exit(), 128 + signal.SIGSEGV)
        self.assertEqual(p.wait_event("run.end")["reason"], "failed")

    def test_a_missing_program_is_127_and_a_non_executable_126(self):
        p = self.start(["run"] + self.base_sets() + ["--", "/nonexistent/train"])
        self.assertEqual(p.wait_exit(), 127)
        self.assertIn("/nonexistent/train", p.wait_event("trainer.start_failed")["message"])
        p = self.start(["run"] + self.base_sets() + ["--", "/etc/hostname"])
        self.assertEqual(p.wait_exit(), 126)

    def test_the_shutdown_command_runs_exactly_once_after_everything_else(self):
        out = self.path("shutdown")
        p = self.run_trainer(["--run-for", "10"], sets={"on-exit": "poweroff", "shutdown-command": f"echo ran >> {out}"})
        self.assertEqual(p.wait_exit(), 0)
        self.assertEqual(self.read(out), "ran\n")
        names = [e["event"] for e in p.events]
        self.assertLess(names.index("run.end"), names.index("shutdown.start"))
        self.assertLess(names.index("shutdown.start"), names.index("shutdown.done"))

    def test_no_shutdown_command_after_a_preemption(self):
        # GCE is stopping or deleting the VM already (--instance-termination-action).
        out = self.path("shutdown")
        p = self.run_trainer([], sets={"on-exit": "poweroff", "shutdown-command": f"echo ran >> {out}"})
        self.preempt(p)
        self.assertEqual(p.wait_exit(), 130)
        self.assertFalse(os.path.exists(out))
        self.assertIn("--instance-termination-action", p.wait_event("shutdown.skipped")["message"])

    def test_the_shutdown_command_runs_once_after_the_run_completes(self):
        out = self.path("shutdown")
        p = self.run_trainer(["--run-for", "10"], sets={"on-exit": "poweroff", "shutdown-command": f"echo ran >> {out}"})
        self.assertEqual(p.wait_exit(), 0)
        self.assertEqual(self.read(out), "ran\n")

    def test_status_file_follows_the_run(self):
        p = self.run_trainer([])
        p.wait_trainer_ready()
        status_path = self.path("state/status.json")
        import json
        st = wait_until(lambda: os.path.exists(status_path) and json.load(open(status_path)), what="status.json")
        self.assertEqual(st["phase"], "running")
        self.assertTrue(pid_alive(st["trainer_pid"]))
        import subprocess
        from harness import SPOTVISOR
        out = subprocess.run([SPOTVISOR, "status", "--state-dir", self.path("state")], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("phase:       running", out.stdout)
        self.assertIn(f"pid {st['trainer_pid']}", out.stdout)
        p.signal(signal.SIGINT)
        p.wait_exit()
        out = subprocess.run([SPOTVISOR, "status", "--state-dir", self.path("state"), "--json"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 3)
        final = json.loads(out.stdout)
        self.assertEqual((final["phase"], final["reason"], final["running"]), ("done", "stopped", False))


class GuestAttributesTest(SpotvisorTestCase):
    def guest(self, key):
        try:
            return self.metadata.state(f"instance/guest-attributes/spotvisor/{key}")["value"]
        except Exception:
            return None

    def test_the_state_is_visible_as_guest_attributes(self):
        p = self.run_trainer([])
        p.wait_trainer_ready()
        wait_until(lambda: self.guest("phase") == "running", what="phase=running as a guest attribute")
        pid = str(p.wait_event("trainer.start")["pid"])
        wait_until(lambda: self.guest("trainer_pid") == pid, what="trainer_pid as a guest attribute")
        p.signal(signal.SIGTERM)
        p.wait_exit()
        self.assertEqual(self.guest("phase"), "done", "the last state is sent before spotvisor exits")
        self.assertEqual(self.guest("reason"), "stopped")
        self.assertEqual(self.guest("trainer_pid"), "")
        self.assertRegex(self.guest("last_event"), r"^supervisor\.state: \S+ -> \S+: ")

    def test_failures_to_write_them_are_logged_once_and_not_fatal(self):
        self.metadata.fault("status", code=403, path_prefix="instance/guest-attributes")
        p = self.run_trainer(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        self.assertEqual(len(p.find("guest_attributes.failed")), 1)


if __name__ == "__main__":
    unittest.main()

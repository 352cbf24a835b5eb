"""What the trainer inherits from spotvisor, and what happens to it when
spotvisor dies, and which process `spotvisor sync` signals (issue #12)."""
import json
import os
import shlex
import signal
import subprocess
import unittest

from harness import SpotvisorTestCase, SPOTVISOR, FAKE_TRAINER, WAIT, pid_alive, wait_until


def group_members(pgid):
    """Live (non-zombie) processes in process group pgid, from /proc."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def kill_group(pgid):
    """Cleanup after a failure: nothing a test started may live on."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


class FileDescriptorTest(SpotvisorTestCase):
    def test_the_trainer_inherits_only_stdin_stdout_and_stderr(self):
        # The second trainer is spawned while the metadata watchers' long-polls
        # are parked (curl's sockets have no close-on-exec), after spotvisor
        # has made HTTP requests, opened status.json, log pipes and so on.
        p = self.run_trainer(["--print-fds", "--run-for", "0", "--exit-code", "1"],
                             sets={"restart": "on-failure", "max-restarts": "1", "restart-delay": "3s",
                                   "metadata-watch-timeout": "60s"})
        p.wait_event("trainer.start")
        self.wait_parked("instance/preempted")
        self.wait_parked("instance/maintenance-event")
        self.assertEqual(len(p.find("trainer.start")), 1,
                         "the restart came before the long-polls were parked; the test proves nothing")
        self.assertEqual(p.wait_exit(), 1)
        lines = [e["message"] for e in p.find("trainer.output") if e["message"].startswith("fake_trainer fds:")]
        self.assertEqual(len(lines), 2, lines)
        for line in lines:
            fds = dict(item.split("=", 1) for item in line[len("fake_trainer fds:"):].split())
            self.assertEqual(sorted(fds), ["0", "1", "2"], f"the trainer inherited more than stdio: {line}")
            self.assertEqual(fds["0"], "/dev/null")
            self.assertTrue(fds["1"].startswith("pipe:") and fds["2"].startswith("pipe:"), line)


class ParentDeathTest(SpotvisorTestCase):
    def assert_trainer_dies_with_spotvisor(self, p):
        p.wait_trainer_ready()
        pid = p.wait_event("trainer.start")["pid"]
        self.addCleanup(kill_group, pid)
        self.assertTrue(pid_alive(pid))
        self.assertEqual(group_members(pid), [pid])
        p.proc.send_signal(signal.SIGKILL)
        p.proc.wait(WAIT)
        wait_until(lambda: not pid_alive(pid) and not group_members(pid), 10,
                   f"the trainer (pid {pid}) and its process group to be gone after spotvisor was SIGKILLed")
        self.assertFalse(any(l.startswith("exit code=") for l in self.marker_lines()),
                         "SIGKILL, not a signal the trainer handles: nobody will sync what it saves now")

    def test_the_trainer_dies_when_spotvisor_is_killed(self):
        p = self.run_trainer(["--marker-file", self.path("marker")])
        self.assert_trainer_dies_with_spotvisor(p)

    def test_a_shell_form_trainer_dies_when_spotvisor_is_killed(self):
        # The shell exec's the trainer: the process that gets the parent-death
        # signal is the trainer itself, not a shell that would leave it behind.
        cmd = f"{shlex.quote(FAKE_TRAINER)} --marker-file {shlex.quote(self.path('marker'))}"
        p = self.start(["run"] + self.base_sets(command=cmd))
        self.assert_trainer_dies_with_spotvisor(p)


class ShellFormExitStatusTest(SpotvisorTestCase):
    def run_shell_form(self):
        cmd = (f"FAKE_VAR='a b' {shlex.quote(FAKE_TRAINER)} --sigint-exit-code 0 --sigint-exit-delay 300 "
               f"--marker-file {shlex.quote(self.path('marker'))}")
        p = self.start(["run"] + self.base_sets(command=cmd, **{"metadata-watch-timeout": "60s"}))
        p.wait_trainer_ready()
        return p

    def assert_trainer_exit_reported(self, p):
        self.assertEqual(p.wait_exit(), 0, "the trainer saved and exited 0 on SIGINT")
        exit_event = p.wait_event("trainer.exit")
        self.assertEqual(exit_event["exit_code"], 0, exit_event)
        self.assertNotIn("signal", exit_event)
        self.assertEqual(p.wait_event("run.end")["exit_code"], 0)
        self.assertIn("exit code=0", self.marker_lines())
        started = [e["message"] for e in p.find("trainer.output") if e["message"].startswith("fake_trainer started")]
        self.assertEqual(started, [f"fake_trainer started pid={p.wait_event('trainer.start')['pid']}"],
                         "the shell was replaced by the trainer")

    def test_preemption_reports_the_trainers_exit_not_the_shells(self):
        p = self.run_shell_form()
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        self.assert_trainer_exit_reported(p)
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")

    def test_sigint_to_spotvisor_reports_the_trainers_exit(self):
        p = self.run_shell_form()
        p.signal(signal.SIGINT)
        self.assert_trainer_exit_reported(p)


class StalePidTest(SpotvisorTestCase):
    def setUp(self):
        super().setUp()
        # Stands in for whatever got the dead spotvisor's pid. SIGUSR1's and
        # SIGUSR2's default action kills it, so its fate shows a stray signal.
        self.victim = subprocess.Popen(["sleep", "30"])
        self.addCleanup(self.victim.wait)
        self.addCleanup(self.victim.kill)
        os.makedirs(self.path("state"))

    def write_status(self, phase="running", **extra):
        status = {"run_id": "r", "mode": "daemon", "phase": phase, "since": "2026-11-23T12:00:00Z",
                  "spotvisor_pid": self.victim.pid, "trainer_pid": None, "bucket": "gs://b/r",
                  "last_event": {"event": "supervisor.state", "message": "x", "time": "2026-11-23T12:00:00Z"}}
        status.update(extra)
        with open(self.path("state/status.json"), "w") as f:
            json.dump(status, f)

    def cli(self, *args):
        return subprocess.run([SPOTVISOR, *args, "--state-dir", self.path("state")], capture_output=True, text=True,
                              timeout=WAIT)

    def assert_victim_untouched(self):
        self.assertIsNone(self.victim.poll(), "the unrelated process was signalled")
        self.victim.kill()
        self.assertEqual(self.victim.wait(WAIT), -signal.SIGKILL, "it got a signal before our SIGKILL")

    def assert_refused(self, r, command):
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(f"spotvisor {command}: spotvisor is not running", r.stderr)
        self.assertIn(f"pid {self.victim.pid} is now \"sleep\"", r.stderr)
        self.assertIn("Nothing was signalled", r.stderr)

    def test_sync_refuses_a_pid_that_now_belongs_to_another_process(self):
        # The start time recorded by the spotvisor that wrote the file differs.
        self.write_status(start_time_ticks=start_ticks(self.victim.pid) - 1, boot_id=boot_id())
        r = self.cli("sync", "--timeout", "2s")
        self.assert_refused(r, "sync")
        self.assert_victim_untouched()

    def test_sync_refuses_by_program_name_when_no_start_time_was_recorded(self):
        self.write_status()  # as written before start_time_ticks existed
        r = self.cli("sync", "--timeout", "2s")
        self.assert_refused(r, "sync")
        self.assert_victim_untouched()

    def test_release_refuses_a_reused_pid(self):
        self.write_status(phase="holding")
        self.assert_refused(self.cli("release"), "release")
        self.assert_victim_untouched()

    def test_status_says_not_running(self):
        self.write_status(start_time_ticks=start_ticks(self.victim.pid) + 1)
        r = self.cli("status", "--json")
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertFalse(json.loads(r.stdout)["running"])
        self.assert_victim_untouched()

    def test_a_live_spotvisor_is_still_recognised(self):
        p = self.run_trainer([], sets={"state-dir": self.path("state2")})
        p.wait_trainer_ready()
        r = subprocess.run([SPOTVISOR, "status", "--json", "--state-dir", self.path("state2")], capture_output=True,
                           text=True, timeout=WAIT)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(json.loads(r.stdout)["running"])
        p.signal(signal.SIGINT)
        self.assertEqual(p.wait_exit(), 130)


if __name__ == "__main__":
    unittest.main()

"""A supervisor that can always stop and never dies (issue #12), through the
real binary: bounded stops in every phase, power-off whatever the Compute
API does, SIGHUP/SIGQUIT, and a thread count that stays flat.
"""
import os
import signal
import socket
import threading
import time
import unittest

from harness import SpotvisorTestCase, wait_until, pid_alive


class BlackHole:
    """Accepts TCP connections on loopback and never answers: a hung API."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self._stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                c, _ = self.sock.accept()
                self.conns.append(c)
            except OSError:
                continue

    def close(self):
        self._stop = True
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


def proc_status(pid, key):
    """A number from /proc/PID/status (Threads, VmSize in kB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class RobustnessTest(SpotvisorTestCase):
    def trainer_pid(self, p):
        return p.wait_event("trainer.start")["pid"]

    def test_a_hung_compute_api_still_powers_off_inside_the_on_exit_budget(self):
        hole = BlackHole()
        self.addCleanup(hole.close)
        self.metadata.set("project/project-id", "my-project")
        self.metadata.set("instance/zone", "projects/123/zones/us-central1-a")
        self.metadata.set("instance/name", "trainer-7")
        off = self.path("off")
        p = self.run_trainer(["--run-for", "10"], sets={
            "on-exit": "stop", "on-exit-timeout": "6s",
            "compute-endpoint": f"http://127.0.0.1:{hole.port}/compute/v1",
            "shutdown-command": f"echo off >> {off}"})
        p.wait_event("shutdown.start")
        t0 = time.monotonic()
        self.assertEqual(p.wait_exit(timeout=15), 0)
        self.assertLess(time.monotonic() - t0, 6.0, "inside on-exit-timeout")
        self.assertTrue(hole.conns, "the API call was made and hung")
        # Either the phase's deadline fires first (shutdown.timeout), or the
        # request's own timeout, clamped to that same deadline, ends the call
        # a moment before it (on-exit failed): both lead to shutdown-command.
        gave_up = p.find("shutdown.timeout") or [e for e in p.find("shutdown.done") if e.get("exit_code", 0) != 0]
        self.assertTrue(gave_up, "the hung call was given up at half the budget")
        p.wait_event("shutdown.poweroff")
        with open(off) as f:
            self.assertEqual(f.read().count("off"), 1, "powered off through shutdown-command, once")

    def test_a_failing_shutdown_command_is_retried_then_forced(self):
        attempts = self.path("attempts")
        p = self.run_trainer(["--run-for", "10"], sets={
            "on-exit": "poweroff", "on-exit-timeout": "6s",
            "shutdown-command": f"echo try >> {attempts}; exit 1"})
        t0 = time.monotonic()
        self.assertEqual(p.wait_exit(timeout=15), 0)
        self.assertLess(time.monotonic() - t0, 6.0)
        with open(attempts) as f:
            self.assertEqual(f.read().count("try"), 4, "the action, then three attempts of the ladder")
        forced = p.wait_event("shutdown.forced")
        self.assertEqual(forced["severity"], "CRITICAL")
        # `spotvisor run` never halts a machine by force; the daemon would reboot(2).
        p.wait_event("shutdown.not_forced")

    def test_sigterm_during_a_slow_restore_ends_the_run_at_once(self):
        from fake_gcs import FakeGcsServer
        gcs = FakeGcsServer(buckets=["ckpt-bucket"]).start()
        self.addCleanup(gcs.stop)
        env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{gcs.port}"}
        # A committed checkpoint whose download never ends.
        data = b"x" * 300000
        import base64
        import crcmod.predefined
        crc = crcmod.predefined.mkCrcFun("crc-32c")(data)
        gcs.put_object("ckpt-bucket", "run1/checkpoints/model~1.00", data)
        gcs.put_object("ckpt-bucket", "run1/manifest.json", (
            '{"version":2,"sequence":1,"files":[{"path":"model","object":"checkpoints/model~1.00","size":300000,'
            f'"crc32c":"{base64.b64encode(crc.to_bytes(4, "big")).decode()}","generation":1}}]}}').encode())
        gcs.fault("slow", delay_ms=60000, kind="download", object_prefix="run1/checkpoints/")
        p = self.run_trainer(["--run-for", "10"], sets={"bucket": "gs://ckpt-bucket", "run-id": "run1"}, env=env)
        p.wait_event("restore.start")
        self.assertTrue(gcs.wait_for_inflight(1, 20), "the download started")
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        self.assertEqual(p.wait_exit(timeout=10), 128 + signal.SIGTERM)
        self.assertLess(time.monotonic() - t0, 3.0, "not after the download")
        self.assertFalse(p.find("trainer.start"))
        self.assertFalse(p.find("restore.failed"), "a stop is not a failed restore")

    def test_a_second_sigterm_cuts_the_final_sync_short(self):
        from fake_gcs import FakeGcsServer
        gcs = FakeGcsServer(buckets=["ckpt-bucket"]).start()
        self.addCleanup(gcs.stop)
        env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{gcs.port}"}
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(b"m" * 100000)
        # The checkpoint's upload only (the run's status.json goes up at the start too).
        gcs.fault("slow", delay_ms=60000, upload_type="multipart", object_prefix="run1/checkpoints/")
        p = self.run_trainer(["--marker-file", self.path("marker")], sets={"bucket": "gs://ckpt-bucket", "run-id": "run1"}, env=env)
        p.wait_trainer_ready()
        p.signal(signal.SIGTERM)
        self.assertTrue(gcs.wait_for_inflight(1, 20), "the final sync's upload started")
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        p.wait_exit(timeout=10)
        self.assertLess(time.monotonic() - t0, 3.0)
        p.wait_event("sync.cancelled")

    def test_sighup_stops_the_run_and_the_trainer_is_not_orphaned(self):
        p = self.run_trainer(["--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        pid = self.trainer_pid(p)
        p.signal(signal.SIGHUP)  # the ssh session went away
        self.assertEqual(p.wait_exit(), 130, "the trainer's own status: it died of the SIGINT it was sent")
        self.assertEqual(p.wait_event("signal.received")["signal"], "SIGHUP")
        self.assertEqual(p.wait_event("trainer.signal")["signal"], "SIGINT", "stopped gracefully, as by SIGTERM")
        wait_until(lambda: not pid_alive(pid), what="the trainer gone")

    def test_sigquit_stops_now(self):
        p = self.run_trainer(["--ignore-sigint", "--marker-file", self.path("marker")], sets={"stop-timeout": "60s"})
        p.wait_trainer_ready()
        t0 = time.monotonic()
        p.signal(signal.SIGQUIT)
        p.wait_exit()
        self.assertLess(time.monotonic() - t0, 10.0, "not the 60 s stop-timeout")
        self.assertIn("SIGTERM", [e["signal"] for e in p.find("trainer.signal")])

    def test_the_thread_count_stays_flat_over_many_syncs(self):
        # One executor: syncs do not leave a thread each behind (the short
        # form of bench/threads.py, which does 1000).
        os.makedirs(self.path("ckpt"))
        p = self.run_trainer(["--marker-file", self.path("marker")],
                             sets={"bucket": f"file://{self.path('bucket')}", "run-id": "run1", "sync-settle": "0s"})
        p.wait_trainer_ready()
        pid = p.proc.pid
        counts, vsz = [], []
        for i in range(60):
            with open(self.path("ckpt/model"), "w") as f:
                f.write(f"step {i}")
            done = len(p.find("sync.complete", kind="on-demand"))
            p.signal(signal.SIGUSR1)
            wait_until(lambda: len(p.find("sync.complete", kind="on-demand")) > done, what=f"sync {i}")
            counts.append(proc_status(pid, "Threads"))
            vsz.append(proc_status(pid, "VmSize"))
        p.signal(signal.SIGTERM)
        p.wait_exit()
        self.assertLessEqual(max(counts), counts[4], f"threads grew: {counts}")
        # A thread left unjoined keeps its 8 MiB stack mapped: 55 syncs would add ~440 MiB.
        self.assertLess(vsz[-1] - vsz[4], 32 * 1024, f"virtual size grew: {vsz[4]} kB -> {vsz[-1]} kB")


if __name__ == "__main__":
    unittest.main()

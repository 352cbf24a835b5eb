"""sd_notify(3) to systemd, over a real AF_UNIX datagram socket standing in
for systemd's NOTIFY_SOCKET: READY, STATUS, STOPPING, EXTEND_TIMEOUT_USEC and
the watchdog, as a Type=notify unit sees them."""
import os
import signal
import socket
import threading
import time
import unittest

from harness import SpotvisorTestCase, WAIT


class NotifySocket:
    """What systemd's side of NOTIFY_SOCKET receives, message by message."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.messages = []  # (monotonic time, {key: value})
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
            with self._cv:
                self.messages.append((time.monotonic(), fields))
                self._cv.notify_all()

    def close(self):
        self.sock.close()

    def with_key(self, key):
        with self._cv:
            return [(t, m) for t, m in self.messages if key in m]

    def wait_for(self, predicate, what, timeout=WAIT):
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for t, m in self.messages:
                    if predicate(m):
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no notify message with {what}; got {[m for _, m in self.messages]}")
                self._cv.wait(min(left, 0.2))


class SystemdNotifyTest(SpotvisorTestCase):
    def start_with_socket(self, trainer_args, env_extra=None, sets=None):
        notify = NotifySocket(self.path("notify.sock"))
        self.addCleanup(notify.close)
        env = {"NOTIFY_SOCKET": notify.path}
        env.update(env_extra or {})
        p = self.run_trainer(trainer_args + ["--print-env"], sets=sets, env=env)
        return p, notify

    def test_ready_status_and_stopping_on_sigterm(self):
        p, notify = self.start_with_socket(["--marker-file", self.path("marker"), "--sigint-exit-delay", "300"],
                                           sets={"stop-timeout": "2m"})
        p.wait_trainer_ready()
        ready = notify.wait_for(lambda m: m.get("READY") == "1", "READY=1")
        self.assertNotIn("STOPPING", ready)
        pid = p.wait_event("trainer.start")["pid"]
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("running") and f"trainer pid {pid}" in m["STATUS"],
                        "STATUS=running with the trainer's pid")
        # READY came before the trainer was running (config loaded, run begun).
        t_ready = notify.with_key("READY")[0][0]
        t_running = [t for t, m in notify.with_key("STATUS") if m["STATUS"].startswith("running")][0]
        self.assertLessEqual(t_ready, t_running)
        self.assertFalse(notify.with_key("STOPPING"), "nothing is stopping yet")

        p.signal(signal.SIGTERM)  # systemctl stop
        self.assertEqual(p.wait_exit(), 130)
        notify.wait_for(lambda m: m.get("STOPPING") == "1", "STOPPING=1")
        # Everything spotvisor sent is in the socket's buffer by now; wait for the reader.
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("done"), "STATUS=done")
        stopping_at = notify.with_key("STOPPING")[0][0]
        extends = notify.with_key("EXTEND_TIMEOUT_USEC")
        self.assertTrue(extends, "the stop timeout is extended while the ladder runs")
        self.assertGreaterEqual(extends[0][0], stopping_at)
        # Covers the stop ladder's own deadline (stop-timeout 2m), beyond the 30s floor.
        self.assertGreaterEqual(int(extends[0][1]["EXTEND_TIMEOUT_USEC"]), 120_000_000)
        self.assertEqual(len(notify.with_key("STOPPING")), 1, "STOPPING=1 is sent once")
        # systemd's variables are spotvisor's, never the trainer's.
        self.assertFalse(p.find("trainer.output", message=f"NOTIFY_SOCKET={notify.path}"))
        self.assertFalse([e for e in p.find("trainer.output") if e["message"].startswith("NOTIFY_SOCKET=")])

    def test_watchdog_is_fed_from_the_loop(self):
        p, notify = self.start_with_socket(["--run-for", "60000"], env_extra={"WATCHDOG_USEC": "1000000"})
        p.wait_trainer_ready()
        p.wait_event("systemd.watchdog")
        # Pinged every half interval; systemd's contract is one per WATCHDOG_USEC.
        notify.wait_for(lambda m: len(notify.with_key("WATCHDOG")) >= 4, "four WATCHDOG=1 pings")
        times = [t for t, _ in notify.with_key("WATCHDOG")]
        gaps = [b - a for a, b in zip(times, times[1:])]
        self.assertLess(max(gaps), 1.0, f"a ping at least every WATCHDOG_USEC: gaps {gaps}")
        p.signal(signal.SIGTERM)
        p.wait_exit()

    def test_watchdog_pid_of_another_process_is_not_ours(self):
        p, notify = self.start_with_socket(["--run-for", "60000"],
                                           env_extra={"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"})
        p.wait_trainer_ready()
        notify.wait_for(lambda m: m.get("READY") == "1", "READY=1")
        self.assertFalse(p.find("systemd.watchdog"))
        p.signal(signal.SIGTERM)
        p.wait_exit()
        self.assertFalse(notify.with_key("WATCHDOG"))

    def test_a_completed_run_says_stopping_before_it_ends(self):
        p, notify = self.start_with_socket(["--run-for", "50"])
        self.assertEqual(p.wait_exit(), 0)
        notify.wait_for(lambda m: m.get("READY") == "1", "READY=1")
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("done"), "STATUS=done")
        t_stopping = notify.with_key("STOPPING")[0][0]
        t_done = [t for t, m in notify.with_key("STATUS") if m["STATUS"].startswith("done")][0]
        self.assertLessEqual(t_stopping, t_done)

    def test_no_stopping_during_a_hold_until_it_is_released(self):
        # A held VM is up for debugging: systemd must not see the unit as
        # stopping (it would start its stop timeout and stop the watchdog).
        p, notify = self.start_with_socket(["--run-for", "10", "--exit-code", "3"],
                                           sets={"on-exit": "poweroff", "shutdown-command": "true",
                                                 "on-failure-hold": "10m", "sync-interval": "0",
                                                 "bucket": f"file://{self.path('bucket')}"})
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("holding"), "STATUS=holding")
        self.assertFalse(notify.with_key("STOPPING"), [m for _, m in notify.messages])
        p.signal(signal.SIGUSR2)  # spotvisor release
        self.assertEqual(p.wait_exit(), 3)
        notify.wait_for(lambda m: m.get("STOPPING") == "1", "STOPPING=1 after the release")
        notify.wait_for(lambda m: "EXTEND_TIMEOUT_USEC" in m, "EXTEND_TIMEOUT_USEC after the release")


if __name__ == "__main__":
    unittest.main()

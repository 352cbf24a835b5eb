"""Trainer output becomes structured log lines, without floods or broken JSON; the trainer's environment."""
import json
import os
import time
import pwd
import unittest

from harness import SpotvisorTestCase, FAKE_TRAINER


class OutputTest(SpotvisorTestCase):
    def outputs(self, p, **fields):
        return [e for e in p.find("trainer.output", **fields)]

    def test_lines_become_events_with_the_stream_named(self):
        p = self.run_trainer(["--print", "hello out", "--stderr", "hello err", "--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        self.assertTrue(self.outputs(p, stream="stdout", message="hello out"))
        self.assertTrue(self.outputs(p, stream="stderr", message="hello err"))
        for raw in p.raw:
            e = json.loads(raw)
            self.assertIn(e["severity"], ("DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL"))
            self.assertRegex(e["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$")
            if e["event"] != "metadata.absent":
                self.assertIn("run_id", e["logging.googleapis.com/labels"])
        # The trainer's last lines come before trainer.exit.
        names = [e["event"] for e in p.events]
        self.assertLess(max(i for i, n in enumerate(names) if n == "trainer.output"), names.index("trainer.exit"))

    def test_progress_bars_are_collapsed(self):
        # 1000 \r-updates within about a second, progress-interval 5s: the
        # first update and the final line, not a thousand entries.
        p = self.run_trainer(["--progress", "1000", "--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        lines = self.outputs(p, stream="stdout")
        progress = [e for e in lines if e.get("progress")]
        self.assertLessEqual(len(progress), 2, [e["message"] for e in progress])
        self.assertGreaterEqual(len(progress), 1)
        self.assertTrue(any("1000/1000" in e["message"] and not e.get("progress") for e in lines),
                        [e["message"] for e in lines])

    def test_long_lines_are_truncated_and_invalid_utf8_escaped(self):
        p = self.run_trainer(["--long-line", "100000", "--invalid-utf8", "--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        long = [e for e in self.outputs(p) if e.get("truncated_bytes")]
        self.assertEqual(len(long), 1)
        self.assertEqual(len(long[0]["message"]), 16384)
        self.assertEqual(long[0]["truncated_bytes"], 100000 - 16384)
        self.assertTrue(any("\\xff" in e["message"] for e in self.outputs(p)), [e["message"][:80] for e in self.outputs(p)])

    def test_the_trainer_environment(self):
        self.metadata.set("instance/attributes/spotvisor-env", "LR=0.01\nEXPERIMENT=baseline")
        p = self.run_trainer(["--print-env", "--run-for", "10"], sets={"run-id": "exp-7"})
        self.assertEqual(p.wait_exit(), 0)
        env = dict(e["message"].split("=", 1) for e in self.outputs(p, stream="stdout") if "=" in e["message"])
        self.assertEqual(env["SPOTVISOR_RUN_ID"], "exp-7")
        self.assertEqual(env["SPOTVISOR_CHECKPOINT_DIR"], self.path("ckpt"))
        self.assertEqual(env["AIP_CHECKPOINT_DIR"], self.path("ckpt"))
        self.assertEqual(env["LR"], "0.01")
        self.assertEqual(env["EXPERIMENT"], "baseline")
        self.assertNotIn("NOTIFY_SOCKET", env)
        self.assertTrue(os.path.isdir(self.path("ckpt")), "checkpoint-dir is created")

    def test_shell_form_from_metadata_expands_env(self):
        self.metadata.set("instance/attributes/spotvisor-command", 'echo "lr=${LR} run=${SPOTVISOR_RUN_ID}"')
        self.metadata.set("instance/attributes/spotvisor-env", "LR=0.5")
        p = self.start(["run"] + self.base_sets())
        self.assertEqual(p.wait_exit(), 0)
        self.assertTrue(self.outputs(p, message="lr=0.5 run=spotvisor-test"), "run-id defaults to the instance name")

    @unittest.skipUnless(os.geteuid() == 0, "switching users needs root")
    def test_the_trainer_runs_as_the_configured_user(self):
        nobody = pwd.getpwnam("nobody")
        self.metadata.set("instance/attributes/spotvisor-command", "id -u; id -g; echo home=$HOME; pwd")
        self.metadata.set("instance/attributes/spotvisor-user", "nobody")
        os.chmod(self.tmp, 0o755)
        p = self.start(["run"] + self.base_sets(workdir=self.path("work")))
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw))
        out = [e["message"] for e in self.outputs(p, stream="stdout")]
        self.assertEqual(out, [str(nobody.pw_uid), str(nobody.pw_gid), f"home={nobody.pw_dir}", self.path("work")])
        self.assertEqual(os.stat(self.path("work")).st_uid, nobody.pw_uid, "a workdir we create belongs to the user")
        self.assertEqual(os.stat(self.path("ckpt")).st_uid, nobody.pw_uid)


class WithoutMetadataTest(SpotvisorTestCase):
    def test_run_without_a_metadata_server_still_supervises(self):
        # Point at a closed port through the documented override, but
        # without GCE_METADATA_HOST set `run` treats metadata as optional:
        # we can only simulate "absent" by leaving the default address,
        # which on this machine does not answer like a metadata server.
        p = self.run_trainer(["--print", "hi", "--run-for", "10"], metadata=False)
        self.assertEqual(p.wait_exit(), 0)
        p.wait_event("metadata.absent")
        self.assertTrue(p.find("trainer.output", message="hi"))


class DaemonTest(SpotvisorTestCase):
    def test_daemon_waits_for_the_metadata_server(self):
        out = self.path("shutdown")
        conf = self.write_config(
            f'shutdown-command = "echo off >> {out}"\nstate-dir = {self.path("state")}\n'
            f'checkpoint-dir = {self.path("ckpt")}\n')
        self.metadata.set("instance/attributes/spotvisor-command", f"{FAKE_TRAINER} --run-for 10 --exit-code 4")
        self.metadata.fault("status", code=503)
        p = self.start(["daemon", "--config", conf])
        p.wait_event("metadata.unavailable")
        self.assertTrue(self.metadata.wait_for_hits("instance/attributes", 3, 20), "retries with backoff")
        self.assertEqual(len(p.find("metadata.unavailable")), 1, "logged once per failure streak")
        self.metadata.fault("none")
        self.assertEqual(p.wait_exit(), 4)
        p.wait_event("metadata.recovered")
        self.assertEqual(self.read(out), "off\n", "daemon mode powers off by default")
        self.assertEqual(p.wait_event("run.start")["mode"], "daemon")


class CloudLoggingTest(SpotvisorTestCase):
    """log-to=api: entries.write against a fake that validates the request shape."""

    def setUp(self):
        super().setUp()
        from fake_logging import FakeLoggingServer
        self.metadata.set("project/project-id", "my-project")
        self.logging = FakeLoggingServer("my-project").start()
        self.addCleanup(self.logging.stop)

    def run_api(self, trainer, **sets):
        base = {"log-to": "api", "logging-endpoint": self.logging.endpoint, "run-id": "exp1",
                "log-labels": "experiment=lr-sweep"}
        base.update(sets)
        p = self.run_trainer(trainer, sets=base)
        return p, p.wait_exit()

    def test_a_dead_logging_api_does_not_eat_the_preemption_window(self):
        # GCE gives a preempted VM ~30 s in all. With every entries.write failing,
        # spotvisor gives the last delivery 3 s (+1 s) once the VM is going down,
        # not the 10 s (+5 s) it used to: the boot test measured 29.4 s from the
        # power button to power-off that way.
        self.logging.fault(503, count=10_000)
        p = self.run_trainer(["--marker-file", self.path("marker")],
                             sets={"log-to": "api", "logging-endpoint": self.logging.endpoint, "run-id": "exp1",
                                   "on-exit": "poweroff", "shutdown-command": "true"})
        p.wait_trainer_ready()
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_event("run.end")
        t_end = time.monotonic()
        self.assertEqual(p.wait_exit(), 130)
        waited = time.monotonic() - t_end
        self.assertLess(waited, 8.0, f"spotvisor took {waited:.1f}s to exit after run.end with Cloud Logging down")
        self.assertIn("not delivered to Cloud Logging", p.stderr)

    def test_events_and_trainer_output_reach_their_logs_before_on_exit(self):
        self.logging.fault(429, count=2)  # retried with backoff
        p, code = self.run_api(["--print", "hello", "--stderr", "oops", "--run-for", "10", "--exit-code", "3"],
                               **{"on-exit": "poweroff", "shutdown-command": f"echo off >> {self.path('off')}"})
        self.assertEqual(code, 3)
        trainer = self.logging.entries("spotvisor-trainer")
        events = self.logging.entries("spotvisor")
        self.assertTrue([e for e in trainer if e["jsonPayload"]["message"] == "hello" and e["jsonPayload"]["stream"] == "stdout"])
        self.assertTrue([e for e in trainer if e["jsonPayload"]["message"] == "oops" and e["jsonPayload"]["stream"] == "stderr"])
        end = [e for e in events if e["jsonPayload"]["event"] == "run.end"]
        self.assertEqual(len(end), 1, "the line that says why the VM stopped was delivered before on-exit")
        self.assertEqual(end[0]["jsonPayload"]["reason"], "failed")
        self.assertEqual(end[0]["severity"], "ERROR")
        self.assertEqual(end[0]["labels"]["run_id"], "exp1")
        self.assertEqual(end[0]["labels"]["experiment"], "lr-sweep")
        self.assertEqual(end[0]["resource"]["labels"]["project_id"], "my-project")
        self.assertEqual([e for e in events if e["jsonPayload"]["event"] == "trainer.exit"][0]["severity"], "ERROR")
        self.assertGreaterEqual(len(self.logging.requests()), 3)
        self.assertLess(len(self.logging.requests()), 10, "batched, not one request per line")
        self.assertEqual(self.read("off"), "off\n")
        self.assertNotIn("fake-token", "".join(p.raw) + p.stderr, "the token is never logged")
        self.assertNotIn("fake-token", json.dumps(self.logging.entries()))
        # stdout keeps the JSON lines too, with the extra label.
        self.assertEqual(p.wait_event("run.end")["logging.googleapis.com/labels"]["experiment"], "lr-sweep")

    def test_a_batch_resent_after_a_lost_answer_adds_no_duplicates(self):
        # The write lands, the answer says 503: spotvisor resends the batch
        # (entries.write is retried as idempotent) and the insertIds make
        # Cloud Logging count each entry once.
        self.logging.fault(503, count=2, applied=True)
        p, code = self.run_api(["--print", "hello", "--run-for", "2"])
        self.assertEqual(code, 0)
        entries = self.logging.entries()
        ids = [e.get("insertId") for e in entries]
        self.assertTrue(all(isinstance(i, str) and i for i in ids), "every entry has an insertId")
        self.assertGreater(len(entries), len(set(ids)), "the lost answers made spotvisor resend (the fake kept both copies)")
        distinct = self.logging.distinct()
        self.assertEqual(len(distinct), len(set(ids)))
        events = [e["jsonPayload"]["event"] for e in distinct if e["logName"].endswith("/logs/spotvisor")]
        self.assertEqual(events.count("run.end"), 1)
        self.assertEqual(len([e for e in distinct if e["jsonPayload"].get("message") == "hello"]), 1)

    def test_a_flood_is_dropped_and_counted_exactly_never_blocking(self):
        self.logging.delay_ms = 50  # ~10,000 entries/s at most: a 100,000-line burst must overflow the queue
        lines = 100000
        p, code = self.run_api(["--flood", str(lines), "--run-for", "10"])
        self.assertEqual(code, 0)
        received = len(self.logging.entries("spotvisor-trainer"))
        drops = sum(e["jsonPayload"]["dropped"] for e in self.logging.entries("spotvisor")
                    if e["jsonPayload"]["event"] == "log.dropped")
        self.assertGreater(drops, 0, "the flood should have overflowed the queue")
        printed = lines + 2  # the fake trainer's "started" and "exiting" lines
        self.assertEqual(received + drops, printed, "every line is either delivered or counted as dropped")
        self.assertTrue([e for e in self.logging.entries("spotvisor") if e["jsonPayload"]["event"] == "run.end"])

    def test_a_configuration_error_reaches_cloud_logging(self):
        self.metadata.set("instance/attributes/spotvisor-restart", "sometimes")
        _, code = self.run_api(["--run-for", "10"])
        self.assertEqual(code, 78)
        events = {e["jsonPayload"]["event"]: e for e in self.logging.entries("spotvisor")}
        self.assertIn("instance metadata spotvisor-restart", events["config.error"]["jsonPayload"]["message"])
        self.assertEqual(events["config.error"]["severity"], "ERROR")
        self.assertEqual(events["run.end"]["jsonPayload"]["reason"], "config-error")

    def test_log_to_stdout_sends_nothing(self):
        _, code = self.run_api(["--run-for", "10"], **{"log-to": "stdout"})
        self.assertEqual(code, 0)
        self.assertEqual(self.logging.requests(), [])


class JournaldTest(SpotvisorTestCase):
    def test_log_to_journald_writes_native_fields(self):
        import shutil
        import subprocess
        from harness import ROOT, SPOTVISOR, FAKE_TRAINER
        if shutil.which("unshare") is None or os.geteuid() != 0:
            self.skipTest("needs root and unshare for a private /run")
        out = self.path("journal.json")
        fake = os.path.join(ROOT, "tests", "fakes", "fake_journal.py")
        # A private mount namespace with a tmpfs on /run: the fake journal
        # socket there is the only one spotvisor can see.
        script = ('mount -t tmpfs tmpfs /run && exec "$@"')
        cmd = (["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", "/usr/bin/python3", fake,
                "/run/systemd/journal/socket", out, "--", SPOTVISOR, "run"]
               + self.base_sets(**{"log-to": "journald", "run-id": "jr", "log-labels": "experiment=j"})
               + ["--", FAKE_TRAINER, "--print", "hello journal", "--run-for", "10", "--exit-code", "2"])
        env = dict(os.environ, **self.env())
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        with open(out) as f:
            entries = json.load(f)
        by_event = {}
        for e in entries:
            by_event.setdefault(e.get("SPOTVISOR_EVENT"), []).append(e)
        end = by_event["run.end"][0]
        self.assertEqual(end["SYSLOG_IDENTIFIER"], "spotvisor")
        self.assertEqual(end["PRIORITY"], "3")  # a failed run is an error
        self.assertEqual(end["SPOTVISOR_REASON"], "failed")
        self.assertEqual(end["SPOTVISOR_LABEL_RUN_ID"], "jr")
        self.assertEqual(end["SPOTVISOR_LABEL_EXPERIMENT"], "j")
        hello = [e for e in by_event["trainer.output"] if e["MESSAGE"] == "hello journal"]
        self.assertEqual(hello[0]["SYSLOG_IDENTIFIER"], "spotvisor-trainer")
        self.assertEqual(hello[0]["SPOTVISOR_STREAM"], "stdout")
        self.assertNotIn('"event":"run.end"', r.stdout, "journald replaces stdout")


if __name__ == "__main__":
    unittest.main()

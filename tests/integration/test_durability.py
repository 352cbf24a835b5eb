"""Durability you can see (issue #14): the newest commit's age and what is not
committed yet, in status, guest attributes, events and committed.json; a
stalled sync warned about, then (sync-stall-action = stop) the run ended."""
import json
import os
import signal
import subprocess
import unittest

from harness import SpotvisorTestCase, SPOTVISOR, FAKE_TRAINER, ROOT, wait_until

EXAMPLE = os.path.join(ROOT, "examples", "committed.py")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


class DurabilityTest(SpotvisorTestCase):
    BUCKET = "ckpt-bucket"

    def setUp(self):
        super().setUp()
        from fake_gcs import FakeGcsServer
        self.gcs = FakeGcsServer(buckets=[self.BUCKET]).start()
        self.addCleanup(self.gcs.stop)
        self.gcs_env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.gcs.port}"}

    def vm(self, trainer_args, **sets):
        base = {"bucket": f"gs://{self.BUCKET}/exp", "run-id": "run1", "sync-settle": "0s",
                "sync-interval": "300ms", "checkpoint-report-interval": "300ms"}
        base.update(sets)
        return self.run_trainer(trainer_args, sets=base, env=self.gcs_env)

    def manifest(self):
        return json.loads(self.gcs.get_object_bytes(self.BUCKET, "exp/run1/manifest.json"))

    def status(self):
        out = subprocess.run([SPOTVISOR, "status", "--state-dir", self.path("state"), "--json"],
                             capture_output=True, text=True)
        return json.loads(out.stdout)

    def guest(self, key):
        try:
            return self.metadata.state(f"instance/guest-attributes/spotvisor/{key}")["value"]
        except KeyError:
            return None

    def test_the_newest_commit_and_what_is_not_committed_are_visible_everywhere(self):
        p = self.vm(["--checkpoint-every", "150"])
        p.wait_trainer_ready()
        synced = wait_until(lambda: [e for e in p.find("sync.complete", kind="periodic") if e["sequence"] >= 2],
                            what="two periodic commits")[0]
        # Each sync.complete says how old the newest commit is and what is still at risk.
        self.assertIsInstance(synced["age_s"], (int, float))
        self.assertGreaterEqual(synced["age_s"], 0)
        self.assertIsInstance(synced["uncommitted_files"], int)
        self.assertIsInstance(synced["uncommitted_bytes"], int)
        # The periodic report, for a log-based metric.
        age = wait_until(lambda: [e for e in p.find("checkpoint.age") if e.get("sequence", 0) >= 1],
                         what="a checkpoint.age event after a commit")[0]
        for field in ("age_s", "committed_at", "uncommitted_files", "uncommitted_bytes", "lag_s", "caught_up_at"):
            self.assertIn(field, age)
        self.assertIs(age["stalled"], False)
        self.assertRegex(age["message"], r"newest commit #\d+ is \S+ old")

        # status --json and the text form.
        st = wait_until(lambda: self.status().get("checkpoint", {}).get("sequence", 0) >= 1 and self.status(),
                        what="status.json with a commit")
        ck = st["checkpoint"]
        self.assertGreaterEqual(ck["files"], 1)
        self.assertGreater(ck["bytes"], 0)
        self.assertEqual(ck["instance"], "spotvisor-test")
        text = subprocess.run([SPOTVISOR, "status", "--state-dir", self.path("state")], capture_output=True, text=True).stdout
        self.assertRegex(text, r"checkpoint:\s+#\d+ committed \S+ \(\S+ ago\): \d+ file\(s\)")
        self.assertRegex(text, r"caught up:\s+\S+ ago")

        # Guest attributes: visible without ssh.
        g = wait_until(lambda: self.guest("checkpoint"), what="the checkpoint guest attribute")
        self.assertIn("sequence", json.loads(g))

        # committed.json names exactly what the bucket's manifest holds.
        def agree():
            with open(self.path("state/committed.json")) as f:
                c = json.load(f)
            m = self.manifest()
            return c if c["sequence"] == m["sequence"] and \
                sorted(e["path"] for e in c["files"]) == sorted(e["path"] for e in m["files"]) else None
        c = wait_until(agree, what="committed.json agreeing with the manifest")
        self.assertEqual(oct(os.stat(self.path("state/committed.json")).st_mode & 0o777), "0o644")
        # The example a trainer would use reads it.
        env = dict(os.environ, SPOTVISOR_COMMITTED_FILE=self.path("state/committed.json"))
        first = c["files"][0]
        ok = subprocess.run([PYTHON, EXAMPLE, "--holds", first["path"], "--size", str(first["size"])], env=env)
        self.assertEqual(ok.returncode, 0)
        self.assertEqual(subprocess.run([PYTHON, EXAMPLE, "--holds", "no-such-file"], env=env).returncode, 1)
        summary = subprocess.run([PYTHON, EXAMPLE], env=env, capture_output=True, text=True)
        self.assertEqual(summary.returncode, 0, summary.stderr)
        self.assertRegex(summary.stdout, r"commit #\d+ in gs://ckpt-bucket/exp/run1: \d+ file\(s\)")
        p.signal(signal.SIGTERM)
        p.wait_exit()

    def test_the_trainer_is_told_where_committed_json_is(self):
        p = self.vm(["--print-env", "--run-for", "10"])
        p.wait_exit()
        out = [e["message"] for e in p.find("trainer.output")]
        self.assertIn(f"SPOTVISOR_COMMITTED_FILE={self.path('state')}/committed.json", out)

    def test_a_stalled_sync_is_a_warning_then_an_error_and_stop_ends_the_run_with_on_exit(self):
        out = self.path("on-exit")
        p = self.vm(["--checkpoint-every", "100"],
                    **{"sync-alert-after": "1500ms", "sync-stall-action": "stop", "on-exit": "poweroff",
                       "shutdown-command": f"echo ran >> {out}"})
        p.wait_trainer_ready()
        wait_until(lambda: [e for e in p.find("sync.complete", kind="periodic") if e["sequence"] >= 1], what="a commit")
        # The bucket starts refusing writes (a revoked role, a read-only scope).
        self.gcs.fault("status", code=403)
        warn = p.wait_event("sync.stalled", level=1)
        self.assertEqual(warn["severity"], "WARNING")
        self.assertIn("failed", warn["cause"])
        self.assertIn("403", warn["cause"])
        self.assertGreater(warn["uncommitted_files"], 0)
        self.assertTrue(self.status()["checkpoint"]["stalled"])
        err = p.wait_event("sync.stalled", level=2)
        self.assertEqual(err["severity"], "ERROR")
        self.assertEqual(err["action"], "stop")
        sig = p.wait_event("trainer.signal")
        self.assertEqual(sig["signal"], "SIGINT")
        p.wait_exit()
        end = p.wait_event("run.end")
        self.assertEqual(end["reason"], "sync-stalled")
        self.assertNotEqual(end["exit_code"], 0)
        # A run that cannot make its progress durable does not keep billing.
        wait_until(lambda: os.path.exists(out), what="on-exit to run")
        self.assertFalse([e for e in p.find("sync.complete") if e["sequence"] >= 1 and e["kind"] == "final"])

    def test_a_stall_that_clears_is_reported_as_recovered_and_warn_only_warns(self):
        p = self.vm(["--checkpoint-every", "100"], **{"sync-alert-after": "1200ms"})
        p.wait_trainer_ready()
        wait_until(lambda: [e for e in p.find("sync.complete", kind="periodic") if e["sequence"] >= 1], what="a commit")
        self.gcs.fault("status", code=403)
        p.wait_event("sync.stalled", level=1)
        self.gcs.fault("none")
        rec = p.wait_event("sync.recovered")
        self.assertIn("caught_up_at", rec)
        self.assertFalse(p.find("trainer.signal"))  # warn: the trainer keeps running
        wait_until(lambda: self.status()["checkpoint"]["stalled"] is False, what="status no longer stalled")
        p.signal(signal.SIGTERM)
        p.wait_exit()


if __name__ == "__main__":
    unittest.main()

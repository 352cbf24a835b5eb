"""`spotvisor runs` and `spotvisor pull` (issue #14): a person's view of a
bucket from a laptop, against runs that spotvisor itself wrote to the fake
GCS, and with the credentials Google's tools use (Application Default
Credentials against a fake OAuth token endpoint, or --access-token-command)."""
import json
import time
import os
import shutil
import signal
import subprocess
import unittest

from harness import SpotvisorTestCase, SPOTVISOR, wait_until

TOKEN = "ya29.fake-user-token"


class LaptopCommandsTest(SpotvisorTestCase):
    BUCKET = "ckpt-bucket"

    def setUp(self):
        super().setUp()
        from fake_gcs import FakeGcsServer
        self.gcs = FakeGcsServer(buckets=[self.BUCKET]).start()
        self.addCleanup(self.gcs.stop)
        self.emulator = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.gcs.port}"}

    def vm(self, run_id, ckpt, trainer_args, interval="0"):
        sets = {"bucket": f"gs://{self.BUCKET}/exp", "run-id": run_id, "checkpoint-dir": self.path(ckpt),
                "state-dir": self.path("state-" + run_id), "sync-interval": interval, "sync-settle": "0s"}
        return self.run_trainer(trainer_args, sets=sets, env=self.emulator)

    def cli(self, *args, env=None, extra_env=None):
        e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.path("home"),
             # No metadata server here: a laptop.
             "GCE_METADATA_HOST": "127.0.0.1:9"}
        e.update(self.emulator if env is None else env)
        e.update(extra_env or {})
        os.makedirs(self.path("home"), exist_ok=True)
        return subprocess.run([SPOTVISOR, *args], capture_output=True, text=True, env=e, timeout=60)

    def two_runs(self):
        """run1 completes (DONE); run2 is preempted after a few checkpoints."""
        p = self.vm("run1", "ckpt1", ["--checkpoint-every", "50", "--run-for", "300"])
        self.assertEqual(p.wait_exit(), 0)
        q = self.vm("run2", "ckpt2", ["--checkpoint-every", "50"], interval="200ms")
        q.wait_trainer_ready()
        wait_until(lambda: len(os.listdir(self.path("ckpt2"))) >= 3, what="three checkpoints")
        q.wait_event("sync.complete", kind="periodic")
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        self.assertEqual(q.wait_exit(), 130)
        q.wait_event("sync.complete", kind="final")
        self.metadata.set("instance/preempted", "FALSE")

    def test_runs_lists_each_run_with_how_it_ended(self):
        self.two_runs()
        out = self.cli("runs", f"gs://{self.BUCKET}/exp")
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertRegex(lines[0], r"^RUN_ID\s+STATE\s+EXIT\s+COMMIT\s+COMMITTED_AT\s+CHECKPOINT\s+INSTANCE\s+BOOTS"
                                   r"\s+PREEMPTED\s+VM_HOURS\s+LOST\s+GROUP\s+GROUP_NOW$")
        # Seconds, not nanoseconds (issue #32); CHECKPOINT: the commit's files, not spotvisor's own objects.
        # The history's columns (issue #30): boots, preemptions, VM hours, work lost to preemptions, group.
        self.assertRegex(lines[1], r"^run1\s+done\s+0\s+#\d+\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\s+\S+ \S+\s+spotvisor-test"
                                   r"\s+1\s+0\s+0\.\d\d\s+-\s+-\s+-$")
        self.assertRegex(lines[2], r"^run2\s+preempted\s+130\s+#\d+\s+\S+Z.*spotvisor-test\s+1\s+1\s+0\.\d\d\s+0 bytes\s+-\s+-$")
        js = self.cli("runs", "--json", f"gs://{self.BUCKET}/exp")
        runs = {r["run_id"]: r for r in json.loads(js.stdout)}
        self.assertEqual(runs["run1"]["state"], "done")
        self.assertEqual(runs["run2"]["state"], "preempted")
        self.assertEqual(runs["run2"]["exit_code"], 130)
        manifest = json.loads(self.gcs.get_object_bytes(self.BUCKET, "exp/run2/manifest.json"))
        self.assertEqual(runs["run2"]["sequence"], manifest["sequence"])
        self.assertEqual(runs["run2"]["files"], len(manifest["files"]))
        # The run's history (issue #28): one boot each, how it ended, how long it ran.
        (boot,) = runs["run2"]["boots"]
        self.assertEqual((boot["instance"], boot["reason"], boot["exit_code"]), ("spotvisor-test", "preempted", 130))
        self.assertIsNotNone(boot["ended_at"])
        self.assertGreater(boot["vm_seconds"], 0)
        self.assertEqual(boot["uncommitted_bytes"], 0, "the final sync committed everything")
        self.assertEqual(runs["run2"]["boot_summary"]["preempted"], 1)
        self.assertEqual(runs["run2"]["boot_summary"]["lost_bytes"], 0)
        self.assertIsNone(runs["run2"]["boot_summary"]["group"])
        self.assertEqual(runs["run1"]["boots"][0]["reason"], "completed")
        # What the VM wrote for it, readable by anyone listing the bucket.
        status = json.loads(self.gcs.get_object_bytes(self.BUCKET, "exp/run2/status.json"))
        self.assertEqual(status["state"], "ended")
        self.assertEqual(status["reason"], "preempted")
        empty = self.cli("runs", f"gs://{self.BUCKET}/nothing-here")
        self.assertEqual((empty.returncode, empty.stdout.strip()), (0, f"no runs under gs://{self.BUCKET}/nothing-here"))
        manifest1 = json.loads(self.gcs.get_object_bytes(self.BUCKET, "exp/run1/manifest.json"))
        self.assertEqual(runs["run1"]["checkpoint_bytes"], sum(f["size"] for f in manifest1["files"]))
        self.assertGreater(runs["run1"]["bytes"], runs["run1"]["checkpoint_bytes"], "bytes: every object of the run")
        # The bucket without the prefix: where the runs are (issue #32).
        top = self.cli("runs", f"gs://{self.BUCKET}")
        self.assertEqual(top.returncode, 0, top.stderr)
        self.assertIn(f"2 run(s) one level down: spotvisor runs gs://{self.BUCKET}/exp", top.stdout)
        missing = self.cli("runs", "file:///nonexistent/spotvisor-runs")
        self.assertEqual(missing.returncode, 1)
        self.assertIn("no such directory", missing.stderr)

    def test_pull_brings_the_newest_commit_back_under_the_trainers_names_and_resumes(self):
        self.two_runs()
        dest = self.path("pulled")
        out = self.cli("pull", f"gs://{self.BUCKET}/exp/run2", dest)
        self.assertEqual(out.returncode, 0, out.stderr)
        manifest = json.loads(self.gcs.get_object_bytes(self.BUCKET, "exp/run2/manifest.json"))
        for f in manifest["files"]:
            with open(os.path.join(dest, f["path"]), "rb") as a, open(self.path("ckpt2/" + f["path"]), "rb") as b:
                self.assertEqual(a.read(), b.read(), f["path"])
        self.assertIn(f"pulled commit #{manifest['sequence']}", out.stdout)
        # Interrupted or tampered with: a second pull fetches only what is missing or wrong.
        first, second = manifest["files"][0]["path"], manifest["files"][1]["path"]
        os.remove(os.path.join(dest, first))
        with open(os.path.join(dest, second), "wb") as f:
            f.write(b"garbage")
        again = self.cli("pull", f"gs://{self.BUCKET}/exp/run2", dest)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertRegex(again.stdout, rf"{len(manifest['files'])} file\(s\), 2 downloaded")
        with open(os.path.join(dest, second), "rb") as a, open(self.path("ckpt2/" + second), "rb") as b:
            self.assertEqual(a.read(), b.read())
        # Default directory: ./RUN_ID.
        cwd_run = subprocess.run([SPOTVISOR, "pull", f"gs://{self.BUCKET}/exp/run1"], capture_output=True, text=True,
                                 cwd=self.tmp, env=dict(self.emulator, PATH=os.environ.get("PATH", ""),
                                                        HOME=self.path("home"), GCE_METADATA_HOST="127.0.0.1:9"))
        self.assertEqual(cwd_run.returncode, 0, cwd_run.stderr)
        self.assertTrue(os.listdir(self.path("run1")))
        self.assertIn("(the run is done)", cwd_run.stdout)
        # An older commit is not kept; a run that does not exist is said so.
        self.assertGreater(manifest["sequence"], 1)  # a periodic commit, then the final one
        old = self.cli("pull", "--sequence", "1", f"gs://{self.BUCKET}/exp/run2", self.path("old"))
        self.assertEqual(old.returncode, 1)
        self.assertIn("commit #1 is not kept", old.stderr)
        same = self.cli("pull", "--sequence", str(manifest["sequence"]), f"gs://{self.BUCKET}/exp/run2", self.path("same"))
        self.assertEqual(same.returncode, 0, same.stderr)
        missing = self.cli("pull", f"gs://{self.BUCKET}/exp/no-such-run", self.path("x"))
        self.assertEqual(missing.returncode, 1)
        self.assertIn("nothing was committed to this run", missing.stderr)
        self.assertEqual(self.cli("pull", "not-a-url").returncode, 64)
        self.assertEqual(self.cli("pull", "--sequence", "zero", f"gs://{self.BUCKET}/exp/run2").returncode, 64)

    def commit(self, files, remove=()):
        """One boot of run3 that commits ckpt3 holding `files` (name -> bytes) and not `remove`."""
        os.makedirs(self.path("ckpt3"), exist_ok=True)
        for name in remove:
            os.remove(self.path(f"ckpt3/{name}"))
        for name, data in files.items():
            with open(self.path(f"ckpt3/{name}"), "wb") as f:
                f.write(data)
        p = self.vm("run3", "ckpt3", ["--run-for", "10", "--exit-code", "1"])
        self.assertEqual(p.wait_exit(), 1)
        p.wait_event("sync.complete", kind="final")

    def test_a_second_pull_leaves_exactly_the_newest_commit_and_sets_local_edits_aside(self):
        # Issue #28: a pull into a directory holding an earlier pull left files
        # of two commits mixed and overwrote a file the user had edited.
        self.commit({"a.bin": b"a1" * 1000, "b.bin": b"b1" * 1000, "c.bin": b"c1" * 1000})
        dest = self.path("pulled3")
        first = self.cli("pull", f"gs://{self.BUCKET}/exp/run3", dest)
        self.assertEqual(first.returncode, 0, first.stderr)
        with open(os.path.join(dest, "a.bin"), "wb") as f:
            f.write(b"my edit")  # edited on the laptop
        with open(os.path.join(dest, "notes.txt"), "w") as f:
            f.write("mine")      # never pulled
        self.commit({"b.bin": b"b2" * 1000, "d.bin": b"d2" * 1000}, remove=["c.bin"])
        second = self.cli("pull", f"gs://{self.BUCKET}/exp/run3", dest)
        self.assertEqual(second.returncode, 0, second.stderr)
        here = {}
        for d, dirs, files in os.walk(dest):
            dirs[:] = [x for x in dirs if x != ".spotvisor-replaced"]
            for name in files:
                rel = os.path.relpath(os.path.join(d, name), dest)
                if rel != ".spotvisor-pull.json":
                    with open(os.path.join(d, name), "rb") as f:
                        here[rel] = f.read()
        self.assertEqual(here, {"a.bin": b"a1" * 1000, "b.bin": b"b2" * 1000, "d.bin": b"d2" * 1000},
                         "exactly the newest commit")
        self.assertIn("removed 2 file(s) an earlier pull put there", second.stdout)  # c.bin, the old b.bin
        self.assertIn("set aside 2 file(s) that are not this commit's", second.stdout)
        aside_root = os.path.join(dest, ".spotvisor-replaced")
        (gen,) = os.listdir(aside_root)
        self.assertIn(os.path.join(aside_root, gen), second.stdout)
        with open(os.path.join(aside_root, gen, "a.bin"), "rb") as f:
            self.assertEqual(f.read(), b"my edit")
        with open(os.path.join(aside_root, gen, "notes.txt")) as f:
            self.assertEqual(f.read(), "mine")
        # Pulled again with nothing new: nothing removed, nothing set aside, nothing downloaded.
        third = self.cli("pull", f"gs://{self.BUCKET}/exp/run3", dest)
        self.assertEqual(third.returncode, 0, third.stderr)
        self.assertRegex(third.stdout, r"3 file\(s\), 0 downloaded")
        self.assertNotIn("removed", third.stdout)
        self.assertNotIn("set aside", third.stdout)

    def test_gc_never_deletes_a_run_a_vm_holds_a_live_claim_on_and_collects_one_whose_claim_expired(self):
        # Issue #28: `gc --keep 0 --delete` deleted a run whose VM was
        # restoring it (no status.json says running before the restore ends).
        self.commit({"a.bin": b"a" * 300000})
        self.gcs.fault("slow", delay_ms=60000, kind="download", object_prefix="exp/run3/checkpoints/")
        p = self.vm("run3", "ckpt3-vm2", ["--run-for", "60000"])
        wait_until(lambda: self.gcs.objects(self.BUCKET, "exp/run3/claims/"), what="the VM's claim")
        p.wait_event("restore.start")
        runs = self.cli("runs", f"gs://{self.BUCKET}/exp")
        self.assertRegex(runs.stdout, r"run3\s+running")
        before = {o["name"] for o in self.gcs.objects(self.BUCKET, "exp/run3/")}
        gc = self.cli("gc", "--keep", "0", "--delete", f"gs://{self.BUCKET}/exp")
        self.assertEqual(gc.returncode, 0, gc.stderr)
        self.assertRegex(gc.stdout, r"keep\s+run3: spotvisor-test holds a live claim on it \(restoring, renewed \S+, expires \S+\)")
        self.assertEqual({o["name"] for o in self.gcs.objects(self.BUCKET, "exp/run3/")}, before)
        self.gcs.fault("none")
        p.wait_event("restore.complete")
        p.wait_event("trainer.start")
        p.signal(signal.SIGTERM)
        p.wait_exit()
        self.assertFalse(self.gcs.objects(self.BUCKET, "exp/run3/claims/"), "released when the run ended")
        # A VM that died without a word: its claim expires, and with it the
        # run's protection (its commit is older than a claim's lifetime).
        self.put_run()
        self.gcs.put_object(self.BUCKET, "exp/r7/claims/vm-7.0123456789abcdef.json", json.dumps({
            "version": 1, "run_id": "r7", "instance": "vm-7", "token": "0123456789abcdef", "state": "running",
            "claimed_at": "2026-11-24T09:00:00Z", "renewed_at": "2026-11-24T09:50:00Z",
            "expires_at": "2026-11-24T10:00:00Z", "ttl_s": 600}).encode())
        gc = self.cli("gc", "--keep", "0", "--delete", f"gs://{self.BUCKET}/exp")
        self.assertEqual(gc.returncode, 0, gc.stderr)
        self.assertRegex(gc.stdout, r"delete\s+r7")
        self.assertFalse(self.gcs.objects(self.BUCKET, "exp/r7/"))

    def test_gc_lists_by_default_and_deletes_only_when_asked_never_a_running_run(self):
        self.two_runs()  # run1 finished first, run2 later
        self.gcs.put_object(self.BUCKET, "exp/live/status.json",
                            json.dumps({"state": "running", "time": "2020-01-01T00:00:00Z"}).encode())
        before = {o["name"] for o in self.gcs.objects(self.BUCKET, "exp/")}
        dry = self.cli("gc", "--keep", "1", f"gs://{self.BUCKET}/exp")
        self.assertEqual(dry.returncode, 0, dry.stderr)
        self.assertRegex(dry.stdout, r"would delete run1 \(done, last \S+\): \d+ object\(s\)")
        self.assertRegex(dry.stdout, r"keep\s+run2")
        self.assertRegex(dry.stdout, r"keep\s+live: its VM says it is running")
        self.assertIn("dry run: 1 run(s)", dry.stdout)
        self.assertEqual({o["name"] for o in self.gcs.objects(self.BUCKET, "exp/")}, before)
        none = self.cli("gc", "--older-than", "1h", f"gs://{self.BUCKET}/exp")
        self.assertIn("dry run: 0 run(s)", none.stdout)
        done = self.cli("gc", "--keep", "1", "--delete", f"gs://{self.BUCKET}/exp")
        self.assertEqual(done.returncode, 0, done.stderr)
        left = {o["name"] for o in self.gcs.objects(self.BUCKET, "exp/")}
        self.assertFalse([n for n in left if n.startswith("exp/run1/")])
        self.assertEqual(left, {n for n in before if not n.startswith("exp/run1/")})
        listed = self.cli("runs", f"gs://{self.BUCKET}/exp").stdout
        self.assertNotIn("run1", listed)
        self.assertIn("run2", listed)
        self.assertEqual(self.cli("gc", f"gs://{self.BUCKET}/exp").returncode, 64)
        self.assertEqual(self.cli("gc", "--keep", "x", f"gs://{self.BUCKET}/exp").returncode, 64)

    def put_run(self):
        manifest = {"version": 2, "run_id": "r7", "sequence": 3, "instance": "vm-7", "commit_id": "c" * 32,
                    "committed_at": "2026-11-24T10:00:00.000000000Z", "marker": False, "files": []}
        self.gcs.put_object(self.BUCKET, "exp/r7/manifest.json", json.dumps(manifest).encode())


class LaptopCredentialsTest(LaptopCommandsTest):
    """No emulator: the fake GCS demands a token, which the commands get as Google's tools do."""

    def setUp(self):
        SpotvisorTestCase.setUp(self)
        from fake_gcs import FakeGcsServer
        from fake_oauth import FakeOAuthServer
        self.gcs = FakeGcsServer(buckets=[self.BUCKET], require_token=TOKEN).start()
        self.addCleanup(self.gcs.stop)
        self.oauth = FakeOAuthServer(access_token=TOKEN).start()
        self.addCleanup(self.oauth.stop)
        self.endpoint = f"http://127.0.0.1:{self.gcs.port}"
        self.put_run()

    def adc_file(self, **overrides):
        path = self.path("adc.json")
        with open(path, "w") as f:
            json.dump(self.oauth.adc(**overrides), f)
        return path

    def runs(self, *args, extra_env=None):
        return self.cli("runs", "--storage-endpoint", self.endpoint, *args, f"gs://{self.BUCKET}/exp", env={},
                        extra_env=extra_env)

    def test_application_default_credentials_refresh_token(self):
        out = self.runs(extra_env={"GOOGLE_APPLICATION_CREDENTIALS": self.adc_file()})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"r7\s+unknown\s+-\s+#3")
        self.assertNotIn(TOKEN, out.stdout + out.stderr)
        self.assertNotIn(self.oauth.refresh_token, out.stdout + out.stderr)
        self.assertEqual(len(self.oauth.requests), 1)
        self.assertEqual(self.oauth.requests[0]["form"]["grant_type"], "refresh_token")

    def test_gclouds_own_file_is_found_without_the_variable(self):
        os.makedirs(self.path("home/.config/gcloud"), exist_ok=True)
        shutil.copy(self.adc_file(), self.path("home/.config/gcloud/application_default_credentials.json"))
        out = self.runs()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("r7", out.stdout)

    def test_a_revoked_login_says_how_to_log_in_again(self):
        out = self.runs(extra_env={"GOOGLE_APPLICATION_CREDENTIALS": self.adc_file(refresh_token="1//revoked")})
        self.assertEqual(out.returncode, 1)
        self.assertIn("gcloud auth application-default login", out.stderr)
        self.assertNotIn("1//revoked", out.stderr)

    def test_a_service_account_key_signs_its_assertion_and_gets_a_token(self):
        key = self.oauth.service_account()
        path = self.path("sa.json")
        with open(path, "w") as f:
            json.dump(key, f)
        out = self.runs(extra_env={"GOOGLE_APPLICATION_CREDENTIALS": path})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"r7\s+unknown\s+-\s+#3")
        # The fake verified the RS256 signature with the key's public half.
        self.assertEqual([r["form"]["grant_type"] for r in self.oauth.requests],
                         ["urn:ietf:params:oauth:grant-type:jwt-bearer"])
        header, claims = self.oauth.assertions[0]
        self.assertEqual(header.get("kid"), key["private_key_id"])
        self.assertEqual(claims["iss"], key["client_email"])
        self.assertLessEqual(abs(claims["iat"] - time.time()), 60)
        for secret in (TOKEN, "PRIVATE KEY", key["private_key"].splitlines()[1]):
            self.assertNotIn(secret, out.stdout + out.stderr)

    def test_launch_asks_a_service_account_key_for_the_cloud_platform_scope(self):
        # `runs` and friends ask for Cloud Storage only; `launch` creates a template and a group.
        from fake_compute import FakeComputeServer
        compute = FakeComputeServer("my-project", "us-central1-a", "x", token_ok=lambda t: t == TOKEN).start()
        self.addCleanup(compute.stop)
        key = self.oauth.service_account()
        path = self.path("sa.json")
        with open(path, "w") as f:
            json.dump(key, f)
        out = self.cli("launch", "--project", "my-project", "--zone", "us-central1-a", "--run-id", "r1",
                       "--bucket", f"gs://{self.BUCKET}/exp", "--image-family", "spotvisor",
                       "--compute-endpoint", compute.endpoint, "--", "python3", "train.py",
                       env={}, extra_env={"GOOGLE_APPLICATION_CREDENTIALS": path})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(compute.group("r1")["targetSize"], 1)
        self.assertEqual([claims["scope"] for _, claims in self.oauth.assertions],
                         ["https://www.googleapis.com/auth/cloud-platform"])
        self.assertNotIn("PRIVATE KEY", out.stdout + out.stderr)

    def test_a_deleted_service_account_key_is_refused_naming_the_account(self):
        key = self.oauth.service_account()
        self.oauth.delete_key(key["client_email"], key["private_key_id"])
        path = self.path("sa.json")
        with open(path, "w") as f:
            json.dump(key, f)
        out = self.runs(extra_env={"GOOGLE_APPLICATION_CREDENTIALS": path})
        self.assertEqual(out.returncode, 1)
        self.assertIn("Invalid JWT Signature.", out.stderr)
        self.assertIn(key["client_email"], out.stderr)
        self.assertIn("deleted or disabled", out.stderr)
        self.assertNotIn("PRIVATE KEY", out.stderr)
        # A key file that is not one: named, with the problem, before any request.
        with open(path, "w") as f:
            json.dump(dict(key, private_key="-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n"), f)
        bad = self.runs(extra_env={"GOOGLE_APPLICATION_CREDENTIALS": path})
        self.assertEqual(bad.returncode, 1)
        self.assertIn("private_key is not a PEM private key", bad.stderr)
        self.assertEqual(len(self.oauth.requests), 1)

    def test_access_token_command(self):
        out = self.runs("--access-token-command", f"echo {TOKEN}")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("r7", out.stdout)
        self.assertNotIn(TOKEN, out.stdout + out.stderr)
        bad = self.runs("--access-token-command", "echo oops >&2; exit 3")
        self.assertEqual(bad.returncode, 1)
        self.assertIn("failed (exit code 3)", bad.stderr)
        wrong = self.runs("--access-token-command", "echo ya29.not-the-token")
        self.assertEqual(wrong.returncode, 1)

    def test_no_credentials_at_all_says_what_to_do(self):
        out = self.runs()
        self.assertEqual(out.returncode, 1)
        self.assertIn("gcloud auth application-default login", out.stderr)

    # The spotvisor-written runs need the emulator: covered by LaptopCommandsTest.
    test_runs_lists_each_run_with_how_it_ended = None
    test_pull_brings_the_newest_commit_back_under_the_trainers_names_and_resumes = None
    test_gc_lists_by_default_and_deletes_only_when_asked_never_a_running_run = None
    test_a_second_pull_leaves_exactly_the_newest_commit_and_sets_local_edits_aside = None
    test_gc_never_deletes_a_run_a_vm_holds_a_live_claim_on_and_collects_one_whose_claim_expired = None


if __name__ == "__main__":
    unittest.main()

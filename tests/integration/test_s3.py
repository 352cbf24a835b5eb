"""Checkpoints in S3 (issue #13): every file-store sync test again through the S3 REST API against the fake S3
(SigV4 verified), and what is S3's own: multipart uploads with a FULL_OBJECT crc32c, conditional manifest writes,
credentials from the environment and from an instance role that rotates, a bucket in another region, and a
real client (boto3) reading back what spotvisor wrote with its checksums validated."""
import json
import os
import shutil
import signal
import subprocess
import sys
import unittest

from harness import SpotvisorTestCase, SPOTVISOR, wait_until

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))
import test_sync  # noqa: E402  (its FileSyncTest is subclassed, not collected here)

AKID, SECRET = "AKIASPOTVISORTEST01", "spotvisor/test+secret/0123456789abcdefghij"

try:
    import boto3  # noqa: F401
    from botocore.config import Config as BotoConfig
    HAVE_BOTO3 = True
except ImportError:  # Debian's python3-boto3, installed by scripts/install-deps.sh
    HAVE_BOTO3 = False


def start_fake_s3(test, bucket):
    """The fake S3 with one bucket and one key pair, stopped at the test's end, and the environment that points
    spotvisor at it: the documented overrides, as the AWS SDKs and CLI read them."""
    from fake_s3 import FakeS3Server
    s3 = FakeS3Server(buckets=[bucket], credentials={AKID: SECRET}).start()
    test.addCleanup(s3.stop)
    return s3, {"AWS_ENDPOINT_URL_S3": s3.endpoint, "AWS_ACCESS_KEY_ID": AKID,
                "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"}


class S3SyncTest(test_sync.FileSyncTest):
    """FileSyncTest's scenarios (preemption and resume, delta uploads, DONE, failed restores, periodic and
    on-demand syncs) through s3://, plus S3's own."""

    BUCKET = "ckpt-bucket"
    PREFIX = "exp/run1/"

    def setUp(self):
        super().setUp()
        self.s3, self.extra_env = start_fake_s3(self, self.BUCKET)

    def bucket(self):
        return f"s3://{self.BUCKET}/exp"

    def objects(self):
        return sorted(k[len(self.PREFIX):] for k in self.s3.objects(self.BUCKET, self.PREFIX))

    def object_bytes(self, name):
        return self.s3.get_object_bytes(self.BUCKET, self.PREFIX + name)

    def put_object(self, name, data):
        self.s3.put_object(self.BUCKET, self.PREFIX + name, data)

    def big_file(self, name, size):
        os.makedirs(os.path.dirname(self.path(name)), exist_ok=True)
        data = os.urandom(size)
        with open(self.path(name), "wb") as f:
            f.write(data)
        return data

    def test_a_large_file_goes_up_as_a_multipart_upload_s3_checks_as_a_whole(self):
        big = self.big_file("ckpt/big.bin", 40 * 1024 * 1024 + 12345)
        p = self.vm(["--run-for", "10"], **{"sync-parallelism": "2"})
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        self.assertEqual(p.wait_event("sync.complete", kind="final")["bytes"], len(big))
        kinds = [e[0] for e in self.s3.log()]
        self.assertEqual(self.s3.hits("create_multipart"), 1)
        self.assertEqual(self.s3.hits("upload_part"), 6)  # 8 MiB parts, the last short
        self.assertEqual(self.s3.hits("complete"), 1)
        self.assertEqual(self.s3.uploads(self.BUCKET), [], "no upload left open")
        entry = [f for f in self.manifest()["files"] if f["path"] == "big.bin"][0]
        info = self.s3.objects(self.BUCKET, self.PREFIX)[self.PREFIX + entry["object"]]
        self.assertTrue(info["etag"].strip('"').endswith("-6"), info)
        self.assertEqual(info["checksum_type"], "FULL_OBJECT")
        self.assertEqual(info["crc32c"], entry["crc32c"])
        self.assertEqual(self.object_bytes(entry["object"]), big)
        self.assertTrue(kinds)
        # And a new VM gets it back byte for byte, as parallel ranges.
        self.s3.delete_object(self.BUCKET, self.PREFIX + "DONE")
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2", **{"sync-parallel-min-size": "20M"})
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-20:]))
        with open(self.path("ckpt2/big.bin"), "rb") as f:
            self.assertEqual(f.read(), big)
        ranged = [e for e in self.s3.log() if e[0] == "GET" and "checkpoints/" in e[1]]
        self.assertGreaterEqual(len(ranged), 3)

    def test_faults_on_parts_and_on_complete_are_retried_and_leave_no_upload(self):
        big = self.big_file("ckpt/big.bin", 20 * 1024 * 1024)
        self.s3.fault("upload_part", code=503, count=1)  # SlowDown
        self.s3.fault("upload_part", reset=True, count=1)
        # The upload completes, its answer is lost: the replay finds it done.
        self.s3.fault("complete", reset=True, after_commit=True, count=1)
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        self.assertEqual(self.s3.uploads(self.BUCKET), [])
        entry = [f for f in self.manifest()["files"] if f["path"] == "big.bin"][0]
        self.assertEqual(self.object_bytes(entry["object"]), big)

    def test_kill_9_mid_multipart_restores_the_previous_commit(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(b"epoch-1" * 1000)
        p = self.vm(["--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        p.signal(signal.SIGUSR1)
        p.wait_event("sync.complete", kind="on-demand")
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(os.urandom(20 * 1024 * 1024))
        self.s3.fault("upload_part", delay=30, count=100)
        p.signal(signal.SIGUSR1)
        wait_until(lambda: self.s3.uploads(self.BUCKET), what="a multipart upload under way")
        p.proc.kill()
        p.wait_exit()
        start = [line for line in self.marker_lines() if line.startswith("start pid=")]
        if start:
            try:
                os.killpg(int(start[0].split("pid=")[1].split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.s3.clear_faults()
        # The upload the kill left behind is billed until aborted: the next start aborts it once it
        # is a day old. A young one (another instance's, under way) is left alone.
        left = self.s3.uploads(self.BUCKET)
        self.assertEqual(len(left), 1)
        self.s3.backdate_upload(left[0]["upload_id"], 2 * 86400)
        young = self.s3.create_upload(self.BUCKET, self.PREFIX + "checkpoints/other~9.x")
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2")
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-20:]))
        self.assertEqual(p2.wait_event("restore.complete")["sequence"], 1)
        with open(self.path("ckpt2/model"), "rb") as f:
            self.assertEqual(f.read(), b"epoch-1" * 1000)
        self.assertEqual([u["upload_id"] for u in self.s3.uploads(self.BUCKET)], [young])

    def test_the_manifest_is_written_under_s3_conditions(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w")
        p = self.vm(["--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        p.signal(signal.SIGUSR1)
        p.wait_event("sync.complete", kind="on-demand")
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w2")
        p.signal(signal.SIGUSR1)
        wait_until(lambda: len(p.find("sync.complete", kind="on-demand")) >= 2, what="a second commit")
        puts = [e for e in self.s3.requests() if e["method"] == "PUT" and e["key"] == self.PREFIX + "manifest.json"]
        self.assertEqual(puts[0]["headers"].get("if-none-match"), "*", "the first commit: only if there is none")
        self.assertTrue(puts[-1]["headers"].get("if-match", "").startswith('"'), "later ones: only over ours")
        # Another writer replaces the manifest: the next commit must not clobber it.
        theirs = dict(self.manifest(), instance="someone-else", commit_id="e" * 32)
        self.put_object("manifest.json", json.dumps(theirs).encode())
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w3")
        p.signal(signal.SIGUSR1)
        fenced = p.wait_event("sync.fenced", kind="on-demand")
        self.assertIn("someone-else", fenced["message"])
        self.assertEqual(self.manifest()["instance"], "someone-else")
        p.signal(signal.SIGTERM)
        p.wait_exit()

    def test_a_conditional_write_conflict_on_the_manifest_is_retried(self):
        # S3 answers 409 ConditionalRequestConflict to one of two racing conditional writes: the
        # commit is tried again (and then meets 412 if the other writer won, handled as above).
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w")
        self.s3.fault("put", code=409, error="ConditionalRequestConflict", count=1,
                      key_prefix=self.PREFIX + "manifest.json")
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        puts = [e for e in self.s3.requests() if e["method"] == "PUT" and e["key"] == self.PREFIX + "manifest.json"]
        self.assertEqual([e["status"] for e in puts[:2]], [409, 200])
        self.assertEqual(self.manifest()["sequence"], 1)

    def test_a_wrong_secret_is_named_and_never_printed(self):
        env = dict(self.extra_env, AWS_SECRET_ACCESS_KEY="not-the-secret-0123456789")
        p = self.run_trainer(["--run-for", "10"], sets={"bucket": self.bucket(), "run-id": "run1",
                                                        "checkpoint-dir": self.path("ckpt")}, env=env)
        self.assertEqual(p.wait_exit(), 74)
        err = p.wait_event("restore.failed")["error"]
        self.assertIn("SignatureDoesNotMatch", err)
        self.assertIn("environment", err)
        self.assertNotIn("not-the-secret", "".join(p.raw))

    def test_a_bucket_in_another_region_is_followed(self):
        self.s3.create_bucket("eu-bucket", region="eu-west-1")
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w")
        p = self.run_trainer(["--run-for", "10"], sets={"bucket": "s3://eu-bucket/x", "run-id": "r",
                                                        "checkpoint-dir": self.path("ckpt"), "sync-interval": "0"},
                             env=self.extra_env)  # AWS_REGION=us-east-1
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        self.assertIn("x/r/DONE", self.s3.objects("eu-bucket", "x/"))

    @unittest.skipUnless(HAVE_BOTO3, "python3-boto3 is not installed")
    def test_boto3_reads_what_spotvisor_wrote_with_checksums_validated(self):
        small = self.big_file("ckpt/small.bin", 1000)
        big = self.big_file("ckpt/big.bin", 20 * 1024 * 1024 + 7)
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        client = boto3.client("s3", endpoint_url=self.s3.endpoint, region_name="us-east-1",
                              aws_access_key_id=AKID, aws_secret_access_key=SECRET,
                              config=BotoConfig(retries={"max_attempts": 1}))
        for f in self.manifest()["files"]:
            r = client.get_object(Bucket=self.BUCKET, Key=self.PREFIX + f["object"], ChecksumMode="ENABLED")
            body = r["Body"].read()  # botocore checks the crc32c S3 returns against these bytes
            self.assertEqual(body, small if f["path"] == "small.bin" else big)
            self.assertEqual(r["ChecksumCRC32C"], f["crc32c"], "the object's crc32c is the manifest's")
            self.assertEqual(r["Metadata"]["spotvisor-path"], f["path"])
        listed = client.list_objects_v2(Bucket=self.BUCKET, Prefix=self.PREFIX)
        self.assertIn(self.PREFIX + "manifest.json", [o["Key"] for o in listed["Contents"]])


class S3InstanceRoleTest(SpotvisorTestCase):
    """No keys in the environment: the instance role's, from the (fake) EC2 metadata service over IMDSv2."""

    def test_role_credentials_are_used_and_rotated_mid_run(self):
        from fake_s3 import FakeS3Server
        from fake_imds import FakeImdsServer
        import datetime
        s3 = FakeS3Server(buckets=["role-bucket"]).start()
        self.addCleanup(s3.stop)
        soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=4)
        s3.add_credentials("ASIAROLE1", "role-secret-1", session_token="tok-1")
        imds = FakeImdsServer(role=None).start()
        self.addCleanup(imds.stop)
        # Within five minutes of expiry: spotvisor asks the role again before each request.
        imds.set_role("trainer-role", "ASIAROLE1", "role-secret-1", "tok-1", soon)
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w1")
        env = {"AWS_ENDPOINT_URL_S3": s3.endpoint, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
               "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_REGION": "us-east-1"}
        p = self.run_trainer(["--marker-file", self.path("marker")],
                             sets={"bucket": "s3://role-bucket", "run-id": "r", "checkpoint-dir": self.path("ckpt"),
                                   "sync-interval": "0", "sync-settle": "0s"}, env=env)
        p.wait_trainer_ready()
        p.signal(signal.SIGUSR1)
        p.wait_event("sync.complete", kind="on-demand")
        # The role's keys rotate; the old ones stop working.
        s3.add_credentials("ASIAROLE2", "role-secret-2", session_token="tok-2")
        imds.set_role("trainer-role", "ASIAROLE2", "role-secret-2", "tok-2",
                      datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=6))
        s3.remove_credentials("ASIAROLE1")
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w2")
        p.signal(signal.SIGUSR1)
        wait_until(lambda: len(p.find("sync.complete", kind="on-demand")) >= 2, what="a sync with the new keys")
        p.signal(signal.SIGTERM)
        p.wait_exit()
        manifest = json.loads(s3.get_object_bytes("role-bucket", "r/manifest.json"))
        self.assertGreaterEqual(manifest["sequence"], 2)
        entry = [f for f in manifest["files"] if f["path"] == "w"][0]
        self.assertEqual(s3.get_object_bytes("role-bucket", "r/" + entry["object"]), b"w2")
        self.assertTrue(s3.requests()[-1]["status"] in (200, 204))
        self.assertTrue(imds.hits("/latest/api/token"), "IMDSv2: a session token first")
        raw = "".join(p.raw)
        for secret in ("role-secret-1", "role-secret-2", "tok-1", "tok-2"):
            self.assertNotIn(secret, raw)

    def test_a_session_token_that_expires_early_is_fetched_again_at_once(self):
        from fake_s3 import FakeS3Server
        from fake_imds import FakeImdsServer
        import datetime
        import time
        s3 = FakeS3Server(buckets=["role-bucket"]).start()
        self.addCleanup(s3.stop)
        later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=6)
        s3.add_credentials("ASIAROLE1", "role-secret-1", session_token="tok-1")
        imds = FakeImdsServer(role=None).start()
        self.addCleanup(imds.stop)
        imds.set_role("trainer-role", "ASIAROLE1", "role-secret-1", "tok-1", later)  # cached: hours left
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w1")
        env = {"AWS_ENDPOINT_URL_S3": s3.endpoint, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
               "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_REGION": "us-east-1"}
        p = self.run_trainer(["--marker-file", self.path("marker")],
                             sets={"bucket": "s3://role-bucket", "run-id": "r", "checkpoint-dir": self.path("ckpt"),
                                   "sync-interval": "0", "sync-settle": "0s"}, env=env)
        p.wait_trainer_ready()
        p.signal(signal.SIGUSR1)
        p.wait_event("sync.complete", kind="on-demand")
        role_reads = imds.hits("/latest/meta-data/iam/security-credentials/trainer-role")
        # S3 says the token expired although its Expiration is hours away (revoked sessions do this):
        # spotvisor drops its cache and asks the role at once, no backoff.
        s3.add_credentials("ASIAROLE1", "role-secret-1", session_token="tok-1", expires_at=time.time() - 1)
        s3.add_credentials("ASIAROLE2", "role-secret-2", session_token="tok-2")
        imds.set_role("trainer-role", "ASIAROLE2", "role-secret-2", "tok-2", later)
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w2")
        p.signal(signal.SIGUSR1)
        wait_until(lambda: len(p.find("sync.complete", kind="on-demand")) >= 2, what="a sync with the new token")
        self.assertFalse(p.find("sync.failed"))
        self.assertEqual(imds.hits("/latest/meta-data/iam/security-credentials/trainer-role"), role_reads + 1)
        self.assertIn("ExpiredToken", [e.get("error") for e in s3.requests()])
        p.signal(signal.SIGTERM)
        p.wait_exit()

    def test_no_keys_and_no_role_says_what_to_do(self):
        from fake_s3 import FakeS3Server
        from fake_imds import FakeImdsServer
        s3 = FakeS3Server(buckets=["role-bucket"]).start()
        self.addCleanup(s3.stop)
        imds = FakeImdsServer(role=None).start()
        self.addCleanup(imds.stop)
        env = {"AWS_ENDPOINT_URL_S3": s3.endpoint, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
               "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
        p = self.run_trainer(["--run-for", "10"], sets={"bucket": "s3://role-bucket", "run-id": "r",
                                                        "checkpoint-dir": self.path("ckpt")}, env=env)
        self.assertEqual(p.wait_exit(), 74)
        self.assertIn("has no IAM role", p.wait_event("restore.failed")["error"])


NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes", "node")
NODE = shutil.which("node")


@unittest.skipUnless(NODE and os.path.isdir(os.path.join(NODE_DIR, "node_modules", "s3rver")),
                     "node or tests/fakes/node/node_modules/s3rver missing (scripts/install-deps.sh runs npm ci)")
class S3rverTest(SpotvisorTestCase):
    """spotvisor's S3 client against s3rver (npm), an S3 server nobody here wrote. s3rver does not verify
    signatures or implement checksums and conditional writes: this checks request shapes and XML
    (multipart, ListObjectsV2 with url encoding, ranged GETs, odd key names), nothing more."""

    def test_sync_and_restore_through_s3rver(self):
        port_file = self.path("s3rver.port")
        proc = subprocess.Popen([NODE, os.path.join(NODE_DIR, "s3rver_serve.js"), "--port", "0", "--port-file",
                                 port_file, "--dir", self.path("s3rver-data"), "--bucket", "ckpt"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.addCleanup(lambda: (proc.terminate(), proc.wait(10)))
        wait_until(lambda: os.path.exists(port_file) or proc.poll() is not None, timeout=30, what="s3rver")
        with open(port_file) as f:
            port = int(f.read())
        env = {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "S3RVER",
               "AWS_SECRET_ACCESS_KEY": "S3RVER", "AWS_REGION": "us-east-1"}
        os.makedirs(self.path("ckpt/a b"))
        big = os.urandom(20 * 1024 * 1024 + 3)  # a multipart upload, restored as ranges
        with open(self.path("ckpt/big.bin"), "wb") as f:
            f.write(big)
        for i in range(60):
            with open(self.path(f"ckpt/a b/f{i:04d}+é"), "wb") as f:
                f.write(b"%d" % i)
        sets = {"bucket": "s3://ckpt/exp", "run-id": "r", "checkpoint-dir": self.path("ckpt"), "sync-interval": "0",
                "sync-settle": "0s", "sync-parallel-min-size": "16M"}
        p = self.run_trainer(["--run-for", "10"], sets=sets, env=env)
        self.assertEqual(p.wait_exit(timeout=180), 0, "".join(p.raw[-20:]) + p.stderr)
        self.assertEqual(p.wait_event("sync.complete", kind="final")["files_uploaded"], 61)
        # Pulled back whole (ranges for the big file).
        gc = subprocess.run([SPOTVISOR, "pull", "s3://ckpt/exp/r", self.path("pulled")], capture_output=True,
                            text=True, timeout=120, env=dict(env, PATH=os.environ.get("PATH", ""),
                                                             HOME=self.path("home")))
        self.assertEqual(gc.returncode, 0, gc.stderr)
        with open(self.path("pulled/big.bin"), "rb") as f:
            self.assertEqual(f.read(), big)
        self.assertEqual(len(os.listdir(self.path("pulled/a b"))), 60)
        with open(self.path("pulled/a b/f0059+é"), "rb") as f:
            self.assertEqual(f.read(), b"59")
        # `runs` lists the prefix through s3rver's ListObjectsV2 and reads status.json.
        runs = subprocess.run([SPOTVISOR, "runs", "s3://ckpt/exp"], capture_output=True, text=True, timeout=120,
                              env=dict(env, PATH=os.environ.get("PATH", ""), HOME=self.path("home")))
        self.assertEqual(runs.returncode, 0, runs.stderr)
        self.assertRegex(runs.stdout, r"\br\b.*done")


class S3PullTest(SpotvisorTestCase):
    def test_pull_and_runs_read_an_s3_run(self):
        from fake_s3 import FakeS3Server
        s3 = FakeS3Server(buckets=["bkt"], credentials={AKID: SECRET}).start()
        self.addCleanup(s3.stop)
        env = {"AWS_ENDPOINT_URL_S3": s3.endpoint, "AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET}
        os.makedirs(self.path("ckpt/sub"))
        with open(self.path("ckpt/sub/w"), "wb") as f:
            f.write(b"weights")
        p = self.run_trainer(["--run-for", "10"], sets={"bucket": "s3://bkt/exp", "run-id": "r1",
                                                        "checkpoint-dir": self.path("ckpt"), "sync-interval": "0"},
                             env=env)
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        cli_env = dict(env, PATH=os.environ.get("PATH", ""), HOME=self.path("home"))
        pulled = subprocess.run([SPOTVISOR, "pull", "s3://bkt/exp/r1", self.path("out")], capture_output=True,
                                text=True, env=cli_env, timeout=60)
        self.assertEqual(pulled.returncode, 0, pulled.stderr)
        with open(self.path("out/sub/w"), "rb") as f:
            self.assertEqual(f.read(), b"weights")
        runs = subprocess.run([SPOTVISOR, "runs", "s3://bkt/exp"], capture_output=True, text=True, env=cli_env,
                              timeout=60)
        self.assertEqual(runs.returncode, 0, runs.stderr)
        self.assertIn("r1", runs.stdout)
        self.assertIn("done", runs.stdout)



class S3TwoVmsTest(SpotvisorTestCase):
    """Two live daemons on one run-id, both committing to S3: the conditional writes fence the loser,
    as ifGenerationMatch does on Cloud Storage (test_checkpoints.py has the GCS twin)."""
    BUCKET = "ckpt-bucket"
    PREFIX = "exp/run1/"

    def setUp(self):
        super().setUp()
        self.s3, self.env_s3 = start_fake_s3(self, self.BUCKET)

    def vm(self, ckpt, state):
        from test_checkpoints import PYTHON, TRAINER
        sets = {"bucket": f"s3://{self.BUCKET}/exp", "run-id": "run1", "checkpoint-dir": self.path(ckpt),
                "state-dir": self.path(state), "sync-interval": "0", "sync-settle": "2s"}
        args = (["run"] + self.base_sets(**sets) + ["--", PYTHON, TRAINER, "--log", self.path(f"{ckpt}.log")]
                + ["--layout", "two", "--every", "0.3", "--marker", "--size", "20000"])
        return self.start(args, env=self.env_s3)

    def trainer_log(self, ckpt):
        try:
            with open(self.path(f"{ckpt}.log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def committed(self):
        m = json.loads(self.s3.get_object_bytes(self.BUCKET, self.PREFIX + "manifest.json"))
        return m, {f["path"]: self.s3.get_object_bytes(self.BUCKET, self.PREFIX + f["object"]) for f in m["files"]}

    def uploads_by(self, since):
        return [e for e in self.s3.requests()[since:] if e["method"] in ("PUT", "POST")]

    def test_two_vms_on_one_run_id_the_loser_is_fenced_and_never_touches_the_winner(self):
        a = self.vm("a", "sa")
        b = self.vm("b", "sb")
        for name in ("a", "b"):
            wait_until(lambda n=name: "saved 2" in self.trainer_log(n), what=f"{name} saved")
        # Both ask for their first commit at once: If-None-Match: * lets exactly one through.
        a.signal(signal.SIGUSR1)
        b.signal(signal.SIGUSR1)
        wait_until(lambda: a.find("sync.complete", kind="on-demand") or a.find("sync.fenced"), what="a's sync to end")
        wait_until(lambda: b.find("sync.complete", kind="on-demand") or b.find("sync.fenced"), what="b's sync to end")
        won = [p for p in (a, b) if p.find("sync.complete", kind="on-demand")]
        lost = [p for p in (a, b) if p.find("sync.fenced")]
        self.assertEqual((len(won), len(lost)), (1, 1), "exactly one commit won")
        winner, loser = won[0], lost[0]
        fenced = loser.find("sync.fenced")[0]
        self.assertIn("another VM is using run-id", fenced["message"])
        manifest, files = self.committed()
        mark = len(self.s3.requests())
        loser.signal(signal.SIGUSR1)
        loser.wait_event("sync.skipped", kind="on-demand")
        self.assertEqual(self.uploads_by(mark), [], "a fenced VM writes nothing more")
        self.assertEqual(self.committed(), (manifest, files), "the winner's checkpoint, byte for byte")
        loser.signal(signal.SIGTERM)
        loser.wait_exit()
        self.assertEqual(len(loser.find("sync.fenced")), 1, "said once")
        self.assertFalse([e for e in self.s3.requests() if e["method"] == "PUT" and e["key"] == self.PREFIX + "DONE"],
                         "no DONE written by anyone")
        # The winner goes on committing over its own manifest. One sync may
        # commit nothing (every file the trainer wrote since is younger than
        # sync-settle): ask again until one does, within the bound.
        def next_commit():
            n = len(winner.find("sync.complete", kind="on-demand"))
            winner.signal(signal.SIGUSR1)
            wait_until(lambda: len(winner.find("sync.complete", kind="on-demand")) > n, what="the winner's next sync")
            return self.committed()[0]["sequence"] > manifest["sequence"]
        wait_until(next_commit, what="the winner's next commit")
        winner.signal(signal.SIGTERM)
        winner.wait_exit()


if __name__ == "__main__":
    unittest.main()

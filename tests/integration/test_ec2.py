"""spotvisor on EC2 (issue #13), against the fake IMDSv2 (tests/fakes/fake_imds.py) and the fake S3: which
cloud, configuration from instance tags and the user data's [spotvisor] section, the Spot interruption notice
(SIGINT at once, the final sync committed before the notice's time), the rebalance recommendation (sync, keep
training), and the metadata service failing while the notice comes."""
import datetime
import json
import os
import signal
import subprocess
import unittest

from harness import SpotvisorTestCase, SPOTVISOR, wait_until, WAIT

BUCKET = "ec2-bucket"


def utc_in(seconds):
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)


class Ec2Test(SpotvisorTestCase):
    def setUp(self):
        super().setUp()
        from fake_imds import FakeImdsServer
        from fake_s3 import FakeS3Server
        self.s3 = FakeS3Server(buckets=[BUCKET]).start()
        self.addCleanup(self.s3.stop)
        self.s3.add_credentials("ASIAEC2ROLE", "ec2-role-secret", session_token="ec2-role-token")
        self.imds = FakeImdsServer(instance_id="i-0abc123def4567890", zone="eu-west-1b", region="eu-west-1",
                                   tags={"spotvisor-bucket": f"s3://{BUCKET}/runs", "Name": "trainer-1"},
                                   role=None).start()
        self.addCleanup(self.imds.stop)
        self.imds.set_role("trainer", "ASIAEC2ROLE", "ec2-role-secret", "ec2-role-token", utc_in(6 * 3600))
        # No GCE_METADATA_HOST (metadata=False below): the EC2 endpoint picks the cloud.
        self.ec2_env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": self.imds.endpoint,
                        "AWS_ENDPOINT_URL_S3": self.s3.endpoint, "AWS_REGION": "eu-west-1",
                        "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}

    def vm(self, trainer_args, **sets):
        base = {"sync-interval": "0", "sync-settle": "0s"}
        base.update(sets)
        return self.run_trainer(trainer_args, sets=base, metadata=False, env=self.ec2_env)

    def manifest(self, run_id):
        return json.loads(self.s3.get_object_bytes(BUCKET, f"runs/{run_id}/manifest.json"))

    def test_the_interruption_notice_stops_the_trainer_and_the_final_sync_lands_before_its_time(self):
        p = self.vm(["--checkpoint-every", "50", "--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        detected = p.wait_event("cloud.detected")
        self.assertEqual(detected["cloud"], "aws")
        self.assertEqual(detected["instance"], "i-0abc123def4567890")
        self.assertEqual(p.wait_event("run.start")["run_id"], "i-0abc123def4567890", "run-id defaults to the instance")
        wait_until(lambda: len(os.listdir(self.path("ckpt"))) >= 2, what="checkpoints")
        when = utc_in(120)
        self.imds.set_instance_action("terminate", when)
        self.assertEqual(p.wait_exit(), 130)
        notice = p.wait_event("preemption.detected")
        self.assertIn("EC2 Spot interruption notice", notice["message"])
        self.assertGreater(notice["ends_in_s"], 100)
        # The final sync's deadline is the notice's time (less preemption-window's margin), not GCE's 30 s.
        syncing = [e for e in p.find("supervisor.state") if e.get("to") == "syncing"][-1]
        self.assertGreater(syncing["deadline_s"], 60)
        self.assertLess(syncing["deadline_s"], 120)
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
        p.wait_event("sync.complete", kind="final")
        m = self.manifest("i-0abc123def4567890")
        committed = datetime.datetime.fromisoformat(m["committed_at"][:26].rstrip("Z") + "+00:00")
        self.assertLess(committed, when, "committed before the instance is taken")
        self.assertEqual(sorted(f["path"] for f in m["files"]), sorted(os.listdir(self.path("ckpt"))))
        self.assertFalse(p.find("shutdown.start"), "no on-exit after an interruption notice")
        self.assertTrue(self.imds.hits("/latest/api/token"), "IMDSv2: a session token first")

    def test_a_notice_seen_late_is_kept_even_by_a_hanging_store_and_the_report_is_written(self):
        # Seen with 12 s left of the two minutes (a late poll, a restart, an IMDS outage), on a
        # store whose part uploads and aborts hang: every step after the notice (the final sync,
        # the multipart abort, the report, run.end) must end before the notice's time, less the margin.
        p = self.vm([])
        p.wait_trainer_ready()
        with open(self.path("ckpt/model.pt"), "wb") as f:
            f.write(os.urandom(40 << 20))  # a multipart upload
        self.s3.fault("upload_part", delay=60, count=None)
        self.s3.fault("abort", delay=60, count=None)
        when = utc_in(12).replace(microsecond=0)  # whole seconds, as EC2 writes it
        self.imds.set_instance_action("terminate", when)
        p.wait_exit(30)
        ended = datetime.datetime.now(datetime.timezone.utc)
        self.assertLess(ended, when - datetime.timedelta(seconds=1), "spotvisor exited before the instance is taken")
        notice = p.wait_event("preemption.detected")
        self.assertLess(notice["ends_in_s"], 13)
        syncing = [e for e in p.find("supervisor.state") if e.get("to") == "syncing"][-1]
        self.assertLess(syncing["deadline_s"], 12, "the notice's time decides, not now + preemption-window")
        failed = p.find("sync.timeout") + p.find("sync.failed")
        self.assertTrue(failed, "the report of the final sync")
        self.assertIn("model.pt", failed[-1]["message"], "names what did not make it")
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")

    def test_a_rebalance_recommendation_syncs_without_stopping(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w")
        p = self.vm(["--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        self.imds.set_rebalance()
        p.wait_event("rebalance.detected")
        p.wait_event("sync.complete", kind="on-demand")
        self.assertIsNone(p.proc.poll(), "the trainer keeps running")
        self.assertFalse(p.find("trainer.stop"))
        self.assertEqual(self.manifest("i-0abc123def4567890")["sequence"], 1)
        p.signal(signal.SIGTERM)
        p.wait_exit()

    def test_the_notice_is_seen_after_the_metadata_service_comes_back(self):
        p = self.vm(["--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        self.imds.fail("/latest/meta-data/spot/", 500, count=None)
        self.imds.set_instance_action("terminate", utc_in(120))
        failing = p.wait_event("metadata.unavailable")
        self.assertIn("spot/instance-action", failing["message"])
        self.assertIsNone(p.proc.poll())
        self.imds.clear_faults()
        self.assertEqual(p.wait_exit(), 130)
        p.wait_event("metadata.recovered")
        self.assertEqual(len(p.find("metadata.unavailable")), 1, "logged once per failure streak")
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")

    def test_configuration_from_tags_over_user_data_and_bad_input_named(self):
        self.imds.set_user_data("#!/bin/bash\necho hello\n[spotvisor]\nrun-id = from-user-data\n"
                                "max-restarts = 7\n[other]\nrun-id = not-ours\n")
        self.imds.set_tags({"spotvisor-bucket": f"s3://{BUCKET}/runs", "spotvisor:run-id": "from-tag"})
        env = dict(os.environ, **self.ec2_env)
        env.pop("GCE_METADATA_HOST", None)
        out = subprocess.run([SPOTVISOR, "config", "--json", "--set", "command=true"], capture_output=True, text=True,
                             env=env, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        keys = json.loads(out.stdout)["keys"]
        self.assertEqual(keys["run-id"]["value"], "from-tag")
        self.assertEqual(keys["run-id"]["origin"], "instance tag spotvisor-run-id")
        self.assertEqual(keys["max-restarts"]["value"], "7")
        self.assertEqual(keys["max-restarts"]["origin"], "user data spotvisor-max-restarts")
        # The cloud cannot come from the metadata it decides to read: said, not silently taken.
        self.imds.set_tags({"spotvisor-bucket": f"s3://{BUCKET}/runs", "spotvisor-cloud": "gce"})
        warned = subprocess.run([SPOTVISOR, "config", "--set", "command=true"], capture_output=True, text=True,
                                env=env, timeout=60)
        self.assertIn("instance tag spotvisor-cloud: ignored", warned.stderr)
        # A section that does not parse, and a tag that cannot be a key: errors naming them.
        self.imds.set_user_data("[spotvisor]\nthis is not a key value line\n")
        self.imds.set_tags({"spotvisor-Bad Key": "x"})
        bad = subprocess.run([SPOTVISOR, "config", "--set", "command=true"], capture_output=True, text=True, env=env,
                             timeout=60)
        self.assertEqual(bad.returncode, 78)
        self.assertIn("user data [spotvisor]", bad.stderr)
        self.assertIn("instance tag spotvisor-Bad Key", bad.stderr)

    def ec2_api(self):
        from fake_ec2 import FakeEc2Server
        api = FakeEc2Server(region="eu-west-1", instances=["i-0abc123def4567890"]).start()
        self.addCleanup(api.stop)
        api.add_credentials("ASIAEC2ROLE", "ec2-role-secret", session_token="ec2-role-token")
        self.ec2_env["AWS_ENDPOINT_URL_EC2"] = api.endpoint
        return api

    def test_on_exit_stop_and_delete_go_through_the_ec2_api(self):
        api = self.ec2_api()
        for on_exit, action, state in (("stop", "StopInstances", "stopped"), ("delete", "TerminateInstances", "terminated")):
            api.add_instance("i-0abc123def4567890")
            p = self.vm(["--run-for", "10"], **{"on-exit": on_exit, "shutdown-command": f"echo off >> {self.path('off')}"})
            self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
            self.assertIn("the EC2 API", p.wait_event("shutdown.start")["message"])
            p.wait_event("shutdown.api_done")
            self.assertEqual([c for c in api.calls() if c[0] != "CreateTags"][-1], (action, ["i-0abc123def4567890"]))
            self.assertEqual(api.state("i-0abc123def4567890"), state)
            self.assertFalse(os.path.exists(self.path("off")), "no poweroff when the API did it")

    def test_the_phase_is_an_instance_tag_and_a_denied_tag_is_said_once(self):
        api = self.ec2_api()
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        self.assertTrue(api.tags("i-0abc123def4567890")["spotvisor-phase"].startswith("done"),
                        api.tags("i-0abc123def4567890"))
        self.assertIn(("CreateTags", ["i-0abc123def4567890"]), api.calls())
        api.deny("CreateTags")
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        failed = p.find("instance_tags.failed")
        self.assertEqual(len(failed), 1, "said once")
        self.assertIn("ec2:CreateTags", failed[0]["message"])

    def test_a_denied_stop_powers_off_instead_naming_the_permission(self):
        api = self.ec2_api()
        api.deny("StopInstances")
        p = self.vm(["--run-for", "10"], **{"on-exit": "stop", "shutdown-command": f"echo off >> {self.path('off')}"})
        p.wait_exit()
        failed = p.wait_event("shutdown.api_failed")
        self.assertIn("UnauthorizedOperation", failed["error"])
        self.assertIn("ec2:StopInstances", failed["error"])
        wait_until(lambda: os.path.exists(self.path("off")), what="the fallback poweroff")

    def test_hidden_tags_are_said_with_the_command_that_shows_them(self):
        self.imds.set_tags_enabled(False)
        p = self.vm(["--run-for", "10"], bucket=f"s3://{BUCKET}/runs")
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        hidden = p.wait_event("config.tags_hidden")
        self.assertIn("--instance-metadata-tags enabled", hidden["message"])
        self.assertIn("i-0abc123def4567890", hidden["message"])


if __name__ == "__main__":
    unittest.main()

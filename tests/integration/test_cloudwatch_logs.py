"""spotvisor's logs in CloudWatch Logs on EC2 (issue #13), against the fake CloudWatch Logs API
(tests/fakes/fake_cloudwatch_logs.py: SigV4 verified, PutLogEvents' batch rules enforced) with the
instance role's credentials from the fake IMDSv2: the group and streams created when missing, spotvisor's
events as JSON and the trainer's lines as printed, throttling and 5xx retried, a denied action named once,
a flood kept within the API's limits, and the endpoint override the AWS SDKs read."""
import json
import os
import unittest

from harness import SpotvisorTestCase, wait_until

INSTANCE = "i-0feedc0ffee123456"
ROLE_KEY, ROLE_SECRET, ROLE_TOKEN = "ASIALOGSROLE", "logs-role-secret", "logs-role-token"


class CloudWatchLogsTest(SpotvisorTestCase):
    def setUp(self):
        super().setUp()
        import datetime
        from fake_imds import FakeImdsServer
        from fake_cloudwatch_logs import FakeCloudWatchLogsServer
        self.logs = FakeCloudWatchLogsServer(region="eu-west-1").start()
        self.addCleanup(self.logs.stop)
        self.logs.add_credentials(ROLE_KEY, ROLE_SECRET, session_token=ROLE_TOKEN)
        self.imds = FakeImdsServer(instance_id=INSTANCE, zone="eu-west-1b", region="eu-west-1",
                                   tags={"Name": "trainer-1"}, role=None).start()
        self.addCleanup(self.imds.stop)
        expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=6)
        self.imds.set_role("trainer", ROLE_KEY, ROLE_SECRET, ROLE_TOKEN, expires)
        self.aws_env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": self.imds.endpoint,
                        "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": self.logs.endpoint,
                        "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}

    def vm(self, trainer_args, **sets):
        base = {"log-to": "api", "log-labels": "experiment=cw"}
        base.update(sets)
        p = self.run_trainer(trainer_args, sets=base, metadata=False, env=self.aws_env)
        return p, p.wait_exit()

    def events(self, group="spotvisor"):
        return [json.loads(e["message"]) for e in self.logs.events(group, f"{INSTANCE}/spotvisor")]

    def trainer_lines(self, group="spotvisor"):
        return [e["message"] for e in self.logs.events(group, f"{INSTANCE}/spotvisor-trainer")]

    def test_events_and_trainer_lines_reach_their_streams_which_are_created_when_missing(self):
        p, code = self.vm(["--print", "epoch 1 loss=0.5", "--stderr", "a warning", "--run-for", "10", "--exit-code", "3"],
                          **{"on-exit": "poweroff", "shutdown-command": f"echo off >> {self.path('off')}"})
        self.assertEqual(code, 3)
        api = p.wait_event("log.api")
        self.assertEqual(api["service"], "cloudwatch-logs")
        self.assertIn(f"{INSTANCE}/spotvisor-trainer", api["message"])
        self.assertEqual(self.logs.hits("CreateLogGroup"), 1, "the group did not exist: created once")
        self.assertEqual(self.logs.hits("CreateLogStream"), 3, "one refused for the missing group, then both streams")
        events = self.events()
        by_name = {e["event"]: e for e in events}
        end = by_name["run.end"]
        self.assertEqual(end["reason"], "failed")
        self.assertEqual(end["severity"], "ERROR")
        self.assertEqual(end["labels"]["experiment"], "cw")
        self.assertIn("run_id", end["labels"])
        self.assertIn("shutdown.start", by_name, "the lines that say why the instance stops arrived before on-exit")
        self.assertEqual([e["event"] for e in events][0], "log.api")
        lines = self.trainer_lines()
        self.assertIn("epoch 1 loss=0.5", lines)
        self.assertIn("a warning", lines)
        stamps = [e["timestamp"] for e in self.logs.events("spotvisor", f"{INSTANCE}/spotvisor")]
        self.assertEqual(stamps, sorted(stamps))
        self.assertLess(self.logs.hits("PutLogEvents"), 12, "batched, not one request per line")
        self.assertNotIn(ROLE_SECRET, "".join(p.raw) + p.stderr, "credentials are never logged")
        self.assertNotIn(ROLE_TOKEN, "".join(p.raw) + p.stderr)

    def test_an_existing_group_and_stream_are_used_and_log_group_comes_from_a_tag(self):
        self.imds.set_tags({"spotvisor-log-group": "/train/exp-1"})
        self.logs.create_group("/train/exp-1")
        self.logs.create_stream("/train/exp-1", f"{INSTANCE}/spotvisor")
        _, code = self.vm(["--print", "hello", "--run-for", "10"])
        self.assertEqual(code, 0)
        self.assertEqual(self.logs.hits("CreateLogGroup"), 0)
        self.assertIn("run.end", [e["event"] for e in self.events("/train/exp-1")])
        self.assertIn("hello", self.trainer_lines("/train/exp-1"))

    def test_throttling_and_server_errors_are_retried_and_nothing_is_lost(self):
        self.logs.fault("ThrottlingException", count=2, operation="PutLogEvents")
        self.logs.fault("ServiceUnavailableException", count=1, operation="PutLogEvents")
        _, code = self.vm(["--print", "kept", "--run-for", "10"])
        self.assertEqual(code, 0)
        self.assertIn("kept", self.trainer_lines())
        names = [e["event"] for e in self.events()]
        self.assertEqual(names.count("run.end"), 1)
        self.assertEqual(names.count("run.start"), 1)

    def test_a_denied_put_is_said_once_naming_the_action_and_the_run_goes_on(self):
        self.logs.deny("PutLogEvents")
        p, code = self.vm(["--print", "hello", "--run-for", "10"])
        self.assertEqual(code, 0, "logging is not worth a failed run")
        self.assertIn("not delivered to CloudWatch Logs", p.stderr)
        self.assertIn("logs:PutLogEvents", p.stderr)
        self.assertIn("need logs:PutLogEvents on log group spotvisor", p.stderr)
        self.assertEqual(p.stderr.count("not delivered to CloudWatch Logs"), 1, "said once, not per batch")
        self.assertEqual(p.wait_event("run.end")["reason"], "completed", "stdout still has everything")

    def test_a_flood_is_sent_within_the_api_limits_or_counted_as_dropped(self):
        # The fake refuses a batch over 10,000 events or 1,048,576 bytes, or out of time order:
        # every request of a 30,000-line burst must have passed, and every line is either
        # there or counted in a log.dropped event.
        lines = 30000
        p, code = self.vm(["--flood", str(lines), "--run-for", "10"])
        self.assertEqual(code, 0)
        refused = [e for e in self.logs.log() if e.get("operation") == "PutLogEvents" and e.get("status") != 200]
        self.assertEqual(refused, [], "no batch broke the API's rules")
        received = len(self.trainer_lines())
        drops = sum(e.get("dropped", 0) for e in self.events() if e["event"] == "log.dropped")
        self.assertEqual(received + drops, lines + 2, "the fake trainer's 'started' and 'exiting' lines too")
        self.assertGreater(received, 0)

    def test_an_invalid_log_group_is_a_config_error_that_still_reaches_cloudwatch(self):
        p, code = self.vm(["--run-for", "10"], **{"log-group": "has spaces"})
        self.assertEqual(code, 78)
        err = p.wait_event("config.error")
        self.assertIn("log-group", err["message"])
        wait_until(lambda: "config.error" in [e["event"] for e in self.events()], what="config.error in the default group")

    def test_auto_sends_nothing_when_the_metadata_service_is_an_override(self):
        # log-to = auto means "on EC2 itself": the IMDS endpoint override says this is a test or an emulator.
        _, code = self.vm(["--run-for", "10"], **{"log-to": "auto"})
        self.assertEqual(code, 0)
        self.assertEqual(self.logs.hits(), 0)


if __name__ == "__main__":
    unittest.main()

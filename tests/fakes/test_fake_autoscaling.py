#!/usr/bin/python3
"""fake_autoscaling.py against clients nobody here wrote: Debian's python3-boto3 `autoscaling`
client and Debian's AWS CLI v2 (their requests verify, their parsers read the answers and the
errors), plus raw requests signed by botocore's own SigV4Auth for what those clients would not
send; and the lifecycle the fake runs (hooks, heartbeats, timeouts, replacements, the IMDS link),
and the launch templates link_ec2() checks in fake_ec2.py (made there with boto3's EC2 client).

Run from the repo root with Debian's Python: /usr/bin/python3 tests/fakes/test_fake_autoscaling.py -v
No sleeps as synchronisation: lifecycle time moves with advance(), and waits are bounded."""
import http.client
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import warnings
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fake_autoscaling import NS, FakeAutoScalingServer  # noqa: E402
from fake_ec2 import FakeEc2Server  # noqa: E402
from fake_imds import FakeImdsServer  # noqa: E402

try:
    import boto3
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.config import Config
    from botocore.credentials import Credentials
    from botocore.exceptions import ClientError
except ImportError:
    boto3 = None

AKID, SECRET, REGION = "AKIDASG", "secret-asg", "eu-west-1"
AWS = shutil.which("aws", path="/usr/bin")  # Debian's awscli (v2)
TERMINATE_HOOK = "autoscaling:EC2_INSTANCE_TERMINATING"
LAUNCH_HOOK = "autoscaling:EC2_INSTANCE_LAUNCHING"
X = "{" + NS + "}"
MIN_SIZE_MESSAGE = ("Currently, desiredSize equals minSize ({}). Terminating instance without replacement will "
                    "violate group's min size constraint. Either set shouldDecrementDesiredCapacity flag to false "
                    "or lower group's min size.")


class _Base(unittest.TestCase):
    server_args = {}

    def setUp(self):
        warnings.simplefilter("ignore", ResourceWarning)  # boto3 clients keep their connections open
        args = {"region": REGION, "credentials": {AKID: SECRET}}
        args.update(self.server_args)
        self.srv = FakeAutoScalingServer(**args).start()
        self.addCleanup(self.srv.stop)

    def client(self, secret=SECRET, akid=AKID, token=None):
        return boto3.client("autoscaling", endpoint_url=self.srv.endpoint, region_name=REGION,
                            aws_access_key_id=akid, aws_secret_access_key=secret, aws_session_token=token,
                            config=Config(retries={"total_max_attempts": 1}))

    def error(self, fn):
        with self.assertRaises(ClientError) as cm:
            fn()
        return cm.exception.response

    def code(self, fn):
        return self.error(fn)["Error"]["Code"]

    def group(self, name="train", min_size=1, max_size=4, desired=2, instances=("i-0aaa", "i-0bbb"), **kw):
        self.srv.create_group(name, min_size, max_size, desired,
                              availability_zones=kw.pop("availability_zones", [REGION + "a", REGION + "b"]), **kw)
        for i in instances:
            self.srv.add_instance(name, i)

    def hook(self, name="drain", group="train", transition=TERMINATE_HOOK, **kw):
        self.client().put_lifecycle_hook(LifecycleHookName=name, AutoScalingGroupName=group,
                                         LifecycleTransition=transition, **kw)

    def raw(self, params, secret=SECRET, service="autoscaling", tamper=None, sign=True, method="POST"):
        """A request signed by botocore's SigV4Auth; returns (status, headers, XML root)."""
        body = urllib.parse.urlencode(params).encode()
        url = self.srv.endpoint + "/"
        if method == "GET":
            url, body = url + "?" + body.decode(), b""
        req = AWSRequest(method=method, url=url, data=body,
                         headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
        if sign:
            SigV4Auth(Credentials(AKID, secret), service, REGION).add_auth(req)
        if tamper is not None:
            body = tamper(body)
        conn = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=10)
        try:
            path = "/" + (url.split("/", 3)[3] if method == "GET" else "")
            conn.request(method, path, body=body, headers={**dict(req.headers), "Content-Length": str(len(body))})
            r = conn.getresponse()
            return r.status, r.headers, ET.fromstring(r.read())
        finally:
            conn.close()


class ControlApiTest(_Base):
    """The test-side API alone (no client needed)."""

    def test_groups_instances_and_terminations(self):
        self.srv.termination_seconds = None
        self.group(min_size=1, max_size=3, desired=2)
        with self.assertRaises(ValueError):
            self.srv.create_group("train", 0, 1)  # AlreadyExists
        with self.assertRaises(ValueError):
            self.srv.create_group("bad", 3, 1)  # max below min
        with self.assertRaises(ValueError):
            self.srv.add_instance("train", "i-0aaa")  # already a member
        with self.assertRaises(ValueError):
            self.srv.add_instance("train", "i-0ccc", "us-east-1a")  # not one of the group's zones
        with self.assertRaises(KeyError):
            self.srv.add_instance("nope", "i-0ccc")
        self.assertEqual([(i["id"], i["az"], i["lifecycle_state"]) for i in self.srv.instances("train")],
                         [("i-0aaa", REGION + "a", "InService"), ("i-0bbb", REGION + "b", "InService")])
        g = self.srv.group("train")
        self.assertEqual((g["min"], g["max"], g["desired"], g["launch_template"]["LaunchTemplateName"]),
                         (1, 3, 2, "spotvisor"))
        self.assertIsNone(self.srv.group("nope"))
        self.assertIsNone(self.srv.begin_termination("i-0aaa", cause="rebalance"))  # no hook: no token
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminating")
        with self.assertRaises(ValueError):
            self.srv.begin_termination("i-0aaa")
        self.assertEqual((self.srv.desired("train"), self.srv.needed("train")), (2, 1))
        self.srv.finish_termination("i-0aaa")
        self.assertEqual((self.srv.lifecycle_state("i-0aaa"), self.srv.lifecycle_state("i-0zzz")), ("Terminated", None))
        self.srv.begin_termination("i-0bbb", decrement=True)
        self.assertEqual((self.srv.desired("train"), self.srv.needed("train")), (1, 1))
        self.assertEqual(self.srv.lifecycle_completed("i-0bbb"), None)
        self.assertEqual(self.srv.calls(), [])

    def test_imds_link_and_wait_for(self):
        imds = FakeImdsServer(instance_id="i-0aaa", region=REGION).start()
        self.addCleanup(imds.stop)
        self.group()
        self.srv.link_imds("i-0aaa", imds)
        self.assertEqual(imds.state()["target_lifecycle_state"], "InService")
        threading.Timer(0.05, self.srv.begin_termination, ["i-0aaa"]).start()
        self.assertTrue(self.srv.wait_for(lambda: self.srv.lifecycle_state("i-0aaa") == "Terminated", timeout=5))
        self.assertEqual(imds.state()["target_lifecycle_state"], "Terminated")
        self.assertFalse(self.srv.wait_for(lambda: False, timeout=0.05))


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed (apt-get install python3-boto3)")
class StrictnessTest(_Base):
    def test_signatures_keys_and_tokens(self):
        self.group()
        self.assertEqual(self.code(lambda: self.client(secret="wrong").describe_auto_scaling_groups()),
                         "SignatureDoesNotMatch")
        err = self.error(lambda: self.client(akid="AKIDNOPE").describe_auto_scaling_groups())
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"], err["ResponseMetadata"]["HTTPStatusCode"]),
                         ("InvalidClientTokenId", "The security token included in the request is invalid.", 403))
        self.srv.add_credentials("ASIAASG", "s", session_token="tok")
        self.client(akid="ASIAASG", secret="s", token="tok").describe_auto_scaling_groups()
        self.assertEqual(self.code(lambda: self.client(akid="ASIAASG", secret="s", token="other")
                                   .describe_auto_scaling_groups()), "InvalidClientTokenId")
        self.assertEqual(self.code(lambda: self.client(akid="ASIAASG", secret="s").describe_auto_scaling_groups()),
                         "InvalidClientTokenId")
        self.srv.add_credentials("ASIAOLD", "s", session_token="t", expires_at=time.time() - 1)
        err = self.error(lambda: self.client(akid="ASIAOLD", secret="s", token="t").describe_auto_scaling_groups())
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"]),
                         ("ExpiredToken", "The security token included in the request is expired"))
        # Nothing that failed its signature reached the groups, or calls().
        self.assertEqual([a for a, _ in self.srv.calls()], ["DescribeAutoScalingGroups"])

    def test_a_request_signed_with_a_skewed_clock_is_refused(self):
        self.srv.clock = lambda: time.time() + 20 * 60
        err = self.error(lambda: self.client().describe_auto_scaling_groups())
        self.assertEqual(err["Error"]["Code"], "SignatureDoesNotMatch")
        self.assertTrue(err["Error"]["Message"].startswith("Signature expired: "), err)
        self.srv.clock = lambda: time.time() + 5 * 60
        self.client().describe_auto_scaling_groups()

    def test_raw_signature_failures_and_the_error_xml(self):
        params = {"Action": "DescribeAutoScalingGroups", "Version": "2011-01-01"}
        status, headers, root = self.raw(params, sign=False)
        self.assertEqual(status, 403)
        self.assertEqual(root.tag, X + "ErrorResponse")
        self.assertEqual([c.tag for c in root], [X + "Error", X + "RequestId"])
        self.assertEqual([(c.tag, c.text) for c in root.find(X + "Error")],
                         [(X + "Type", "Sender"), (X + "Code", "MissingAuthenticationToken"),
                          (X + "Message", "Request is missing Authentication Token")])
        self.assertEqual(root.find(X + "RequestId").text, headers["x-amzn-RequestId"])
        status, _, root = self.raw(params, service="ec2")
        self.assertEqual((status, root.find(f"{X}Error/{X}Code").text), (403, "SignatureDoesNotMatch"))
        self.assertIn("scoped to correct service: 'autoscaling'", root.find(f"{X}Error/{X}Message").text)
        status, _, root = self.raw(params, tamper=lambda b: b.replace(b"Groups", b"Instances"))
        self.assertEqual((status, root.find(f"{X}Error/{X}Code").text), (403, "SignatureDoesNotMatch"))
        self.assertEqual(self.srv.calls(), [])

    def test_the_answer_xml_and_get(self):
        self.group(instances=())
        for method in ("POST", "GET"):
            status, headers, root = self.raw({"Action": "DescribeAutoScalingGroups", "Version": "2011-01-01",
                                              "AutoScalingGroupNames.member.1": "train"}, method=method)
            self.assertEqual(status, 200)
            self.assertEqual(root.tag, X + "DescribeAutoScalingGroupsResponse")
            self.assertEqual([c.tag for c in root], [X + "DescribeAutoScalingGroupsResult", X + "ResponseMetadata"])
            self.assertEqual(root.find(f"{X}ResponseMetadata/{X}RequestId").text, headers["x-amzn-RequestId"])
            group = root.find(f"{X}DescribeAutoScalingGroupsResult/{X}AutoScalingGroups/{X}member")
            self.assertEqual(group.find(X + "AutoScalingGroupName").text, "train")
            self.assertEqual([m.text for m in group.find(X + "AvailabilityZones")], [REGION + "a", REGION + "b"])
        status, _, root = self.raw({"Action": "SetDesiredCapacity", "Version": "2011-01-01",
                                    "AutoScalingGroupName": "train", "DesiredCapacity": "3"})
        self.assertEqual(status, 200)
        self.assertEqual([c.tag for c in root], [X + "ResponseMetadata"])  # no Result element
        self.assertEqual(self.srv.desired("train"), 3)

    def test_unknown_actions_versions_and_missing_parameters(self):
        self.assertEqual(self.code(lambda: self.client().describe_scaling_activities()), "InvalidAction")
        status, _, root = self.raw({"Action": "DescribeAutoScalingGroups", "Version": "2010-08-01"})
        self.assertEqual((status, root.find(f"{X}Error/{X}Code").text), (400, "InvalidAction"))
        self.assertEqual(root.find(f"{X}Error/{X}Message").text,
                         "Could not find operation DescribeAutoScalingGroups for version 2010-08-01")
        status, _, root = self.raw({"Action": "TerminateInstanceInAutoScalingGroup", "Version": "2011-01-01",
                                    "ShouldDecrementDesiredCapacity": "true"})
        self.assertEqual((status, root.find(f"{X}Error/{X}Code").text), (400, "ValidationError"))
        self.assertEqual(root.find(f"{X}Error/{X}Message").text,
                         "1 validation error detected: Value null at 'instanceId' failed to satisfy constraint: "
                         "Member must not be null")
        status, _, root = self.raw({"Action": "SetDesiredCapacity", "Version": "2011-01-01",
                                    "AutoScalingGroupName": "g", "DesiredCapacity": "many"})
        self.assertEqual((status, root.find(f"{X}Error/{X}Code").text), (400, "ValidationError"))

    def test_deny(self):
        self.group()
        self.srv.deny("TerminateInstanceInAutoScalingGroup")
        self.srv.deny("DescribeAutoScalingGroups")
        err = self.error(lambda: self.client().terminate_instance_in_auto_scaling_group(
            InstanceId="i-0aaa", ShouldDecrementDesiredCapacity=False))
        self.assertEqual((err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]), ("AccessDenied", 403))
        arn = self.srv.group("train")["arn"]
        self.assertRegex(err["Error"]["Message"],
                         r"^User: arn:aws:sts::\d{12}:assumed-role/\S+ is not authorized to perform: "
                         r"autoscaling:TerminateInstanceInAutoScalingGroup on resource: " + re.escape(arn) +
                         r" because no identity-based policy allows the "
                         r"autoscaling:TerminateInstanceInAutoScalingGroup action$")
        self.assertRegex(arn, r"^arn:aws:autoscaling:eu-west-1:\d{12}:autoScalingGroup:[0-9a-f-]{36}:"
                              r"autoScalingGroupName/train$")
        err = self.error(lambda: self.client().describe_auto_scaling_groups())
        self.assertRegex(err["Error"]["Message"], r"is not authorized to perform: autoscaling:DescribeAutoScalingGroups"
                                                  r" because no identity-based policy allows")
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "InService")
        self.srv.allow("TerminateInstanceInAutoScalingGroup")
        self.client().terminate_instance_in_auto_scaling_group(InstanceId="i-0aaa",
                                                               ShouldDecrementDesiredCapacity=False)
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminated")

    def test_unknown_groups_and_instances(self):
        c = self.client()
        self.assertEqual(c.describe_auto_scaling_groups(AutoScalingGroupNames=["nope"])["AutoScalingGroups"], [])
        self.assertEqual(c.describe_auto_scaling_instances(InstanceIds=["i-0zzz"])["AutoScalingInstances"], [])
        for fn in (lambda: c.set_desired_capacity(AutoScalingGroupName="nope", DesiredCapacity=1),
                   lambda: c.update_auto_scaling_group(AutoScalingGroupName="nope", MaxSize=3),
                   lambda: c.describe_lifecycle_hooks(AutoScalingGroupName="nope")):
            err = self.error(fn)
            self.assertEqual((err["Error"]["Code"], err["Error"]["Message"]),
                             ("ValidationError", "AutoScalingGroup name not found - AutoScalingGroup nope not found"))
        err = self.error(lambda: c.delete_auto_scaling_group(AutoScalingGroupName="nope"))
        self.assertEqual(err["Error"]["Message"], "AutoScalingGroup name not found - AutoScalingGroup 'nope' not found")
        err = self.error(lambda: c.terminate_instance_in_auto_scaling_group(InstanceId="i-0zzz",
                                                                            ShouldDecrementDesiredCapacity=True))
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"]),
                         ("ValidationError",
                          "Instance Id not found - No managed instance found for instance ID: i-0zzz"))

    def test_below_min_size(self):
        self.group(min_size=2, desired=2)
        err = self.error(lambda: self.client().terminate_instance_in_auto_scaling_group(
            InstanceId="i-0aaa", ShouldDecrementDesiredCapacity=True))
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"]),
                         ("ValidationError", MIN_SIZE_MESSAGE.format(2)))
        self.assertEqual((self.srv.desired("train"), self.srv.lifecycle_state("i-0aaa")), (2, "InService"))
        err = self.error(lambda: self.client().set_desired_capacity(AutoScalingGroupName="train", DesiredCapacity=5))
        self.assertEqual(err["Error"]["Message"], "New SetDesiredCapacity value 5 is above max value 4 for the "
                                                  "AutoScalingGroup.")
        err = self.error(lambda: self.client().set_desired_capacity(AutoScalingGroupName="train", DesiredCapacity=1))
        self.assertEqual(err["Error"]["Message"], "New SetDesiredCapacity value 1 is below min value 2 for the "
                                                  "AutoScalingGroup.")

    def test_update_sizes(self):
        self.group(min_size=1, max_size=4, desired=2)
        c = self.client()
        err = self.error(lambda: c.update_auto_scaling_group(AutoScalingGroupName="train", MinSize=5))
        self.assertEqual(err["Error"]["Message"], "Max bound, 4, must be greater than or equal to min bound, 5")
        err = self.error(lambda: c.update_auto_scaling_group(AutoScalingGroupName="train", DesiredCapacity=9))
        self.assertEqual(err["Error"]["Message"], "Desired capacity:9 must be between the specified min size:1 and "
                                                  "max size:4")
        c.update_auto_scaling_group(AutoScalingGroupName="train", MinSize=3)  # raises the desired capacity too
        self.assertEqual((self.srv.group("train")["min"], self.srv.desired("train")), (3, 3))
        c.update_auto_scaling_group(AutoScalingGroupName="train", MinSize=0, MaxSize=1)  # and lowers it
        self.assertEqual(self.srv.desired("train"), 1)
        c.update_auto_scaling_group(AutoScalingGroupName="train", MinSize=0, MaxSize=6, DesiredCapacity=0,
                                    CapacityRebalance=True)
        g = c.describe_auto_scaling_groups(AutoScalingGroupNames=["train"])["AutoScalingGroups"][0]
        self.assertEqual((g["MinSize"], g["MaxSize"], g["DesiredCapacity"], g["CapacityRebalance"]), (0, 6, 0, True))

    def test_create_refusals(self):
        c = self.client()
        lt = {"LaunchTemplateName": "trainer"}
        c.create_auto_scaling_group(AutoScalingGroupName="g", LaunchTemplate=lt, MinSize=0, MaxSize=1,
                                    AvailabilityZones=[REGION + "a"])
        err = self.error(lambda: c.create_auto_scaling_group(AutoScalingGroupName="g", LaunchTemplate=lt, MinSize=0,
                                                             MaxSize=1, AvailabilityZones=[REGION + "a"]))
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"]),
                         ("AlreadyExists", "AutoScalingGroup by this name already exists - A group with the name g "
                                           "already exists"))
        err = self.error(lambda: c.create_auto_scaling_group(AutoScalingGroupName="h", MinSize=0, MaxSize=1,
                                                             AvailabilityZones=[REGION + "a"]))
        self.assertEqual(err["Error"]["Message"], "Valid requests must contain either LaunchTemplate, "
                                                  "LaunchConfigurationName, InstanceId or MixedInstancesPolicy "
                                                  "parameter.")
        err = self.error(lambda: c.create_auto_scaling_group(AutoScalingGroupName="h", LaunchTemplate=lt, MinSize=0,
                                                             MaxSize=1))
        self.assertEqual(err["Error"]["Message"], "At least one Availability Zone or VPC Subnet is required.")
        err = self.error(lambda: c.create_auto_scaling_group(
            AutoScalingGroupName="h", MinSize=0, MaxSize=1, AvailabilityZones=[REGION + "a"],
            LaunchTemplate={"LaunchTemplateName": "trainer", "LaunchTemplateId": "lt-0123456789abcdef0"}))
        self.assertEqual(err["Error"]["Message"], "Valid requests must contain either launchTemplateId or "
                                                  "LaunchTemplateName")
        err = self.error(lambda: c.create_auto_scaling_group(AutoScalingGroupName="h", LaunchTemplate=lt, MinSize=2,
                                                             MaxSize=4, DesiredCapacity=1,
                                                             AvailabilityZones=[REGION + "a"]))
        self.assertEqual(err["Error"]["Message"], "Desired capacity:1 must be between the specified min size:2 and "
                                                  "max size:4")
        self.assertEqual(self.srv.groups(), ["g"])

    def test_lifecycle_action_refusals(self):
        self.group()
        c = self.client()
        err = self.error(lambda: c.complete_lifecycle_action(LifecycleHookName="drain", AutoScalingGroupName="train",
                                                             LifecycleActionResult="CONTINUE", InstanceId="i-0aaa"))
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"]),
                         ("ValidationError", "No active Lifecycle Action found with instance ID i-0aaa"))
        err = self.error(lambda: c.record_lifecycle_action_heartbeat(
            LifecycleHookName="drain", AutoScalingGroupName="train",
            LifecycleActionToken="bcd2f1b8-9a78-44d3-8a7a-4dd07d7cf635"))
        self.assertEqual(err["Error"]["Message"],
                         "No active Lifecycle Action found with token bcd2f1b8-9a78-44d3-8a7a-4dd07d7cf635")
        self.assertEqual(self.code(lambda: c.put_lifecycle_hook(
            LifecycleHookName="drain", AutoScalingGroupName="train", LifecycleTransition="autoscaling:SOMETIME")),
            "ValidationError")
        self.assertEqual(self.code(lambda: c.put_lifecycle_hook(
            LifecycleHookName="drain", AutoScalingGroupName="train", LifecycleTransition=TERMINATE_HOOK,
            HeartbeatTimeout=10)), "ValidationError")
        self.assertEqual(self.code(lambda: c.put_lifecycle_hook(
            LifecycleHookName="bad name", AutoScalingGroupName="train", LifecycleTransition=TERMINATE_HOOK)),
            "ValidationError")
        self.assertEqual(self.code(lambda: c.delete_lifecycle_hook(LifecycleHookName="drain",
                                                                   AutoScalingGroupName="train")), "ValidationError")
        self.hook()
        self.srv.begin_termination("i-0aaa")
        self.assertEqual(self.code(lambda: c.complete_lifecycle_action(
            LifecycleHookName="drain", AutoScalingGroupName="train", LifecycleActionResult="MAYBE",
            InstanceId="i-0aaa")), "ValidationError")
        err = self.error(lambda: c.terminate_instance_in_auto_scaling_group(InstanceId="i-0aaa",
                                                                            ShouldDecrementDesiredCapacity=False))
        self.assertEqual(err["Error"]["Code"], "ScalingActivityInProgress")
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminating:Wait")


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed (apt-get install python3-boto3)")
class LifecycleTest(_Base):
    def instances(self, ids=None):
        r = self.client().describe_auto_scaling_instances(**({"InstanceIds": ids} if ids else {}))
        return {i["InstanceId"]: i["LifecycleState"] for i in r["AutoScalingInstances"]}

    def test_terminate_without_a_hook_and_the_replacement(self):
        self.group(desired=2)
        act = self.client().terminate_instance_in_auto_scaling_group(
            InstanceId="i-0aaa", ShouldDecrementDesiredCapacity=False)["Activity"]
        self.assertEqual(act["Description"], "Terminating EC2 instance: i-0aaa")
        self.assertRegex(act["Cause"], r"^At \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ instance i-0aaa was taken out of service "
                                       r"in response to a user request\.$")
        self.assertEqual((act["StatusCode"], act["AutoScalingGroupName"]), ("InProgress", "train"))
        # termination_seconds=0: gone by the time the answer came; the desired capacity stays, so
        # the group is one short and the test (the controller) launches the replacement.
        self.assertEqual(self.instances(), {"i-0bbb": "InService"})
        self.assertEqual((self.srv.desired("train"), self.srv.needed("train")), (2, 1))
        self.srv.add_instance("train", "i-0ccc")
        self.assertEqual(self.srv.needed("train"), 0)
        self.assertEqual(self.srv.instances("train")[1]["az"], REGION + "a")  # the emptier zone
        # With the decrement, no replacement is wanted.
        act = self.client().terminate_instance_in_auto_scaling_group(
            InstanceId="i-0bbb", ShouldDecrementDesiredCapacity=True)["Activity"]
        self.assertTrue(act["Cause"].endswith("shrinking the capacity from 2 to 1."), act["Cause"])
        self.assertEqual((self.srv.desired("train"), self.srv.needed("train")), (1, 0))
        self.assertEqual([a for a, _ in self.srv.calls()], ["TerminateInstanceInAutoScalingGroup",
                                                             "DescribeAutoScalingInstances",
                                                             "TerminateInstanceInAutoScalingGroup"])
        self.assertEqual(self.srv.calls()[0][1], {"InstanceId": "i-0aaa", "ShouldDecrementDesiredCapacity": "false"})

    def test_terminating_hook_complete_by_instance_and_by_token(self):
        self.group(desired=3, max_size=4, instances=("i-0aaa", "i-0bbb", "i-0ccc"))
        self.hook(HeartbeatTimeout=300)
        c = self.client()
        c.terminate_instance_in_auto_scaling_group(InstanceId="i-0aaa", ShouldDecrementDesiredCapacity=True)
        self.assertEqual(self.instances(["i-0aaa"]), {"i-0aaa": "Terminating:Wait"})
        # What an instance asks to learn its own group:
        mine = c.describe_auto_scaling_instances(InstanceIds=["i-0aaa"])["AutoScalingInstances"][0]
        self.assertEqual((mine["AutoScalingGroupName"], mine["HealthStatus"]), ("train", "HEALTHY"))
        self.assertIsNone(self.srv.lifecycle_completed("i-0aaa"))
        c.complete_lifecycle_action(LifecycleHookName="drain", AutoScalingGroupName="train",
                                    LifecycleActionResult="CONTINUE", InstanceId="i-0aaa")
        self.assertEqual(self.srv.lifecycle_completed("i-0aaa"), "CONTINUE")
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminated")
        self.assertNotIn("i-0aaa", self.instances())
        # A termination the group starts itself (a Spot interruption): the token is what the
        # lifecycle notification would carry.
        token = self.srv.begin_termination("i-0bbb", cause="spot-interruption")
        self.assertEqual(self.srv.lifecycle_state("i-0bbb"), "Terminating:Wait")
        c.complete_lifecycle_action(LifecycleHookName="drain", AutoScalingGroupName="train",
                                    LifecycleActionResult="ABANDON", LifecycleActionToken=token)
        self.assertEqual(self.srv.lifecycle_completed("i-0bbb"), "ABANDON")
        self.assertEqual(self.srv.lifecycle_state("i-0bbb"), "Terminated")  # ABANDON terminates too
        self.assertEqual((self.srv.desired("train"), self.srv.needed("train")), (2, 1))
        err = self.error(lambda: c.complete_lifecycle_action(
            LifecycleHookName="drain", AutoScalingGroupName="train", LifecycleActionResult="CONTINUE",
            LifecycleActionToken=token))
        self.assertEqual(err["Error"]["Message"], f"No active Lifecycle Action found with token {token}")

    def test_heartbeats_and_the_timeout(self):
        self.group()
        self.hook(HeartbeatTimeout=300, DefaultResult="CONTINUE")
        hooks = self.client().describe_lifecycle_hooks(AutoScalingGroupName="train")["LifecycleHooks"]
        self.assertEqual(hooks, [{"LifecycleHookName": "drain", "AutoScalingGroupName": "train",
                                  "LifecycleTransition": TERMINATE_HOOK, "HeartbeatTimeout": 300,
                                  "GlobalTimeout": 30000, "DefaultResult": "CONTINUE"}])
        self.srv.begin_termination("i-0aaa")
        self.srv.advance(200)
        self.client().record_lifecycle_action_heartbeat(LifecycleHookName="drain", AutoScalingGroupName="train",
                                                        InstanceId="i-0aaa")
        self.srv.advance(250)  # 450 s in, but 250 since the heartbeat
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminating:Wait")
        self.srv.advance(51)
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminated")
        (action,) = self.srv.lifecycle_actions("i-0aaa")
        self.assertEqual((action["result"], action["completed_by"], action["heartbeats"]), ("CONTINUE", "timeout", 1))
        self.assertIsNone(self.srv.lifecycle_completed("i-0aaa"))  # nobody called CompleteLifecycleAction
        self.assertEqual(self.code(lambda: self.client().complete_lifecycle_action(
            LifecycleHookName="drain", AutoScalingGroupName="train", LifecycleActionResult="CONTINUE",
            InstanceId="i-0aaa")), "ValidationError")

    def test_heartbeats_stop_at_the_global_timeout(self):
        self.group()
        self.hook(HeartbeatTimeout=30)  # GlobalTimeout 3000
        self.srv.begin_termination("i-0aaa")
        for _ in range(103):  # 103 x 29 s = 2987 s
            self.srv.advance(29)
            self.client().record_lifecycle_action_heartbeat(LifecycleHookName="drain", AutoScalingGroupName="train",
                                                            InstanceId="i-0aaa")
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminating:Wait")
        self.srv.advance(14)
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminated")
        self.assertEqual(self.srv.lifecycle_actions("i-0aaa")[0]["result"], "ABANDON")  # the default DefaultResult

    def test_two_hooks_and_abandon(self):
        self.group()
        self.hook("drain")
        self.hook("upload-logs")
        self.srv.begin_termination("i-0aaa")
        self.assertEqual([a["hook"] for a in self.srv.lifecycle_actions("i-0aaa")], ["drain", "upload-logs"])
        self.client().complete_lifecycle_action(LifecycleHookName="drain", AutoScalingGroupName="train",
                                                LifecycleActionResult="CONTINUE", InstanceId="i-0aaa")
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminating:Wait")  # still held by the other
        self.client().complete_lifecycle_action(LifecycleHookName="upload-logs", AutoScalingGroupName="train",
                                                LifecycleActionResult="CONTINUE", InstanceId="i-0aaa")
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminated")
        self.srv.begin_termination("i-0bbb")
        self.client().complete_lifecycle_action(LifecycleHookName="upload-logs", AutoScalingGroupName="train",
                                                LifecycleActionResult="ABANDON", InstanceId="i-0bbb")
        self.assertEqual(self.srv.lifecycle_state("i-0bbb"), "Terminated")
        self.assertEqual([(a["hook"], a["result"], a["completed_by"]) for a in self.srv.lifecycle_actions("i-0bbb")],
                         [("drain", "ABANDON", "abandoned"), ("upload-logs", "ABANDON", "CompleteLifecycleAction")])
        self.assertEqual(self.srv.lifecycle_completed("i-0bbb"), "ABANDON")

    def test_launching_hook(self):
        self.group(instances=())
        self.hook("warm-up", transition=LAUNCH_HOOK)
        self.srv.add_instance("train", "i-0new", state="Pending")
        self.srv.add_instance("train", "i-0bad", state="Pending")
        self.assertEqual(self.instances(), {"i-0new": "Pending:Wait", "i-0bad": "Pending:Wait"})
        self.assertEqual(self.srv.needed("train"), 0)  # pending instances count toward capacity
        c = self.client()
        c.complete_lifecycle_action(LifecycleHookName="warm-up", AutoScalingGroupName="train",
                                    LifecycleActionResult="CONTINUE", InstanceId="i-0new")
        c.complete_lifecycle_action(LifecycleHookName="warm-up", AutoScalingGroupName="train",
                                    LifecycleActionResult="ABANDON", InstanceId="i-0bad")
        self.assertEqual(self.instances(), {"i-0new": "InService"})
        self.assertEqual(self.srv.needed("train"), 1)

    def test_termination_seconds_none_keeps_it_listed(self):
        self.srv.termination_seconds = None
        self.group()
        self.hook()
        self.srv.begin_termination("i-0aaa")
        self.client().complete_lifecycle_action(LifecycleHookName="drain", AutoScalingGroupName="train",
                                                LifecycleActionResult="CONTINUE", InstanceId="i-0aaa")
        self.assertEqual(self.instances(["i-0aaa"]), {"i-0aaa": "Terminating:Proceed"})
        self.srv.begin_termination("i-0bbb")  # Terminating:Wait, until its hook is deleted
        self.client().delete_lifecycle_hook(LifecycleHookName="drain", AutoScalingGroupName="train")
        self.assertEqual(self.instances(), {"i-0aaa": "Terminating:Proceed", "i-0bbb": "Terminating:Proceed"})
        self.assertEqual(self.srv.lifecycle_actions("i-0bbb")[0]["completed_by"], "DeleteLifecycleHook")
        self.srv.finish_termination("i-0aaa")
        self.assertEqual(self.instances(), {"i-0bbb": "Terminating:Proceed"})

    def test_delete_group(self):
        self.srv.termination_seconds = None
        self.group()
        self.hook()
        c = self.client()
        err = self.error(lambda: c.delete_auto_scaling_group(AutoScalingGroupName="train"))
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"]),
                         ("ResourceInUse", "You cannot delete an AutoScalingGroup while there are instances or pending "
                                           "Spot instance request(s) still in the group."))
        self.srv.begin_termination("i-0aaa")
        self.srv.begin_termination("i-0bbb")
        err = self.error(lambda: c.delete_auto_scaling_group(AutoScalingGroupName="train"))
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"]),
                         ("ScalingActivityInProgress", "You cannot delete an AutoScalingGroup while there are scaling "
                                                       "activities in progress for that group."))
        c.delete_auto_scaling_group(AutoScalingGroupName="train", ForceDelete=True)
        self.assertEqual(c.describe_auto_scaling_groups()["AutoScalingGroups"], [])
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminated")
        self.assertEqual({a["completed_by"] for a in self.srv.lifecycle_actions()}, {"ForceDelete"})

    def test_detach_instances(self):
        imds = FakeImdsServer(instance_id="i-0aaa", region=REGION).start()
        self.addCleanup(imds.stop)
        self.group(min_size=1, desired=2)
        self.srv.link_imds("i-0aaa", imds)
        c = self.client()
        err = self.error(lambda: c.detach_instances(InstanceIds=["i-0zzz"], AutoScalingGroupName="train",
                                                    ShouldDecrementDesiredCapacity=True))
        self.assertEqual(err["Error"]["Message"], "The instance i-0zzz is not part of Auto Scaling group train.")
        acts = c.detach_instances(InstanceIds=["i-0aaa"], AutoScalingGroupName="train",
                                  ShouldDecrementDesiredCapacity=True)["Activities"]
        self.assertEqual([(a["Description"], a["StatusCode"]) for a in acts],
                         [("Detaching EC2 instance: i-0aaa", "InProgress")])
        self.assertTrue(acts[0]["Cause"].endswith("was detached in response to a user request, shrinking the "
                                                  "capacity from 2 to 1."), acts[0]["Cause"])
        self.assertEqual([i["id"] for i in self.srv.instances("train")], ["i-0bbb"])
        self.assertEqual((self.srv.desired("train"), self.srv.needed("train")), (1, 0))
        self.assertEqual(self.srv.detached(), {"i-0aaa": "train"})
        self.assertEqual(imds._target_lifecycle_state, "Detached")
        # At the minimum the decrement is refused; without it, the group is short of one.
        err = self.error(lambda: c.detach_instances(InstanceIds=["i-0bbb"], AutoScalingGroupName="train",
                                                    ShouldDecrementDesiredCapacity=True))
        self.assertEqual(err["Error"]["Code"], "ValidationError")
        self.assertIn("fall below its minimum size (1)", err["Error"]["Message"])
        c.detach_instances(InstanceIds=["i-0bbb"], AutoScalingGroupName="train", ShouldDecrementDesiredCapacity=False)
        self.assertEqual((self.srv.desired("train"), self.srv.needed("train")), (1, 1))
        # Empty now: deleted without ForceDelete.
        c.delete_auto_scaling_group(AutoScalingGroupName="train")
        self.assertIsNone(self.srv.group("train"))
        self.srv.deny("DetachInstances")
        self.group(name="g2", min_size=0, desired=1, instances=("i-0ccc",))
        self.assertEqual(self.code(lambda: c.detach_instances(InstanceIds=["i-0ccc"], AutoScalingGroupName="g2",
                                                              ShouldDecrementDesiredCapacity=True)), "AccessDenied")

    def test_a_lost_answer_took_effect(self):
        from botocore.exceptions import ConnectionClosedError, EndpointConnectionError
        self.srv.lose_answer("CreateAutoScalingGroup")
        c = self.client()
        with self.assertRaises((ConnectionClosedError, EndpointConnectionError)):
            c.create_auto_scaling_group(AutoScalingGroupName="lost", MinSize=0, MaxSize=1,
                                        AvailabilityZones=[REGION + "a"],
                                        LaunchTemplate={"LaunchTemplateName": "trainer", "Version": "$Latest"})
        self.assertIsNotNone(self.srv.group("lost"), "carried out all the same")
        self.assertEqual(self.code(lambda: c.create_auto_scaling_group(
            AutoScalingGroupName="lost", MinSize=0, MaxSize=1, AvailabilityZones=[REGION + "a"],
            LaunchTemplate={"LaunchTemplateName": "trainer", "Version": "$Latest"})), "AlreadyExists")

    def test_imds_follows_the_group(self):
        imds = FakeImdsServer(instance_id="i-0aaa", region=REGION).start()
        self.addCleanup(imds.stop)

        def target():
            conn = http.client.HTTPConnection("127.0.0.1", imds.port, timeout=5)
            try:
                conn.request("PUT", "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
                token = conn.getresponse().read().decode()
                conn.request("GET", "/latest/meta-data/autoscaling/target-lifecycle-state",
                             headers={"X-aws-ec2-metadata-token": token})
                r = conn.getresponse()
                body = r.read().decode()
                return body if r.status == 200 else r.status
            finally:
                conn.close()
        self.assertEqual(target(), 404)  # in no group yet
        self.srv.link_imds("i-0aaa", imds)
        self.group()
        self.hook(HeartbeatTimeout=120)
        self.assertEqual(target(), "InService")
        self.client().terminate_instance_in_auto_scaling_group(InstanceId="i-0aaa",
                                                               ShouldDecrementDesiredCapacity=False)
        self.assertEqual(target(), "Terminated")
        self.assertEqual(self.srv.lifecycle_state("i-0aaa"), "Terminating:Wait")
        # wait_for: the heartbeat timeout passes on another thread, the lifecycle clock moved by it.
        threading.Timer(0.1, self.srv.advance, [121]).start()
        self.assertTrue(self.srv.wait_for(lambda: self.srv.lifecycle_state("i-0aaa") == "Terminated", timeout=5))
        self.assertEqual(target(), "Terminated")

    def test_describe_pages_filters_subnets_and_mixed_instances(self):
        self.srv.subnets = {"subnet-0a": REGION + "a", "subnet-0b": REGION + "b"}
        c = self.client()
        c.create_auto_scaling_group(
            AutoScalingGroupName="spot", MinSize=0, MaxSize=8, DesiredCapacity=1,
            VPCZoneIdentifier="subnet-0a,subnet-0b",
            CapacityRebalance=True, Tags=[{"Key": "spotvisor-run", "Value": "r1", "PropagateAtLaunch": True}],
            MixedInstancesPolicy={
                "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateId": "lt-0123456789abcdef0",
                                                                   "Version": "3"},
                                   "Overrides": [{"InstanceType": "g5.xlarge"}, {"InstanceType": "g6.xlarge"}]},
                "InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 0,
                                          "SpotAllocationStrategy": "price-capacity-optimized"}})
        self.group("other", instances=())
        err = self.error(lambda: c.create_auto_scaling_group(
            AutoScalingGroupName="x", MinSize=0, MaxSize=1, VPCZoneIdentifier="subnet-0zz",
            LaunchTemplate={"LaunchTemplateName": "trainer"}))
        self.assertEqual(err["Error"]["Message"], "The subnet ID 'subnet-0zz' does not exist")
        self.srv.add_instance("spot", "i-0s1", REGION + "b", instance_type="g6.xlarge")
        g = c.describe_auto_scaling_groups(AutoScalingGroupNames=["spot"])["AutoScalingGroups"][0]
        self.assertEqual(g["AvailabilityZones"], [REGION + "a", REGION + "b"])
        self.assertEqual(g["VPCZoneIdentifier"], "subnet-0a,subnet-0b")
        self.assertEqual(g["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"],
                         [{"InstanceType": "g5.xlarge"}, {"InstanceType": "g6.xlarge"}])
        self.assertEqual(g["MixedInstancesPolicy"]["InstancesDistribution"],
                         {"OnDemandAllocationStrategy": "prioritized", "OnDemandBaseCapacity": 0,
                          "OnDemandPercentageAboveBaseCapacity": 0,
                          "SpotAllocationStrategy": "price-capacity-optimized"})
        self.assertEqual(g["Instances"][0]["InstanceType"], "g6.xlarge")
        self.assertEqual(g["Instances"][0]["LaunchTemplate"], {"LaunchTemplateId": "lt-0123456789abcdef0",
                                                               "Version": "3"})
        self.assertEqual(g["Tags"], [{"ResourceId": "spot", "ResourceType": "auto-scaling-group",
                                      "Key": "spotvisor-run", "Value": "r1", "PropagateAtLaunch": True}])
        act = c.terminate_instance_in_auto_scaling_group(InstanceId="i-0s1",
                                                         ShouldDecrementDesiredCapacity=True)["Activity"]
        self.assertEqual(act["Details"], '{"Subnet ID":"subnet-0b","Availability Zone":"eu-west-1b"}')
        page = c.describe_auto_scaling_groups(MaxRecords=1)
        self.assertEqual([g["AutoScalingGroupName"] for g in page["AutoScalingGroups"]], ["other"])
        page = c.describe_auto_scaling_groups(MaxRecords=1, NextToken=page["NextToken"])
        self.assertEqual(([g["AutoScalingGroupName"] for g in page["AutoScalingGroups"]], page.get("NextToken")),
                         (["spot"], None))
        got = c.describe_auto_scaling_groups(Filters=[{"Name": "tag:spotvisor-run", "Values": ["r1", "r2"]}])
        self.assertEqual([g["AutoScalingGroupName"] for g in got["AutoScalingGroups"]], ["spot"])
        pages = c.get_paginator("describe_auto_scaling_groups").paginate(PaginationConfig={"PageSize": 1})
        self.assertEqual([g["AutoScalingGroupName"] for p in pages for g in p["AutoScalingGroups"]], ["other", "spot"])


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed (apt-get install python3-boto3)")
class LaunchTemplateLinkTest(_Base):
    """link_ec2(): groups name launch templates that fake_ec2.py has, made there with boto3's EC2 client."""
    FULLY_FORMED = "You must use a valid fully-formed launch template. "
    SPOT_IN_MIXED = ("Incompatible launch template: You cannot use a launch template that is set to request Spot "
                     "Instances (InstanceMarketOptions) when you configure an Auto Scaling group with a mixed "
                     "instances policy. Add a different launch template to the group and try again.")

    def setUp(self):
        super().setUp()
        self.ec2_srv = FakeEc2Server(region=REGION, credentials={AKID: SECRET}).start()
        self.addCleanup(self.ec2_srv.stop)
        self.srv.link_ec2(self.ec2_srv)
        self.ec2 = boto3.client("ec2", endpoint_url=self.ec2_srv.endpoint, region_name=REGION, aws_access_key_id=AKID,
                                aws_secret_access_key=SECRET, config=Config(retries={"total_max_attempts": 1}))
        data = {"ImageId": "ami-0123456789abcdef0", "InstanceType": "g5.xlarge",
                "UserData": "IyEvYmluL2Jhc2gKc3BvdHZpc29yIHJ1bgo=", "IamInstanceProfile": {"Name": "spotvisor-node"},
                "MetadataOptions": {"HttpTokens": "required", "InstanceMetadataTags": "enabled"}}
        self.lt = self.ec2.create_launch_template(LaunchTemplateName="spotvisor-trainer",
                                                  LaunchTemplateData=data)["LaunchTemplate"]
        self.spot_lt = self.ec2.create_launch_template(
            LaunchTemplateName="spotvisor-spot",
            LaunchTemplateData=dict(data, InstanceMarketOptions={"MarketType": "spot"}))["LaunchTemplate"]

    def mixed(self, name="spot", spec=None, **kw):
        args = dict(
            AutoScalingGroupName=name, MinSize=0, MaxSize=4, DesiredCapacity=1,
            VPCZoneIdentifier="subnet-0a,subnet-0b", CapacityRebalance=True,
            Tags=[{"Key": "spotvisor-run", "Value": "r1", "PropagateAtLaunch": True},
                  {"Key": "team", "Value": "ml", "PropagateAtLaunch": False}],
            MixedInstancesPolicy={
                "LaunchTemplate": {"LaunchTemplateSpecification": spec or {"LaunchTemplateName": "spotvisor-trainer",
                                                                           "Version": "$Latest"},
                                   "Overrides": [{"InstanceType": "g5.xlarge", "WeightedCapacity": "1"},
                                                 {"InstanceType": "g6.xlarge"}]},
                "InstancesDistribution": {"OnDemandBaseCapacity": 0, "OnDemandPercentageAboveBaseCapacity": 0,
                                          "SpotAllocationStrategy": "price-capacity-optimized"}},
            LifecycleHookSpecificationList=[{"LifecycleHookName": "drain", "LifecycleTransition": TERMINATE_HOOK,
                                             "HeartbeatTimeout": 120, "DefaultResult": "CONTINUE"}])
        args.update(kw)
        return self.client().create_auto_scaling_group(**args)

    def test_a_mixed_instances_group_on_a_template_ec2_has(self):
        self.mixed()
        lt_id = self.lt["LaunchTemplateId"]
        g = self.srv.group("spot")
        self.assertEqual(g["mixed_instances_policy"]["LaunchTemplate"]["LaunchTemplateSpecification"],
                         {"LaunchTemplateId": lt_id, "LaunchTemplateName": "spotvisor-trainer", "Version": "$Latest"})
        self.assertEqual([o["InstanceType"] for o in g["mixed_instances_policy"]["LaunchTemplate"]["Overrides"]],
                         ["g5.xlarge", "g6.xlarge"])
        dist = g["mixed_instances_policy"]["InstancesDistribution"]
        self.assertEqual((dist["OnDemandPercentageAboveBaseCapacity"], dist["SpotAllocationStrategy"]),
                         (0, "price-capacity-optimized"))
        self.assertEqual(g["tag_list"], [{"Key": "spotvisor-run", "Value": "r1", "PropagateAtLaunch": True},
                                         {"Key": "team", "Value": "ml", "PropagateAtLaunch": False}])
        self.assertEqual(g["tags"], {"spotvisor-run": "r1", "team": "ml"})
        self.assertEqual((g["vpc_zone_identifier"], g["subnets"], g["capacity_rebalance"]),
                         ("subnet-0a,subnet-0b", ["subnet-0a", "subnet-0b"], True))
        self.assertEqual([(h["LifecycleHookName"], h["LifecycleTransition"], h["HeartbeatTimeout"], h["DefaultResult"])
                          for h in g["hooks"]], [("drain", TERMINATE_HOOK, 120, "CONTINUE")])
        # What boto3 sent for it, as the fake recorded it.
        params = self.srv.calls()[-1][1]
        for key, value in (("MixedInstancesPolicy.LaunchTemplate.LaunchTemplateSpecification.LaunchTemplateName",
                            "spotvisor-trainer"),
                           ("MixedInstancesPolicy.LaunchTemplate.Overrides.member.2.InstanceType", "g6.xlarge"),
                           ("MixedInstancesPolicy.InstancesDistribution.SpotAllocationStrategy",
                            "price-capacity-optimized"),
                           ("Tags.member.2.PropagateAtLaunch", "false"),
                           ("LifecycleHookSpecificationList.member.1.HeartbeatTimeout", "120"),
                           ("CapacityRebalance", "true")):
            self.assertEqual(params.get(key), value, key)
        # By id: the group answers the name too, as the service (which asks EC2) does.
        self.mixed("by-id", {"LaunchTemplateId": lt_id})
        described = self.client().describe_auto_scaling_groups(
            Filters=[{"Name": "tag:spotvisor-run", "Values": ["r1"]}])["AutoScalingGroups"]
        self.assertEqual([d["AutoScalingGroupName"] for d in described], ["by-id", "spot"])
        self.assertEqual(described[0]["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"],
                         {"LaunchTemplateId": lt_id, "LaunchTemplateName": "spotvisor-trainer", "Version": "$Default"})
        self.assertEqual(described[1]["Tags"][0], {"ResourceId": "spot", "ResourceType": "auto-scaling-group",
                                                   "Key": "spotvisor-run", "Value": "r1", "PropagateAtLaunch": True})
        # A plain LaunchTemplate may request Spot; only a mixed instances policy may not.
        self.client().create_auto_scaling_group(AutoScalingGroupName="plain", MinSize=0, MaxSize=1,
                                                AvailabilityZones=[REGION + "a"],
                                                LaunchTemplate={"LaunchTemplateName": "spotvisor-spot"})
        self.assertEqual(self.srv.group("plain")["launch_template"]["LaunchTemplateId"],
                         self.spot_lt["LaunchTemplateId"])
        self.client().delete_auto_scaling_group(AutoScalingGroupName="plain")
        self.assertIsNone(self.srv.group("plain"))

    def test_templates_ec2_lacks_or_that_request_spot_are_refused(self):
        err = self.error(lambda: self.mixed(spec={"LaunchTemplateName": "no-such-template"}))["Error"]
        self.assertEqual((err["Code"], err["Message"]), (
            "ValidationError",
            self.FULLY_FORMED + "The specified launch template, with template name no-such-template, does not exist."))
        err = self.error(lambda: self.mixed(spec={"LaunchTemplateId": "lt-0123456789abcdef0"}))["Error"]
        self.assertEqual(err["Message"], self.FULLY_FORMED + "The specified launch template, with template ID "
                                                             "lt-0123456789abcdef0, does not exist.")
        err = self.error(lambda: self.mixed(spec={"LaunchTemplateName": "spotvisor-trainer", "Version": "7"}))["Error"]
        self.assertEqual(err["Message"], self.FULLY_FORMED + f"Could not find the specified version 7 for the launch "
                                                             f"template with ID {self.lt['LaunchTemplateId']}.")
        err = self.error(lambda: self.mixed(spec={"LaunchTemplateName": "spotvisor-spot"}))
        self.assertEqual((err["Error"]["Code"], err["Error"]["Message"], err["ResponseMetadata"]["HTTPStatusCode"]),
                         ("InvalidQueryParameter", self.SPOT_IN_MIXED, 400))
        self.assertEqual(self.srv.groups(), [])
        # A later version that requests Spot is refused once the group asks for it.
        self.ec2_srv.add_launch_template_version("spotvisor-trainer", {"InstanceMarketOptions": {"MarketType": "spot"}})
        self.mixed(spec={"LaunchTemplateName": "spotvisor-trainer", "Version": "1"})
        self.assertEqual(self.code(lambda: self.mixed("latest", {"LaunchTemplateName": "spotvisor-trainer",
                                                                 "Version": "$Latest"})), "InvalidQueryParameter")
        # UpdateAutoScalingGroup is checked the same way, and a refused update changes nothing.
        err = self.error(lambda: self.client().update_auto_scaling_group(
            AutoScalingGroupName="spot", MaxSize=9, MixedInstancesPolicy={
                "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": "gone-template"}}}))
        self.assertIn("with template name gone-template, does not exist.", err["Error"]["Message"])
        self.assertEqual(self.srv.group("spot")["max"], 4)
        self.ec2.delete_launch_template(LaunchTemplateName="spotvisor-spot")
        self.assertEqual(self.code(lambda: self.client().create_auto_scaling_group(
            AutoScalingGroupName="plain", MinSize=0, MaxSize=1, AvailabilityZones=[REGION + "a"],
            LaunchTemplate={"LaunchTemplateName": "spotvisor-spot"})), "ValidationError")
        with self.assertRaises(ValueError):  # the control API follows the link too
            self.srv.create_group("ctl", launch_template_name="spotvisor-spot")
        # Unlinked, names and ids are taken as they come, as before.
        self.srv.link_ec2(None)
        self.mixed("unlinked", {"LaunchTemplateName": "no-such-template"})
        self.srv.create_group("ctl", launch_template_name="spotvisor-spot")


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed (apt-get install python3-boto3)")
@unittest.skipUnless(AWS, "awscli (Debian package) is not installed (apt-get install awscli)")
class AwsCliTest(_Base):
    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="fake-asg-cli-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.env = {"PATH": "/usr/bin:/bin", "HOME": self.tmp, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                    "AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION,
                    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                    "AWS_EC2_METADATA_DISABLED": "true", "AWS_PAGER": "", "AWS_MAX_ATTEMPTS": "1"}

    def aws(self, *args, check=True):
        import json
        p = subprocess.run([AWS, "autoscaling", *args, "--endpoint-url", self.srv.endpoint], env=self.env,
                           capture_output=True, text=True, timeout=60)
        if check and p.returncode != 0:
            self.fail(f"aws autoscaling {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
        return json.loads(p.stdout) if check and p.stdout.strip() else p

    def test_group_lifecycle_through_the_cli(self):
        self.aws("create-auto-scaling-group", "--auto-scaling-group-name", "cli",
                 "--launch-template", "LaunchTemplateName=trainer,Version=$Latest", "--min-size", "1",
                 "--max-size", "3", "--desired-capacity", "2", "--availability-zones", REGION + "a", REGION + "b",
                 "--capacity-rebalance", "--tags", "Key=spotvisor-run,Value=r1,PropagateAtLaunch=true")
        self.srv.add_instance("cli", "i-0c1")
        self.srv.add_instance("cli", "i-0c2")
        g = self.aws("describe-auto-scaling-groups", "--auto-scaling-group-names", "cli")["AutoScalingGroups"][0]
        self.assertEqual((g["MinSize"], g["MaxSize"], g["DesiredCapacity"], g["CapacityRebalance"]), (1, 3, 2, True))
        self.assertEqual(g["LaunchTemplate"]["LaunchTemplateName"], "trainer")
        self.assertEqual([(i["InstanceId"], i["LifecycleState"]) for i in g["Instances"]],
                         [("i-0c1", "InService"), ("i-0c2", "InService")])
        self.aws("put-lifecycle-hook", "--lifecycle-hook-name", "drain", "--auto-scaling-group-name", "cli",
                 "--lifecycle-transition", TERMINATE_HOOK, "--heartbeat-timeout", "120", "--default-result",
                 "CONTINUE")
        act = self.aws("terminate-instance-in-auto-scaling-group", "--instance-id", "i-0c1",
                       "--should-decrement-desired-capacity")["Activity"]
        self.assertTrue(act["Cause"].endswith("shrinking the capacity from 2 to 1."), act)
        got = self.aws("describe-auto-scaling-instances", "--instance-ids", "i-0c1")["AutoScalingInstances"]
        self.assertEqual([(i["AutoScalingGroupName"], i["LifecycleState"]) for i in got],
                         [("cli", "Terminating:Wait")])
        self.aws("complete-lifecycle-action", "--lifecycle-hook-name", "drain", "--auto-scaling-group-name", "cli",
                 "--lifecycle-action-result", "CONTINUE", "--instance-id", "i-0c1")
        self.assertEqual(self.srv.lifecycle_completed("i-0c1"), "CONTINUE")
        self.assertEqual(self.aws("describe-auto-scaling-instances", "--instance-ids", "i-0c1"),
                         {"AutoScalingInstances": []})
        # desired 1 = min 1: the CLI gets the service's refusal; without the decrement it goes.
        p = self.aws("terminate-instance-in-auto-scaling-group", "--instance-id", "i-0c2",
                     "--should-decrement-desired-capacity", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("An error occurred (ValidationError) when calling the TerminateInstanceInAutoScalingGroup "
                      "operation", p.stderr)
        self.assertIn(MIN_SIZE_MESSAGE.format(1), p.stderr)
        self.aws("terminate-instance-in-auto-scaling-group", "--instance-id", "i-0c2",
                 "--no-should-decrement-desired-capacity")
        self.assertEqual((self.srv.desired("cli"), self.srv.needed("cli")), (1, 1))
        self.srv.add_instance("cli", "i-0c3")
        p = self.aws("delete-auto-scaling-group", "--auto-scaling-group-name", "cli", check=False)
        self.assertIn("(ResourceInUse)", p.stderr)
        self.aws("delete-auto-scaling-group", "--auto-scaling-group-name", "cli", "--force-delete")
        p = self.aws("delete-auto-scaling-group", "--auto-scaling-group-name", "cli", check=False)
        self.assertIn("An error occurred (ValidationError) when calling the DeleteAutoScalingGroup operation", p.stderr)
        self.assertIn("AutoScalingGroup name not found - AutoScalingGroup 'cli' not found", p.stderr)
        self.assertEqual([a for a, _ in self.srv.calls()],
                         ["CreateAutoScalingGroup", "DescribeAutoScalingGroups", "PutLifecycleHook",
                          "TerminateInstanceInAutoScalingGroup", "DescribeAutoScalingInstances",
                          "CompleteLifecycleAction", "DescribeAutoScalingInstances",
                          "TerminateInstanceInAutoScalingGroup", "TerminateInstanceInAutoScalingGroup",
                          "DeleteAutoScalingGroup", "DeleteAutoScalingGroup", "DeleteAutoScalingGroup"])

    def test_detach_through_the_cli(self):
        self.aws("create-auto-scaling-group", "--auto-scaling-group-name", "cli", "--launch-template",
                 "LaunchTemplateName=trainer,Version=$Latest", "--min-size", "0", "--max-size", "1",
                 "--desired-capacity", "1", "--availability-zones", REGION + "a")
        self.srv.add_instance("cli", "i-0d1")
        acts = self.aws("detach-instances", "--instance-ids", "i-0d1", "--auto-scaling-group-name", "cli",
                        "--should-decrement-desired-capacity")["Activities"]
        self.assertEqual(acts[0]["Description"], "Detaching EC2 instance: i-0d1")
        self.assertEqual(self.srv.desired("cli"), 0)
        self.aws("delete-auto-scaling-group", "--auto-scaling-group-name", "cli")
        self.assertEqual(self.srv.groups(), [])

    def test_cli_auth_errors(self):
        self.env["AWS_SECRET_ACCESS_KEY"] = "wrong"
        p = self.aws("describe-auto-scaling-groups", check=False)
        self.assertIn("An error occurred (SignatureDoesNotMatch)", p.stderr)
        self.srv.deny("DescribeAutoScalingGroups")
        self.env["AWS_SECRET_ACCESS_KEY"] = SECRET
        p = self.aws("describe-auto-scaling-groups", check=False)
        self.assertIn("An error occurred (AccessDenied)", p.stderr)
        self.assertIn("is not authorized to perform: autoscaling:DescribeAutoScalingGroups", p.stderr)


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed (apt-get install python3-boto3)")
class ServeTest(unittest.TestCase):
    def test_serve_prints_the_endpoint_and_stops_on_sigterm(self):
        warnings.simplefilter("ignore", ResourceWarning)
        p = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "fake_autoscaling.py"), "serve", "--port", "0",
                              "--credentials", f"{AKID}:{SECRET}", "--region", REGION, "--group", "g:1:2",
                              "--instance", "g:i-0s1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        self.addCleanup(lambda: p.poll() is None and p.kill())
        ready, _, _ = select.select([p.stdout], [], [], 15)
        self.assertTrue(ready, "serve printed nothing within 15 s")
        line = p.stdout.readline()
        m = re.fullmatch(r"fake-autoscaling listening on (http://127\.0\.0\.1:\d+)\n", line)
        self.assertTrue(m, line)
        c = boto3.client("autoscaling", endpoint_url=m.group(1), region_name=REGION, aws_access_key_id=AKID,
                         aws_secret_access_key=SECRET, config=Config(retries={"total_max_attempts": 1}))
        got = c.describe_auto_scaling_instances()["AutoScalingInstances"]
        self.assertEqual([(i["InstanceId"], i["AutoScalingGroupName"], i["AvailabilityZone"]) for i in got],
                         [("i-0s1", "g", REGION + "a")])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=10), 0)
        self.assertEqual(p.stderr.read(), "")
        p.stdout.close()
        p.stderr.close()


if __name__ == "__main__":
    unittest.main()

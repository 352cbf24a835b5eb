#!/usr/bin/python3
"""fake_ec2.py against clients nobody here wrote: boto3's own EC2 client (Debian's python3-boto3)
and Debian's AWS CLI v2 (their requests verify, their parsers read the answers and the errors),
plus raw requests signed by botocore's SigV4Auth for what those clients would not send.

Run from the repo root with Debian's Python: /usr/bin/python3 tests/fakes/test_fake_ec2.py -v"""
import base64
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.parse
import warnings
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_ec2 import FakeEc2Server  # noqa: E402

try:
    import boto3
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.config import Config
    from botocore.credentials import Credentials
    from botocore.exceptions import ClientError
except ImportError:
    boto3 = None

AWS = shutil.which("aws", path="/usr/bin")  # Debian's awscli (v2)
USER_DATA = "#!/bin/bash\n/usr/local/bin/spotvisor run --config /etc/spotvisor.toml\n"
# A realistic LaunchTemplateData, as boto3 takes it (and DescribeLaunchTemplateVersions gives it back).
TRAINER_DATA = {
    "ImageId": "ami-0123456789abcdef0",
    "InstanceType": "g5.xlarge",
    "KeyName": "ops",
    "UserData": base64.b64encode(USER_DATA.encode()).decode(),
    "IamInstanceProfile": {"Name": "spotvisor-node"},
    "SecurityGroupIds": ["sg-0aaa1111bbbb22223", "sg-0ccc3333dddd44445"],
    "InstanceInitiatedShutdownBehavior": "terminate",
    "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled",
                        "InstanceMetadataTags": "enabled"},
    "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "spotvisor-run", "Value": "r1"},
                                                                {"Key": "Name", "Value": "trainer"}]},
                          {"ResourceType": "volume", "Tags": [{"Key": "spotvisor-run", "Value": "r1"}]}],
    "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"Encrypted": True, "DeleteOnTermination": True,
                                                                "VolumeSize": 200, "VolumeType": "gp3",
                                                                "Throughput": 250}}],
    "Monitoring": {"Enabled": False},
}
SPOT = {"MarketType": "spot", "SpotOptions": {"MaxPrice": "0.75", "SpotInstanceType": "one-time",
                                              "InstanceInterruptionBehavior": "terminate"}}
LT_ID = re.compile(r"lt-[0-9a-f]{17}\Z")


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed")
class Boto3Test(unittest.TestCase):
    def setUp(self):
        warnings.simplefilter("ignore", ResourceWarning)  # boto3 clients keep their connections open
        self.srv = FakeEc2Server(region="eu-west-1", credentials={"AKIDEC2": "secret-ec2"},
                                 instances=["i-0aaa", "i-0bbb"]).start()
        self.addCleanup(self.srv.stop)

    def client(self, secret="secret-ec2", akid="AKIDEC2", token=None):
        return boto3.client("ec2", endpoint_url=self.srv.endpoint, region_name="eu-west-1",
                            aws_access_key_id=akid, aws_secret_access_key=secret, aws_session_token=token,
                            config=Config(retries={"max_attempts": 1}))

    def test_stop_and_terminate(self):
        r = self.client().stop_instances(InstanceIds=["i-0aaa"])
        self.assertEqual(r["StoppingInstances"][0]["InstanceId"], "i-0aaa")
        self.assertEqual(r["StoppingInstances"][0]["CurrentState"]["Name"], "stopping")
        r = self.client().terminate_instances(InstanceIds=["i-0bbb"])
        self.assertEqual(r["TerminatingInstances"][0]["CurrentState"]["Name"], "shutting-down")
        self.assertEqual(self.srv.calls(), [("StopInstances", ["i-0aaa"]), ("TerminateInstances", ["i-0bbb"])])
        self.assertEqual(self.srv.state("i-0bbb"), "terminated")

    def code(self, fn):
        with self.assertRaises(ClientError) as cm:
            fn()
        return cm.exception.response["Error"]["Code"]

    def test_errors_as_ec2_sends_them(self):
        self.assertEqual(self.code(lambda: self.client(secret="wrong").stop_instances(InstanceIds=["i-0aaa"])),
                         "SignatureDoesNotMatch")
        self.assertEqual(self.code(lambda: self.client(akid="NOPE").stop_instances(InstanceIds=["i-0aaa"])),
                         "AuthFailure")
        self.assertEqual(self.code(lambda: self.client().stop_instances(InstanceIds=["i-0zzz"])),
                         "InvalidInstanceID.NotFound")
        self.srv.deny("TerminateInstances")
        self.assertEqual(self.code(lambda: self.client().terminate_instances(InstanceIds=["i-0aaa"])),
                         "UnauthorizedOperation")
        self.assertEqual(self.srv.state("i-0aaa"), "running")

    def test_session_credentials(self):
        self.srv.add_credentials("ASIAEC2", "s", session_token="tok")
        self.client(akid="ASIAEC2", secret="s", token="tok").stop_instances(InstanceIds=["i-0aaa"])
        self.assertEqual(self.code(lambda: self.client(akid="ASIAEC2", secret="s", token="other")
                                   .stop_instances(InstanceIds=["i-0aaa"])), "AuthFailure")
        self.srv.add_credentials("ASIAOLD", "s", session_token="t", expires_at=1)
        self.assertEqual(self.code(lambda: self.client(akid="ASIAOLD", secret="s", token="t")
                                   .stop_instances(InstanceIds=["i-0aaa"])), "RequestExpired")

    def test_create_tags(self):
        self.client().create_tags(Resources=["i-0aaa"], Tags=[{"Key": "spotvisor-phase", "Value": "running"}])
        self.assertEqual(self.srv.tags("i-0aaa"), {"spotvisor-phase": "running"})
        self.assertEqual(self.code(lambda: self.client().create_tags(
            Resources=["i-0aaa"], Tags=[{"Key": "aws:x", "Value": "v"}])), "InvalidParameterValue")
        self.srv.deny("CreateTags")
        self.assertEqual(self.code(lambda: self.client().create_tags(
            Resources=["i-0aaa"], Tags=[{"Key": "k", "Value": "v"}])), "UnauthorizedOperation")

    def test_a_request_signed_with_a_skewed_clock_is_refused(self):
        import time
        self.srv.clock = lambda: time.time() + 20 * 60  # the server's clock 20 min ahead of the signer's
        self.assertEqual(self.code(lambda: self.client().stop_instances(InstanceIds=["i-0aaa"])), "RequestExpired")
        self.assertEqual(self.srv.state("i-0aaa"), "running")
        self.srv.clock = lambda: time.time() + 5 * 60  # within 15 min: accepted
        self.client().stop_instances(InstanceIds=["i-0aaa"])

    def test_other_actions_are_refused(self):
        self.assertEqual(self.code(lambda: self.client().describe_instances()), "InvalidAction")
        self.assertEqual(self.code(lambda: self.client().create_launch_template_version(
            LaunchTemplateName="x-y", LaunchTemplateData={"ImageId": "ami-1"})), "InvalidAction")


class _LtBase(unittest.TestCase):
    REGION = "eu-west-1"

    def setUp(self):
        warnings.simplefilter("ignore", ResourceWarning)  # boto3 clients keep their connections open
        self.srv = FakeEc2Server(region=self.REGION, credentials={"AKIDEC2": "secret-ec2"},
                                 instances=["i-0aaa"]).start()
        self.addCleanup(self.srv.stop)
        self.ec2 = boto3.client("ec2", endpoint_url=self.srv.endpoint, region_name=self.REGION,
                                aws_access_key_id="AKIDEC2", aws_secret_access_key="secret-ec2",
                                config=Config(retries={"max_attempts": 1}))

    def error(self, fn):
        with self.assertRaises(ClientError) as cm:
            fn()
        e = cm.exception.response
        return e["Error"]["Code"], e["Error"]["Message"], e["ResponseMetadata"]["HTTPStatusCode"]

    def create(self, name="spotvisor-trainer", data=None, **kw):
        data = TRAINER_DATA if data is None else data
        return self.ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=data, **kw)["LaunchTemplate"]

    def raw(self, params):
        """A POST signed by botocore's SigV4Auth; returns (status, Error Code or root tag, message)."""
        body = urllib.parse.urlencode({"Version": "2016-11-15", **params}).encode()
        req = AWSRequest(method="POST", url=self.srv.endpoint + "/", data=body,
                         headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
        SigV4Auth(Credentials("AKIDEC2", "secret-ec2"), "ec2", self.REGION).add_auth(req)
        conn = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=10)
        try:
            conn.request("POST", "/", body=body, headers=dict(req.headers))
            r = conn.getresponse()
            root = ET.fromstring(r.read())
        finally:
            conn.close()
        if root.tag == "Response":
            return r.status, root.findtext("Errors/Error/Code"), root.findtext("Errors/Error/Message")
        return r.status, root.tag, None


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed")
class LaunchTemplateTest(_LtBase):
    def test_create_describe_and_delete_round_trip(self):
        lt = self.create(VersionDescription="first",
                         TagSpecifications=[{"ResourceType": "launch-template",
                                             "Tags": [{"Key": "owner", "Value": "spotvisor"}]}])
        self.assertRegex(lt["LaunchTemplateId"], LT_ID)
        self.assertEqual((lt["LaunchTemplateName"], lt["DefaultVersionNumber"], lt["LatestVersionNumber"],
                          lt["CreatedBy"], lt["Tags"]),
                         ("spotvisor-trainer", 1, 1, "arn:aws:iam::123456789012:root",
                          [{"Key": "owner", "Value": "spotvisor"}]))
        # What the fake stored, and what boto3 put on the wire for it.
        got = self.srv.launch_template("spotvisor-trainer")
        self.assertEqual(got["id"], lt["LaunchTemplateId"])
        self.assertEqual(got["data"], TRAINER_DATA)
        self.assertEqual(got["user_data_text"], USER_DATA)
        self.assertEqual(got["tags"], {"owner": "spotvisor"})
        self.assertEqual([(v["number"], v["description"], v["default"]) for v in got["versions"]], [(1, "first", True)])
        self.assertEqual(self.srv.launch_template(template_id=lt["LaunchTemplateId"])["name"], "spotvisor-trainer")
        self.assertIsNone(self.srv.launch_template("nope"))
        action, params = self.srv.requests()[-1]
        self.assertEqual(action, "CreateLaunchTemplate")
        for key, value in (("LaunchTemplateData.SecurityGroupId.2", "sg-0ccc3333dddd44445"),
                           ("LaunchTemplateData.IamInstanceProfile.Name", "spotvisor-node"),
                           ("LaunchTemplateData.MetadataOptions.HttpPutResponseHopLimit", "2"),
                           ("LaunchTemplateData.TagSpecification.1.Tag.2.Key", "Name"),
                           ("LaunchTemplateData.BlockDeviceMapping.1.Ebs.VolumeSize", "200"),
                           ("LaunchTemplateData.Monitoring.Enabled", "false"),
                           ("TagSpecification.1.ResourceType", "launch-template"),
                           ("TagSpecification.1.Tag.1.Value", "spotvisor")):
            self.assertEqual(params.get(key), value, key)
        # Describe: by name, by id, filters, pages.
        spot = self.create("spotvisor-spot", dict(TRAINER_DATA, InstanceMarketOptions=SPOT))
        by_name = self.ec2.describe_launch_templates(LaunchTemplateNames=["spotvisor-spot"])["LaunchTemplates"]
        self.assertEqual([t["LaunchTemplateId"] for t in by_name], [spot["LaunchTemplateId"]])
        by_id = self.ec2.describe_launch_templates(LaunchTemplateIds=[lt["LaunchTemplateId"]])["LaunchTemplates"]
        self.assertEqual(by_id[0]["Tags"], [{"Key": "owner", "Value": "spotvisor"}])
        names = lambda r: [t["LaunchTemplateName"] for t in r["LaunchTemplates"]]  # noqa: E731
        self.assertEqual(names(self.ec2.describe_launch_templates()), ["spotvisor-trainer", "spotvisor-spot"])
        self.assertEqual(names(self.ec2.describe_launch_templates(
            Filters=[{"Name": "tag:owner", "Values": ["spot*"]}])), ["spotvisor-trainer"])
        self.assertEqual(names(self.ec2.describe_launch_templates(
            Filters=[{"Name": "launch-template-name", "Values": ["*-spot", "other"]}])), ["spotvisor-spot"])
        self.assertEqual(names(self.ec2.describe_launch_templates(Filters=[{"Name": "tag-key", "Values": ["x"]}])), [])
        pages = self.ec2.get_paginator("describe_launch_templates").paginate(PaginationConfig={"PageSize": 1})
        self.assertEqual([n for page in pages for n in names(page)], ["spotvisor-trainer", "spotvisor-spot"])
        # Versions: $Latest, $Default, numbers, by name or id; LaunchTemplateData comes back as it went.
        for kw in ({"LaunchTemplateName": "spotvisor-spot"}, {"LaunchTemplateId": spot["LaunchTemplateId"]}):
            for versions in ([], ["$Latest"], ["$Default"], ["1"], ["1", "$Latest"]):
                got = self.ec2.describe_launch_template_versions(Versions=versions, **kw)["LaunchTemplateVersions"]
                self.assertEqual([(v["VersionNumber"], v["DefaultVersion"], v["LaunchTemplateId"]) for v in got],
                                 [(1, True, spot["LaunchTemplateId"])], (kw, versions))
                self.assertEqual(got[0]["LaunchTemplateData"], dict(TRAINER_DATA, InstanceMarketOptions=SPOT))
        everyone = self.ec2.describe_launch_template_versions(Versions=["$Latest", "$Default"])
        self.assertEqual([v["LaunchTemplateName"] for v in everyone["LaunchTemplateVersions"]],
                         ["spotvisor-trainer", "spotvisor-spot"])
        # Delete by name and by id: the template comes back; the name can be used again.
        gone = self.ec2.delete_launch_template(LaunchTemplateName="spotvisor-trainer")["LaunchTemplate"]
        self.assertEqual((gone["LaunchTemplateId"], gone["LaunchTemplateName"]),
                         (lt["LaunchTemplateId"], "spotvisor-trainer"))
        self.ec2.delete_launch_template(LaunchTemplateId=spot["LaunchTemplateId"])
        self.assertEqual(self.srv.launch_templates(), [])
        self.assertNotEqual(self.create()["LaunchTemplateId"], lt["LaunchTemplateId"])
        self.assertEqual(self.srv.calls(), [], "calls() keeps to the instance actions")

    def test_client_token_makes_create_idempotent(self):
        first = self.create(ClientToken="run-r1-attempt")
        again = self.create(ClientToken="run-r1-attempt")
        self.assertEqual(again["LaunchTemplateId"], first["LaunchTemplateId"])
        self.assertEqual(self.srv.launch_templates(), ["spotvisor-trainer"])
        code, message, status = self.error(lambda: self.create(data=dict(TRAINER_DATA, InstanceType="g6.xlarge"),
                                                               ClientToken="run-r1-attempt"))
        self.assertEqual((code, message, status), (
            "IdempotentParameterMismatch", "Arguments on this idempotent request are inconsistent with arguments "
                                           "used in previous request(s).", 400))
        self.ec2.delete_launch_template(LaunchTemplateName="spotvisor-trainer")
        self.assertEqual(self.create(ClientToken="run-r1-attempt")["LaunchTemplateId"], first["LaunchTemplateId"],
                         "a retry after the delete still gets the first answer")
        self.assertEqual(self.srv.launch_templates(), [])
        # Without a token (or with another one) the name is simply taken.
        self.create()
        self.assertEqual(self.error(lambda: self.create(ClientToken="other")),
                         ("InvalidLaunchTemplateName.AlreadyExistsException", "Launch template name already in use.",
                          400))

    def test_refusals_as_ec2_words_them(self):
        lt = self.create()
        lt_id = lt["LaunchTemplateId"]
        self.assertEqual(self.error(lambda: self.create()),
                         ("InvalidLaunchTemplateName.AlreadyExistsException", "Launch template name already in use.",
                          400))
        code, message, _ = self.error(lambda: self.create("bad name!"))
        self.assertEqual(code, "InvalidLaunchTemplateName.MalformedException")
        self.assertIn("between 3 and 128 characters", message)
        self.assertEqual(self.error(lambda: self.create("bad-ud", dict(TRAINER_DATA, UserData="#!/bin/bash"))),
                         ("InvalidUserData.Malformed", "Invalid BASE64 encoding of user data.", 400))
        # Whitespace and missing padding pass, as EC2 lets them.
        self.create("lenient-ud", {"UserData": "IyEvYmluL2Jhc2gK\nZWNobyBoaQo"})
        self.assertEqual(self.srv.launch_template("lenient-ud")["user_data_text"], "#!/bin/bash\necho hi\n")
        self.assertEqual(self.error(lambda: self.create("empty", {})),
                         ("MissingParameter", "No launch template data was provided. Launch template data is required "
                                              "to create a launch template.", 400))
        self.assertEqual(self.error(lambda: self.create("wrong-tag", TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "k", "Value": "v"}]}])),
            ("InvalidParameterValue", "'instance' is not a valid taggable resource type for this operation.", 400))
        code, message, _ = self.error(lambda: self.create("bad-enum", dict(TRAINER_DATA,
                                                                            InstanceInitiatedShutdownBehavior="halt")))
        self.assertEqual(code, "InvalidParameterValue")
        self.assertIn("halt", message)
        requirements = {"InstanceRequirements": {"VCpuCount": {"Min": 4}, "MemoryMiB": {"Min": 1024}}}
        code, message, _ = self.error(lambda: self.create("reqs", requirements))
        self.assertEqual(code, "UnknownParameter")
        self.assertEqual(message, "The parameter LaunchTemplateData.InstanceRequirements is not recognized "
                                  "(fake_ec2.py does not implement it)")
        # Not found, by each way of naming a template.
        self.assertEqual(self.error(lambda: self.ec2.describe_launch_templates(LaunchTemplateNames=["nope-lt"])),
                         ("InvalidLaunchTemplateName.NotFoundException",
                          "At least one of the launch templates specified in the request does not exist.", 400))
        self.assertEqual(self.error(lambda: self.ec2.describe_launch_template_versions(LaunchTemplateName="nope-lt")),
                         ("InvalidLaunchTemplateName.NotFoundException",
                          "The specified launch template, with template name nope-lt, does not exist.", 400))
        self.assertEqual(self.error(lambda: self.ec2.delete_launch_template(LaunchTemplateId="lt-07ff4bb0369cd679c")),
                         ("InvalidLaunchTemplateId.NotFound",
                          "The specified launch template, with template ID lt-07ff4bb0369cd679c, does not exist.", 400))
        self.assertEqual(self.error(lambda: self.ec2.delete_launch_template(LaunchTemplateName="nope-lt"))[:2],
                         ("InvalidLaunchTemplateName.NotFoundException",
                          "The specified launch template, with template name nope-lt, does not exist."))
        self.assertEqual(self.error(lambda: self.ec2.delete_launch_template(LaunchTemplateId="template-1"))[0],
                         "InvalidLaunchTemplateId.Malformed")
        self.assertEqual(self.error(lambda: self.ec2.describe_launch_template_versions(
            LaunchTemplateId=lt_id, Versions=["3"])),
            ("InvalidLaunchTemplateId.VersionNotFound",
             f"Could not find the specified version 3 for the launch template with ID {lt_id}.", 400))
        code, message, _ = self.error(lambda: self.ec2.describe_launch_template_versions())
        self.assertEqual(code, "MissingParameter")
        self.assertTrue(message.startswith("To describe the launch template data for all your launch templates, "
                                           "for \u2018--versions\u2019 specify \u2018$Latest\u2019"), message)
        self.assertEqual(self.error(lambda: self.ec2.describe_launch_template_versions(Versions=["1"]))[:2],
                         ("InvalidParameterValue", message))
        self.assertEqual(self.error(lambda: self.ec2.delete_launch_template(
            LaunchTemplateName="spotvisor-trainer", LaunchTemplateId=lt_id))[0], "InvalidParameterCombination")
        self.assertEqual(self.error(lambda: self.ec2.delete_launch_template()),
                         ("MissingParameter", "The request must contain the parameter launch template ID or launch "
                                              "template name", 400))
        self.assertEqual(self.error(lambda: self.ec2.describe_launch_templates(
            Filters=[{"Name": "image-id", "Values": ["ami-1"]}]))[:2],
            ("InvalidParameterValue", "The filter 'image-id' is invalid"))
        self.assertEqual(self.srv.launch_templates(), ["lenient-ud", "spotvisor-trainer"])

    def test_deny_and_dry_run(self):
        self.create()
        for action, call in (
                ("CreateLaunchTemplate", lambda **kw: self.create("another", **kw)),
                ("DescribeLaunchTemplates", lambda **kw: self.ec2.describe_launch_templates(**kw)),
                ("DescribeLaunchTemplateVersions",
                 lambda **kw: self.ec2.describe_launch_template_versions(LaunchTemplateName="spotvisor-trainer", **kw)),
                ("DeleteLaunchTemplate",
                 lambda **kw: self.ec2.delete_launch_template(LaunchTemplateName="spotvisor-trainer", **kw))):
            self.assertEqual(self.error(lambda: call(DryRun=True)),
                             ("DryRunOperation", "Request would have succeeded, but DryRun flag is set.", 412), action)
            self.srv.deny(action)
            self.assertEqual(self.error(call), ("UnauthorizedOperation",
                                                "You are not authorized to perform this operation.", 403), action)
            self.assertEqual(self.error(lambda: call(DryRun=True))[0], "UnauthorizedOperation", action)
            self.srv.allow(action)
        self.assertEqual(self.srv.launch_templates(), ["spotvisor-trainer"], "nothing was created or deleted")

    def test_control_api_versions_and_tags(self):
        v1 = {"ImageId": "ami-0aaa", "UserData": base64.b64encode(b"v1").decode()}
        lt_id = self.srv.add_launch_template("ctl", v1,
                                             tags={"team": "ml"}, version_description="one")
        self.assertRegex(lt_id, LT_ID)
        self.assertEqual(self.srv.add_launch_template_version("ctl", {"ImageId": "ami-0bbb"}, "two"), 2)
        self.assertEqual(self.srv.add_launch_template_version(lt_id, dict(TRAINER_DATA, InstanceMarketOptions=SPOT),
                                                              make_default=True), 3)
        got = self.srv.launch_template("ctl")
        self.assertEqual((got["default_version"], got["latest_version"], got["tags"]), (3, 3, {"team": "ml"}))
        self.assertEqual([(v["number"], v["default"], v["user_data_text"]) for v in got["versions"]],
                         [(3, True, USER_DATA), (2, False, None), (1, False, "v1")])
        self.assertEqual(got["data"]["InstanceMarketOptions"], SPOT)
        versions = self.ec2.describe_launch_template_versions(LaunchTemplateName="ctl")["LaunchTemplateVersions"]
        self.assertEqual([(v["VersionNumber"], v["DefaultVersion"], v.get("VersionDescription")) for v in versions],
                         [(3, True, None), (2, False, "two"), (1, False, "one")])
        self.assertEqual([v["VersionNumber"] for v in self.ec2.describe_launch_template_versions(
            LaunchTemplateName="ctl", MinVersion="2", MaxVersion="2")["LaunchTemplateVersions"]], [2])
        self.assertEqual([v["VersionNumber"] for v in self.ec2.describe_launch_template_versions(
            LaunchTemplateName="ctl", Versions=["$Default", "1"])["LaunchTemplateVersions"]], [3, 1])
        with self.assertRaises(ValueError):
            self.srv.add_launch_template("ctl", {"ImageId": "ami-1"})  # taken
        with self.assertRaises(ValueError):
            self.srv.add_launch_template("x y", {"ImageId": "ami-1"})  # malformed
        with self.assertRaises(ValueError):
            self.srv.add_launch_template("bad-field", {"Imageid": "ami-1"})
        with self.assertRaises(KeyError):
            self.srv.add_launch_template_version("nope", {"ImageId": "ami-1"})
        # CreateTags reaches launch templates too, and DescribeLaunchTemplates filters on them.
        self.ec2.create_tags(Resources=[lt_id], Tags=[{"Key": "spotvisor-run", "Value": "r9"}])
        self.assertEqual(self.srv.launch_template("ctl")["tags"], {"team": "ml", "spotvisor-run": "r9"})
        self.assertEqual(self.srv.calls(), [("CreateTags", [lt_id])])
        found = self.ec2.describe_launch_templates(Filters=[{"Name": "tag:spotvisor-run", "Values": ["r9"]}])
        self.assertEqual([t["LaunchTemplateId"] for t in found["LaunchTemplates"]], [lt_id])

    def test_raw_requests_clients_would_not_send(self):
        self.assertEqual(self.raw({"Action": "CreateLaunchTemplate", "LaunchTemplateName": "x" * 129,
                                   "LaunchTemplateData.ImageId": "ami-1"})[:2],
                         (400, "InvalidLaunchTemplateName.MalformedException"))
        self.assertEqual(self.raw({"Action": "CreateLaunchTemplate", "LaunchTemplateName": "ab",
                                   "LaunchTemplateData.ImageId": "ami-1"})[:2],
                         (400, "InvalidLaunchTemplateName.MalformedException"))
        self.assertEqual(self.raw({"Action": "CreateLaunchTemplate", "LaunchTemplateName": "x" * 128,
                                   "LaunchTemplateData.ImageId": "ami-1"}),
                         (200, "{http://ec2.amazonaws.com/doc/2016-11-15/}CreateLaunchTemplateResponse", None))
        self.assertEqual(self.raw({"Action": "CreateLaunchTemplate", "LaunchTemplateName": "unknown",
                                   "LaunchTemplateData.ImageID": "ami-1"}),
                         (400, "UnknownParameter", "The parameter LaunchTemplateData.ImageID is not recognized"))
        self.assertEqual(self.raw({"Action": "CreateLaunchTemplate", "LaunchTemplateName": "unknown2",
                                   "LaunchTemplateData.ImageId": "ami-1", "Colour": "blue"}),
                         (400, "UnknownParameter", "The parameter Colour is not recognized"))
        self.assertEqual(self.raw({"Action": "CreateLaunchTemplate", "LaunchTemplateName": "hops",
                                   "LaunchTemplateData.MetadataOptions.HttpPutResponseHopLimit": "two"})[:2],
                         (400, "InvalidParameterValue"))
        self.assertEqual(self.raw({"Action": "CreateLaunchTemplate",
                                   "LaunchTemplateData.ImageId": "ami-1"})[:2], (400, "MissingParameter"))
        self.assertEqual(self.srv.launch_templates(), ["x" * 128])


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed")
@unittest.skipUnless(AWS, "awscli (Debian package) is not installed (apt-get install awscli)")
class AwsCliTest(_LtBase):
    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="fake-ec2-cli-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.env = {"PATH": "/usr/bin:/bin", "HOME": self.tmp, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                    "AWS_ACCESS_KEY_ID": "AKIDEC2", "AWS_SECRET_ACCESS_KEY": "secret-ec2",
                    "AWS_DEFAULT_REGION": self.REGION, "AWS_CONFIG_FILE": os.devnull,
                    "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true", "AWS_PAGER": "",
                    "AWS_MAX_ATTEMPTS": "1"}

    def aws(self, *args, check=True):
        p = subprocess.run([AWS, "ec2", *args, "--endpoint-url", self.srv.endpoint], env=self.env,
                           capture_output=True, text=True, timeout=60)
        if check and p.returncode != 0:
            self.fail(f"aws ec2 {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
        return json.loads(p.stdout) if check and p.stdout.strip() else p

    def test_launch_templates_through_the_cli(self):
        path = os.path.join(self.tmp, "lt.json")
        with open(path, "w") as f:
            json.dump(dict(TRAINER_DATA, InstanceMarketOptions=SPOT), f)
        lt = self.aws("create-launch-template", "--launch-template-name", "cli-trainer", "--version-description",
                      "from the CLI", "--launch-template-data", "file://" + path, "--tag-specifications",
                      "ResourceType=launch-template,Tags=[{Key=owner,Value=cli}]")["LaunchTemplate"]
        self.assertRegex(lt["LaunchTemplateId"], LT_ID)
        self.assertEqual(lt["Tags"], [{"Key": "owner", "Value": "cli"}])
        got = self.srv.launch_template("cli-trainer")
        self.assertEqual(got["data"], dict(TRAINER_DATA, InstanceMarketOptions=SPOT))
        self.assertEqual((got["user_data_text"], got["versions"][0]["description"]), (USER_DATA, "from the CLI"))
        versions = self.aws("describe-launch-template-versions", "--launch-template-id", lt["LaunchTemplateId"],
                            "--versions", "$Latest")["LaunchTemplateVersions"]
        self.assertEqual(versions[0]["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"], "required")
        p = self.aws("create-launch-template", "--launch-template-name", "cli-trainer", "--launch-template-data",
                     "file://" + path, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("An error occurred (InvalidLaunchTemplateName.AlreadyExistsException) when calling the "
                      "CreateLaunchTemplate operation", p.stderr)
        self.assertIn(": Launch template name already in use.", p.stderr)
        gone = self.aws("delete-launch-template", "--launch-template-name", "cli-trainer")["LaunchTemplate"]
        self.assertEqual(gone["LaunchTemplateId"], lt["LaunchTemplateId"])
        self.assertIsNone(self.srv.launch_template("cli-trainer"))
        p = self.aws("delete-launch-template", "--launch-template-id", lt["LaunchTemplateId"], check=False)
        self.assertIn("An error occurred (InvalidLaunchTemplateId.NotFound) when calling the DeleteLaunchTemplate "
                      "operation", p.stderr)
        self.assertIn(f": The specified launch template, with template ID {lt['LaunchTemplateId']}, does not exist.",
                      p.stderr)
        self.assertEqual([a for a, _ in self.srv.requests()],
                         ["CreateLaunchTemplate", "DescribeLaunchTemplateVersions", "CreateLaunchTemplate",
                          "DeleteLaunchTemplate", "DeleteLaunchTemplate"])


if __name__ == "__main__":
    unittest.main()

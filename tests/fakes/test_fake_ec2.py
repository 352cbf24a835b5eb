#!/usr/bin/python3
"""fake_ec2.py against boto3's own EC2 client (Debian's python3-boto3): its requests verify, its
parser reads the answers and the errors."""
import os
import sys
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_ec2 import FakeEc2Server  # noqa: E402

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError:
    boto3 = None


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


if __name__ == "__main__":
    unittest.main()

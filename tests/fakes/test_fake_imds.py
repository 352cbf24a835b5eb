#!/usr/bin/python3
"""Self-test of fake_imds.py, and proof against clients nobody here wrote.

Run from the repo root with Debian's python3 (botocore and aws-cli are
Debian packages, installed for /usr/bin/python3 only):

    /usr/bin/python3 -m unittest tests/fakes/test_fake_imds.py
    /usr/bin/python3 tests/fakes/test_fake_imds.py

The botocore tests need `python3-botocore` (1.29), the aws-cli tests
`/usr/bin/aws` (Debian's awscli 2.9); each is skipped, saying why, when
missing. No sleeps as synchronisation: tokens expire by the fake's clock,
and tests wait on the fake's log with a bound.
"""

import datetime
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import warnings
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fake_imds import FakeImdsServer, iso_utc  # noqa: E402

SCRIPT = os.path.join(HERE, "fake_imds.py")
TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
MD = "/latest/meta-data/"
T0 = 1795600800.0          # 2026-11-25T07:20:00Z: a fixed clock for the fake

try:
    import botocore
    import botocore.session
    import botocore.utils
    BOTOCORE = None
except ImportError as e:
    BOTOCORE = (f"botocore not importable by {sys.executable} ({e}); "
                "install Debian's python3-botocore and run with "
                "/usr/bin/python3")

AWS_CLI = "/usr/bin/aws"
NO_AWS_CLI = None if os.access(AWS_CLI, os.X_OK) else \
    "Debian's awscli (/usr/bin/aws) is not installed"


def wait_until(predicate, timeout=5.0, interval=0.01):
    """Bounded poll for things the fake cannot signal (files, processes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self):
        return self.body.decode()


def http_request(port, path, method="GET", headers=None, timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()},
                        r.read())
    finally:
        conn.close()


def raw_exchange(port, data, timeout=5.0):
    """Send raw bytes, half-close, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


class FakeTestCase(unittest.TestCase):
    server_args = {}

    def setUp(self):
        self.clock_now = T0
        args = dict(clock=lambda: self.clock_now,
                    tags={"Name": "trainer-1",
                          "spotvisor-bucket": "s3://b/p"})
        args.update(self.server_args)
        self.srv = FakeImdsServer(**args).start()
        self.addCleanup(self.srv.stop)

    def request(self, path, method="GET", headers=None, token=True):
        headers = dict(headers or {})
        if token is True:
            headers[TOKEN] = self.token()
        elif token:
            headers[TOKEN] = token
        return http_request(self.srv.port, path, method, headers)

    def token(self, ttl="21600"):
        r = http_request(self.srv.port, "/latest/api/token", "PUT",
                         {TTL: ttl})
        self.assertEqual(r.status, 200, r.body)
        return r.text


class TokenTests(FakeTestCase):
    def test_put_token(self):
        r = http_request(self.srv.port, "/latest/api/token", "PUT",
                         {TTL: "300"})
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers["content-type"], "text/plain")
        self.assertEqual(r.headers[TTL.lower()], "300")
        self.assertEqual(r.headers["server"], "EC2ws")
        self.assertRegex(r.text, r"^[A-Za-z0-9_=-]{56}$")
        self.assertNotEqual(r.text, self.token())   # a fresh one each time

    def test_ttl_bounds(self):
        for ttl in ("1", "21600", " 60 "):
            self.assertEqual(http_request(self.srv.port, "/latest/api/token",
                                          "PUT", {TTL: ttl}).status, 200, ttl)
        for ttl in ("0", "21601", "-5", "+5", "1.5", "abc", "", "1e3",
                    "９"):
            r = http_request(self.srv.port, "/latest/api/token", "PUT",
                             {TTL: ttl.encode().decode("latin-1")})
            self.assertEqual(r.status, 400, ttl)
            self.assertIn("<title>400 - Bad Request</title>", r.text)
            self.assertEqual(r.headers["content-type"], "text/html")
            self.assertEqual(r.headers["connection"], "close")
        self.assertEqual(http_request(self.srv.port, "/latest/api/token",
                                      "PUT").status, 400)

    def test_other_methods_on_token_path(self):
        for method in ("GET", "HEAD", "POST", "DELETE", "PATCH", "OPTIONS",
                       "BREW"):
            r = http_request(self.srv.port, "/latest/api/token", method,
                             {TTL: "60"})
            self.assertEqual(r.status, 405, method)

    def test_forwarded_put_refused(self):
        r = http_request(self.srv.port, "/latest/api/token", "PUT",
                         {TTL: "60", "X-Forwarded-For": "203.0.113.9"})
        self.assertEqual(r.status, 403)
        self.assertIn("403 - Forbidden", r.text)
        self.assertEqual(self.srv.live_tokens(), 0)

    def test_version_specific_token_path_forbidden(self):
        for path in ("/2021-03-23/api/token", "/latest/api/token/"):
            r = http_request(self.srv.port, path, "PUT", {TTL: "60"})
            self.assertEqual(r.status, 403, path)
        r = http_request(self.srv.port, MD, "PUT", {TTL: "60"})
        self.assertEqual(r.status, 405)

    def test_get_needs_a_token(self):
        r = self.request(MD + "instance-id", token=None)
        self.assertEqual(r.status, 401)
        self.assertIn("<title>401 - Unauthorized</title>", r.text)
        self.assertEqual(r.headers["content-type"], "text/html")
        for bogus in ("nope", "", "x" * 56):
            self.assertEqual(self.request(MD + "instance-id",
                                          token=bogus).status, 401, bogus)
        # Even unknown paths ask for the token first.
        self.assertEqual(self.request("/nowhere", token=None).status, 401)
        self.assertEqual(self.request("/", token=None).status, 401)

    def test_token_expires_by_fake_clock(self):
        tok = self.token("60")
        r = self.request(MD + "instance-id", token=tok)
        self.assertEqual((r.status, r.text), (200, "i-0123456789abcdef0"))
        self.assertEqual(r.headers[TTL.lower()], "60")
        self.srv.advance(59.5)
        r = self.request(MD + "instance-id", token=tok)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers[TTL.lower()], "1")   # rounded up
        self.srv.advance(0.5)
        self.assertEqual(self.request(MD + "instance-id", token=tok).status,
                         401)
        # The injected clock counts too.
        tok = self.token("10")
        self.clock_now += 10
        self.assertEqual(self.request(MD, token=tok).status, 401)

    def test_expire_tokens(self):
        a, b = self.token(), self.token()
        self.assertEqual(self.srv.live_tokens(), 2)
        self.srv.expire_tokens()
        for tok in (a, b):
            self.assertEqual(self.request(MD, token=tok).status, 401)
        self.assertEqual(self.request(MD).status, 200)   # a new one works


class ImdsV1AllowedTests(FakeTestCase):
    server_args = {"allow_v1": True}

    def test_no_token_served_but_bad_token_refused(self):
        r = self.request(MD + "instance-type", token=None)
        self.assertEqual((r.status, r.text), (200, "g4dn.xlarge"))
        self.assertNotIn(TTL.lower(), r.headers)
        self.assertEqual(self.request(MD, token="stale").status, 401)
        tok = self.token("5")
        self.srv.advance(5)
        self.assertEqual(self.request(MD, token=tok).status, 401)


class TreeTests(FakeTestCase):
    server_args = {"role": "spotvisor-node"}

    def test_meta_data_listing(self):
        r = self.request(MD)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers["content-type"], "text/plain")
        lines = r.text.split("\n")
        self.assertFalse(r.text.endswith("\n"))
        for name in ("ami-id", "hostname", "instance-id", "instance-type",
                     "instance-life-cycle", "local-hostname", "local-ipv4",
                     "events/", "iam/", "placement/", "tags/"):
            self.assertIn(name, lines)
        self.assertNotIn("spot/", lines)         # no notice yet
        self.assertEqual(lines, sorted(lines))
        self.assertEqual(self.request(MD.rstrip("/")).text, r.text)
        self.assertEqual(self.request("/latest/").text, "dynamic\nmeta-data")
        self.assertEqual(self.request("/").text, "latest")

    def test_leaves(self):
        expect = {
            "instance-id": "i-0123456789abcdef0",
            "instance-type": "g4dn.xlarge",
            "ami-id": "ami-0abcdef1234567890",
            "local-ipv4": "10.0.0.5",
            "hostname": "ip-10-0-0-5.ec2.internal",
            "local-hostname": "ip-10-0-0-5.ec2.internal",
            "instance-life-cycle": "spot",
            "placement/availability-zone": "us-east-1a",
            "placement/region": "us-east-1",
            "events/maintenance/scheduled": "[]",
        }
        for path, value in expect.items():
            r = self.request(MD + path)
            self.assertEqual((r.status, r.text), (200, value), path)
        # A leaf asked for with a trailing slash, as botocore's region
        # fetcher does.
        self.assertEqual(self.request(MD + "placement/availability-zone/")
                         .text, "us-east-1a")
        self.assertEqual(self.request(MD + "placement/").text,
                         "availability-zone\navailability-zone-id\nregion")
        self.assertEqual(self.request(MD + "events/").text, "maintenance/")

    def test_unknown_paths(self):
        for path in (MD + "nope", MD + "instance-id/x", "/latest/nope",
                     "/2021-03-23/meta-data/instance-id", "/latest/api/",
                     MD + "network/interfaces/macs/"):
            r = self.request(path)
            self.assertEqual(r.status, 404, path)
            self.assertIn("<title>404 - Not Found</title>", r.text)
            self.assertEqual(r.headers["content-type"], "text/html")

    def test_head(self):
        r = self.request(MD + "instance-id", method="HEAD")
        self.assertEqual((r.status, r.body), (200, b""))
        self.assertEqual(r.headers["content-length"],
                         str(len("i-0123456789abcdef0")))
        r = self.request(MD + "nope", method="HEAD")
        self.assertEqual((r.status, r.headers["content-length"]), (404, "0"))

    def test_other_methods_405(self):
        for method in ("POST", "DELETE", "PATCH"):
            self.assertEqual(self.request(MD + "instance-id",
                                          method=method).status, 405)

    def test_keep_alive(self):
        tok = self.token()
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port,
                                          timeout=5)
        self.addCleanup(conn.close)
        for path in ("instance-id", "local-ipv4", "instance-type"):
            conn.request("GET", MD + path, headers={TOKEN: tok})
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            r.read()
        clients = {e["client"] for e in self.srv.log(True)[1:]}
        self.assertEqual(len(clients), 1)       # one connection, 3 answers

    def test_identity_document(self):
        r = self.request("/latest/dynamic/instance-identity/document")
        self.assertEqual(r.status, 200)
        doc = json.loads(r.text)
        self.assertEqual(doc["instanceId"], "i-0123456789abcdef0")
        self.assertEqual(doc["region"], "us-east-1")
        self.assertEqual(doc["availabilityZone"], "us-east-1a")
        self.assertEqual(doc["privateIp"], "10.0.0.5")
        self.assertEqual(doc["instanceType"], "g4dn.xlarge")
        self.assertEqual(doc["accountId"], "123456789012")
        self.assertIn('\n  "instanceId" : "i-0123456789abcdef0",\n', r.text)
        self.assertEqual(self.request("/latest/dynamic/").text,
                         "instance-identity/")

    def test_user_data(self):
        self.assertEqual(self.request("/latest/user-data").status, 404)
        self.srv.set_user_data(b"#!/bin/sh\n\xff\x00binary")
        r = self.request("/latest/user-data")
        self.assertEqual((r.status, r.body), (200, b"#!/bin/sh\n\xff\x00binary"))
        self.assertEqual(self.request("/latest/").text,
                         "dynamic\nmeta-data\nuser-data")
        self.srv.set_user_data("texte")
        self.assertEqual(self.request("/latest/user-data").text, "texte")
        self.srv.set_user_data(None)
        self.assertEqual(self.request("/latest/user-data").status, 404)

    def test_iam(self):
        r = self.request(MD + "iam/security-credentials/")
        self.assertEqual((r.status, r.text), (200, "spotvisor-node"))
        r = self.request(MD + "iam/security-credentials/spotvisor-node")
        creds = json.loads(r.text)
        self.assertEqual(list(creds), ["Code", "LastUpdated", "Type",
                                       "AccessKeyId", "SecretAccessKey",
                                       "Token", "Expiration"])
        self.assertEqual(creds["Code"], "Success")
        self.assertEqual(creds["Type"], "AWS-HMAC")
        self.assertEqual(creds["LastUpdated"], iso_utc(T0))
        self.assertEqual(creds["Expiration"], iso_utc(T0 + 6 * 3600))
        self.assertTrue(r.text.startswith('{\n  "Code" : "Success",\n'))
        info = json.loads(self.request(MD + "iam/info").text)
        self.assertTrue(info["InstanceProfileArn"].endswith(
            ":instance-profile/spotvisor-node"))
        self.assertEqual(self.request(MD + "iam/").text,
                         "info\nsecurity-credentials/")

        self.srv.set_role("other", "AKIDX", "SECX", "TOKX",
                          datetime.datetime(2026, 11, 25, 13, 0, 0))
        creds = json.loads(self.request(
            MD + "iam/security-credentials/other").text)
        self.assertEqual((creds["AccessKeyId"], creds["SecretAccessKey"],
                          creds["Token"], creds["Expiration"]),
                         ("AKIDX", "SECX", "TOKX", "2026-11-25T13:00:00Z"))
        self.assertEqual(self.request(
            MD + "iam/security-credentials/spotvisor-node").status, 404)

        self.srv.set_role(None)
        for path in ("iam/", "iam/info", "iam/security-credentials/"):
            self.assertEqual(self.request(MD + path).status, 404, path)
        self.assertNotIn("iam/", self.request(MD).text.split("\n"))


class SpotTests(FakeTestCase):
    def test_instance_action_lifecycle(self):
        for path in ("spot/instance-action", "spot/termination-time",
                     "spot/"):
            self.assertEqual(self.request(MD + path).status, 404, path)
        self.srv.set_instance_action("terminate")
        r = self.request(MD + "spot/instance-action")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers["content-type"], "text/plain")
        when = iso_utc(T0 + 120)
        self.assertEqual(r.text, '{"action": "terminate", "time": "%s"}'
                         % when)
        self.assertEqual(json.loads(r.text),
                         {"action": "terminate", "time": when})
        self.assertEqual(self.request(MD + "spot/termination-time").text,
                         when)
        self.assertEqual(self.request(MD + "spot/").text,
                         "instance-action\ntermination-time")
        self.assertIn("spot/", self.request(MD).text.split("\n"))
        self.srv.set_instance_action(None)
        self.assertEqual(self.request(MD + "spot/instance-action").status,
                         404)
        self.assertEqual(self.request(MD + "spot/termination-time").status,
                         404)

    def test_time_forms_and_actions(self):
        self.srv.set_instance_action(
            "stop", time=datetime.datetime(2026, 11, 25, 10, 0, 0,
                                           tzinfo=datetime.timezone.utc))
        self.assertEqual(json.loads(self.request(
            MD + "spot/instance-action").text),
            {"action": "stop", "time": "2026-11-25T10:00:00Z"})
        # termination-time belongs to terminations only.
        self.assertEqual(self.request(MD + "spot/termination-time").status,
                         404)
        self.srv.set_instance_action("hibernate", time="not-a-time")
        self.assertEqual(json.loads(self.request(
            MD + "spot/instance-action").text)["time"], "not-a-time")
        with self.assertRaises(Exception):
            self.srv.set_instance_action("explode")

    def test_rebalance(self):
        self.assertEqual(self.request(
            MD + "events/recommendations/rebalance").status, 404)
        self.assertEqual(self.request(MD + "events/recommendations/").status,
                         404)
        self.srv.set_rebalance()
        r = self.request(MD + "events/recommendations/rebalance")
        self.assertEqual(json.loads(r.text), {"noticeTime": iso_utc(T0)})
        self.assertEqual(self.request(MD + "events/").text,
                         "maintenance/\nrecommendations/")
        self.srv.set_rebalance("2026-11-25T09:58:00Z")
        self.assertEqual(self.request(
            MD + "events/recommendations/rebalance").text,
            '{"noticeTime": "2026-11-25T09:58:00Z"}')
        self.srv.clear_rebalance()
        self.assertEqual(self.request(
            MD + "events/recommendations/rebalance").status, 404)

    def test_maintenance(self):
        event = {"NotBefore": "21 Jan 2027 09:00:43 GMT",
                 "Code": "system-reboot", "Description": "scheduled reboot",
                 "EventId": "instance-event-0d59937288b749b32",
                 "NotAfter": "21 Jan 2027 09:17:23 GMT", "State": "active"}
        self.srv.set_maintenance([event])
        r = self.request(MD + "events/maintenance/scheduled")
        self.assertEqual(json.loads(r.text), [event])
        self.srv.set_maintenance([])
        self.assertEqual(self.request(
            MD + "events/maintenance/scheduled").text, "[]")


class TagTests(FakeTestCase):
    def test_tags(self):
        r = self.request(MD + "tags/instance")
        self.assertEqual(r.text, "Name\nspotvisor-bucket")   # set order
        self.assertEqual(self.request(MD + "tags/instance/").text, r.text)
        self.assertEqual(self.request(MD + "tags/").text, "instance/")
        self.assertEqual(self.request(
            MD + "tags/instance/spotvisor-bucket").text, "s3://b/p")
        self.assertEqual(self.request(MD + "tags/instance/missing").status,
                         404)
        self.srv.set_tags({"z:key@x": "1", "a=b": "2"})
        self.assertEqual(self.request(MD + "tags/instance").text,
                         "z:key@x\na=b")
        self.assertEqual(self.request(MD + "tags/instance/z%3Akey%40x").text,
                         "1")
        self.srv.set_tags({})
        r = self.request(MD + "tags/instance/")
        self.assertEqual((r.status, r.body), (200, b""))

    def test_tags_disabled(self):
        self.srv.set_tags_enabled(False)
        for path in ("tags/", "tags/instance", "tags/instance/Name"):
            self.assertEqual(self.request(MD + path).status, 404, path)
        self.assertNotIn("tags/", self.request(MD).text.split("\n"))
        self.srv.set_tags_enabled(True)
        self.assertEqual(self.request(MD + "tags/instance/Name").text,
                         "trainer-1")


class AutoScalingTests(FakeTestCase):
    """autoscaling/target-lifecycle-state, as the EC2 Auto Scaling User
    Guide's "Retrieve the target lifecycle state through instance metadata"
    shows it: bare text, 404 for an instance in no group."""

    ITEM = MD + "autoscaling/target-lifecycle-state"

    def test_absent_until_set(self):
        self.assertEqual(self.request(self.ITEM).status, 404)
        self.assertEqual(self.request(MD + "autoscaling/").status, 404)
        self.assertNotIn("autoscaling/", self.request(MD).text.split("\n"))
        self.assertIsNone(self.srv.state()["target_lifecycle_state"])

    def test_states_and_listing(self):
        self.srv.set_target_lifecycle_state("InService")
        r = self.request(self.ITEM)
        self.assertEqual((r.status, r.text), (200, "InService"))
        self.assertEqual(r.headers["content-type"], "text/plain")
        self.assertEqual(self.request(self.ITEM + "/").text, "InService")
        self.assertEqual(self.request(MD + "autoscaling").text,
                         "target-lifecycle-state")
        lines = self.request(MD).text.split("\n")
        self.assertIn("autoscaling/", lines)
        self.assertEqual(lines, sorted(lines))
        for state in ("Terminated", "Warmed:Hibernated", "Standby",
                      "Detached"):
            self.srv.set_target_lifecycle_state(state)
            self.assertEqual(self.request(self.ITEM).text, state)
        self.assertEqual(self.srv.state()["target_lifecycle_state"],
                         "Detached")
        self.srv.set_target_lifecycle_state(None)
        self.assertEqual(self.request(self.ITEM).status, 404)
        self.assertNotIn("autoscaling/", self.request(MD).text.split("\n"))

    def test_only_the_documented_states(self):
        # Transitional states (Terminating:Wait...) are what Describe* show,
        # never the target.
        for bad in ("Terminating:Wait", "inservice", "", 3):
            with self.assertRaises(Exception, msg=repr(bad)):
                self.srv.set_target_lifecycle_state(bad)
        self.assertEqual(self.request(self.ITEM).status, 404)

    def test_control_api(self):
        def ctl(body):
            conn = http.client.HTTPConnection("127.0.0.1", self.srv.port,
                                              timeout=5)
            try:
                conn.request("POST", "/_fake/target-lifecycle-state",
                             body=json.dumps(body))
                r = conn.getresponse()
                return r.status, json.loads(r.read())
            finally:
                conn.close()
        self.assertEqual(ctl({"state": "Terminated"}),
                         (200, {"target_lifecycle_state": "Terminated"}))
        self.assertEqual(self.request(self.ITEM).text, "Terminated")
        self.assertEqual(ctl({"state": "Bogus"})[0], 400)
        self.assertEqual(ctl({"state": None})[0], 200)
        self.assertEqual(self.request(self.ITEM).status, 404)


class FaultAndLogTests(FakeTestCase):
    def test_fail_count(self):
        self.srv.fail(MD + "spot/", 500, 2)
        tok = self.token()
        codes = [self.request(MD + "spot/instance-action", token=tok).status
                 for _ in range(3)]
        self.assertEqual(codes, [500, 500, 404])
        self.assertEqual(self.request(MD + "instance-id", token=tok).status,
                         200)
        self.srv.fail("/latest/api/token", 503, None)
        for _ in range(2):
            self.assertEqual(http_request(self.srv.port, "/latest/api/token",
                                          "PUT", {TTL: "5"}).status, 503)
        self.srv.clear_faults()
        self.token()

    def test_hang_then_clear(self):
        self.srv.hang(path_prefix=MD + "spot/")
        tok = self.token()                     # other paths still answer
        with socket.create_connection(("127.0.0.1", self.srv.port),
                                      timeout=5) as s:
            s.sendall(f"GET {MD}spot/instance-action HTTP/1.1\r\nHost: x\r\n"
                      f"{TOKEN}: {tok}\r\n\r\n".encode())
            self.assertTrue(self.srv.wait_for(lambda: self.srv.hung() == 1))
            self.assertEqual(self.request(MD + "instance-id").status, 200)
            self.srv.hang(False)
            self.assertEqual(s.recv(100), b"")   # closed, no answer
        self.assertEqual(self.srv.hung(), 0)
        self.assertEqual(self.srv.log()[1][2], None)

    def test_hang_released_by_stop(self):
        self.srv.hang()
        with socket.create_connection(("127.0.0.1", self.srv.port),
                                      timeout=5) as s:
            s.sendall(b"PUT /latest/api/token HTTP/1.1\r\nHost: x\r\n"
                      b"X-aws-ec2-metadata-token-ttl-seconds: 5\r\n\r\n")
            self.assertTrue(self.srv.wait_for(lambda: self.srv.hung() == 1))
            self.srv.stop()
            self.assertEqual(s.recv(100), b"")

    def test_refuse_and_reset(self):
        port = self.srv.port
        self.srv.refuse()
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        self.srv.refuse(False)
        self.assertEqual(self.srv.port, port)
        self.token()
        self.srv.reset(path_prefix="/latest/api/token")
        with self.assertRaises((ConnectionResetError,
                                http.client.RemoteDisconnected)):
            http_request(port, "/latest/api/token", "PUT", {TTL: "5"})
        self.srv.reset(False)
        self.token()

    def test_log_and_hits(self):
        self.srv.reset_log()
        tok = self.token()
        self.request(MD + "instance-id", token=tok)
        self.request(MD + "spot/instance-action", token=tok)
        self.request(MD + "instance-id", token=None)
        self.assertEqual(self.srv.log(), [
            ("PUT", "/latest/api/token", 200, False),
            ("GET", MD + "instance-id", 200, True),
            ("GET", MD + "spot/instance-action", 404, True),
            ("GET", MD + "instance-id", 401, False),
        ])
        self.assertEqual(self.srv.hits(MD), 3)
        self.assertEqual(self.srv.hits(MD + "instance-id"), 2)
        self.assertEqual(self.srv.hits(), 4)
        detail = self.srv.log(detail=True)[0]
        self.assertEqual(detail["headers"][TTL], "21600")
        self.assertFalse(self.srv.wait_for(lambda: self.srv.hits() > 4,
                                           timeout=0.05))

    def test_control_api(self):
        def ctl(method, name, body=None):
            conn = http.client.HTTPConnection("127.0.0.1", self.srv.port,
                                              timeout=5)
            try:
                conn.request(method, "/_fake/" + name,
                             body=None if body is None else json.dumps(body))
                r = conn.getresponse()
                return r.status, json.loads(r.read())
            finally:
                conn.close()
        status, out = ctl("POST", "instance-action", {"action": "terminate"})
        self.assertEqual((status, out["action"]), (200, "terminate"))
        self.assertEqual(json.loads(self.request(
            MD + "spot/instance-action").text)["time"], iso_utc(T0 + 120))
        ctl("POST", "instance-action", {"action": None})
        self.assertEqual(self.request(MD + "spot/instance-action").status,
                         404)
        self.assertEqual(ctl("POST", "instance-action",
                             {"action": "bogus"})[0], 400)
        self.assertEqual(ctl("POST", "tags", {"tags": {"a": 1}})[0], 400)
        self.assertEqual(ctl("POST", "nope", {})[0], 404)
        self.srv.reset_log()
        self.assertEqual(ctl("POST", "fault", {"mode": "fail",
                                               "path_prefix": MD,
                                               "status": 502})[0], 200)
        self.assertEqual(self.request(MD).status, 502)
        self.assertEqual(ctl("GET", "hits?prefix=" + MD)[1]["count"], 1)
        self.assertEqual(ctl("GET", "wait?prefix=/x&count=1&timeout=0.05")[0],
                         408)
        # Control requests are neither logged nor faulted.
        self.assertEqual(self.srv.hits("/_fake/"), 0)


class MalformedInputTests(FakeTestCase):
    """Every byte from a client can be anything: a 4xx or a close, never a
    traceback (checked for the `serve` process in ScriptTests) or a hang."""

    def exchange(self, data):
        return raw_exchange(self.srv.port, data)[:12]   # "HTTP/1.1 NNN"

    def test_malformed_requests(self):
        tok = self.token().encode()
        cases = {
            b"GARBAGE\r\n\r\n": b"HTTP/1.1 400",
            b"GET\r\n\r\n": b"HTTP/1.1 400",
            b"GET / HTTP/9.9\r\n\r\n": b"HTTP/1.1 505",
            b"GET /latest/meta-data/ HTTP/1.1\r\nContent-Length: abc\r\n\r\n":
                b"HTTP/1.1 400",
            b"GET /latest/meta-data/ HTTP/1.1\r\nContent-Length: 5\r\n"
            b"Content-Length: 6\r\n\r\nhello!": b"HTTP/1.1 400",
            b"PUT /latest/api/token HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
            b"\r\nzz\r\n": b"HTTP/1.1 400",
            b"PUT /latest/api/token HTTP/1.1\r\nContent-Length: 100000\r\n"
            b"\r\n" + b"x" * 100000: b"HTTP/1.1 400",
            b"PUT /latest/api/token HTTP/1.1\r\nContent-Length: 10\r\n\r\nab":
                b"HTTP/1.1 400",
            b"PUT /latest/api/token HTTP/1.1\r\n"
            b"X-aws-ec2-metadata-token-ttl-seconds: \xff\xfe\r\n\r\n":
                b"HTTP/1.1 400",
            b"PUT /latest/api/token HTTP/1.1\r\n"
            b"X-aws-ec2-metadata-token-ttl-seconds: 5\r\n"
            b"X-aws-ec2-metadata-token-ttl-seconds: 6\r\n\r\n":
                b"HTTP/1.1 400",
            b"GET /latest/meta-data/ HTTP/1.1\r\n"
            b"X-aws-ec2-metadata-token: \xff\x00\x01\r\n\r\n": b"HTTP/1.1 401",
            b"GET /latest/meta-data/%ff%fe HTTP/1.1\r\n"
            b"X-aws-ec2-metadata-token: " + tok + b"\r\n\r\n": b"HTTP/1.1 404",
            b"GET /\xff\xfe/../../etc/passwd HTTP/1.1\r\n"
            b"X-aws-ec2-metadata-token: " + tok + b"\r\n\r\n": b"HTTP/1.1 404",
            b"GET //latest//meta-data//instance-id HTTP/1.1\r\n"
            b"X-aws-ec2-metadata-token: " + tok + b"\r\n\r\n": b"HTTP/1.1 200",
            b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n": b"HTTP/1.1 414",
            b"GET / HTTP/1.1\r\n" + b"X-h: v\r\n" * 200 + b"\r\n":
                b"HTTP/1.1 431",
            b"POST /_fake/instance-action HTTP/1.1\r\nContent-Length: 5\r\n"
            b"\r\n{{{{{": b"HTTP/1.1 400",
            b"POST /_fake/instance-action HTTP/1.1\r\nContent-Length: 4\r\n"
            b"\r\n[42]": b"HTTP/1.1 400",
        }
        for data, expect in cases.items():
            self.assertEqual(self.exchange(data), expect, data[:80])
        rng = random.Random(7)
        for _ in range(30):
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
            self.exchange(junk + b"\r\n\r\n")   # any answer, or a close
        self.assertEqual(self.request(MD + "instance-id").status, 200)


@unittest.skipIf(BOTOCORE, BOTOCORE)
class BotocoreTests(unittest.TestCase):
    """botocore's own IMDS client (Debian's python3-botocore 1.29)."""

    ROLE = {"name": "spotvisor-node", "access_key_id": "ASIAFAKEROLEKEY1",
            "secret": "role/secret+key", "token": "role-session-token"}

    def start(self, **kwargs):
        kwargs.setdefault("role", self.ROLE)
        srv = FakeImdsServer(**kwargs).start()
        self.addCleanup(srv.stop)
        return srv

    def fetcher(self, srv, timeout=2, num_attempts=1,
                cls="InstanceMetadataFetcher"):
        fetcher = getattr(botocore.utils, cls)(
            timeout=timeout, num_attempts=num_attempts,
            env={}, config={"ec2_metadata_service_endpoint": srv.endpoint})
        # botocore never closes the fetcher's urllib3 pool itself.
        self.addCleanup(fetcher._session.close)
        return fetcher

    def assert_role_creds(self, creds):
        self.assertEqual((creds.get("role_name"), creds.get("access_key"),
                          creds.get("secret_key"), creds.get("token")),
                         ("spotvisor-node", "ASIAFAKEROLEKEY1",
                          "role/secret+key", "role-session-token"))

    def test_fetcher_gets_role_credentials_with_a_token(self):
        srv = self.start()
        creds = self.fetcher(srv).retrieve_iam_role_credentials()
        self.assert_role_creds(creds)
        log = srv.log(detail=True)
        self.assertEqual([(e["method"], e["path"], e["status"])
                          for e in log], [
            ("PUT", "/latest/api/token", 200),
            ("GET", MD + "iam/security-credentials/", 200),
            ("GET", MD + "iam/security-credentials/spotvisor-node", 200)])
        # botocore 1.29 asks for the maximum TTL, then sends the token.
        self.assertEqual(log[0]["headers"]["x-aws-ec2-metadata-token-ttl-"
                                           "seconds"], "21600")
        self.assertTrue(all(e["had_token"] for e in log[1:]))

    def test_session_credentials_from_env_endpoint(self):
        srv = self.start()
        home = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, home)
        env = {"HOME": home, "PATH": "/usr/bin:/bin",
               "AWS_CONFIG_FILE": os.path.join(home, "none"),
               "AWS_SHARED_CREDENTIALS_FILE": os.path.join(home, "none"),
               "AWS_EC2_METADATA_SERVICE_ENDPOINT": srv.endpoint}
        # The session's IMDS fetcher keeps a urllib3 pool nobody closes.
        self.enterContext(warnings.catch_warnings())
        warnings.simplefilter("ignore", ResourceWarning)
        with mock.patch.dict(os.environ, env, clear=True):
            session = botocore.session.get_session()
            creds = session.get_credentials()
            self.assertIsNotNone(creds)
            self.assertEqual(creds.method, "iam-role")
            frozen = creds.get_frozen_credentials()
        self.assertEqual((frozen.access_key, frozen.secret_key,
                          frozen.token),
                         ("ASIAFAKEROLEKEY1", "role/secret+key",
                          "role-session-token"))
        self.assertEqual(srv.hits("/latest/api/token"), 1)

    def test_region_fetcher(self):
        srv = self.start(region="eu-west-1")
        fetcher = self.fetcher(srv, cls="InstanceMetadataRegionFetcher")
        self.assertEqual(fetcher.retrieve_region(), "eu-west-1")
        self.assertEqual(srv.log(), [
            ("PUT", "/latest/api/token", 200, False),
            ("GET", MD + "placement/availability-zone/", 200, True)])

    def test_no_role_gives_no_credentials(self):
        srv = self.start(role=None)
        self.assertEqual(self.fetcher(srv).retrieve_iam_role_credentials(),
                         {})
        self.assertEqual(srv.log()[-1],
                         ("GET", MD + "iam/security-credentials/", 404, True))

    def test_fresh_token_per_fetch_and_no_refetch_after_401(self):
        """botocore 1.29 never caches IMDS tokens: every credential fetch
        PUTs a new one, so expired tokens never reach it. A 401 on a GET is
        retried (num_attempts) with the same token, not a new one."""
        srv = self.start()
        fetcher = self.fetcher(srv)
        self.assert_role_creds(fetcher.retrieve_iam_role_credentials())
        srv.expire_tokens()
        srv.advance(7 * 3600)
        self.assert_role_creds(fetcher.retrieve_iam_role_credentials())
        self.assertEqual(srv.hits("/latest/api/token"), 2)

        srv.reset_log()
        srv.fail(MD + "iam/security-credentials/", 401, 1)
        self.assert_role_creds(
            self.fetcher(srv, num_attempts=2).retrieve_iam_role_credentials())
        log = srv.log(detail=True)
        self.assertEqual([(e["method"], e["status"]) for e in log],
                         [("PUT", 200), ("GET", 401), ("GET", 200),
                          ("GET", 200)])
        tokens = {e["headers"]["x-aws-ec2-metadata-token"] for e in log[1:]}
        self.assertEqual(len(tokens), 1)

        srv.reset_log()
        srv.fail(MD + "iam/security-credentials/", 401, 1)
        self.assertEqual(self.fetcher(srv).retrieve_iam_role_credentials(),
                         {})          # one attempt: the 401 is final

    def test_token_put_failures(self):
        srv = self.start()
        # 400 on the PUT: BadIMDSRequestError, nothing else is asked.
        srv.fail("/latest/api/token", 400, 1)
        self.assertEqual(self.fetcher(srv).retrieve_iam_role_credentials(),
                         {})
        self.assertEqual(srv.hits(MD), 0)
        # 403/404/405 on the PUT: botocore falls back to IMDSv1 (no token),
        # which an IMDSv2-only instance refuses.
        for status in (403, 404, 405):
            srv.reset_log()
            srv.fail("/latest/api/token", status, 1)
            self.assertEqual(
                self.fetcher(srv).retrieve_iam_role_credentials(), {})
            self.assertEqual(srv.log()[1:], [
                ("GET", MD + "iam/security-credentials/", 401, False)])

    def test_token_put_timeout_falls_back_to_v1(self):
        srv = self.start(allow_v1=True)
        srv.hang(path_prefix="/latest/api/token")
        started = time.monotonic()
        creds = self.fetcher(srv, timeout=0.3).retrieve_iam_role_credentials()
        took = time.monotonic() - started
        self.assert_role_creds(creds)
        self.assertGreaterEqual(took, 0.3)
        log = srv.log()
        self.assertEqual(log[0][:3], ("PUT", "/latest/api/token", None))
        self.assertEqual([e[3] for e in log[1:]], [False, False])


@unittest.skipIf(NO_AWS_CLI, NO_AWS_CLI)
class AwsCliTests(unittest.TestCase):
    """Debian's aws-cli 2.9.19 resolves credentials and region from the
    fake, offline. Its bundled botocore joins the endpoint and
    `latest/api/token` without a '/', so the endpoint needs a trailing
    slash (botocore 1.29 adds one itself)."""

    def setUp(self):
        self.srv = FakeImdsServer(
            region="eu-west-1",
            role={"name": "spotvisor-node", "access_key_id": "ASIACLIKEY00001",
                  "secret": "cli/secret", "token": "cli-token"}).start()
        self.addCleanup(self.srv.stop)
        home = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, home)
        self.env = {"HOME": home, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                    "AWS_CONFIG_FILE": os.path.join(home, "none"),
                    "AWS_SHARED_CREDENTIALS_FILE": os.path.join(home, "none"),
                    "AWS_EC2_METADATA_SERVICE_ENDPOINT":
                        self.srv.endpoint + "/"}

    def aws(self, *args, env=None):
        return subprocess.run([AWS_CLI, *args], env=env or self.env,
                              capture_output=True, text=True, timeout=30)

    def test_export_credentials_from_iam_role(self):
        p = self.aws("configure", "export-credentials", "--format", "process")
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertEqual((out["AccessKeyId"], out["SecretAccessKey"],
                          out["SessionToken"]),
                         ("ASIACLIKEY00001", "cli/secret", "cli-token"))
        self.assertEqual(self.srv.log(), [
            ("PUT", "/latest/api/token", 200, False),
            ("GET", MD + "iam/security-credentials/", 200, True),
            ("GET", MD + "iam/security-credentials/spotvisor-node", 200,
             True)])

    def test_configure_list_shows_iam_role_and_imds_region(self):
        p = self.aws("configure", "list")
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = {line.split()[0]: line.split()[1:]
                for line in p.stdout.splitlines() if line.strip()}
        self.assertEqual(rows["access_key"][-1], "iam-role")
        self.assertTrue(rows["access_key"][0].endswith("0001"))
        self.assertEqual(rows["region"], ["eu-west-1", "imds"])

    def test_endpoint_without_slash_is_rejected_by_cli_2_9(self):
        env = dict(self.env,
                   AWS_EC2_METADATA_SERVICE_ENDPOINT=self.srv.endpoint)
        p = self.aws("configure", "export-credentials", env=env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("Invalid endpoint EC2 Instance Metadata endpoint",
                      p.stderr)
        self.assertEqual(self.srv.log(), [])


class ScriptTests(unittest.TestCase):
    """The `serve` process, its control channel and its signals."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        port_file = os.path.join(self.dir, "port")
        user_data = os.path.join(self.dir, "ud")
        with open(user_data, "wb") as f:
            f.write(b"#cloud-config\n")
        self.proc = subprocess.Popen(
            [sys.executable, SCRIPT, "serve", "--port-file", port_file,
             "--tag", "spotvisor-bucket=s3://b/p", "--tag", "a=b=c",
             "--role", "node:AKIDCLI:SECRET:TOK:EN", "--region", "eu-west-1",
             "--user-data-file", user_data, "--instance-action", "terminate",
             "--target-lifecycle-state", "InService"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(self.kill)
        self.assertTrue(wait_until(lambda: os.path.exists(port_file)),
                        "no port file")
        with open(port_file) as f:
            self.port = int(f.read())
        self.assertEqual(self.proc.stdout.readline().strip(),
                         f"fake-imds listening on 127.0.0.1:{self.port}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()

    def get(self, path):
        tok = http_request(self.port, "/latest/api/token", "PUT",
                           {TTL: "60"}).text
        return http_request(self.port, path, headers={TOKEN: tok})

    def ctl(self, *args):
        return subprocess.run([sys.executable, SCRIPT, "ctl", "--port",
                               str(self.port), *args],
                              capture_output=True, text=True, timeout=20)

    def test_serve_ctl_signals(self):
        self.assertEqual(json.loads(self.get(MD + "spot/instance-action")
                                    .text)["action"], "terminate")
        self.assertEqual(self.get(MD + "tags/instance/a").text, "b=c")
        self.assertEqual(self.get(MD + "placement/region").text, "eu-west-1")
        self.assertEqual(self.get("/latest/user-data").body,
                         b"#cloud-config\n")
        creds = json.loads(self.get(MD + "iam/security-credentials/node")
                           .text)
        self.assertEqual((creds["AccessKeyId"], creds["Token"]),
                         ("AKIDCLI", "TOK:EN"))

        p = self.ctl("instance-action", "none")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(self.get(MD + "spot/instance-action").status, 404)
        p = self.ctl("instance-action", "stop", "2026-11-25T10:00:00Z")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(self.get(MD + "spot/instance-action").text,
                         '{"action": "stop", "time": "2026-11-25T10:00:00Z"}')
        self.assertEqual(self.ctl("instance-action", "bogus").returncode, 1)

        # SIGUSR1: a terminate notice two minutes ahead, for scripts.
        self.ctl("instance-action", "none")
        self.proc.send_signal(signal.SIGUSR1)
        self.assertTrue(wait_until(lambda: self.get(
            MD + "spot/termination-time").status == 200))
        notice = json.loads(self.get(MD + "spot/instance-action").text)
        when = datetime.datetime.strptime(notice["time"],
                                          "%Y-%m-%dT%H:%M:%SZ")
        ahead = (when.replace(tzinfo=datetime.timezone.utc)
                 - datetime.datetime.now(datetime.timezone.utc))
        self.assertTrue(100 <= ahead.total_seconds() <= 121, ahead)

        self.assertEqual(self.get(MD + "autoscaling/target-lifecycle-state")
                         .text, "InService")
        p = self.ctl("target-lifecycle-state", "Terminated")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(self.get(MD + "autoscaling/target-lifecycle-state")
                         .text, "Terminated")
        p = self.ctl("target-lifecycle-state", "none")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(self.get(MD + "autoscaling/target-lifecycle-state")
                         .status, 404)

        p = self.ctl("rebalance")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.get(MD + "events/recommendations/rebalance")
                         .status, 200)
        self.assertIn('"count": 1', self.ctl("hits", MD + "events/").stdout)

        # refuse takes the control port away too; SIGUSR2 lifts it.
        p = self.ctl("fault", '{"mode": "refuse"}')
        self.assertEqual(p.returncode, 0, p.stderr)
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.port), 2).close()
        self.proc.send_signal(signal.SIGUSR2)
        self.assertTrue(wait_until(lambda: self.ctl("state").returncode == 0))

        # Garbage never produces a traceback in the serving process.
        rng = random.Random(11)
        for data in (b"GARBAGE\r\n\r\n", b"\x00" * 100,
                     b"PUT /latest/api/token HTTP/1.1\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n-1\r\n",
                     *(bytes(rng.randrange(256) for _ in range(200))
                       for _ in range(10))):
            raw_exchange(self.port, data)
        self.assertEqual(self.get(MD + "instance-id").status, 200)

        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(timeout=10), 0)
        self.assertEqual(self.proc.stderr.read(), "")


if __name__ == "__main__":
    unittest.main()

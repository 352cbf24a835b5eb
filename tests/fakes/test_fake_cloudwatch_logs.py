#!/usr/bin/python3
"""fake_cloudwatch_logs.py against clients nobody here wrote: Debian's python3-boto3 `logs` client
and Debian's AWS CLI v2 (its requests verify, its parsers read the answers and the errors), plus
raw requests signed by botocore's own SigV4Auth for the input those clients would not send.

Run with Debian's Python: /usr/bin/python3 tests/fakes/test_fake_cloudwatch_logs.py -v"""
import glob
import http.client
import json
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
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fake_cloudwatch_logs import FakeCloudWatchLogsServer  # noqa: E402

try:
    import boto3
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.config import Config
    from botocore.credentials import Credentials
    from botocore.exceptions import ClientError, HTTPClientError
except ImportError:
    boto3 = None

AKID, SECRET, REGION = "AKIDLOGS", "secret-logs", "eu-west-1"
AWS = shutil.which("aws", path="/usr/bin")  # Debian's awscli (v2)
NOW_MS = lambda: int(time.time() * 1000)  # noqa: E731
HOUR = 3600 * 1000
DAY = 24 * HOUR


def _debian_cli_version():
    try:
        import awscli  # Debian's awscli package, what /usr/bin/aws runs
        return awscli.__version__
    except ImportError:
        return ""


def _newer_cli():
    """An AWS CLI whose botocore knows the service-specific endpoint variables (botocore >= 1.31),
    if one is installed besides Debian's (e.g. aws-cli v1 from pip under pyenv)."""
    cands = [shutil.which("aws")] + sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/aws")))
    for c in cands:
        if not c or c == AWS or "/shims/" in c:
            continue
        try:
            out = subprocess.run([c, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(r"botocore/(\d+)\.(\d+)", out.stdout + out.stderr)
        if m and (int(m.group(1)), int(m.group(2))) >= (1, 31):
            return c, (out.stdout + out.stderr).strip()
    return None, None


class _Base(unittest.TestCase):
    server_args = {}

    def setUp(self):
        warnings.simplefilter("ignore", ResourceWarning)  # boto3 clients keep their connections open
        args = {"region": REGION, "credentials": {AKID: SECRET}}
        args.update(self.server_args)
        self.srv = FakeCloudWatchLogsServer(**args).start()
        self.addCleanup(self.srv.stop)

    def client(self, secret=SECRET, akid=AKID, token=None, attempts=1, mode="standard"):
        return boto3.client("logs", endpoint_url=self.srv.endpoint, region_name=REGION,
                            aws_access_key_id=akid, aws_secret_access_key=secret, aws_session_token=token,
                            config=Config(retries={"total_max_attempts": attempts, "mode": mode}))

    def error(self, fn):
        with self.assertRaises(ClientError) as cm:
            fn()
        return cm.exception.response

    def code(self, fn):
        return self.error(fn)["Error"]["Code"]

    def raw(self, op, body, secret=SECRET, tamper=None, headers=None, ctype="application/x-amz-json-1.1"):
        """A request signed by botocore's SigV4Auth (service logs); returns (status, headers, json)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs = {"Content-Type": ctype, "X-Amz-Target": f"Logs_20140328.{op}"}
        hdrs.update(headers or {})
        req = AWSRequest(method="POST", url=self.srv.endpoint + "/", data=data, headers=hdrs)
        SigV4Auth(Credentials(AKID, secret), "logs", REGION).add_auth(req)
        if tamper is not None:
            data = tamper(data)
        conn = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=10)
        try:
            conn.request("POST", "/", body=data, headers={**dict(req.headers), "Content-Length": str(len(data))})
            r = conn.getresponse()
            return r.status, r.headers, json.loads(r.read() or b"{}")
        finally:
            conn.close()


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed")
class Boto3Test(_Base):
    def test_write_read_describe_filter(self):
        c = self.client()
        c.create_log_group(logGroupName="/spotvisor/run-1")
        c.create_log_stream(logGroupName="/spotvisor/run-1", logStreamName="i-0aaa/trainer")
        c.create_log_stream(logGroupName="/spotvisor/run-1", logStreamName="i-0aaa/supervisor")
        t0 = NOW_MS() - 60_000
        msgs = ["step 1 loss=2.5", "step 2 loss=2.1", "ERROR cuda oom", "step 3 loss=1.9", "résumé ✓"]
        r = c.put_log_events(logGroupName="/spotvisor/run-1", logStreamName="i-0aaa/trainer",
                             logEvents=[{"timestamp": t0 + i, "message": m} for i, m in enumerate(msgs[:3])])
        self.assertIn("nextSequenceToken", r)
        self.assertNotIn("rejectedLogEventsInfo", r)
        # A stale sequence token is accepted and ignored, as AWS has done since 2023; equal timestamps are fine.
        c.put_log_events(logGroupName="/spotvisor/run-1", logStreamName="i-0aaa/trainer", sequenceToken="1234",
                         logEvents=[{"timestamp": t0 + 3, "message": msgs[3]},
                                    {"timestamp": t0 + 3, "message": msgs[4]}])
        c.put_log_events(logGroupName="/spotvisor/run-1", logStreamName="i-0aaa/supervisor",
                         logEvents=[{"timestamp": t0 + 10, "message": "ERROR preempted"}])
        self.assertEqual([e["message"] for e in self.srv.events("/spotvisor/run-1", "i-0aaa/trainer")], msgs)

        got = c.get_log_events(logGroupName="/spotvisor/run-1", logStreamName="i-0aaa/trainer", startFromHead=True)
        self.assertEqual([e["message"] for e in got["events"]], msgs)
        self.assertEqual([e["timestamp"] for e in got["events"]], [t0, t0 + 1, t0 + 2, t0 + 3, t0 + 3])
        self.assertTrue(all(e["ingestionTime"] >= t0 for e in got["events"]))
        # Paging forward two at a time until the service hands back the token it was given.
        pages, token = [], None
        for _ in range(10):
            kw = {"nextToken": token} if token else {}
            p = c.get_log_events(logGroupName="/spotvisor/run-1", logStreamName="i-0aaa/trainer",
                                 startFromHead=True, limit=2, **kw)
            if p["nextForwardToken"] == token:
                self.assertEqual(p["events"], [])
                break
            pages.append([e["message"] for e in p["events"]])
            token = p["nextForwardToken"]
        self.assertEqual(pages, [msgs[0:2], msgs[2:4], msgs[4:5]])
        # Without startFromHead: the newest events.
        tail = c.get_log_events(logGroupName="/spotvisor/run-1", logStreamName="i-0aaa/trainer", limit=2)
        self.assertEqual([e["message"] for e in tail["events"]], msgs[3:5])

        ds = c.describe_log_streams(logGroupName="/spotvisor/run-1", logStreamNamePrefix="i-0aaa/t")["logStreams"]
        self.assertEqual([s["logStreamName"] for s in ds], ["i-0aaa/trainer"])
        self.assertEqual((ds[0]["firstEventTimestamp"], ds[0]["lastEventTimestamp"]), (t0, t0 + 3))
        self.assertGreaterEqual(ds[0]["lastIngestionTime"], t0)
        self.assertTrue(ds[0]["arn"].endswith(":log-group:/spotvisor/run-1:log-stream:i-0aaa/trainer"))
        groups = c.describe_log_groups(logGroupNamePrefix="/spotvisor/")["logGroups"]
        self.assertEqual([g["logGroupName"] for g in groups], ["/spotvisor/run-1"])

        f = c.filter_log_events(logGroupName="/spotvisor/run-1", filterPattern="ERROR")
        self.assertEqual([(e["logStreamName"], e["message"]) for e in f["events"]],
                         [("i-0aaa/trainer", "ERROR cuda oom"), ("i-0aaa/supervisor", "ERROR preempted")])
        f = c.filter_log_events(logGroupName="/spotvisor/run-1", logStreamNames=["i-0aaa/trainer"],
                                filterPattern='"loss=2"')
        self.assertEqual([e["message"] for e in f["events"]], msgs[0:2])
        f = c.filter_log_events(logGroupName="/spotvisor/run-1", logStreamNames=["i-0aaa/trainer"],
                                filterPattern="step -loss=2.5")
        self.assertEqual([e["message"] for e in f["events"]], msgs[1:2] + msgs[3:4])

    def test_errors_come_out_as_the_services_codes(self):
        c = self.client()
        self.srv.create_stream("g", "s")
        r = self.error(lambda: c.put_log_events(logGroupName="g", logStreamName="nope",
                                                logEvents=[{"timestamp": NOW_MS(), "message": "x"}]))
        self.assertEqual((r["Error"]["Code"], r["Error"]["Message"]),
                         ("ResourceNotFoundException", "The specified log stream does not exist."))
        self.assertEqual(r["ResponseMetadata"]["HTTPStatusCode"], 400)
        self.assertTrue(r["ResponseMetadata"]["RequestId"])
        r = self.error(lambda: c.create_log_stream(logGroupName="nogroup", logStreamName="s"))
        self.assertEqual(r["Error"]["Message"], "The specified log group does not exist.")
        self.assertEqual(self.code(lambda: c.create_log_group(logGroupName="g")), "ResourceAlreadyExistsException")
        self.assertEqual(self.code(lambda: c.create_log_stream(logGroupName="g", logStreamName="s")),
                         "ResourceAlreadyExistsException")
        t = NOW_MS()
        r = self.error(lambda: c.put_log_events(logGroupName="g", logStreamName="s", logEvents=[
            {"timestamp": t, "message": "b"}, {"timestamp": t - 1, "message": "a"}]))
        self.assertEqual((r["Error"]["Code"], r["Error"]["Message"]), (
            "InvalidParameterException",
            "Log events in a single PutLogEvents request must be in chronological order."))
        big = "x" * 250_000  # 5 x (250,000 + 26) > 1,048,576
        self.assertEqual(self.code(lambda: c.put_log_events(logGroupName="g", logStreamName="s", logEvents=[
            {"timestamp": t, "message": big} for _ in range(5)])), "InvalidParameterException")
        self.assertEqual(self.code(lambda: c.put_log_events(logGroupName="g", logStreamName="s", logEvents=[
            {"timestamp": t, "message": "y" * 262_119}])), "InvalidParameterException")  # 262,145 with the 26
        self.assertEqual(self.srv.events("g", "s"), [])
        self.assertEqual(self.code(lambda: c.delete_log_group(logGroupName="g")), "UnknownOperationException")

    def test_credentials_are_checked(self):
        put = dict(logGroupName="g", logStreamName="s", logEvents=[{"timestamp": NOW_MS(), "message": "x"}])
        self.srv.create_stream("g", "s")
        r = self.error(lambda: self.client(secret="wrong").put_log_events(**put))
        self.assertEqual(r["Error"]["Code"], "InvalidSignatureException")
        self.assertIn("signature we calculated does not match", r["Error"]["Message"])
        r = self.error(lambda: self.client(akid="AKIDNOPE").put_log_events(**put))
        self.assertEqual((r["Error"]["Code"], r["Error"]["Message"]), (
            "UnrecognizedClientException", "The security token included in the request is invalid."))
        self.srv.add_credentials("ASIALIVE", "s", session_token="tok", expires_at=time.time() + 3600)
        self.client(akid="ASIALIVE", secret="s", token="tok").put_log_events(**put)
        self.assertEqual(self.code(lambda: self.client(akid="ASIALIVE", secret="s", token="other")
                                   .put_log_events(**put)), "UnrecognizedClientException")
        self.srv.add_credentials("ASIAOLD", "s", session_token="t", expires_at=time.time() - 1)
        self.assertEqual(self.code(lambda: self.client(akid="ASIAOLD", secret="s", token="t").put_log_events(**put)),
                         "ExpiredTokenException")
        self.assertEqual(len(self.srv.events("g", "s")), 1)

    def test_a_request_signed_with_a_skewed_clock_is_refused(self):
        self.srv.create_group("g")
        self.srv.clock = lambda: time.time() + 20 * 60  # the service's clock 20 min ahead of the signer's
        r = self.error(lambda: self.client().describe_log_streams(logGroupName="g"))
        self.assertEqual(r["Error"]["Code"], "InvalidSignatureException")
        self.assertTrue(r["Error"]["Message"].startswith("Signature expired: "), r["Error"]["Message"])
        self.srv.clock = lambda: time.time() + 5 * 60  # within 15 min: accepted
        self.assertEqual(self.client().describe_log_streams(logGroupName="g")["logStreams"], [])

    def test_deny_answers_access_denied_as_iam_words_it(self):
        self.srv.create_stream("g", "s")
        self.srv.deny("PutLogEvents")
        r = self.error(lambda: self.client().put_log_events(
            logGroupName="g", logStreamName="s", logEvents=[{"timestamp": NOW_MS(), "message": "x"}]))
        self.assertEqual(r["Error"]["Code"], "AccessDeniedException")
        self.assertRegex(r["Error"]["Message"],
                         r"^User: arn:aws:sts::\d{12}:assumed-role/\S+ is not authorized to perform: "
                         r"logs:PutLogEvents on resource: arn:aws:logs:eu-west-1:\d{12}:log-group:g:log-stream:s "
                         r"because no identity-based policy allows the logs:PutLogEvents action$")
        self.assertEqual(self.srv.events("g", "s"), [])
        self.client().get_log_events(logGroupName="g", logStreamName="s")  # other operations still allowed

    def test_faults(self):
        self.srv.create_stream("g", "s")
        c = self.client()
        put = lambda m: c.put_log_events(logGroupName="g", logStreamName="s",  # noqa: E731
                                         logEvents=[{"timestamp": NOW_MS(), "message": m}])
        self.srv.fault("ThrottlingException", operation="PutLogEvents")
        r = self.error(lambda: put("a"))
        self.assertEqual((r["Error"]["Code"], r["Error"]["Message"], r["ResponseMetadata"]["HTTPStatusCode"]),
                         ("ThrottlingException", "Rate exceeded", 400))
        self.srv.fault("ServiceUnavailableException")
        r = self.error(lambda: put("b"))
        self.assertEqual((r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]),
                         ("ServiceUnavailableException", 500))
        self.srv.fault("reset", operation="PutLogEvents")
        with self.assertRaises(HTTPClientError):
            put("c")
        self.assertEqual(self.srv.events("g", "s"), [])
        self.srv.fault("lost_answer", operation="PutLogEvents")
        with self.assertRaises(HTTPClientError):
            put("d")
        self.assertEqual([e["message"] for e in self.srv.events("g", "s")], ["d"])  # applied, answer lost
        self.assertEqual([e["outcome"] for e in self.srv.log()], ["answered", "answered", "reset", "lost_answer"])
        self.assertEqual(self.srv.hits("PutLogEvents"), 4)
        # botocore takes InternalFailure (500) as retryable: one retry, and the event lands once.
        self.srv.fault("InternalFailure", operation="PutLogEvents")
        c2 = self.client(attempts=2, mode="standard")
        c2.put_log_events(logGroupName="g", logStreamName="s", logEvents=[{"timestamp": NOW_MS(), "message": "e"}])
        self.assertEqual(self.srv.hits("PutLogEvents"), 6)
        self.assertEqual([e["message"] for e in self.srv.events("g", "s")], ["d", "e"])

    def test_delay_holds_the_answer_until_cleared(self):
        self.srv.create_stream("g", "s")
        self.srv.fault("delay", seconds=60, operation="PutLogEvents")
        done = []
        c = self.client()
        t = threading.Thread(target=lambda: done.append(c.put_log_events(
            logGroupName="g", logStreamName="s", logEvents=[{"timestamp": NOW_MS(), "message": "late"}])))
        t.start()
        self.assertTrue(self.srv.wait_for(lambda: any(e["status"] is None and e["operation"] == "PutLogEvents"
                                                      for e in self.srv.log()), timeout=5))
        self.assertFalse(self.srv.wait_for("PutLogEvents", count=1, timeout=0.3))  # still held
        self.srv.clear_faults()
        self.assertTrue(self.srv.wait_for("PutLogEvents", count=1, timeout=5))
        t.join(10)
        self.assertEqual(len(done), 1)
        self.assertEqual([e["message"] for e in self.srv.events("g", "s")], ["late"])


@unittest.skipIf(boto3 is None, "python3-boto3 (botocore's SigV4Auth) is not installed")
class StrictnessTest(_Base):
    """Requests the SDKs would send but the service refuses, or would refuse to send at all."""

    def setUp(self):
        super().setUp()
        self.srv.create_stream("g", "s")

    def put(self, events, **kw):
        return self.raw("PutLogEvents", {"logGroupName": "g", "logStreamName": "s", "logEvents": events}, **kw)

    def test_answer_and_error_shape(self):
        st, h, body = self.put([{"timestamp": NOW_MS(), "message": "ok"}])
        self.assertEqual(st, 200)
        self.assertEqual(h["Content-Type"], "application/x-amz-json-1.1")
        self.assertTrue(h["x-amzn-RequestId"])
        self.assertIsInstance(body["nextSequenceToken"], str)
        st, h, body = self.raw("PutLogEvents", {"logGroupName": "nog", "logStreamName": "s",
                                                "logEvents": [{"timestamp": NOW_MS(), "message": "x"}]})
        self.assertEqual((st, body), (400, {"__type": "ResourceNotFoundException",
                                            "message": "The specified log group does not exist."}))
        self.assertTrue(h["x-amzn-RequestId"])
        st, _, body = self.raw("PutRetentionPolicy", {"logGroupName": "g", "retentionInDays": 1})
        self.assertEqual((st, body["__type"]), (400, "UnknownOperationException"))
        st, _, body = self.raw("PutLogEvents", b'{"logGroupName": "g",', )
        self.assertEqual((st, body["__type"]), (400, "SerializationException"))
        st, _, body = self.put([{"timestamp": NOW_MS(), "message": "x"}], ctype="application/json")
        self.assertEqual((st, body["__type"]), (400, "SerializationException"))

    def test_the_payload_is_signed(self):
        st, _, body = self.put([{"timestamp": NOW_MS(), "message": "abc"}],
                               tamper=lambda d: d.replace(b"abc", b"abd"))
        self.assertEqual((st, body["__type"]), (400, "InvalidSignatureException"))
        # A declared x-amz-content-sha256 cannot stand in for the body's own hash.
        st, _, body = self.put([{"timestamp": NOW_MS(), "message": "abc"}],
                               headers={"X-Amz-Content-Sha256": "UNSIGNED-PAYLOAD"})
        self.assertEqual((st, body["__type"]), (400, "InvalidSignatureException"))
        self.assertEqual(self.srv.events("g", "s"), [])
        conn = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=10)
        conn.request("POST", "/", body=b"{}", headers={"X-Amz-Target": "Logs_20140328.DescribeLogGroups",
                                                      "Content-Type": "application/x-amz-json-1.1"})
        r = conn.getresponse()
        self.assertEqual((r.status, json.loads(r.read())["__type"]), (400, "MissingAuthenticationTokenException"))
        conn.close()

    def test_order_span_count_and_sizes(self):
        t = NOW_MS()
        st, _, body = self.put([{"timestamp": t, "message": "b"}, {"timestamp": t - 1, "message": "a"}])
        self.assertEqual((st, body["__type"], body["message"]), (
            400, "InvalidParameterException",
            "Log events in a single PutLogEvents request must be in chronological order."))
        st, _, body = self.put([{"timestamp": t - DAY - 1, "message": "a"}, {"timestamp": t, "message": "b"}])
        self.assertEqual((st, body["__type"]), (400, "InvalidParameterException"))
        self.assertIn("24 hours", body["message"])
        st, _, body = self.put([{"timestamp": t - DAY, "message": "a"}, {"timestamp": t, "message": "b"}])
        self.assertEqual(st, 200)  # exactly 24 h is allowed
        st, _, body = self.put([{"timestamp": t, "message": ""}])
        self.assertEqual((st, body["__type"]), (400, "InvalidParameterException"))
        st, _, body = self.put([])
        self.assertEqual((st, body["__type"]), (400, "InvalidParameterException"))
        st, _, body = self.put([{"timestamp": t, "message": "x"}] * 10_001)
        self.assertEqual((st, body["__type"]), (400, "InvalidParameterException"))
        st, _, _ = self.put([{"timestamp": t, "message": "x"}] * 10_000)
        self.assertEqual(st, 200)
        # Sizes count UTF-8 bytes + 26: "é" is 2 bytes, so 131,059 of them + 26 = 262,144 exactly.
        st, _, _ = self.put([{"timestamp": t, "message": "é" * 131_059}])
        self.assertEqual(st, 200)
        st, _, body = self.put([{"timestamp": t, "message": "é" * 131_059 + "x"}])
        self.assertEqual((st, body["__type"]), (400, "InvalidParameterException"))
        # The batch: 4 events of 262,144 = 1,048,576 exactly is fine; one byte more is not.
        ev = {"timestamp": t, "message": "z" * (262_144 - 26)}
        self.assertEqual(self.put([ev] * 4)[0], 200)
        st, _, body = self.put([ev] * 3 + [{"timestamp": t, "message": "z" * (262_144 - 26 - 1)},
                                           {"timestamp": t, "message": "zz"}])
        self.assertEqual((st, body["__type"]), (400, "InvalidParameterException"))
        self.assertEqual(len(self.srv.events("g", "s")), 2 + 10_000 + 1 + 4)

    def test_rejected_events_too_old_too_new_expired(self):
        t = NOW_MS()
        evs = [{"timestamp": t - 14 * DAY - 2 * HOUR, "message": "old1"},
               {"timestamp": t - 14 * DAY - HOUR, "message": "old2"},
               {"timestamp": t - 14 * DAY + HOUR, "message": "kept1"},
               {"timestamp": t - 14 * DAY + 2 * HOUR, "message": "kept2"}]
        st, _, body = self.put(evs)
        self.assertEqual((st, body["rejectedLogEventsInfo"]), (200, {"tooOldLogEventEndIndex": 1}))
        evs = [{"timestamp": t + HOUR, "message": "kept3"}, {"timestamp": t + 3 * HOUR, "message": "new1"},
               {"timestamp": t + 4 * HOUR, "message": "new2"}]
        st, _, body = self.put(evs)
        self.assertEqual((st, body["rejectedLogEventsInfo"]), (200, {"tooNewLogEventStartIndex": 1}))
        self.assertEqual([e["message"] for e in self.srv.events("g", "s")], ["kept1", "kept2", "kept3"])
        self.srv.create_group("r", retention_days=1)
        self.srv.create_stream("r", "s")
        st, _, body = self.raw("PutLogEvents", {"logGroupName": "r", "logStreamName": "s", "logEvents": [
            {"timestamp": t - DAY - HOUR, "message": "gone"}, {"timestamp": t - 2 * HOUR, "message": "in"}]})
        self.assertEqual((st, body["rejectedLogEventsInfo"]), (200, {"expiredLogEventEndIndex": 0}))
        self.assertEqual([e["message"] for e in self.srv.events("r", "s")], ["in"])

    def test_the_clock_is_injectable(self):
        base = time.time()
        self.srv.clock = lambda: base + 3 * 3600  # the service 3 h ahead: signature refused
        st, _, body = self.put([{"timestamp": NOW_MS(), "message": "x"}])
        self.assertEqual((st, body["__type"]), (400, "InvalidSignatureException"))
        self.assertTrue(body["message"].startswith("Signature expired: "))
        self.srv.clock = lambda: base - 20 * 60
        st, _, body = self.put([{"timestamp": NOW_MS(), "message": "x"}])
        self.assertTrue(body["message"].startswith("Signature not yet current: "), body)

    def test_larger_events_with_the_one_mib_option(self):
        self.srv.max_event_bytes = 1_048_576
        st, _, _ = self.put([{"timestamp": NOW_MS(), "message": "q" * (1_048_576 - 26)}])
        self.assertEqual(st, 200)


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed")
@unittest.skipUnless(AWS, "awscli (Debian package) is not installed")
class AwsCliTest(_Base):
    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="fake-logs-cli-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.env = {"PATH": "/usr/bin:/bin", "HOME": self.tmp, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                    "AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION,
                    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                    "AWS_EC2_METADATA_DISABLED": "true", "AWS_PAGER": "", "AWS_MAX_ATTEMPTS": "1"}

    def aws(self, *args, cli=None, env=None, check=True):
        p = subprocess.run([cli or AWS, *args], env={**self.env, **(env or {})}, capture_output=True,
                           text=True, timeout=60)
        if check and p.returncode != 0:
            self.fail(f"aws {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
        return p

    def test_create_put_get(self):
        ep = ["--endpoint-url", self.srv.endpoint]
        self.aws("logs", "create-log-group", "--log-group-name", "/spotvisor/cli", *ep)
        self.aws("logs", "create-log-stream", "--log-group-name", "/spotvisor/cli", "--log-stream-name", "n1", *ep)
        t = NOW_MS()
        events = json.dumps([{"timestamp": t, "message": "hello"}, {"timestamp": t + 1, "message": "wörld"}])
        out = json.loads(self.aws("logs", "put-log-events", "--log-group-name", "/spotvisor/cli",
                                  "--log-stream-name", "n1", "--log-events", events, *ep).stdout)
        self.assertIn("nextSequenceToken", out)
        out = json.loads(self.aws("logs", "get-log-events", "--log-group-name", "/spotvisor/cli",
                                  "--log-stream-name", "n1", "--start-from-head", *ep).stdout)
        self.assertEqual([(e["timestamp"], e["message"]) for e in out["events"]], [(t, "hello"), (t + 1, "wörld")])
        p = self.aws("logs", "put-log-events", "--log-group-name", "/spotvisor/cli", "--log-stream-name", "nope",
                     "--log-events", events, *ep, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("(ResourceNotFoundException)", p.stderr)
        self.assertIn("The specified log stream does not exist.", p.stderr)
        self.assertEqual(self.srv.hits("PutLogEvents"), 2)

    def test_the_endpoint_variable(self):
        """AWS_ENDPOINT_URL_CLOUDWATCH_LOGS (what spotvisor's SDK reads) needs botocore >= 1.31: Debian's
        aws-cli 2.9.19 ignores it (so the test above passes --endpoint-url); a newer CLI, if installed,
        must reach the fake through it. HTTPS_PROXY points at a closed port so an ignored variable
        fails here instead of reaching AWS."""
        env = {"AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": self.srv.endpoint, "HTTPS_PROXY": "http://127.0.0.1:9",
               "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        self.srv.create_group("viaenv")
        p = self.aws("logs", "describe-log-groups", "--cli-connect-timeout", "5", env=env, check=False)
        if _debian_cli_version().startswith("2.9."):
            self.assertNotEqual(p.returncode, 0)
            self.assertEqual(self.srv.hits(), 0)
        newer, newer_version = _newer_cli()
        if newer is None:
            self.skipTest("no AWS CLI with botocore >= 1.31 installed besides Debian's")
        p = self.aws("logs", "describe-log-groups", cli=newer, env=env)
        self.assertEqual([g["logGroupName"] for g in json.loads(p.stdout)["logGroups"]], ["viaenv"], newer_version)
        self.assertEqual(self.srv.hits("DescribeLogGroups"), 1)


@unittest.skipIf(boto3 is None, "python3-boto3 is not installed")
class ServeTest(unittest.TestCase):
    def test_serve_prints_the_endpoint_and_stops_on_sigterm(self):
        warnings.simplefilter("ignore", ResourceWarning)
        p = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "fake_cloudwatch_logs.py"), "serve",
                              "--port", "0", "--credentials", f"{AKID}:{SECRET}", "--region", REGION,
                              "--stream", "g:s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        self.addCleanup(lambda: p.poll() is None and p.kill())
        ready, _, _ = select.select([p.stdout], [], [], 15)
        self.assertTrue(ready, "serve printed nothing within 15 s")
        line = p.stdout.readline()
        m = re.fullmatch(r"fake-cloudwatch-logs listening on (http://127\.0\.0\.1:\d+)\n", line)
        self.assertTrue(m, line)
        c = boto3.client("logs", endpoint_url=m.group(1), region_name=REGION, aws_access_key_id=AKID,
                         aws_secret_access_key=SECRET, config=Config(retries={"max_attempts": 1}))
        c.put_log_events(logGroupName="g", logStreamName="s", logEvents=[{"timestamp": NOW_MS(), "message": "x"}])
        got = c.get_log_events(logGroupName="g", logStreamName="s", startFromHead=True)
        self.assertEqual([e["message"] for e in got["events"]], ["x"])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=10), 0)
        p.stdout.close()
        p.stderr.close()


if __name__ == "__main__":
    unittest.main()

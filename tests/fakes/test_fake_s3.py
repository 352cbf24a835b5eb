"""Self-test of fake_s3.py, and the proof that it speaks S3 to code nobody
here wrote: Debian's boto3 1.26 / botocore 1.29 and AWS CLI 2.9, AWS's own
published SigV4 signing examples, and (for the other direction) s3rver for
Node, checked to work with tests/fakes/node/s3rver_serve.js.

Run with Debian's Python (python3-crc32c, python3-boto3, awscli):
    /usr/bin/python3 -m unittest tests/fakes/test_fake_s3.py
"""
import base64
import hashlib
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fake_s3  # noqa: E402
from fake_s3 import FakeS3Server  # noqa: E402

try:
    import crc32c
except ImportError:  # pragma: no cover
    crc32c = None

try:
    import boto3
    import botocore
    from boto3.s3.transfer import TransferConfig
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.config import Config
    from botocore.credentials import Credentials
    from botocore.exceptions import ClientError
    HAVE_BOTO = True
except ImportError:  # pragma: no cover
    HAVE_BOTO = False

AWS = shutil.which("aws", path="/usr/bin") or shutil.which("aws")
NODE = shutil.which("node")
NODE_DIR = os.path.join(HERE, "node")
S3RVER_SCRIPT = os.path.join(NODE_DIR, "s3rver_serve.js")
MiB = 1024 * 1024

AKID, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TEMP_AKID, TEMP_SECRET, TOKEN = ("ASIATEMPEXAMPLE", "tempsecret",
                                 "FwoGZXIvYXdzEBAaDEXAMPLETOKEN+/=")

# AWS's published SigV4 examples (docs.aws.amazon.com/AmazonS3/latest/API/
# sig-v4-header-based-auth.html, sigv4-query-string-auth.html,
# sigv4-streaming.html, sigv4-streaming-trailers.html): fixed key, fixed
# time, fixed signatures.
EX_AKID, EX_SECRET = "AKIAIOSFODNN7EXAMPLE", \
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
EX_TIME = 1369353600                     # 2013-05-24T00:00:00Z
EX_SCOPE = "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"


def error_code(body):
    m = re.search(rb"<Code>([^<]*)</Code>", body)
    return m.group(1).decode() if m else None


def b64crc32c(data):
    return base64.b64encode(struct.pack(">I", crc32c.crc32c(data))).decode()


class Raw:
    """Requests signed by botocore's own S3 signer, sent with http.client,
    so they can be tampered with after signing."""

    def __init__(self, srv):
        self.srv = srv

    def headers(self, method, path, query="", headers=None, body=b"",
                akid=AKID, secret=SECRET, token=None, region="us-east-1"):
        url = self.srv.endpoint + path + ("?" + query if query else "")
        req = AWSRequest(method=method, url=url, data=body,
                         headers=dict(headers or {}))
        S3SigV4Auth(Credentials(akid, secret, token), "s3",
                    region).add_auth(req)
        return dict(req.headers.items())

    def send(self, method, path, query="", headers=None, body=b"",
             send_body=None, **sign):
        h = self.headers(method, path, query, headers, body, **sign)
        return self.send_raw(method, path + ("?" + query if query else ""),
                             h, body if send_body is None else send_body)

    def send_raw(self, method, target, headers, body=b""):
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port,
                                          timeout=10)
        try:
            conn.request(method, target, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, dict((k.lower(), v) for k, v in
                                  r.getheaders()), r.read()
        finally:
            conn.close()


# ---------------------------------------------------------------- strictness
@unittest.skipUnless(HAVE_BOTO, "python3-boto3 (botocore's signer) is not "
                     "installed")
class StrictnessTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeS3Server(buckets=("b",), credentials={
            AKID: SECRET,
            TEMP_AKID: (TEMP_SECRET, TOKEN)}).start()
        self.addCleanup(self.srv.stop)
        self.raw = Raw(self.srv)

    def expect(self, result, status, code):
        got_status, headers, body = result
        self.assertEqual((got_status, error_code(body)), (status, code),
                         body.decode(errors="replace"))
        return headers, body

    def test_a_correct_signature_passes(self):
        st, _, _ = self.raw.send("PUT", "/b/k%20%2B%C3%A9", body=b"x")
        self.assertEqual(st, 200)
        self.assertEqual(self.srv.get_object_bytes("b", "k +é"), b"x")

    def test_signature_errors(self):
        _, body = self.expect(self.raw.send("GET", "/b/k", secret="wrong"),
                              403, "SignatureDoesNotMatch")
        self.assertIn(b"<CanonicalRequest>GET\n/b/k\n", body)
        self.expect(self.raw.send("GET", "/b/k", akid="AKIDUNKNOWN"),
                    403, "InvalidAccessKeyId")
        self.expect(self.raw.send_raw("GET", "/b/k", {}), 403,
                    "AccessDenied")
        self.expect(self.raw.send("GET", "/b/k", region="eu-west-1"),
                    400, "AuthorizationHeaderMalformed")
        # A signed header changed after signing.
        h = self.raw.headers("GET", "/b/k", headers={"Range": "bytes=0-1"})
        h["Range"] = "bytes=0-2"
        self.expect(self.raw.send_raw("GET", "/b/k", h), 403,
                    "SignatureDoesNotMatch")
        # An x-amz-* header nobody signed.
        h = self.raw.headers("GET", "/b/k")
        h["x-amz-meta-extra"] = "1"
        _, body = self.expect(self.raw.send_raw("GET", "/b/k", h), 403,
                              "AccessDenied")
        self.assertIn(b"<HeadersNotSigned>x-amz-meta-extra<", body)
        # Host not among the signed headers.
        h = self.raw.headers("GET", "/b/k")
        h["Authorization"] = h["Authorization"].replace(
            "SignedHeaders=host;", "SignedHeaders=")
        self.expect(self.raw.send_raw("GET", "/b/k", h), 403,
                    "SignatureDoesNotMatch")
        # S3 requires x-amz-content-sha256 with header auth.
        h = self.raw.headers("GET", "/b/k")
        del h["X-Amz-Content-SHA256"]
        self.expect(self.raw.send_raw("GET", "/b/k", h), 400,
                    "InvalidRequest")
        # Malformed Authorization headers.
        for bad in ("AWS4-HMAC-SHA256 Credential=x", "Bearer abc",
                    "AWS4-HMAC-SHA256 Credential=a/b, SignedHeaders=host, "
                    "Signature=00"):
            st, _, body = self.raw.send_raw("GET", "/b/k", {
                "Authorization": bad, "x-amz-content-sha256": "UNSIGNED-"
                "PAYLOAD", "x-amz-date": "20260101T000000Z"})
            self.assertIn(st, (400, 403), body)
            self.assertTrue(error_code(body), body)
        # The old signature version.
        self.expect(self.raw.send_raw("GET", "/b/k", {
            "Authorization": "AWS AKIDEXAMPLE:abc=", "Date": "x"}),
            400, "InvalidRequest")

    def test_virtual_hosted_style(self):
        host = f"b.localhost:{self.srv.port}"
        req = AWSRequest(method="PUT", url=f"http://{host}/v%20k", data=b"v")
        S3SigV4Auth(Credentials(AKID, SECRET), "s3",
                    "us-east-1").add_auth(req)
        h = dict(req.headers.items(), Host=host)
        st, _, body = self.raw.send_raw("PUT", "/v%20k", h, b"v")
        self.assertEqual(st, 200, body)
        self.assertTrue(self.srv.wait_for("object", bucket="b", key="v k"))
        self.assertEqual(self.srv.requests()[-1]["bucket"], "b")

    def test_session_tokens(self):
        ok = self.raw.send("PUT", "/b/t", body=b"1", akid=TEMP_AKID,
                           secret=TEMP_SECRET, token=TOKEN)
        self.assertEqual(ok[0], 200, ok[2])
        # A temporary key id without its token is unknown to S3.
        self.expect(self.raw.send("GET", "/b/t", akid=TEMP_AKID,
                                  secret=TEMP_SECRET), 403,
                    "InvalidAccessKeyId")
        self.expect(self.raw.send("GET", "/b/t", akid=TEMP_AKID,
                                  secret=TEMP_SECRET, token="other"), 400,
                    "InvalidToken")
        # The token must be signed.
        h = self.raw.headers("GET", "/b/t", akid=TEMP_AKID,
                             secret=TEMP_SECRET)
        h["X-Amz-Security-Token"] = TOKEN
        self.expect(self.raw.send_raw("GET", "/b/t", h), 403,
                    "AccessDenied")
        self.srv.add_credentials(TEMP_AKID, TEMP_SECRET, TOKEN,
                                 expires_at=time.time() - 1)
        self.expect(self.raw.send("GET", "/b/t", akid=TEMP_AKID,
                                  secret=TEMP_SECRET, token=TOKEN), 400,
                    "ExpiredToken")
        self.srv.remove_credentials(TEMP_AKID)
        self.expect(self.raw.send("GET", "/b/t", akid=TEMP_AKID,
                                  secret=TEMP_SECRET, token=TOKEN), 403,
                    "InvalidAccessKeyId")

    def test_clock_skew(self):
        for offset in (16 * 60, -16 * 60):
            with FakeS3Server(buckets=("b",), credentials={AKID: SECRET},
                              clock=lambda: time.time() + offset) as srv:
                _, body = self.expect(Raw(srv).send("GET", "/b/k"), 403,
                                      "RequestTimeTooSkewed")
                self.assertIn(b"<MaxAllowedSkewMilliseconds>900000<", body)
        with FakeS3Server(buckets=("b",), credentials={AKID: SECRET},
                          clock=lambda: time.time() + 14 * 60) as srv:
            self.assertEqual(Raw(srv).send("GET", "/b/k")[0], 404)

    def test_payload_hash_and_digests(self):
        # The body differs from the one signed (same length).
        _, body = self.expect(self.raw.send("PUT", "/b/k", body=b"aaaa",
                                            send_body=b"aaab"),
                              400, "XAmzContentSHA256Mismatch")
        self.assertIn(b"<ClientComputedContentSHA256>", body)
        good_md5 = base64.b64encode(hashlib.md5(b"data").digest()).decode()
        bad_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
        self.assertEqual(self.raw.send("PUT", "/b/k", body=b"data", headers={
            "Content-MD5": good_md5})[0], 200)
        self.expect(self.raw.send("PUT", "/b/k", body=b"data", headers={
            "Content-MD5": bad_md5}), 400, "BadDigest")
        self.expect(self.raw.send("PUT", "/b/k", body=b"data", headers={
            "Content-MD5": "not base64!"}), 400, "InvalidDigest")
        self.expect(self.raw.send("PUT", "/b/k", body=b"data", headers={
            "x-amz-checksum-crc32c": b64crc32c(b"other")}), 400, "BadDigest")
        _, body = self.expect(self.raw.send("PUT", "/b/k", body=b"data",
                                            headers={
                                                "x-amz-checksum-crc32c": "AA"
                                            }), 400, "InvalidRequest")
        self.assertIn(b"Value for x-amz-checksum-crc32c header is invalid.",
                      body)
        self.expect(self.raw.send("PUT", "/b/k", body=b"data", headers={
            "x-amz-checksum-crc32c": b64crc32c(b"data"),
            "x-amz-checksum-crc32": "AAAAAA=="}), 400, "InvalidRequest")
        st, h, _ = self.raw.send("PUT", "/b/c", body=b"data", headers={
            "x-amz-checksum-crc32c": b64crc32c(b"data")})
        self.assertEqual((st, h["x-amz-checksum-crc32c"]),
                         (200, b64crc32c(b"data")))
        self.assertEqual(self.srv.objects("b")["c"]["crc32c"],
                         b64crc32c(b"data"))
        # Returned only when asked for.
        st, h, _ = self.raw.send("GET", "/b/c")
        self.assertNotIn("x-amz-checksum-crc32c", h)
        st, h, _ = self.raw.send("GET", "/b/c", headers={
            "x-amz-checksum-mode": "ENABLED"})
        self.assertEqual(h["x-amz-checksum-crc32c"], b64crc32c(b"data"))
        # UNSIGNED-PAYLOAD is accepted (what libcurl sends for uploads).
        h = self.raw.headers("PUT", "/b/u", body=b"zz",
                             headers={"X-Amz-Content-SHA256": "UNSIGNED-"
                                      "PAYLOAD"})
        self.assertEqual(self.raw.send_raw("PUT", "/b/u", h, b"zz")[0], 200)

    def test_expect_100_continue(self):
        def exchange(headers, body):
            s = socket.create_connection(("127.0.0.1", self.srv.port),
                                         timeout=5)
            self.addCleanup(s.close)
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            s.sendall(f"PUT /b/e HTTP/1.1\r\nHost: {host}\r\n{head}"
                      f"Content-Length: "
                      f"{len(body)}\r\nExpect: 100-continue\r\n\r\n"
                      .encode())
            first = s.recv(65536)
            if first.startswith(b"HTTP/1.1 100"):
                s.sendall(body)
                rest = b""
                while b"\r\n\r\n" not in rest:
                    rest += s.recv(65536)
                return first, rest
            return first, None
        host = f"127.0.0.1:{self.srv.port}"
        body = b"x" * 100000
        h = self.raw.headers("PUT", "/b/e", body=body)
        h.pop("Expect", None)
        first, rest = exchange(h, body)
        self.assertTrue(first.startswith(b"HTTP/1.1 100 Continue"), first)
        self.assertTrue(rest.startswith(b"HTTP/1.1 200"), rest)
        # A bad signature is refused before the body is sent.
        h = self.raw.headers("PUT", "/b/e", body=body, secret="bad")
        first, rest = exchange(h, body)
        self.assertTrue(first.startswith(b"HTTP/1.1 403"), first)
        self.assertIn(b"Connection: close", first)
        self.assertEqual(self.srv.requests()[-1]["outcome"], "early-reject")

    def test_conditional_writes(self):
        def put(key, body, **headers):
            return self.raw.send("PUT", "/b/" + key, body=body,
                                 headers=headers)
        self.assertEqual(put("c", b"1", **{"If-None-Match": "*"})[0], 200)
        self.expect(put("c", b"2", **{"If-None-Match": "*"}), 412,
                    "PreconditionFailed")
        etag = self.srv.objects("b")["c"]["etag"]
        self.expect(put("c", b"3", **{"If-Match": '"0000"'}), 412,
                    "PreconditionFailed")
        self.assertEqual(put("c", b"3", **{"If-Match": etag})[0], 200)
        # If-Match on a missing key: S3 answers 404 NoSuchKey, not 412.
        self.expect(put("missing", b"3", **{"If-Match": etag}), 404,
                    "NoSuchKey")
        self.expect(put("c", b"4", **{"If-None-Match": '"abc"'}), 501,
                    "NotImplemented")
        self.assertEqual(self.srv.get_object_bytes("b", "c"), b"3")
        # Conditional delete.
        etag = self.srv.objects("b")["c"]["etag"]
        self.expect(self.raw.send("DELETE", "/b/c", headers={
            "If-Match": '"0000"'}), 412, "PreconditionFailed")
        self.assertEqual(self.raw.send("DELETE", "/b/c", headers={
            "If-Match": etag})[0], 204)
        self.expect(self.raw.send("DELETE", "/b/c", headers={
            "If-Match": etag}), 404, "NoSuchKey")
        self.assertEqual(self.raw.send("DELETE", "/b/c")[0], 204)

    def test_a_delete_during_a_conditional_write_is_a_409(self):
        # If-None-Match: * whose body is still arriving when a delete of
        # the key lands: S3 answers 409 ConditionalRequestConflict.
        self.srv.put_object("b", "race", b"old")
        body = b"n" * 1000
        h = self.raw.headers("PUT", "/b/race", body=body,
                             headers={"If-None-Match": "*"})
        s = socket.create_connection(("127.0.0.1", self.srv.port), timeout=5)
        self.addCleanup(s.close)
        head = "".join(f"{k}: {v}\r\n" for k, v in h.items())
        s.sendall(f"PUT /b/race HTTP/1.1\r\nHost: 127.0.0.1:{self.srv.port}"
                  f"\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
                  + body[:10])
        # Once the server reads the body it has noted the key's state.
        self.assertTrue(self.srv.wait_for(
            lambda: [e["phase"] for e in self.srv.requests()] == ["body"]))
        self.srv.delete_object("b", "race")
        s.sendall(body[10:])
        answer = b""
        while b"</Error>" not in answer:
            chunk = s.recv(65536)
            self.assertTrue(chunk, answer)
            answer += chunk
        self.assertTrue(answer.startswith(b"HTTP/1.1 409"), answer)
        self.assertEqual(error_code(answer), "ConditionalRequestConflict")

    def test_hostile_input_gets_s3_errors(self):
        # Bad percent-encoding, an overlong key, odd ranges.
        st, _, body = self.raw.send_raw("GET", "/b/%FF%FE", {})
        self.assertEqual((st, error_code(body)), (400, "InvalidURI"))
        self.expect(self.raw.send("PUT", "/b/" + "k" * 1025, body=b""), 400,
                    "KeyTooLongError")
        self.srv.put_object("b", "r", b"0123456789")
        for rng, want in (("bytes=2-4", (206, b"234")),
                          ("bytes=-3", (206, b"789")),
                          ("bytes=7-", (206, b"789")),
                          ("bytes=8-100", (206, b"89")),
                          ("bytes=5-3", (200, b"0123456789")),
                          ("bytes=abc", (200, b"0123456789")),
                          ("bytes=0-1,4-5", (200, b"0123456789"))):
            st, _, body = self.raw.send("GET", "/b/r", headers={
                "Range": rng})
            self.assertEqual((st, body), want, rng)
        self.expect(self.raw.send("GET", "/b/r", headers={
            "Range": "bytes=10-"}), 416, "InvalidRange")
        # XML: not XML, an entity bomb, the wrong root, no Content-MD5.
        for doc in (b"<Delete><Object><Key>x", b"\xff\xfe garbage",
                    b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaa">'
                    b']><Delete><Object><Key>&a;</Key></Object></Delete>',
                    b"<Other/>", b"<Delete/>"):
            md5 = base64.b64encode(hashlib.md5(doc).digest()).decode()
            self.expect(self.raw.send("POST", "/b", "delete", body=doc,
                                      headers={"Content-MD5": md5}),
                        400, "MalformedXML")
        self.expect(self.raw.send("POST", "/b", "delete",
                                  body=b"<Delete/>"), 400, "InvalidRequest")
        # Broken HTTP framing: an error, then the connection closes.
        s = socket.create_connection(("127.0.0.1", self.srv.port), timeout=5)
        self.addCleanup(s.close)
        s.sendall(b"PUT /b/x HTTP/1.1\r\nHost: h\r\nContent-Length: -5\r\n"
                  b"\r\n")
        answer = s.recv(65536)
        self.assertTrue(answer.startswith(b"HTTP/1.1 400"), answer)
        s2 = socket.create_connection(("127.0.0.1", self.srv.port),
                                      timeout=5)
        self.addCleanup(s2.close)
        s2.sendall(b"GET /b/x NOT-HTTP\r\n\r\n")
        self.assertTrue(s2.recv(65536).startswith(b"HTTP/1.1 400"))
        # Unimplemented things say so.
        self.expect(self.raw.send("GET", "/b/r", "tagging"), 501,
                    "NotImplemented")
        self.expect(self.raw.send("PUT", "/b/copy", headers={
            "x-amz-copy-source": "/b/r"}), 501, "NotImplemented")
        self.expect(self.raw.send("GET", "/nobucket/k"), 404, "NoSuchBucket")
        # Every error above left the server healthy.
        self.assertEqual(self.raw.send("GET", "/b/r")[0], 200)

    def test_mutated_requests_never_hang_or_crash(self):
        # Valid signed requests with random bytes changed, cut or inserted:
        # every one gets an HTTP answer or a closed connection, and none
        # reaches the fake's InternalError (a bug) path.
        import random
        rnd = random.Random(1)
        port = self.srv.port
        seeds = []
        for method, path, query, body, extra in (
                ("PUT", "/b/fz", "", b"0123456789" * 20, {}),
                ("POST", "/b", "delete", b"<Delete><Object><Key>a</Key>"
                 b"</Object></Delete>", {"Content-MD5": "x"}),
                ("GET", "/b", "list-type=2&prefix=a&max-keys=3", b"", {}),
                ("POST", "/b/fz", "uploadId=abc", b"<CompleteMultipartUpload>"
                 b"<Part><PartNumber>1</PartNumber><ETag>x</ETag></Part>"
                 b"</CompleteMultipartUpload>", {}),
                ("GET", "/b/fz", "", b"", {"Range": "bytes=1-5"})):
            h = self.raw.headers(method, path, query, extra, body)
            h["Host"] = f"127.0.0.1:{port}"
            h["Content-Length"] = str(len(body))
            target = path + ("?" + query if query else "")
            seeds.append((f"{method} {target} HTTP/1.1\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode()
                + body)
        for i in range(150):
            req = bytearray(rnd.choice(seeds))
            for _ in range(rnd.randint(1, 4)):
                op, at = rnd.randrange(3), rnd.randrange(len(req))
                if op == 0:
                    req[at] = rnd.randrange(256)
                elif op == 1:
                    del req[at:at + rnd.randint(1, 40)]
                else:
                    req[at:at] = bytes(rnd.randrange(256)
                                       for _ in range(rnd.randint(1, 8)))
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            try:
                s.sendall(bytes(req))
                s.shutdown(socket.SHUT_WR)
                answer = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            except ConnectionResetError:
                answer = b""
            finally:
                s.close()
            self.assertTrue(answer == b"" or answer.startswith(b"HTTP/1.1 "),
                            (i, bytes(req), answer))
        self.assertEqual([e for e in self.srv.requests()
                          if e["error"] == "InternalError"], [])
        self.assertTrue(self.srv.wait_for("idle"))

    def test_multipart_rules(self):
        raw = self.raw
        st, _, body = raw.send("POST", "/b/mp", "uploads", headers={
            "x-amz-checksum-algorithm": "CRC32C"})
        self.assertEqual(st, 200, body)
        uid = re.search(rb"<UploadId>([^<]+)<", body).group(1).decode()
        q = f"partNumber=%d&uploadId={uid}"
        parts = [b"a" * (5 * MiB), b"b" * (5 * MiB), b"c" * 100]
        etags = []
        for n, data in enumerate(parts, 1):
            # The upload was created with CRC32C: parts need the checksum.
            if n == 1:
                self.expect(raw.send("PUT", "/b/mp", q % n, body=data), 400,
                            "InvalidRequest")
            st, h, body = raw.send("PUT", "/b/mp", q % n, body=data, headers={
                "x-amz-checksum-crc32c": b64crc32c(data)})
            self.assertEqual(st, 200, body)
            etags.append(h["etag"])
        for bad in ("0", "10001", "x"):
            self.expect(raw.send("PUT", "/b/mp", f"partNumber={bad}&"
                                 f"uploadId={uid}", body=b"z"), 400,
                        "InvalidArgument")
        self.expect(raw.send("PUT", "/b/mp", "partNumber=1&uploadId=nope",
                             body=b"z"), 404, "NoSuchUpload")
        self.assertEqual(len(self.srv.uploads("b")[0]["parts"]), 3)

        def complete(items, **headers):
            xml = "<CompleteMultipartUpload>" + "".join(
                f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag>"
                f"<ChecksumCRC32C>{c}</ChecksumCRC32C></Part>"
                for n, e, c in items) + "</CompleteMultipartUpload>"
            return raw.send("POST", "/b/mp", f"uploadId={uid}",
                            body=xml.encode(), headers=headers)
        crcs = [b64crc32c(p) for p in parts]
        items = list(zip((1, 2, 3), etags, crcs))
        self.expect(complete([items[1], items[0], items[2]]), 400,
                    "InvalidPartOrder")
        self.expect(complete([(1, '"0000"', crcs[0])] + items[1:]), 400,
                    "InvalidPart")
        self.expect(complete([items[0], (4, etags[0], crcs[0])]), 400,
                    "InvalidPart")
        # Part 3 (100 bytes) may be last, but not in the middle.
        small_first = [(3, etags[2], crcs[2])]
        st, _, body = raw.send("PUT", "/b/mp", q % 4, body=b"d", headers={
            "x-amz-checksum-crc32c": b64crc32c(b"d")})
        self.expect(complete(small_first + [(4, '"' + hashlib.md5(
            b"d").hexdigest() + '"', b64crc32c(b"d"))]), 400,
            "EntityTooSmall")
        self.srv.put_object("b", "mp", b"exists")
        self.expect(complete(items, **{"If-None-Match": "*"}), 412,
                    "PreconditionFailed")
        st, _, body = complete(items)
        self.assertEqual(st, 200, body)
        info = self.srv.objects("b")["mp"]
        want_etag = hashlib.md5(b"".join(hashlib.md5(p).digest()
                                         for p in parts)).hexdigest()
        self.assertEqual(info["etag"], f'"{want_etag}-3"')
        raw_crcs = b"".join(base64.b64decode(c) for c in crcs)
        self.assertEqual(info["crc32c"], b64crc32c(raw_crcs) + "-3")
        self.assertEqual(info["checksum_type"], "COMPOSITE")
        self.assertEqual(self.srv.get_object_bytes("b", "mp"),
                         b"".join(parts))
        self.assertEqual(self.srv.uploads(), [])
        self.expect(complete(items), 404, "NoSuchUpload")

    def test_delete_during_multipart_then_conditional_complete_is_409(self):
        self.srv.put_object("b", "k", b"old")
        st, _, body = self.raw.send("POST", "/b/k", "uploads")
        uid = re.search(rb"<UploadId>([^<]+)<", body).group(1).decode()
        st, h, _ = self.raw.send("PUT", "/b/k", f"partNumber=1&uploadId={uid}",
                                 body=b"new")
        self.srv.delete_object("b", "k")
        xml = (f"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>"
               f"<ETag>{h['etag']}</ETag></Part></CompleteMultipartUpload>")
        self.expect(self.raw.send("POST", "/b/k", f"uploadId={uid}",
                                  body=xml.encode(),
                                  headers={"If-None-Match": "*"}),
                    409, "ConditionalRequestConflict")

    def test_wrong_region_bucket(self):
        self.srv.create_bucket("eu", region="eu-west-1")
        h, body = self.expect(self.raw.send("GET", "/eu/k"), 400,
                              "AuthorizationHeaderMalformed")
        self.assertEqual(h["x-amz-bucket-region"], "eu-west-1")
        self.assertIn(b"<Region>eu-west-1</Region>", body)
        st, h, _ = self.raw.send("HEAD", "/eu")
        self.assertEqual((st, h["x-amz-bucket-region"]), (400, "eu-west-1"))
        self.assertEqual(self.raw.send("GET", "/eu/k",
                                       region="eu-west-1")[0], 404)
        # GetBucketLocation may be signed for us-east-1.
        st, _, body = self.raw.send("GET", "/eu", "location")
        self.assertEqual(st, 200)
        self.assertIn(b">eu-west-1</LocationConstraint>", body)

    def test_faults(self):
        srv, raw = self.srv, self.raw
        srv.fault("put", code=503, count=2)
        self.expect(raw.send("PUT", "/b/f", body=b"1"), 503, "SlowDown")
        self.expect(raw.send("PUT", "/b/f", body=b"1"), 503, "SlowDown")
        self.assertEqual(raw.send("PUT", "/b/f", body=b"1")[0], 200)
        srv.fault("get", code=500, error="InternalError")
        self.expect(raw.send("GET", "/b/f"), 500, "InternalError")
        srv.fault("get", reset=True)
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            raw.send("GET", "/b/f")
        srv.put_object("b", "big", b"z" * 100000)
        srv.fault("get", after_bytes=1000)
        with self.assertRaises((ConnectionError,
                                http.client.IncompleteRead)):
            raw.send("GET", "/b/big")
        srv.fault("put", after_bytes=10, key_prefix="up")
        with self.assertRaises((ConnectionError, http.client.HTTPException,
                                BrokenPipeError)):
            raw.send("PUT", "/b/up", body=b"u" * 200000)
        self.assertNotIn("up", srv.objects("b"))
        # A lost answer: the write lands, the client sees a 500.
        srv.fault("put", code=500, after_commit=True)
        self.expect(raw.send("PUT", "/b/lost", body=b"L"), 500,
                    "InternalError")
        self.assertEqual(srv.get_object_bytes("b", "lost"), b"L")
        srv.fault("any", delay=0.2)
        t0 = time.monotonic()
        self.assertEqual(raw.send("GET", "/b/lost")[0], 200)
        self.assertGreaterEqual(time.monotonic() - t0, 0.2)
        self.assertEqual(srv.faults(), [])
        outcomes = [e["outcome"] for e in srv.requests()]
        self.assertEqual(outcomes.count("reset"), 3)
        self.assertEqual(srv.hits("put"), 5)
        self.assertEqual(srv.log()[0][:2], ("PUT", "/b/f"))
        self.assertEqual(srv.log()[0].status, 503)


# ---------------------------------------------------------------- AWS examples
@unittest.skipUnless(crc32c is not None, "python3-crc32c missing")
class AwsPublishedExamplesTest(unittest.TestCase):
    """AWS's own SigV4 examples, byte for byte: the signatures were computed
    by AWS, not by any client here."""

    def setUp(self):
        self.srv = FakeS3Server(buckets=("examplebucket",),
                                credentials={EX_AKID: EX_SECRET},
                                vhost_suffixes=("s3.amazonaws.com",),
                                clock=lambda: EX_TIME).start()
        self.addCleanup(self.srv.stop)
        self.raw = Raw(self.srv)

    def auth(self, signed, sig):
        return (f"AWS4-HMAC-SHA256 Credential={EX_SCOPE},SignedHeaders="
                f"{signed},Signature={sig}")

    def test_header_auth_examples(self):
        self.srv.put_object("examplebucket", "test.txt", b"x" * 20)
        st, _, body = self.raw.send_raw("GET", "/test.txt", {
            "Host": "examplebucket.s3.amazonaws.com", "Range": "bytes=0-9",
            "x-amz-content-sha256": fake_s3.EMPTY_SHA256,
            "x-amz-date": "20130524T000000Z",
            "Authorization": self.auth(
                "host;range;x-amz-content-sha256;x-amz-date",
                "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036"
                "bdb41")})
        self.assertEqual((st, body), (206, b"x" * 10))
        st, _, body = self.raw.send_raw("PUT", "/test%24file.text", {
            "Host": "examplebucket.s3.amazonaws.com",
            "Date": "Fri, 24 May 2013 00:00:00 GMT",
            "x-amz-date": "20130524T000000Z",
            "x-amz-storage-class": "REDUCED_REDUNDANCY",
            "x-amz-content-sha256": "44ce7dd67c959e0d3524ffac1771dfbba87d2b6"
                                    "b4b4e99e42034a8b803f8b072",
            "Authorization": self.auth(
                "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-"
                "class", "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5"
                "971af0ece108bd")}, b"Welcome to Amazon S3.")
        self.assertEqual(st, 200, body)
        self.assertEqual(self.srv.get_object_bytes("examplebucket",
                                                   "test$file.text"),
                         b"Welcome to Amazon S3.")
        empty = {"Host": "examplebucket.s3.amazonaws.com",
                 "x-amz-content-sha256": fake_s3.EMPTY_SHA256,
                 "x-amz-date": "20130524T000000Z"}
        # GET ?lifecycle: the signature holds; the sub-resource is a 501.
        st, _, body = self.raw.send_raw("GET", "/?lifecycle", dict(
            empty, Authorization=self.auth(
                "host;x-amz-content-sha256;x-amz-date",
                "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a01367"
                "83543")))
        self.assertEqual((st, error_code(body)), (501, "NotImplemented"))
        st, _, body = self.raw.send_raw("GET", "/?max-keys=2&prefix=J", dict(
            empty, Authorization=self.auth(
                "host;x-amz-content-sha256;x-amz-date",
                "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69"
                "dc6f7")))
        self.assertEqual(st, 200, body)
        # One character different: refused.
        st, _, body = self.raw.send_raw("GET", "/?max-keys=3&prefix=J", dict(
            empty, Authorization=self.auth(
                "host;x-amz-content-sha256;x-amz-date",
                "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69"
                "dc6f7")))
        self.assertEqual((st, error_code(body)),
                         (403, "SignatureDoesNotMatch"))

    def test_presigned_example(self):
        self.srv.put_object("examplebucket", "test.txt", b"presigned")
        target = ("/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-"
                  "Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2F"
                  "s3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-"
                  "Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature="
                  "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f"
                  "604d404")
        host = {"Host": "examplebucket.s3.amazonaws.com"}
        self.assertEqual(self.raw.send_raw("GET", target, host)[:3:2],
                         (200, b"presigned"))
        st, _, body = self.raw.send_raw("GET", target.replace("86400",
                                                              "86401"), host)
        self.assertEqual((st, error_code(body)),
                         (403, "SignatureDoesNotMatch"))
        self.srv.clock = lambda: EX_TIME + 86401
        st, _, body = self.raw.send_raw("GET", target, host)
        self.assertEqual((st, error_code(body)), (403, "AccessDenied"))
        self.assertIn(b"Request has expired", body)

    def streaming(self, seed, signed, trailer, chunk_sigs, trailer_text=b""):
        body = (b"10000;chunk-signature=" + chunk_sigs[0] + b"\r\n" +
                b"a" * 65536 + b"\r\n400;chunk-signature=" + chunk_sigs[1] +
                b"\r\n" + b"a" * 1024 + b"\r\n0;chunk-signature=" +
                chunk_sigs[2] + b"\r\n" + trailer_text + b"\r\n")
        headers = {"Host": "s3.amazonaws.com",
                   "x-amz-date": "20130524T000000Z",
                   "x-amz-storage-class": "REDUCED_REDUNDANCY",
                   "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-"
                                           "PAYLOAD" + trailer,
                   "Content-Encoding": "aws-chunked",
                   "x-amz-decoded-content-length": "66560",
                   "Authorization": self.auth(signed, seed)}
        if trailer:
            headers["x-amz-trailer"] = "x-amz-checksum-crc32c"
        return self.raw.send_raw("PUT", "/examplebucket/chunkObject.txt",
                                 headers, body)

    def test_streaming_examples(self):
        sigs = [b"ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a"
                b"288648", b"0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7"
                b"d234b86a503ef5497", b"b6c6ea8a5354eaf15b3cb7646744f4275b71"
                b"ea724fed81ceb9323e279d449df9"]
        signed = ("content-encoding;content-length;host;x-amz-content-sha256;"
                  "x-amz-date;x-amz-decoded-content-length;"
                  "x-amz-storage-class")
        seed = ("4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa"
                "80a0a9")
        st, _, body = self.streaming(seed, signed, "", sigs)
        self.assertEqual(st, 200, body)
        self.assertEqual(self.srv.get_object_bytes(
            "examplebucket", "chunkObject.txt"), b"a" * 66560)
        # A chunk signature one digit off.
        bad = [sigs[0], sigs[1][:-1] + b"0", sigs[2]]
        st, _, body = self.streaming(seed, signed, "", bad)
        self.assertEqual((st, error_code(body)),
                         (403, "SignatureDoesNotMatch"))

    def test_streaming_trailer_example(self):
        sigs = [b"b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501"
                b"ef5aa2", b"1c1344b170168f8e65b41376b44b20fe354e373826ccbbe"
                b"2c1d40a8cae51e5c7", b"2ca2aba2005185cf7159c6277faf83795951"
                b"dd77a3a99e6e65d5c9f85863f992"]
        signed = ("content-encoding;host;x-amz-content-sha256;x-amz-date;"
                  "x-amz-decoded-content-length;x-amz-storage-class;"
                  "x-amz-trailer")
        seed = ("106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544"
                "bfeb8e")
        trailer = (b"x-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-"
                   b"signature:d81f82fc3505edab99d459891051a732e8730629a2e4a"
                   b"59689829ca17fe2e435\r\n")
        st, _, body = self.streaming(seed, signed, "-TRAILER", sigs, trailer)
        self.assertEqual(st, 200, body)
        info = self.srv.objects("examplebucket")["chunkObject.txt"]
        self.assertEqual((info["size"], info["crc32c"]), (66560, "sOO8/Q=="))
        st, _, body = self.streaming(seed, signed, "-TRAILER", sigs,
                                     trailer.replace(b"sOO8", b"sOO9"))
        self.assertEqual((st, error_code(body)),
                         (403, "SignatureDoesNotMatch"))


# ---------------------------------------------------------------- boto3
@unittest.skipUnless(HAVE_BOTO, "python3-boto3 is not installed")
class Boto3Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fake-s3-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.srv = FakeS3Server(buckets=("b",), credentials={
            AKID: SECRET, TEMP_AKID: (TEMP_SECRET, TOKEN)}).start()
        self.addCleanup(self.srv.stop)
        self.s3 = self.client()

    def client(self, secret=SECRET, akid=AKID, token=None, retries=1,
               region="us-east-1", **config):
        c = boto3.client(
            "s3", endpoint_url=self.srv.endpoint, region_name=region,
            aws_access_key_id=akid, aws_secret_access_key=secret,
            aws_session_token=token,
            config=Config(s3={"addressing_style": "path"},
                          retries={"max_attempts": retries,
                                   "mode": "standard"}, **config))
        self.addCleanup(c.close)
        return c

    def code(self, call, *args, **kw):
        with self.assertRaises(ClientError) as cm:
            call(*args, **kw)
        return (cm.exception.response["ResponseMetadata"]["HTTPStatusCode"],
                cm.exception.response["Error"]["Code"])

    def test_objects_round_trip(self):
        keys = ["plain", "with space", "plus+sign", "pct%20literal",
                "ünïcødé/日本", "dir/sub/file.bin", "tilde~and=eq&amp"]
        for i, k in enumerate(keys):
            r = self.s3.put_object(Bucket="b", Key=k, Body=f"v{i}".encode(),
                                   ContentType="text/x-test",
                                   Metadata={"m": str(i)})
            self.assertEqual(r["ETag"], '"%s"' % hashlib.md5(
                f"v{i}".encode()).hexdigest())
        for i, k in enumerate(keys):
            g = self.s3.get_object(Bucket="b", Key=k)
            self.assertEqual(g["Body"].read(), f"v{i}".encode())
            self.assertEqual((g["ContentType"], g["Metadata"]),
                             ("text/x-test", {"m": str(i)}))
            h = self.s3.head_object(Bucket="b", Key=k)
            self.assertEqual(h["ContentLength"], 2)
        self.assertEqual(sorted(self.srv.objects("b")), sorted(keys))
        listed = [o["Key"] for o in self.s3.list_objects_v2(
            Bucket="b")["Contents"]]
        self.assertEqual(listed, sorted(keys))
        r = self.s3.list_objects_v2(Bucket="b", Delimiter="/")
        self.assertEqual([p["Prefix"] for p in r["CommonPrefixes"]],
                         ["dir/", "ünïcødé/"])
        self.assertEqual(self.code(self.s3.head_object, Bucket="b",
                                   Key="nope"), (404, "404"))
        self.assertEqual(self.code(self.s3.get_object, Bucket="b",
                                   Key="nope"), (404, "NoSuchKey"))
        self.assertEqual(self.code(self.s3.get_object, Bucket="nob",
                                   Key="x"), (404, "NoSuchBucket"))
        self.assertEqual(self.s3.get_object(Bucket="b", Key="plain",
                                            Range="bytes=1-")["Body"].read(),
                         b"0")
        self.assertEqual(self.code(self.s3.get_object, Bucket="b",
                                   Key="plain", Range="bytes=5-"),
                         (416, "InvalidRange"))
        r = self.s3.delete_objects(Bucket="b", Delete={"Objects": [
            {"Key": "plain"}, {"Key": "never-existed"}]})
        self.assertEqual(sorted(d["Key"] for d in r["Deleted"]),
                         ["never-existed", "plain"])
        r = self.s3.delete_objects(Bucket="b", Delete={
            "Objects": [{"Key": "with space"}], "Quiet": True})
        self.assertNotIn("Deleted", r)
        self.s3.delete_object(Bucket="b", Key="plus+sign")
        self.s3.delete_object(Bucket="b", Key="plus+sign")   # 204 again
        self.assertEqual(len(self.srv.objects("b")), len(keys) - 3)
        self.assertEqual([b["Name"] for b in
                          self.s3.list_buckets()["Buckets"]], ["b"])
        self.s3.head_bucket(Bucket="b")

    def test_paging_2500_keys(self):
        for i in range(2500):
            self.srv.put_object("b", f"k/{i:05d}", b"")
        pages = list(self.s3.get_paginator("list_objects_v2").paginate(
            Bucket="b", PaginationConfig={"PageSize": 1000}))
        self.assertEqual([p["KeyCount"] for p in pages], [1000, 1000, 500])
        keys = [o["Key"] for p in pages for o in p["Contents"]]
        self.assertEqual(keys, [f"k/{i:05d}" for i in range(2500)])
        # MaxKeys above 1000 is capped.
        r = self.s3.list_objects_v2(Bucket="b", MaxKeys=5000)
        self.assertEqual((r["KeyCount"], r["IsTruncated"]), (1000, True))
        r = self.s3.list_objects_v2(Bucket="b", StartAfter="k/02497")
        self.assertEqual([o["Key"] for o in r["Contents"]],
                         ["k/02498", "k/02499"])
        # v1 listing with markers, and prefixes rolled up across pages.
        for d in ("a", "b", "c"):
            self.srv.put_object("b", f"x/{d}/1", b"")
            self.srv.put_object("b", f"x/{d}/2", b"")
        pages = list(self.s3.get_paginator("list_objects_v2").paginate(
            Bucket="b", Prefix="x/", Delimiter="/",
            PaginationConfig={"PageSize": 2}))
        self.assertEqual([c["Prefix"] for p in pages
                          for c in p.get("CommonPrefixes", [])],
                         ["x/a/", "x/b/", "x/c/"])
        pages = list(self.s3.get_paginator("list_objects").paginate(
            Bucket="b", Prefix="x/", Delimiter="/",
            PaginationConfig={"PageSize": 2}))
        self.assertEqual([c["Prefix"] for p in pages
                          for c in p.get("CommonPrefixes", [])],
                         ["x/a/", "x/b/", "x/c/"])

    def test_multipart_upload_file_and_download(self):
        src = os.path.join(self.tmp, "big.bin")
        data = os.urandom(20 * MiB + 12345)
        with open(src, "wb") as f:
            f.write(data)
        cfg = TransferConfig(multipart_threshold=8 * MiB,
                             multipart_chunksize=5 * MiB, max_concurrency=4)
        self.s3.upload_file(src, "b", "big.bin", Config=cfg)
        self.assertEqual(self.srv.hits("upload_part"), 5)
        info = self.srv.objects("b")["big.bin"]
        self.assertTrue(info["etag"].endswith('-5"'), info)
        self.assertEqual(self.srv.get_object_bytes("b", "big.bin"), data)
        self.assertEqual(self.srv.uploads(), [])
        dst = os.path.join(self.tmp, "big.out")
        self.s3.download_file("b", "big.bin", dst, Config=cfg)
        with open(dst, "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertGreaterEqual(self.srv.hits("get"), 2)   # ranged GETs

    def test_crc32c_checksums(self):
        r = self.s3.put_object(Bucket="b", Key="c", Body=b"checksummed",
                               ChecksumAlgorithm="CRC32C")
        self.assertEqual(r["ChecksumCRC32C"], b64crc32c(b"checksummed"))
        g = self.s3.get_object(Bucket="b", Key="c", ChecksumMode="ENABLED")
        self.assertEqual(g["Body"].read(), b"checksummed")
        self.assertEqual(g["ChecksumCRC32C"], b64crc32c(b"checksummed"))
        # botocore really checks it: a wrong stored value makes it fail.
        with self.srv._lock:
            self.srv._buckets["b"].objects["c"].checksums["crc32c"] = \
                b64crc32c(b"something else")
        g = self.s3.get_object(Bucket="b", Key="c", ChecksumMode="ENABLED")
        with self.assertRaises(botocore.exceptions.FlexibleChecksumError):
            g["Body"].read()
        # Multipart with CRC32C parts: the composite "CRC-N".
        mp = self.s3.create_multipart_upload(Bucket="b", Key="m",
                                             ChecksumAlgorithm="CRC32C")
        parts = [os.urandom(5 * MiB), os.urandom(1000)]
        done = []
        for n, p in enumerate(parts, 1):
            r = self.s3.upload_part(Bucket="b", Key="m", PartNumber=n,
                                    UploadId=mp["UploadId"], Body=p,
                                    ChecksumAlgorithm="CRC32C")
            done.append({"PartNumber": n, "ETag": r["ETag"],
                         "ChecksumCRC32C": r["ChecksumCRC32C"]})
        listed = self.s3.list_parts(Bucket="b", Key="m",
                                    UploadId=mp["UploadId"])
        self.assertEqual([p["ChecksumCRC32C"] for p in listed["Parts"]],
                         [b64crc32c(p) for p in parts])
        r = self.s3.complete_multipart_upload(
            Bucket="b", Key="m", UploadId=mp["UploadId"],
            MultipartUpload={"Parts": done})
        want = b64crc32c(b"".join(base64.b64decode(d["ChecksumCRC32C"])
                                  for d in done)) + "-2"
        self.assertEqual(r["ChecksumCRC32C"], want)
        h = self.s3.head_object(Bucket="b", Key="m", ChecksumMode="ENABLED")
        self.assertEqual(h["ChecksumCRC32C"], want)
        g = self.s3.get_object(Bucket="b", Key="m", ChecksumMode="ENABLED")
        self.assertEqual(g["Body"].read(), b"".join(parts))

    def test_aws_chunked_trailer_as_botocore_sends_it_over_https(self):
        # Over https botocore sends flexible checksums as an unsigned
        # aws-chunked body with the checksum in a trailer (HTTP chunked,
        # STREAMING-UNSIGNED-PAYLOAD-TRAILER); over http it puts them in a
        # header. Flip botocore's own decision to "trailer" so its encoder
        # and signer produce exactly the https request, over http.
        c = self.client()

        def as_https(params, **_):
            algo = params["context"].get("checksum", {}).get(
                "request_algorithm")
            if isinstance(algo, dict):
                algo["in"] = "trailer"
        for op in ("PutObject", "UploadPart"):
            c.meta.events.register(f"before-call.s3.{op}", as_https)
        data = os.urandom(3 * MiB + 7)
        r = c.put_object(Bucket="b", Key="tr", Body=data,
                         ChecksumAlgorithm="CRC32C")
        self.assertEqual(r["ChecksumCRC32C"], b64crc32c(data))
        sent = self.srv.requests()[-1]["headers"]
        self.assertEqual((sent["x-amz-content-sha256"],
                          sent["content-encoding"], sent["transfer-encoding"],
                          sent["x-amz-trailer"],
                          sent["x-amz-decoded-content-length"]),
                         ("STREAMING-UNSIGNED-PAYLOAD-TRAILER", "aws-chunked",
                          "chunked", "x-amz-checksum-crc32c", str(len(data))))
        self.assertEqual(self.srv.get_object_bytes("b", "tr"), data)
        self.assertEqual(self.srv.objects("b")["tr"]["crc32c"],
                         b64crc32c(data))
        mp = c.create_multipart_upload(Bucket="b", Key="trm",
                                       ChecksumAlgorithm="CRC32C")
        r = c.upload_part(Bucket="b", Key="trm", PartNumber=1, Body=data,
                          UploadId=mp["UploadId"], ChecksumAlgorithm="CRC32C")
        self.assertEqual(r["ChecksumCRC32C"], b64crc32c(data))
        # A trailer that does not match the body.
        raw = Raw(self.srv)
        body = (b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32c:" +
                b64crc32c(b"other").encode() + b"\r\n\r\n")
        trailer_headers = {"Content-Encoding": "aws-chunked",
                           "x-amz-decoded-content-length": "5",
                           "x-amz-trailer": "x-amz-checksum-crc32c"}

        def send(body, headers):
            req = AWSRequest(method="PUT", url=self.srv.endpoint + "/b/bad",
                             data=body, headers=headers)
            req.context["checksum"] = {"request_algorithm": {
                "in": "trailer", "algorithm": "crc32c",
                "name": "x-amz-checksum-crc32c"}}
            S3SigV4Auth(Credentials(AKID, SECRET), "s3",
                        "us-east-1").add_auth(req)
            return raw.send_raw("PUT", "/b/bad", dict(req.headers.items()),
                                body)
        st, _, answer = send(body, trailer_headers)
        self.assertEqual((st, error_code(answer)), (400, "BadDigest"))
        st, _, answer = send(b"5\r\nhello\r\n0\r\n\r\n", trailer_headers)
        self.assertEqual((st, error_code(answer)),
                         (400, "MalformedTrailerError"))
        st, _, answer = send(body.replace(b"5\r\nhello", b"4\r\nhello"),
                             trailer_headers)
        self.assertEqual((st, error_code(answer)), (400, "IncompleteBody"))
        self.assertNotIn("bad", self.srv.objects("b"))

    def hook_headers(self, client, op, headers):
        def add(request, **_):
            for k, v in headers.items():
                request.headers[k] = v
        client.meta.events.register(f"before-sign.s3.{op}", add)

    def test_conditional_writes_through_boto3(self):
        # botocore 1.29 predates IfNoneMatch/IfMatch: the headers go in
        # through a before-sign hook, so they are signed like the rest.
        c = self.client()
        self.hook_headers(c, "PutObject", {"If-None-Match": "*"})
        c.put_object(Bucket="b", Key="once", Body=b"1")
        self.assertEqual(self.code(c.put_object, Bucket="b", Key="once",
                                   Body=b"2"), (412, "PreconditionFailed"))
        self.assertEqual(self.srv.get_object_bytes("b", "once"), b"1")
        c2 = self.client()
        self.hook_headers(c2, "PutObject", {"If-Match": '"0123"'})
        self.assertEqual(self.code(c2.put_object, Bucket="b", Key="once",
                                   Body=b"2"), (412, "PreconditionFailed"))
        self.assertEqual(self.code(c2.put_object, Bucket="b", Key="absent",
                                   Body=b"2"), (404, "NoSuchKey"))
        # A lost answer, retried: the retry of a conditional create finds
        # the object it created itself and gets 412 (google-cloud-cpp's
        # lesson: recognise the commit that landed).
        c3 = self.client(retries=3)
        self.hook_headers(c3, "PutObject", {"If-None-Match": "*"})
        self.srv.fault("put", reset=True, after_commit=True)
        self.assertEqual(self.code(c3.put_object, Bucket="b", Key="lost",
                                   Body=b"L"), (412, "PreconditionFailed"))
        self.assertEqual(self.srv.get_object_bytes("b", "lost"), b"L")
        self.assertEqual(self.srv.hits("put"), 6)

    def test_auth_errors_and_session_tokens(self):
        self.assertEqual(self.code(self.client(secret="wrong").list_objects_v2,
                                   Bucket="b"),
                         (403, "SignatureDoesNotMatch"))
        self.assertEqual(self.code(self.client(akid="AKIDNOPE")
                                   .list_objects_v2, Bucket="b"),
                         (403, "InvalidAccessKeyId"))
        temp = self.client(akid=TEMP_AKID, secret=TEMP_SECRET, token=TOKEN)
        temp.put_object(Bucket="b", Key="t", Body=b"t")
        self.srv.add_credentials(TEMP_AKID, TEMP_SECRET, TOKEN,
                                 expires_at=time.time() - 1)
        self.assertEqual(self.code(temp.get_object, Bucket="b", Key="t"),
                         (400, "ExpiredToken"))
        # boto3 1.26 presigns with SigV2 unless told: S3 (and the fake)
        # refuse SigV2.
        sigv2 = self.s3.generate_presigned_url(
            "get_object", Params={"Bucket": "b", "Key": "t"}, ExpiresIn=60)
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(sigv2, timeout=10)
        self.assertEqual((cm.exception.code, error_code(cm.exception.read())),
                         (400, "InvalidRequest"))
        v4 = self.client(signature_version="s3v4")
        url = v4.generate_presigned_url(
            "get_object", Params={"Bucket": "b", "Key": "t"}, ExpiresIn=60)
        with urllib.request.urlopen(url, timeout=10) as r:
            self.assertEqual(r.read(), b"t")
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(url.replace("Signature=", "Signature=0"),
                                   timeout=10)
        self.assertEqual(cm.exception.code, 403)

    def test_region_redirect(self):
        # A bucket in another region: botocore reads the region from S3's
        # AuthorizationHeaderMalformed answer and signs again for it.
        self.srv.create_bucket("eu", region="eu-west-1")
        c = self.client(retries=3)
        c.put_object(Bucket="eu", Key="k", Body=b"eu")
        self.assertEqual(c.get_object(Bucket="eu", Key="k")["Body"].read(),
                         b"eu")
        self.assertEqual(c.get_bucket_location(Bucket="eu")
                         ["LocationConstraint"], "eu-west-1")

    def test_retries_through_faults(self):
        c = self.client(retries=5)
        self.srv.fault("put", code=503, count=2)
        c.put_object(Bucket="b", Key="r", Body=b"r")
        self.assertEqual(self.srv.hits("put"), 3)
        src = os.path.join(self.tmp, "retry.bin")
        data = os.urandom(11 * MiB)
        with open(src, "wb") as f:
            f.write(data)
        self.srv.fault("upload_part", after_bytes=MiB, count=1)
        self.srv.fault("complete", code=500, count=1)
        c.upload_file(src, "b", "retry.bin", Config=TransferConfig(
            multipart_threshold=8 * MiB, multipart_chunksize=5 * MiB))
        self.assertEqual(self.srv.get_object_bytes("b", "retry.bin"), data)
        self.assertEqual(self.srv.hits("upload_part"), 4)
        self.assertEqual(self.srv.hits("complete"), 2)
        self.srv.fault("get", code=503, count=1)
        dst = os.path.join(self.tmp, "retry.out")
        c.download_file("b", "retry.bin", dst)
        with open(dst, "rb") as f:
            self.assertEqual(f.read(), data)
        # A reset in the middle of a download body is NOT retried by this
        # Debian pairing: botocore 1.29 raises ResponseStreamingError, which
        # s3transfer 0.6.0 does not count as retryable (0.6.1 does).
        self.srv.fault("get", after_bytes=4096)
        with self.assertRaises(botocore.exceptions.ResponseStreamingError):
            c.download_file("b", "retry.bin", dst)


# ---------------------------------------------------------------- AWS CLI
@unittest.skipUnless(HAVE_BOTO, "python3-boto3 is not installed")
@unittest.skipUnless(AWS, "awscli (Debian package) is not installed")
class AwsCliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fake-s3-cli-")
        cls.srv = FakeS3Server(buckets=("cli",),
                               credentials={AKID: SECRET}).start()
        home = os.path.join(cls.tmp, "home")
        os.mkdir(home)
        cls.env = {"PATH": "/usr/bin:/bin", "HOME": home,
                   "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                   "AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET,
                   "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_CONFIG_FILE": os.devnull,
                   "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                   "AWS_EC2_METADATA_DISABLED": "true", "AWS_PAGER": "",
                   "AWS_MAX_ATTEMPTS": "1"}

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def aws(self, *args, check=True):
        p = subprocess.run([AWS, "--endpoint-url", self.srv.endpoint,
                            "--no-cli-pager", *args], env=self.env,
                           capture_output=True, timeout=120)
        if check and p.returncode != 0:
            self.fail(f"aws {' '.join(args)}: exit {p.returncode}\n"
                      f"{p.stderr.decode(errors='replace')}")
        return p

    def test_cp_ls_sync(self):
        srv = self.srv
        small = os.path.join(self.tmp, "small.txt")
        with open(small, "wb") as f:
            f.write(b"small file\n")
        big = os.path.join(self.tmp, "big.bin")
        big_data = os.urandom(20 * MiB)
        with open(big, "wb") as f:
            f.write(big_data)
        self.aws("s3", "cp", small, "s3://cli/one/small.txt")
        srv.reset_log()
        self.aws("s3", "cp", big, "s3://cli/one/big.bin")
        self.assertGreaterEqual(srv.hits("upload_part"), 3)
        self.assertEqual(srv.hits("complete"), 1)
        self.assertEqual(srv.get_object_bytes("cli", "one/big.bin"),
                         big_data)
        out = self.aws("s3", "ls", "--recursive", "s3://cli/").stdout
        self.assertIn(b"one/small.txt", out)
        self.assertIn(f"{20 * MiB} one/big.bin".encode(), out)
        down = os.path.join(self.tmp, "big.down")
        self.aws("s3", "cp", "s3://cli/one/big.bin", down)
        with open(down, "rb") as f:
            self.assertEqual(f.read(), big_data)

        # sync up a tree with awkward names, twice, then down.
        tree = os.path.join(self.tmp, "tree")
        names = [f"f{i:02d}.txt" for i in range(40)] + [
            "with space.txt", "plus+plus.txt", "ünïcødé.txt", "日本語.txt",
            "pct%41.txt", "sub dir/a b.txt", "sub dir/ü/deep.txt",
            "tilde~.txt", "semi;colon.txt", "amp&er.txt"]
        past = time.time() - 3600        # older than any LastModified
        for n in names:
            path = os.path.join(tree, n)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(f"content of {n}\n")
            os.utime(path, (past, past))
        self.aws("s3", "sync", tree, "s3://cli/tree/")
        stored = srv.objects("cli", "tree/")
        self.assertEqual(sorted(stored), sorted("tree/" + n for n in names))
        for n in names:
            self.assertEqual(srv.get_object_bytes("cli", "tree/" + n),
                             f"content of {n}\n".encode())
        srv.reset_log()
        out = self.aws("s3", "sync", tree, "s3://cli/tree/").stdout
        self.assertEqual((srv.hits("put"), out), (0, b""))
        back = os.path.join(self.tmp, "back")
        self.aws("s3", "sync", "s3://cli/tree/", back)
        for n in names:
            with open(os.path.join(back, n)) as f:
                self.assertEqual(f.read(), f"content of {n}\n")

    def test_s3api_checksums(self):
        path = os.path.join(self.tmp, "ck.txt")
        with open(path, "wb") as f:
            f.write(b"checked by the AWS CLI\n")
        out = json.loads(self.aws(
            "s3api", "put-object", "--bucket", "cli", "--key", "ck.txt",
            "--body", path, "--checksum-algorithm", "CRC32C").stdout)
        want = b64crc32c(b"checked by the AWS CLI\n")
        self.assertEqual(out["ChecksumCRC32C"], want)
        self.assertEqual(self.srv.objects("cli")["ck.txt"]["crc32c"], want)
        dst = os.path.join(self.tmp, "ck.out")
        out = json.loads(self.aws(
            "s3api", "get-object", "--bucket", "cli", "--key", "ck.txt",
            "--checksum-mode", "ENABLED", dst).stdout)
        self.assertEqual(out["ChecksumCRC32C"], want)
        with open(dst, "rb") as f:
            self.assertEqual(f.read(), b"checked by the AWS CLI\n")
        p = self.aws("s3api", "head-object", "--bucket", "cli", "--key",
                     "absent", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"404", p.stderr)


# ---------------------------------------------------------------- processes
def read_line(proc, timeout):
    """One stdout line of proc within timeout (select: no sleeping)."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1)
        if not chunk:
            return None
        buf += chunk
    return buf.decode()


@unittest.skipUnless(HAVE_BOTO, "python3-boto3 is not installed")
class ProcessTest(unittest.TestCase):
    def boto(self, endpoint, akid, secret):
        c = boto3.client("s3", endpoint_url=endpoint,
                         region_name="us-east-1", aws_access_key_id=akid,
                         aws_secret_access_key=secret,
                         config=Config(s3={"addressing_style": "path"},
                                       retries={"max_attempts": 1}))
        self.addCleanup(c.close)
        return c

    def spawn(self, argv):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE)

        def reap():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
        self.addCleanup(reap)
        return proc

    def test_serve_cli(self):
        tmp = tempfile.mkdtemp(prefix="fake-s3-serve-")
        self.addCleanup(shutil.rmtree, tmp)
        port_file = os.path.join(tmp, "port")
        proc = self.spawn(
            [sys.executable, os.path.join(HERE, "fake_s3.py"), "serve",
             "--port", "0", "--port-file", port_file, "--bucket", "p",
             "--bucket", "eu:eu-west-1", "--credentials", "AK:SK",
             "--credentials", "TK:TS:TOKEN"])
        line = read_line(proc, 10)
        m = re.fullmatch(r"fake-s3 listening on 127\.0\.0\.1:(\d+)\n",
                         line or "")
        self.assertTrue(m, line)
        with open(port_file) as f:
            self.assertEqual(f.read(), m.group(1) + "\n")
        c = self.boto(f"http://127.0.0.1:{m.group(1)}", "AK", "SK")
        c.put_object(Bucket="p", Key="k", Body=b"served")
        self.assertEqual(c.get_object(Bucket="p", Key="k")["Body"].read(),
                         b"served")
        self.assertEqual(c.get_bucket_location(Bucket="eu")
                         ["LocationConstraint"], "eu-west-1")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(10), 0)

    @unittest.skipUnless(NODE and os.path.isdir(
        os.path.join(NODE_DIR, "node_modules", "s3rver")),
        "node or tests/fakes/node/node_modules/s3rver missing (npm ci in "
        "tests/fakes/node)")
    def test_s3rver_script(self):
        tmp = tempfile.mkdtemp(prefix="s3rver-test-")
        self.addCleanup(shutil.rmtree, tmp)
        port_file = os.path.join(tmp, "port")
        proc = self.spawn(
            [NODE, S3RVER_SCRIPT, "--port", "0", "--port-file", port_file,
             "--dir", os.path.join(tmp, "data"), "--bucket", "ckpt"])
        line = read_line(proc, 20)
        m = re.fullmatch(r"s3rver listening on 127\.0\.0\.1:(\d+)\n",
                         line or "")
        self.assertTrue(m, line)
        with open(port_file) as f:
            self.assertEqual(f.read(), m.group(1) + "\n")
        c = self.boto(f"http://127.0.0.1:{m.group(1)}", "S3RVER", "S3RVER")
        c.put_object(Bucket="ckpt", Key="a b/ü", Body=b"from boto3")
        self.assertEqual(c.get_object(Bucket="ckpt", Key="a b/ü")["Body"]
                         .read(), b"from boto3")
        self.assertEqual([o["Key"] for o in c.list_objects_v2(
            Bucket="ckpt")["Contents"]], ["a b/ü"])
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(10), 0)


if __name__ == "__main__":
    unittest.main()

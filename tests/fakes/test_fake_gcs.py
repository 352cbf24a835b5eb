#!/usr/bin/python3
"""Self-test of fake_gcs.py.

Run from the repo root (Debian's python3: the fake needs python3-crcmod):
    /usr/bin/python3 tests/fakes/test_fake_gcs.py -v
    /usr/bin/python3 -m unittest tests/fakes/test_fake_gcs.py

No sleeps as synchronisation: tests wait on the fake's own counters
(inflight/hits/objects), which change under the lock the data takes.
TestRcloneInterop runs only when `rclone` is on PATH (Debian: rclone 1.60).
"""

import base64
import hashlib
import http.client
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import crcmod  # noqa: E402
from fake_gcs import FakeError, FakeGcsServer, QUANTUM  # noqa: E402

SCRIPT = os.path.join(HERE, "fake_gcs.py")
PYTHON = "/usr/bin/python3"
BUCKET = "ckpt"
KIB = 1024
MIB = 1024 * KIB

# An independent CRC32C (Castagnoli, reflected) so the fake's hashes are not
# checked against the very function they were computed with.
_crc32c_int = crcmod.mkCrcFun(0x11EDC6F41, initCrc=0, xorOut=0xFFFFFFFF,
                              rev=True)


def crc32c_b64(data):
    return base64.b64encode(struct.pack(">I", _crc32c_int(data))).decode()


def md5_b64(data):
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def q(name):
    return urllib.parse.quote(name, safe="")


def pattern(n, seed=0):
    """n deterministic, non-repeating-looking bytes."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


def wait_until(predicate, timeout=5.0, interval=0.01):
    """Bounded poll for conditions the fake cannot signal (files, pids)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)


class GcsTestCase(unittest.TestCase):
    require_token = None

    def setUp(self):
        self.srv = FakeGcsServer(buckets=[BUCKET],
                                 require_token=self.require_token)
        self.srv.start()
        self.addCleanup(self.srv.stop)

    # ------------------------------------------------------------ clients
    def request(self, method, path, body=None, headers=None, chunked=False,
                timeout=10.0):
        """One request on a fresh connection; returns a Response."""
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port,
                                          timeout=timeout)
        try:
            hdrs = dict(headers or {})
            if chunked:
                data = body

                def gen():
                    for i in range(0, len(data), 7000):  # odd-sized chunks
                        yield data[i:i + 7000]
                conn.request(method, path, body=gen(), headers=hdrs,
                             encode_chunked=True)
            else:
                if body is None and method in ("POST", "PUT"):
                    hdrs.setdefault("Content-Length", "0")
                conn.request(method, path, body=body, headers=hdrs)
            r = conn.getresponse()
            return Response(r.status, {k.lower(): v for k, v in
                                       r.getheaders()}, r.read())
        finally:
            conn.close()

    def obj_path(self, name, bucket=BUCKET):
        return f"/storage/v1/b/{bucket}/o/{q(name)}"

    def media(self, name, data, bucket=BUCKET, headers=None, **query):
        qs = urllib.parse.urlencode(dict(query, uploadType="media",
                                         name=name))
        return self.request("POST", f"/upload/storage/v1/b/{bucket}/o?{qs}",
                            data, headers)

    def start_resumable(self, name=None, meta=None, headers=None,
                        bucket=BUCKET, **query):
        """Start a session; returns the session path (Location, relative)."""
        query = dict(query, uploadType="resumable")
        if name is not None:
            query["name"] = name
        body = json.dumps(meta if meta is not None else {}).encode()
        r = self.request("POST", f"/upload/storage/v1/b/{bucket}/o?"
                         + urllib.parse.urlencode(query), body,
                         dict({"Content-Type": "application/json"},
                              **(headers or {})))
        self.assertEqual(r.status, 200, r.body)
        loc = urllib.parse.urlsplit(r.headers["location"])
        self.assertEqual(loc.scheme, "http")
        self.assertEqual(loc.netloc, f"127.0.0.1:{self.srv.port}")
        return f"{loc.path}?{loc.query}"

    def chunk(self, uri, data, content_range, method="PUT", headers=None,
              chunked=False):
        h = dict(headers or {})
        if content_range is not None:
            h["Content-Range"] = content_range
        return self.request(method, uri, data, h, chunked=chunked)

    def assertGcsError(self, r, code, reason=None, contains=None):
        self.assertEqual(r.status, code, r.body)
        err = r.json()["error"]
        self.assertEqual(err["code"], code)
        self.assertIsInstance(err["message"], str)
        self.assertEqual(err["errors"][0]["message"], err["message"])
        self.assertEqual(err["errors"][0]["domain"], "global")
        if reason is not None:
            self.assertEqual(err["errors"][0]["reason"], reason)
        if contains is not None:
            self.assertIn(contains, err["message"])
        return err

    def assertReset(self, fn):
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            fn()


# ---------------------------------------------------------------- buckets
class TestBuckets(GcsTestCase):
    def test_get_bucket(self):
        r = self.request("GET", f"/storage/v1/b/{BUCKET}")
        self.assertEqual(r.status, 200)
        b = r.json()
        self.assertEqual(b["kind"], "storage#bucket")
        self.assertEqual(b["name"], BUCKET)
        self.assertEqual(b["id"], BUCKET)
        self.assertTrue(b["selfLink"].endswith(f"/storage/v1/b/{BUCKET}"))
        self.assertTrue(b["iamConfiguration"]["uniformBucketLevelAccess"]
                        ["enabled"])

    def test_unknown_bucket_is_404_with_real_error_shape(self):
        r = self.request("GET", "/storage/v1/b/nope")
        err = self.assertGcsError(r, 404, "notFound")
        self.assertEqual(err["message"], "The specified bucket does not "
                                         "exist.")
        for path in ("/storage/v1/b/nope/o", "/storage/v1/b/nope/o/x",
                     "/storage/v1/b/nope/o/x?alt=media"):
            self.assertGcsError(self.request("GET", path), 404, "notFound")
        self.assertGcsError(self.media("x", b"1", bucket="nope"), 404)

    def test_list_buckets_needs_project(self):
        self.srv.create_bucket("other-bucket")
        self.assertGcsError(self.request("GET", "/storage/v1/b"), 400,
                            "required")
        r = self.request("GET", "/storage/v1/b?project=p")
        self.assertEqual([b["name"] for b in r.json()["items"]],
                         [BUCKET, "other-bucket"])

    def test_bucket_names_are_validated(self):
        with self.assertRaises(FakeError):
            self.srv.create_bucket("x")
        with self.assertRaises(FakeError):
            self.srv.create_bucket("Upper")


# ---------------------------------------------------------------- media
class TestMediaUpload(GcsTestCase):
    def test_resource_fields(self):
        data = b"hello world\n" * 1000
        r = self.media("dir/a.txt", data, headers={"Content-Type":
                                                   "text/plain"})
        self.assertEqual(r.status, 200, r.body)
        o = r.json()
        base = f"http://127.0.0.1:{self.srv.port}"
        self.assertEqual(o["kind"], "storage#object")
        self.assertEqual(o["name"], "dir/a.txt")
        self.assertEqual(o["bucket"], BUCKET)
        self.assertEqual(o["id"], f"{BUCKET}/dir/a.txt/{o['generation']}")
        self.assertEqual(o["selfLink"],
                         f"{base}/storage/v1/b/{BUCKET}/o/dir%2Fa.txt")
        self.assertEqual(o["mediaLink"],
                         f"{base}/download/storage/v1/b/{BUCKET}/o/dir%2Fa.txt"
                         f"?generation={o['generation']}&alt=media")
        self.assertIsInstance(o["generation"], str)
        self.assertGreater(int(o["generation"]), 0)
        self.assertEqual(o["metageneration"], "1")
        self.assertEqual(o["contentType"], "text/plain")
        self.assertEqual(o["size"], str(len(data)))
        self.assertEqual(o["md5Hash"], md5_b64(data))
        self.assertEqual(o["crc32c"], crc32c_b64(data))
        self.assertRegex(o["timeCreated"],
                         r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertEqual(o["updated"], o["timeCreated"])
        self.assertTrue(o["etag"])
        self.assertNotIn("metadata", o)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "dir/a.txt"),
                         data)

    def test_known_crc32c_vector(self):
        o = self.media("v", b"123456789").json()
        self.assertEqual(base64.b64decode(o["crc32c"]),
                         bytes.fromhex("e3069283"))

    def test_generation_strictly_increases(self):
        gens = [int(self.media("g", b"%d" % i).json()["generation"])
                for i in range(5)]
        gens.append(int(self.media("other", b"x").json()["generation"]))
        self.assertEqual(gens, sorted(set(gens)))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "g"), b"4")

    def test_default_content_type_and_empty_object(self):
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                 "media&name=empty", b"")
        o = r.json()
        self.assertEqual(o["size"], "0")
        self.assertEqual(o["contentType"], "application/octet-stream")
        self.assertEqual(o["crc32c"], "AAAAAA==")
        self.assertEqual(o["md5Hash"], md5_b64(b""))

    def test_upload_parameters_are_required(self):
        msg = ("Upload requests must include an uploadType URL parameter "
               "and a URL-encoded object name.")
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?name=x", b"1")
        self.assertGcsError(r, 400, contains=msg)
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                 "media", b"1")
        self.assertGcsError(r, 400, contains=msg)
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                 "bogus&name=x", b"1")
        self.assertGcsError(r, 400)
        self.assertEqual(self.srv.objects(BUCKET), [])

    def test_invalid_names(self):
        for name in ("a\nb", "..", "x" * 1025):
            self.assertGcsError(self.media(name, b"1"), 400)
        self.assertEqual(self.srv.objects(BUCKET), [])

    def test_length_required(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port,
                                          timeout=5)
        conn.putrequest("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                "media&name=x")
        conn.endheaders()
        r = conn.getresponse()
        self.assertEqual(r.status, 411)
        r.read()
        conn.close()

    def test_chunked_request_body(self):
        data = pattern(300 * KIB)
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                 "media&name=c", data, chunked=True)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.json()["md5Hash"], md5_b64(data))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "c"), data)
        self.assertEqual(self.srv.log()[-1]["headers"]["transfer-encoding"],
                         "chunked")

    def test_x_goog_hash_verified(self):
        data = b"payload"
        good = f"crc32c={crc32c_b64(data)},md5={md5_b64(data)}"
        self.assertEqual(self.media("h", data,
                                    headers={"x-goog-hash": good}).status,
                         200)
        bad_crc = crc32c_b64(b"other")
        r = self.media("h2", data, headers={"x-goog-hash":
                                            f"crc32c={bad_crc}"})
        err = self.assertGcsError(r, 400, "invalid")
        self.assertEqual(err["message"],
                         f'Provided CRC32C "{bad_crc}" doesn\'t match '
                         f'calculated CRC32C "{crc32c_b64(data)}".')
        r = self.media("h2", data, headers={"x-goog-hash":
                                            f"md5={md5_b64(b'x')}"})
        self.assertGcsError(r, 400, contains="MD5")
        self.assertEqual([o["name"] for o in self.srv.objects(BUCKET)],
                         ["h"])

    def test_uniform_bucket_rejects_acls(self):
        r = self.media("a", b"1", predefinedAcl="private")
        self.assertGcsError(r, 400, "invalid",
                            contains="Cannot insert legacy ACL for an object "
                                     "when uniform bucket-level access is "
                                     "enabled.")
        self.srv.create_bucket("legacy-acl", uniform_access=False)
        r = self.media("a", b"1", bucket="legacy-acl",
                       predefinedAcl="private")
        self.assertEqual(r.status, 200)


# ---------------------------------------------------------------- multipart
class TestMultipartUpload(GcsTestCase):
    def multipart(self, body, boundary="b0undary", query="",
                  ctype="multipart/related"):
        return self.request(
            "POST", "/upload/storage/v1/b/ckpt/o?uploadType=multipart"
            + query, body, {"Content-Type": f"{ctype}; boundary={boundary}"})

    def test_with_part_headers_and_metadata(self):
        data = pattern(100 * KIB) + b"\r\n--not-the-boundary\r\n"
        meta = {"name": "m/one", "contentType": "application/x-ckpt",
                "metadata": {"step": "42"}, "cacheControl": "no-cache"}
        body = (b"--b0undary\r\nContent-Type: application/json; "
                b"charset=UTF-8\r\n\r\n" + json.dumps(meta).encode()
                + b"\r\n--b0undary\r\nContent-Type: text/plain\r\n\r\n"
                + data + b"\r\n--b0undary--\r\n")
        r = self.multipart(body)
        self.assertEqual(r.status, 200, r.body)
        o = r.json()
        self.assertEqual(o["name"], "m/one")
        self.assertEqual(o["contentType"], "application/x-ckpt")
        self.assertEqual(o["metadata"], {"step": "42"})
        self.assertEqual(o["cacheControl"], "no-cache")
        self.assertEqual(o["crc32c"], crc32c_b64(data))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "m/one"), data)

    def test_parts_without_headers_preamble_padding_epilogue(self):
        data = b"\x00\x01binary\r\n"
        body = (b"preamble to ignore\r\n--XyZ  \r\n\r\n"
                b'{"name":"bare"}\r\n--XyZ\r\n\r\n' + data
                + b"\r\n--XyZ--\r\nepilogue")
        r = self.multipart(body, boundary='"XyZ"')
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.json()["contentType"], "application/octet-stream")
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "bare"), data)

    def test_name_in_query_and_chunked_body(self):
        data = pattern(200 * KIB, 3)
        body = (b"--bb\r\nContent-Type: application/json\r\n\r\n{}\r\n"
                b"--bb\r\n\r\n" + data + b"\r\n--bb--")
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                 "multipart&name=q", body,
                         {"Content-Type": "multipart/related; boundary=bb"},
                         chunked=True)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "q"), data)

    def test_hashes_in_metadata_are_verified(self):
        data = b"checkpoint bytes"

        def body(meta):
            return (b"--bb\r\n\r\n" + json.dumps(meta).encode()
                    + b"\r\n--bb\r\n\r\n" + data + b"\r\n--bb--")
        ok = {"name": "ok", "crc32c": crc32c_b64(data),
              "md5Hash": md5_b64(data)}
        self.assertEqual(self.multipart(body(ok), "bb").status, 200)
        r = self.multipart(body({"name": "bad", "crc32c": "AAAAAA=="}), "bb")
        self.assertGcsError(r, 400, "invalid", contains="Provided CRC32C")
        r = self.multipart(body({"name": "bad", "md5Hash":
                                 md5_b64(b"nope")}), "bb")
        self.assertGcsError(r, 400, contains="Provided MD5 hash")
        r = self.multipart(body({"name": "bad", "crc32c": "zz"}), "bb")
        self.assertGcsError(r, 400)
        self.assertEqual([o["name"] for o in self.srv.objects(BUCKET)],
                         ["ok"])

    def test_malformed_bodies(self):
        good_meta = b'{"name":"x"}'
        cases = {
            "no closing boundary": (b"--bb\r\n\r\n" + good_meta
                                    + b"\r\n--bb\r\n\r\ndata"),
            "LF only": (b"--bb\n\n" + good_meta + b"\n--bb\n\ndata\n--bb--"),
            "three parts": (b"--bb\r\n\r\n" + good_meta + b"\r\n--bb\r\n\r\n"
                            b"a\r\n--bb\r\n\r\nb\r\n--bb--"),
            "metadata not JSON": b"--bb\r\n\r\nnot json\r\n--bb\r\n\r\nd"
                                 b"\r\n--bb--",
            "no boundary at all": b"just data",
        }
        for what, body in cases.items():
            with self.subTest(what):
                self.assertGcsError(self.multipart(body, "bb"), 400)
        r = self.multipart(cases["three parts"], "bb",
                           ctype="application/octet-stream")
        self.assertGcsError(r, 400)
        self.assertEqual(self.srv.objects(BUCKET), [])


# ---------------------------------------------------------------- resumable
class TestResumableUpload(GcsTestCase):
    def test_full_flow_with_status_queries(self):
        data = pattern(3 * QUANTUM + 1000)
        uri = self.start_resumable(meta={"name": "r/obj", "metadata":
                                         {"k": "v"}})
        self.assertIn("upload_id=", uri)
        # Nothing persisted yet: 308 without a Range header.
        r = self.chunk(uri, None, "bytes */*")
        self.assertEqual(r.status, 308)
        self.assertNotIn("range", r.headers)
        r = self.chunk(uri, data[:QUANTUM], f"bytes 0-{QUANTUM - 1}/*")
        self.assertEqual(r.status, 308)
        self.assertEqual(r.headers["range"], f"bytes=0-{QUANTUM - 1}")
        r = self.chunk(uri, data[QUANTUM:3 * QUANTUM],
                       f"bytes {QUANTUM}-{3 * QUANTUM - 1}/*", method="POST")
        self.assertEqual(r.status, 308)
        self.assertEqual(r.headers["range"], f"bytes=0-{3 * QUANTUM - 1}")
        r = self.chunk(uri, None, f"bytes */{len(data)}")     # status query
        self.assertEqual(r.status, 308)
        self.assertEqual(r.headers["range"], f"bytes=0-{3 * QUANTUM - 1}")
        self.assertEqual(self.srv.objects(BUCKET), [])
        r = self.chunk(uri, data[3 * QUANTUM:],
                       f"bytes {3 * QUANTUM}-{len(data) - 1}/{len(data)}")
        self.assertEqual(r.status, 200, r.body)
        o = r.json()
        self.assertEqual(o["name"], "r/obj")
        self.assertEqual(o["metadata"], {"k": "v"})
        self.assertEqual(o["size"], str(len(data)))
        self.assertEqual(o["crc32c"], crc32c_b64(data))
        self.assertEqual(o["md5Hash"], md5_b64(data))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "r/obj"), data)
        # A completed session answers status queries with the resource.
        r = self.chunk(uri, None, "bytes */*")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["generation"], o["generation"])
        self.assertEqual([k for k in self.srv.hits_by_kind()],
                         ["resumable", "query", "chunk"])

    def test_name_in_query_and_content_type_sources(self):
        uri = self.start_resumable("from-query", meta={},
                                   headers={"X-Upload-Content-Type":
                                            "application/x-t"})
        o = self.chunk(uri, b"abc", "bytes 0-2/3").json()
        self.assertEqual((o["name"], o["contentType"]),
                         ("from-query", "application/x-t"))
        uri = self.start_resumable("wins", meta={"name": "loses",
                                                 "contentType": "a/b"})
        o = self.chunk(uri, b"abc", "bytes 0-2/3").json()
        self.assertEqual((o["name"], o["contentType"]), ("wins", "a/b"))
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                 "resumable", b"{}",
                         {"Content-Type": "application/json"})
        self.assertGcsError(r, 400)

    def test_non_final_chunk_must_be_multiple_of_256k(self):
        uri = self.start_resumable("x")
        for n in (1000, QUANTUM + 1, 2 * QUANTUM - 1):
            r = self.chunk(uri, pattern(n), f"bytes 0-{n - 1}/*")
            self.assertGcsError(r, 400, contains="multiple of 262144")
            r = self.chunk(uri, pattern(n), f"bytes 0-{n - 1}/{n + 1}")
            self.assertGcsError(r, 400)
        r = self.chunk(uri, None, "bytes */*")
        self.assertEqual(r.status, 308)
        self.assertNotIn("range", r.headers)
        self.assertEqual(self.srv.uploads()[0]["persisted"], 0)

    def test_gap_and_inconsistent_overlap_are_rejected(self):
        data = pattern(4 * QUANTUM, 7)
        uri = self.start_resumable("x")
        r = self.chunk(uri, data[QUANTUM:2 * QUANTUM],
                       f"bytes {QUANTUM}-{2 * QUANTUM - 1}/*")
        self.assertGcsError(r, 400, contains="exceeds already uploaded size "
                                             "of 0 byte(s)")
        self.assertEqual(self.chunk(uri, data[:2 * QUANTUM],
                                    f"bytes 0-{2 * QUANTUM - 1}/*").status,
                         308)
        # Resending persisted bytes (a retry) is accepted if identical ...
        r = self.chunk(uri, data[QUANTUM:3 * QUANTUM],
                       f"bytes {QUANTUM}-{3 * QUANTUM - 1}/*")
        self.assertEqual(r.status, 308)
        self.assertEqual(r.headers["range"], f"bytes=0-{3 * QUANTUM - 1}")
        r = self.chunk(uri, data[:QUANTUM], f"bytes 0-{QUANTUM - 1}/*")
        self.assertEqual(r.headers["range"], f"bytes=0-{3 * QUANTUM - 1}")
        # ... and rejected if it differs from what is stored.
        bad = bytearray(data[2 * QUANTUM:4 * QUANTUM])
        bad[5] ^= 1
        r = self.chunk(uri, bytes(bad), f"bytes {2 * QUANTUM}-"
                                        f"{4 * QUANTUM - 1}/*")
        self.assertGcsError(r, 400, contains="differ")
        r = self.chunk(uri, data[2 * QUANTUM:], f"bytes {2 * QUANTUM}-"
                                                f"{4 * QUANTUM - 1}/"
                                                f"{4 * QUANTUM}")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "x"), data)

    def test_x_guploader_no_308(self):
        uri = self.start_resumable("n")
        no308 = {"X-GUploader-No-308": "yes"}
        r = self.chunk(uri, pattern(QUANTUM), f"bytes 0-{QUANTUM - 1}/*",
                       method="POST", headers=no308)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers["x-http-status-code-override"], "308")
        self.assertEqual(r.headers["range"], f"bytes=0-{QUANTUM - 1}")
        self.assertEqual(r.body, b"")
        r = self.chunk(uri, None, "bytes */*", headers=no308)
        self.assertEqual((r.status, r.headers["x-http-status-code-override"]),
                         (200, "308"))
        r = self.chunk(uri, b"end", f"bytes {QUANTUM}-{QUANTUM + 2}/"
                                    f"{QUANTUM + 3}", headers=no308)
        self.assertEqual(r.status, 200)
        self.assertNotIn("x-http-status-code-override", r.headers)
        self.assertEqual(r.json()["size"], str(QUANTUM + 3))

    def test_finalize_with_empty_body_and_declared_total(self):
        data = pattern(2 * QUANTUM)
        uri = self.start_resumable("f", headers={"X-Upload-Content-Length":
                                                 str(len(data))})
        r = self.chunk(uri, data[:QUANTUM], f"bytes 0-{QUANTUM - 1}/"
                                            f"{len(data) + 1}")
        self.assertGcsError(r, 400, contains="does not match")
        r = self.chunk(uri, data, f"bytes 0-{len(data) - 1}/*")
        self.assertEqual(r.status, 308)
        r = self.chunk(uri, None, f"bytes */{len(data)}")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "f"), data)

    def test_bad_content_ranges(self):
        uri = self.start_resumable("b")
        for cr, body in (("bytes 0-9/5", pattern(10)),
                         ("bytes 5-1/*", pattern(5)),
                         ("bytes 0-99/*", pattern(10)),
                         ("bytes=0-9/10", pattern(10)),
                         ("bytes */*", b"data")):
            with self.subTest(cr):
                self.assertGcsError(self.chunk(uri, body, cr), 400)

    def test_no_content_range_means_whole_object(self):
        uri = self.start_resumable("w")
        r = self.chunk(uri, b"all of it", None)
        self.assertEqual(r.status, 200)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "w"), b"all of it")

    def test_chunked_request_bodies(self):
        data = pattern(QUANTUM + 77, 5)
        uri = self.start_resumable("ch")
        r = self.chunk(uri, data[:QUANTUM], f"bytes 0-{QUANTUM - 1}/*",
                       method="POST", chunked=True)
        self.assertEqual(r.status, 308)
        r = self.chunk(uri, data[QUANTUM:],
                       f"bytes {QUANTUM}-{len(data) - 1}/{len(data)}",
                       chunked=True)
        self.assertEqual(r.status, 200)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "ch"), data)

    def test_cancel(self):
        uri = self.start_resumable("c")
        self.chunk(uri, pattern(QUANTUM), f"bytes 0-{QUANTUM - 1}/*")
        r = self.request("DELETE", uri)
        self.assertEqual(r.status, 499)
        self.assertGcsError(self.chunk(uri, None, "bytes */*"), 404)
        self.assertEqual(self.srv.uploads()[0]["state"], "cancelled")
        self.assertEqual(self.srv.objects(BUCKET), [])

    def test_unknown_session(self):
        r = self.chunk("/upload/storage/v1/b/ckpt/o?uploadType=resumable&"
                       "upload_id=nope", None, "bytes */*")
        self.assertGcsError(r, 404, "notFound")

    def test_hash_mismatch_fails_the_session(self):
        data = pattern(QUANTUM + 5)
        uri = self.start_resumable("h", meta={"crc32c": crc32c_b64(b"x")})
        self.chunk(uri, data[:QUANTUM], f"bytes 0-{QUANTUM - 1}/*")
        r = self.chunk(uri, data[QUANTUM:], f"bytes {QUANTUM}-"
                                            f"{len(data) - 1}/{len(data)}")
        self.assertGcsError(r, 400, contains="Provided CRC32C")
        self.assertGcsError(self.chunk(uri, None, "bytes */*"), 400)
        self.assertEqual(self.srv.objects(BUCKET), [])
        uri = self.start_resumable("h2")
        r = self.chunk(uri, data, f"bytes 0-{len(data) - 1}/{len(data)}",
                       headers={"x-goog-hash": f"md5={md5_b64(b'x')}"})
        self.assertGcsError(r, 400, contains="Provided MD5 hash")
        uri = self.start_resumable("h3", meta={"md5Hash": md5_b64(data)})
        r = self.chunk(uri, data, f"bytes 0-{len(data) - 1}/{len(data)}")
        self.assertEqual(r.status, 200)


# ---------------------------------------------------------------- preconds
class TestPreconditions(GcsTestCase):
    def test_if_generation_match_zero_means_does_not_exist(self):
        self.assertEqual(self.media("p", b"1", ifGenerationMatch=0).status,
                         200)
        r = self.media("p", b"2", ifGenerationMatch=0)
        err = self.assertGcsError(r, 412, "conditionNotMet")
        self.assertEqual(err["message"], "At least one of the pre-conditions "
                                         "you specified did not hold.")
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "p"), b"1")

    def test_generation_and_metageneration_conditions_on_writes(self):
        gen = int(self.media("p", b"1").json()["generation"])
        self.assertGcsError(self.media("p", b"x", ifGenerationMatch=gen + 1),
                            412)
        self.assertGcsError(self.media("p", b"x", ifGenerationNotMatch=gen),
                            412)
        self.assertGcsError(self.media("p", b"x", ifMetagenerationMatch=2),
                            412)
        self.assertGcsError(self.media("p", b"x",
                                       ifMetagenerationNotMatch=1), 412)
        self.assertGcsError(self.media("new", b"x", ifGenerationNotMatch=5),
                            412)
        self.assertGcsError(self.media("new", b"x", ifGenerationMatch=5),
                            412)
        self.assertGcsError(self.media("p", b"x", ifGenerationMatch="abc"),
                            400)
        r = self.media("p", b"2", ifGenerationMatch=gen,
                       ifMetagenerationMatch=1)
        self.assertEqual(r.status, 200)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "p"), b"2")

    def test_multipart_and_resumable_preconditions(self):
        body = b'--bb\r\n\r\n{"name":"m"}\r\n--bb\r\n\r\nd\r\n--bb--'
        hdr = {"Content-Type": "multipart/related; boundary=bb"}
        path = "/upload/storage/v1/b/ckpt/o?uploadType=multipart&" \
               "ifGenerationMatch=0"
        self.assertEqual(self.request("POST", path, body, hdr).status, 200)
        self.assertGcsError(self.request("POST", path, body, hdr), 412)
        # Resumable: checked when the upload is finalized.
        uri = self.start_resumable("late", ifGenerationMatch=0)
        self.media("late", b"someone else was first")
        r = self.chunk(uri, b"mine", "bytes 0-3/4")
        self.assertGcsError(r, 412)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "late"),
                         b"someone else was first")

    def test_read_and_delete_preconditions(self):
        gen = int(self.media("p", b"1").json()["generation"])
        path = self.obj_path("p")
        self.assertGcsError(self.request("GET", f"{path}?ifGenerationMatch="
                                                f"{gen + 1}"), 412)
        self.assertGcsError(self.request("GET", f"{path}?alt=media&"
                                                "ifGenerationMatch=0"), 412)
        self.assertEqual(self.request("GET", f"{path}?alt=media&"
                                             f"ifGenerationMatch={gen}").body,
                         b"1")
        self.assertGcsError(self.request("GET", f"{path}?generation="
                                                f"{gen - 1}"), 404)
        self.assertGcsError(self.request("DELETE", f"{path}?"
                                                   "ifGenerationMatch=1"),
                            412)
        self.assertGcsError(self.request("DELETE", f"{path}?"
                                                   "ifMetagenerationMatch=3"),
                            412)
        self.assertEqual(len(self.srv.objects(BUCKET)), 1)
        r = self.request("DELETE", f"{path}?ifGenerationMatch={gen}")
        self.assertEqual(r.status, 204)
        self.assertEqual(self.srv.objects(BUCKET), [])


# ---------------------------------------------------------------- listing
class TestList(GcsTestCase):
    NAMES = ["a.txt", "dir/1", "dir/2", "dir/sub/3", "dir/", "dir0",
             "e/x", "z"]

    def setUp(self):
        super().setUp()
        for n in self.NAMES:
            self.srv.put_object(BUCKET, n, n.encode())

    def list(self, **params):
        r = self.request("GET", f"/storage/v1/b/{BUCKET}/o?"
                         + urllib.parse.urlencode(params))
        self.assertEqual(r.status, 200, r.body)
        out = r.json()
        self.assertEqual(out["kind"], "storage#objects")
        return out

    def names(self, out):
        return [o["name"] for o in out.get("items", [])]

    def test_lexicographic_order_and_resources(self):
        out = self.list()
        self.assertEqual(self.names(out), sorted(self.NAMES))
        self.assertNotIn("nextPageToken", out)
        self.assertNotIn("prefixes", out)
        item = out["items"][0]
        self.assertEqual(item["size"], "5")
        self.assertEqual(item["crc32c"], crc32c_b64(b"a.txt"))

    def test_prefix_and_delimiter(self):
        out = self.list(delimiter="/")
        self.assertEqual(self.names(out), ["a.txt", "dir0", "z"])
        self.assertEqual(out["prefixes"], ["dir/", "e/"])
        out = self.list(prefix="dir/", delimiter="/")
        self.assertEqual(self.names(out), ["dir/", "dir/1", "dir/2"])
        self.assertEqual(out["prefixes"], ["dir/sub/"])
        out = self.list(prefix="dir")
        self.assertEqual(self.names(out), ["dir/", "dir/1", "dir/2",
                                           "dir/sub/3", "dir0"])
        out = self.list(prefix="nothing")
        self.assertEqual(out, {"kind": "storage#objects"})

    def test_include_trailing_delimiter(self):
        out = self.list(delimiter="/", includeTrailingDelimiter="true")
        self.assertEqual(self.names(out), ["a.txt", "dir/", "dir0", "z"])
        self.assertEqual(out["prefixes"], ["dir/", "e/"])

    def test_paging_counts_items_and_prefixes(self):
        seen_items, seen_prefixes, pages, token = [], [], 0, None
        while True:
            params = {"delimiter": "/", "maxResults": 2}
            if token:
                params["pageToken"] = token
            out = self.list(**params)
            pages += 1
            self.assertLessEqual(len(out.get("items", []))
                                 + len(out.get("prefixes", [])), 2)
            seen_items += self.names(out)
            seen_prefixes += out.get("prefixes", [])
            token = out.get("nextPageToken")
            if not token:
                break
        self.assertEqual(seen_items, ["a.txt", "dir0", "z"])
        self.assertEqual(seen_prefixes, ["dir/", "e/"])
        self.assertEqual(pages, 3)

    def test_paging_without_delimiter(self):
        got, token = [], None
        while True:
            params = {"maxResults": 3}
            if token:
                params["pageToken"] = token
            out = self.list(**params)
            got += self.names(out)
            token = out.get("nextPageToken")
            if not token:
                break
        self.assertEqual(got, sorted(self.NAMES))

    def test_default_page_is_1000(self):
        for i in range(1005):
            self.srv.put_object(BUCKET, f"many/{i:05d}", b"")
        out = self.list(prefix="many/")
        self.assertEqual(len(out["items"]), 1000)
        out = self.list(prefix="many/", pageToken=out["nextPageToken"],
                        maxResults=5000)
        self.assertEqual(self.names(out)[-1], "many/01004")
        self.assertEqual(len(out["items"]), 5)
        self.assertNotIn("nextPageToken", out)

    def test_offsets(self):
        out = self.list(startOffset="dir/2", endOffset="e")
        self.assertEqual(self.names(out), ["dir/2", "dir/sub/3", "dir0"])

    def test_bad_parameters(self):
        for params in ({"maxResults": "0"}, {"maxResults": "x"},
                       {"pageToken": "!!!"}):
            r = self.request("GET", f"/storage/v1/b/{BUCKET}/o?"
                             + urllib.parse.urlencode(params))
            self.assertGcsError(r, 400)


# ---------------------------------------------------------------- names
class TestObjectNames(GcsTestCase):
    NAMES = ["a/b/c.bin", "with space", "plus+sign", "per%cent", "q?mark",
             "hash#tag", "ünï/cödé ✓", "semi;colon=eq&amp"]

    def test_percent_encoded_names_round_trip(self):
        for i, name in enumerate(self.NAMES):
            with self.subTest(name):
                data = f"{i}:{name}".encode()
                o = self.media(name, data).json()
                self.assertEqual(o["name"], name)
                self.assertTrue(o["selfLink"].endswith("/o/" + q(name)))
                r = self.request("GET", self.obj_path(name))
                self.assertEqual(r.json()["name"], name)
                r = self.request("GET", self.obj_path(name) + "?alt=media")
                self.assertEqual(r.body, data)
        self.assertEqual(sorted(o["name"] for o in self.srv.objects(BUCKET)),
                         sorted(self.NAMES))
        for name in self.NAMES:
            self.assertEqual(self.request("DELETE",
                                          self.obj_path(name)).status, 204)

    def test_unencoded_slash_is_not_found(self):
        self.media("a/b", b"x")
        r = self.request("GET", f"/storage/v1/b/{BUCKET}/o/a/b")
        self.assertGcsError(r, 404, contains="%2F")

    def test_media_link_is_usable(self):
        o = self.media("dl/ok", b"data").json()
        link = urllib.parse.urlsplit(o["mediaLink"])
        r = self.request("GET", f"{link.path}?{link.query}")
        self.assertEqual(r.body, b"data")


# ---------------------------------------------------------------- download
class TestDownload(GcsTestCase):
    def setUp(self):
        super().setUp()
        self.data = pattern(100000, 9)
        self.obj = self.srv.put_object(BUCKET, "d/obj", self.data,
                                       "application/x-test")
        self.path = self.obj_path("d/obj") + "?alt=media"

    def test_full_download_headers(self):
        r = self.request("GET", self.path)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, self.data)
        self.assertEqual(r.headers["x-goog-hash"],
                         f"crc32c={crc32c_b64(self.data)},"
                         f"md5={md5_b64(self.data)}")
        self.assertEqual(r.headers["x-goog-generation"],
                         self.obj["generation"])
        self.assertEqual(r.headers["x-goog-metageneration"], "1")
        self.assertEqual(r.headers["x-goog-stored-content-length"], "100000")
        self.assertEqual(r.headers["content-type"], "application/x-test")
        self.assertEqual(r.headers["content-length"], "100000")

    def test_ranges(self):
        for rng, first, last in (("bytes=10-19", 10, 19),
                                 ("bytes=99990-", 99990, 99999),
                                 ("bytes=99990-200000", 99990, 99999),
                                 ("bytes=-7", 99993, 99999)):
            with self.subTest(rng):
                r = self.request("GET", self.path, headers={"Range": rng})
                self.assertEqual(r.status, 206)
                self.assertEqual(r.body, self.data[first:last + 1])
                self.assertEqual(r.headers["content-range"],
                                 f"bytes {first}-{last}/100000")
                # x-goog-hash describes the whole object, not the range.
                self.assertEqual(r.headers["x-goog-hash"].split(",")[0],
                                 f"crc32c={crc32c_b64(self.data)}")
        r = self.request("GET", self.path, headers={"Range":
                                                    "bytes=100000-"})
        self.assertGcsError(r, 416)
        self.assertEqual(r.headers["content-range"], "bytes */100000")

    def test_download_path_and_generation(self):
        gen = self.obj["generation"]
        r = self.request("GET", f"/download/storage/v1/b/{BUCKET}/o/"
                                f"{q('d/obj')}?alt=media&generation={gen}")
        self.assertEqual(r.body, self.data)
        r = self.request("GET", f"{self.path}&generation={int(gen) + 1}")
        self.assertGcsError(r, 404)
        self.assertGcsError(self.request("GET", self.obj_path("missing")
                                         + "?alt=media"), 404, "notFound",
                            contains=f"No such object: {BUCKET}/missing")

    def test_large_download(self):
        big = pattern(8 * MIB + 3, 4)
        self.srv.put_object(BUCKET, "big", big)
        r = self.request("GET", self.obj_path("big") + "?alt=media")
        self.assertEqual(r.body, big)


class TestDelete(GcsTestCase):
    def test_delete(self):
        self.media("x", b"1")
        r = self.request("DELETE", self.obj_path("x"))
        self.assertEqual((r.status, r.body), (204, b""))
        self.assertGcsError(self.request("GET", self.obj_path("x")), 404)
        self.assertGcsError(self.request("DELETE", self.obj_path("x")), 404)


class TestNotImplemented(GcsTestCase):
    def test_501_for_unimplemented_features(self):
        self.media("src", b"1")
        src = self.obj_path("src")
        cases = [
            ("POST", f"{src}/copyTo/b/{BUCKET}/o/dst"),
            ("POST", f"{src}/rewriteTo/b/{BUCKET}/o/dst"),
            ("POST", f"/storage/v1/b/{BUCKET}/o/dst/compose"),
            ("GET", f"{src}/acl"),
            ("PATCH", src),
            ("PUT", src),
            ("GET", f"/storage/v1/b/{BUCKET}/iam"),
            ("GET", f"/storage/v1/b/{BUCKET}/acl"),
            ("GET", f"/storage/v1/b/{BUCKET}/notificationConfigs"),
            ("POST", "/storage/v1/b?project=p"),
            ("DELETE", f"/storage/v1/b/{BUCKET}"),
            ("GET", "/storage/v1/projects/p/hmacKeys"),
            ("GET", f"/{BUCKET}/src"),                      # XML API
            ("POST", "/batch/storage/v1"),
        ]
        for method, path in cases:
            with self.subTest(f"{method} {path}"):
                r = self.request(method, path, b"{}" if method in (
                    "POST", "PUT", "PATCH") else None)
                self.assertGcsError(r, 501, "notImplemented",
                                    contains="not implemented")
        self.assertEqual(self.srv.hits("unsupported"), len(cases))
        self.assertGcsError(self.request("GET", "/storage/v1/nothing"), 404)


# ---------------------------------------------------------------- auth
class TestAuth(GcsTestCase):
    require_token = "s3cret"

    def test_token_required(self):
        path = f"/storage/v1/b/{BUCKET}/o"
        r = self.request("GET", path)
        self.assertGcsError(r, 401, "required")
        self.assertIn("Bearer", r.headers["www-authenticate"])
        r = self.request("GET", path, headers={"Authorization":
                                               "Bearer wrong"})
        self.assertGcsError(r, 401, "authError")
        r = self.media("x", b"1", headers={"Authorization": "Bearer wrong"})
        self.assertGcsError(r, 401)
        self.assertEqual(self.srv.objects(BUCKET), [])
        ok = {"Authorization": "Bearer s3cret"}
        self.assertEqual(self.request("GET", path, headers=ok).status, 200)
        self.assertEqual(self.media("x", b"1", headers=ok).status, 200)
        self.assertEqual([e["auth"] for e in self.srv.log()],
                         ["missing", "invalid", "invalid", "ok", "ok"])
        self.assertEqual(self.srv.auth_failures(), 3)
        self.assertNotIn("authorization", self.srv.log()[0]["headers"])
        # The control API never needs the token.
        self.srv.set_require_token(None)
        self.assertEqual(self.request("GET", path).status, 200)


# ---------------------------------------------------------------- faults
class TestFaults(GcsTestCase):
    def test_status_with_count_then_clears(self):
        self.srv.fault("status", code=503, count=2, upload_type="media")
        for _ in range(2):
            r = self.media("x", b"1")
            err = self.assertGcsError(r, 503, "backendError")
            self.assertIn("injected", err["message"])
        self.assertEqual(self.srv.objects(BUCKET), [])
        self.assertEqual(self.srv.current_faults(), [])
        self.assertEqual(self.media("x", b"1").status, 200)
        self.assertEqual([e.get("fault") for e in self.srv.log()],
                         ["status", "status", None])

    def test_any_code_and_matchers(self):
        self.srv.fault("status", code=429, object_prefix="hot/")
        self.srv.fault("status", code=408, method="GET",
                       path_prefix="/download/", add=True)
        self.assertGcsError(self.media("hot/a", b"1"), 429,
                            "rateLimitExceeded")
        self.assertEqual(self.media("cold/a", b"1").status, 200)
        r = self.request("GET", f"/download/storage/v1/b/{BUCKET}/o/"
                                f"{q('cold/a')}?alt=media")
        self.assertGcsError(r, 408)
        self.assertEqual(self.request("GET", self.obj_path("cold/a")
                                      + "?alt=media").status, 200)
        self.assertEqual(len(self.srv.current_faults()), 2)
        self.srv.fault("none")
        self.assertEqual(self.srv.current_faults(), [])
        for code in (500, 503):
            self.srv.fault("status", code=code, kind="list", count=1)
            self.assertGcsError(self.request("GET", f"/storage/v1/b/{BUCKET}"
                                                    "/o"), code)

    def test_fault_matching_resumable_phases(self):
        self.srv.fault("status", code=503, upload_type="resumable", count=1)
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                 "resumable&name=x", b"{}")
        self.assertGcsError(r, 503)
        self.assertEqual(self.srv.uploads(), [])
        uri = self.start_resumable("x")
        self.srv.fault("status", code=500, upload_type="chunk", count=1)
        r = self.chunk(uri, pattern(QUANTUM), f"bytes 0-{QUANTUM - 1}/*")
        self.assertGcsError(r, 500)
        self.srv.fault("status", code=503, upload_type="query", count=1)
        self.assertGcsError(self.chunk(uri, None, "bytes */*"), 503)
        r = self.chunk(uri, None, "bytes */*")
        self.assertEqual(r.status, 308)
        self.assertNotIn("range", r.headers)    # the 500'd chunk was dropped

    def test_reset_before(self):
        self.srv.fault("reset_before", count=1)
        self.assertReset(lambda: self.media("x", b"1"))
        self.assertEqual(self.srv.objects(BUCKET), [])
        self.assertEqual(self.srv.log()[-1]["outcome"], "reset_before")
        self.assertIsNone(self.srv.log()[-1]["status"])
        self.assertEqual(self.media("x", b"1").status, 200)

    def test_reset_mid_body_on_download(self):
        data = pattern(MIB)
        self.srv.put_object(BUCKET, "d", data)
        self.srv.fault("reset_mid_body", kind="download", count=1)
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port,
                                          timeout=5)
        conn.request("GET", self.obj_path("d") + "?alt=media")
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        self.assertEqual(r.getheader("Content-Length"), str(MIB))
        got = bytearray()
        with self.assertRaises((ConnectionError, http.client.HTTPException)):
            while True:
                b = r.read1(65536)
                if not b:
                    raise http.client.IncompleteRead(bytes(got))
                got += b
        conn.close()
        self.assertLess(len(got), MIB)
        self.assertEqual(bytes(got), data[:len(got)])
        self.srv.fault("reset_mid_body", kind="download", count=1, bytes=10)
        self.assertReset(lambda: self.request("GET", self.obj_path("d")
                                              + "?alt=media"))

    def test_reset_mid_body_on_chunk_persists_aligned_prefix(self):
        data = pattern(5 * QUANTUM, 2)
        uri = self.start_resumable("r")
        self.srv.fault("reset_mid_body", upload_type="chunk", count=1)
        self.assertReset(lambda: self.chunk(uri, data[:4 * QUANTUM],
                                            f"bytes 0-{4 * QUANTUM - 1}/*"))
        r = self.chunk(uri, None, "bytes */*")
        self.assertEqual(r.headers["range"], f"bytes=0-{2 * QUANTUM - 1}")
        # The client's retry resends the whole chunk: the overlap is fine.
        r = self.chunk(uri, data[:4 * QUANTUM], f"bytes 0-{4 * QUANTUM - 1}/*")
        self.assertEqual(r.headers["range"], f"bytes=0-{4 * QUANTUM - 1}")
        # bytes= picks the persisted prefix (rounded down to 256 KiB); a
        # final chunk is never completed by the fault.
        self.srv.fault("reset_mid_body", upload_type="chunk", count=1,
                       bytes=QUANTUM + 5)
        self.assertReset(lambda: self.chunk(
            uri, data[4 * QUANTUM:], f"bytes {4 * QUANTUM}-"
                                     f"{5 * QUANTUM - 1}/{5 * QUANTUM}"))
        self.srv.fault("reset_mid_body", upload_type="chunk", count=1)
        self.assertReset(lambda: self.chunk(
            uri, data[4 * QUANTUM:], f"bytes {4 * QUANTUM}-"
                                     f"{5 * QUANTUM - 1}/{5 * QUANTUM}"))
        self.assertEqual(self.srv.uploads()[0]["persisted"], 4 * QUANTUM)
        self.assertEqual(self.srv.objects(BUCKET), [])
        r = self.chunk(uri, data[4 * QUANTUM:], f"bytes {4 * QUANTUM}-"
                                                f"{5 * QUANTUM - 1}/"
                                                f"{5 * QUANTUM}")
        self.assertEqual(r.status, 200)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "r"), data)

    def test_reset_mid_body_on_uploads_writes_nothing(self):
        self.srv.fault("reset_mid_body", upload_type="media", count=1)
        self.assertReset(lambda: self.media("x", pattern(MIB)))
        self.assertEqual(self.srv.objects(BUCKET), [])

    def test_reset_after_loses_the_answer_not_the_write(self):
        self.srv.fault("reset_after", upload_type="media", count=1)
        self.assertReset(lambda: self.media("x", b"v1", ifGenerationMatch=0))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "x"), b"v1")
        entry = self.srv.log()[-1]
        self.assertEqual((entry["outcome"], entry["would_status"]),
                         ("reset_after", 200))
        # The guarded retry tells the client the write already happened.
        self.assertGcsError(self.media("x", b"v1", ifGenerationMatch=0), 412)

    def test_slow_and_inflight(self):
        self.srv.fault("slow", delay_ms=300, kind="get", count=1)
        self.media("x", b"1")
        box = {}

        def run():
            t = time.monotonic()
            box["r"] = self.request("GET", self.obj_path("x"))
            box["dt"] = time.monotonic() - t
        th = threading.Thread(target=run)
        th.start()
        self.assertTrue(self.srv.wait_for_inflight(1, timeout=5))
        self.assertEqual(self.srv.inflight(), 1)
        th.join(5)
        self.assertEqual(box["r"].status, 200)
        self.assertGreaterEqual(box["dt"], 0.3)
        self.assertTrue(self.srv.wait_idle(5))

    def test_clearing_releases_slow_requests(self):
        self.srv.fault("slow", delay_ms=60000, upload_type="media")
        box = {}
        th = threading.Thread(target=lambda: box.setdefault(
            "r", self.media("x", b"1")))
        th.start()
        self.assertTrue(self.srv.wait_for_hits("media", 1, timeout=5))
        self.assertEqual(self.srv.inflight(), 1)
        self.srv.fault("slow", delay_ms=60000, kind="get", add=True)
        self.assertEqual(self.srv.inflight(), 1)     # adding does not
        self.srv.fault("none")
        th.join(5)
        self.assertFalse(th.is_alive())
        self.assertEqual(box["r"].status, 200)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "x"), b"1")

    def test_invalid_specs(self):
        for spec in ({"mode": "explode"}, {"mode": "status", "code": 99},
                     {"mode": "status", "count": 0},
                     {"mode": "status", "upload_type": "download"},
                     {"mode": "slow", "delay_ms": -1},
                     {"mode": "reset_before", "code": 500}):
            with self.subTest(spec):
                with self.assertRaises(FakeError):
                    self.srv.fault(spec)
        r = self.request("POST", "/_fake/fault", json.dumps(
            {"mode": "explode"}).encode())
        self.assertEqual(r.status, 400)

    def test_control_api_is_never_faulted(self):
        self.srv.fault("reset_before")
        r = self.request("GET", "/_fake/objects?bucket=ckpt")
        self.assertEqual((r.status, r.json()), (200, []))
        r = self.request("POST", "/_fake/fault", b'{"mode":"none"}')
        self.assertEqual(r.json(), [])


# ---------------------------------------------------------------- observing
class TestObservability(GcsTestCase):
    def test_log_entries(self):
        uri = self.start_resumable("obs", meta={"name": "obs"})
        self.chunk(uri, pattern(QUANTUM), f"bytes 0-{QUANTUM - 1}/*",
                   headers={"X-GUploader-No-308": "yes"})
        log = self.srv.log()
        self.assertEqual([e["kind"] for e in log], ["resumable", "chunk"])
        e = log[1]
        self.assertEqual(e["method"], "PUT")
        self.assertEqual(e["path"], "/upload/storage/v1/b/ckpt/o")
        self.assertEqual(e["query"]["uploadType"], "resumable")
        self.assertEqual(e["headers"]["content-range"],
                         f"bytes 0-{QUANTUM - 1}/*")
        self.assertEqual(e["headers"]["x-guploader-no-308"], "yes")
        self.assertEqual(e["body_size"], QUANTUM)
        self.assertEqual(e["status"], 200)
        self.assertEqual((e["bucket"], e["object"]), (BUCKET, "obs"))
        self.assertEqual(e["upload_id"], self.srv.uploads()[0]["upload_id"])
        self.assertLessEqual(e["time"], time.time())
        self.srv.reset_log()
        self.assertEqual((self.srv.log(), self.srv.hits()), ([], 0))

    def test_hits_and_waits(self):
        self.assertFalse(self.srv.wait_for_hits("media", 1, timeout=0.05))
        self.assertFalse(self.srv.wait_for_object(BUCKET, "w", timeout=0.05))
        th = threading.Thread(target=lambda: self.media("w", b"1"))
        th.start()
        self.assertTrue(self.srv.wait_for_object(BUCKET, "w", timeout=5))
        self.assertTrue(self.srv.wait_for_hits("media", 1, timeout=5))
        th.join()
        gen = self.srv.objects(BUCKET)[0]["generation"]
        self.assertFalse(self.srv.wait_for_object(BUCKET, "w", 0.05, gen))
        self.request("GET", self.obj_path("w"))
        self.assertEqual(self.srv.hits_by_kind(), {"media": 1, "get": 1})
        self.assertEqual(self.srv.hits(), 2)

    def test_seed_inspect_reset(self):
        res = self.srv.put_object(BUCKET, "seed/a", b"abc", "text/x",
                                  metadata={"m": "1"})
        self.assertEqual(res["metadata"], {"m": "1"})
        self.srv.put_object(BUCKET, "seed/b", b"")
        self.srv.put_object(BUCKET, "other", b"z")
        objs = self.srv.objects(BUCKET, "seed/")
        self.assertEqual([(o["name"], o["size"], o["crc32c"], o["md5Hash"])
                          for o in objs],
                         [("seed/a", 3, crc32c_b64(b"abc"), md5_b64(b"abc")),
                          ("seed/b", 0, crc32c_b64(b""), md5_b64(b""))])
        self.assertEqual(objs[0]["metadata"], {"m": "1"})
        self.assertEqual(self.srv.object_resource(BUCKET, "other")["size"],
                         "1")
        r = self.request("GET", self.obj_path("seed/a") + "?alt=media")
        self.assertEqual(r.body, b"abc")
        with self.assertRaises(FakeError):
            self.srv.get_object_bytes(BUCKET, "nope")
        self.srv.delete_object(BUCKET, "other")
        self.start_resumable("s")
        self.assertEqual(len(self.srv.uploads()), 1)
        self.srv.fault("status", code=500)
        self.srv.reset()
        self.assertEqual(self.srv.objects(BUCKET), [])
        self.assertEqual(self.srv.uploads(), [])
        self.assertEqual(self.srv.current_faults(), [])
        self.assertEqual(self.srv.log(), [])
        self.assertEqual(self.srv.buckets(), [BUCKET])
        self.srv.reset(keep_buckets=False)
        self.assertEqual(self.srv.buckets(), [])

    def test_control_api(self):
        def ctl(method, path, body=None):
            return self.request(method, "/_fake/" + path, body)
        self.assertEqual(ctl("POST", "bucket", b'{"name":"more"}').status,
                         200)
        self.assertEqual(ctl("GET", "buckets").json(), [BUCKET, "more"])
        r = ctl("PUT", "object?bucket=more&name=a%2Fb&content_type=text/x",
                b"bytes!")
        self.assertEqual(r.json()["contentType"], "text/x")
        self.assertEqual(ctl("GET", "object?bucket=more&name=a%2Fb").body,
                         b"bytes!")
        self.assertEqual(ctl("GET", "objects?bucket=more").json()[0]["size"],
                         6)
        self.assertEqual(ctl("GET", "object?bucket=more&name=x").status, 404)
        r = ctl("GET", "wait?what=object&bucket=more&name=a%2Fb&timeout=1")
        self.assertEqual(r.json(), {"ok": True})
        r = ctl("GET", "wait?what=hits&kind=media&timeout=0.05")
        self.assertEqual(r.status, 408)
        self.assertEqual(ctl("GET", "inflight").json(), {"count": 0})
        self.assertEqual(ctl("GET", "hits").json()["count"], 0)
        self.assertEqual(ctl("DELETE", "object?bucket=more&name=a%2Fb")
                         .status, 200)
        self.assertEqual(ctl("GET", "nope").status, 404)
        self.assertEqual(ctl("POST", "auth", b'{"token":"t"}').status, 200)
        self.assertGcsError(self.request("GET", f"/storage/v1/b/{BUCKET}"),
                            401)


# ---------------------------------------------------------------- script
class TestScript(unittest.TestCase):
    def test_serve_and_ctl(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen(
            [PYTHON, SCRIPT, "serve", "--port-file", port_file, "--bucket",
             "ckpt", "--fine-grained-bucket", "legacy", "--require-token",
             "tok"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        def cleanup():
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            proc.stdout.close()
            proc.stderr.close()
        self.addCleanup(cleanup)
        self.assertTrue(wait_until(lambda: os.path.exists(port_file), 10))
        with open(port_file) as f:
            port = f.read().strip()
        line = proc.stdout.readline()
        self.assertEqual(line.strip(), f"fake-gcs listening on 127.0.0.1:"
                         f"{port} (STORAGE_EMULATOR_HOST=http://127.0.0.1:"
                         f"{port})")

        def ctl(*args, stdin=None, timeout="2"):
            p = subprocess.run([PYTHON, SCRIPT, "ctl", "--port", port,
                                "--timeout", timeout, *args], input=stdin,
                               capture_output=True, timeout=20)
            return p.returncode, p.stdout
        src = os.path.join(tmp, "src")
        with open(src, "wb") as f:
            f.write(b"seeded\x00bytes")
        self.assertEqual(ctl("put", "ckpt", "dir/x", src, "text/x")[0], 0)
        self.assertEqual(ctl("put", "ckpt", "y", "-", stdin=b"stdin")[0], 0)
        rc, out = ctl("objects", "ckpt", "dir/")
        self.assertEqual([o["name"] for o in json.loads(out)], ["dir/x"])
        self.assertEqual(ctl("get", "ckpt", "dir/x"), (0, b"seeded\x00bytes"))
        self.assertEqual(json.loads(ctl("buckets")[1]), ["ckpt", "legacy"])
        rc, _ = ctl("fault", '{"mode":"status","code":503,"count":1}')
        self.assertEqual(rc, 0)
        self.assertEqual(len(json.loads(ctl("faults")[1])), 1)
        conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=5)
        conn.request("GET", "/storage/v1/b/ckpt/o",
                     headers={"Authorization": "Bearer tok"})
        self.assertEqual(conn.getresponse().status, 503)
        conn.close()
        self.assertEqual(json.loads(ctl("wait", "hits", "list", "1")[1])
                         ["ok"], True)
        self.assertEqual(ctl("wait", "hits", "media", "1",
                             timeout="0.2")[0], 1)              # 408
        self.assertEqual(json.loads(ctl("hits", "list")[1])["count"], 1)
        entry = json.loads(ctl("log")[1])[0]
        # Faults act before auth (they model the network/front end).
        self.assertEqual((entry["fault"], entry["status"]), ("status", 503))
        conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=5)
        conn.request("GET", "/storage/v1/b/ckpt/o")
        self.assertEqual(conn.getresponse().status, 401)
        conn.close()
        self.assertEqual(json.loads(ctl("log")[1])[1]["auth"], "missing")
        self.assertEqual(json.loads(ctl("wait", "idle")[1])["ok"], True)
        self.assertEqual(json.loads(ctl("wait", "object", "ckpt", "y")[1]),
                         {"ok": True})
        self.assertEqual(json.loads(ctl("inflight")[1]), {"count": 0})
        self.assertEqual(ctl("delete", "ckpt", "y")[0], 0)
        self.assertEqual(ctl("get", "ckpt", "y")[0], 1)
        self.assertEqual(ctl("reset")[0], 0)
        self.assertEqual(json.loads(ctl("objects", "ckpt")[1]), [])
        self.assertEqual(ctl("auth", "none")[0], 0)
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(10), 0)

    def test_serve_rejects_bad_bucket(self):
        p = subprocess.run([PYTHON, SCRIPT, "serve", "--bucket", "B"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(p.returncode, 2)
        self.assertIn("invalid bucket name", p.stderr)


# ---------------------------------------------------------------- rclone
RCLONE = shutil.which("rclone")


@unittest.skipUnless(RCLONE, "rclone is not on PATH (Debian: apt-get "
                             "install rclone) - interop not checked")
class TestRcloneInterop(unittest.TestCase):
    """rclone's GCS backend (Google's Go API client) against the fake.

    rclone 1.60 has no --gcs-chunk-size: Google's Go client sends files
    under 16 MiB as one multipart upload and larger ones as resumable
    uploads in 16 MiB chunks, so the big file here is 20 MB.
    """

    BIG = 20_000_000

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.src = os.path.join(cls.tmp, "src")
        os.makedirs(os.path.join(cls.src, "sub"))
        with open(os.path.join(cls.src, "small.txt"), "wb") as f:
            f.write(b"small checkpoint index\n")
        with open(os.path.join(cls.src, "sub", "big.bin"), "wb") as f:
            f.write(pattern(cls.BIG, 11))
        home = os.path.join(cls.tmp, "home")
        os.makedirs(home)
        config = os.path.join(home, "rclone.conf")
        open(config, "w").close()
        cls.base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                        "HOME": home, "RCLONE_CONFIG": config,
                        "RCLONE_CONFIG_FAKEGCS_TYPE": "google cloud storage",
                        "RCLONE_CONFIG_FAKEGCS_ANONYMOUS": "true",
                        "RCLONE_CONFIG_FAKEGCS_BUCKET_POLICY_ONLY": "true"}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def setUp(self):
        self.srv = FakeGcsServer(buckets=[BUCKET]).start()
        self.addCleanup(self.srv.stop)

    def rclone(self, *args, check=True, **env):
        e = dict(self.base_env, RCLONE_CONFIG_FAKEGCS_ENDPOINT=(
            self.srv.base_url + "/storage/v1/"))
        e.update(env)
        p = subprocess.run([RCLONE, "--retries", "2",
                            "--low-level-retries", "3", *args], env=e,
                           capture_output=True, text=True, timeout=60)
        if check:
            self.assertEqual(p.returncode, 0, p.stderr)
        return p

    def test_copy_list_copy_back_check(self):
        self.rclone("copy", self.src, f"fakegcs:{BUCKET}/run")
        objs = {o["name"]: o for o in self.srv.objects(BUCKET)}
        self.assertEqual(sorted(objs), ["run/small.txt", "run/sub/big.bin"])
        self.assertEqual(objs["run/sub/big.bin"]["size"], self.BIG)
        # Evidence of the wire protocol rclone used.
        log = self.srv.log()
        kinds = [e["kind"] for e in log]
        self.assertIn("multipart", kinds)
        self.assertIn("resumable", kinds)
        chunks = [e for e in log if e["kind"] == "chunk"]
        self.assertEqual([e["headers"]["content-range"] for e in chunks],
                         [f"bytes 0-{16 * MIB - 1}/*",
                          f"bytes {16 * MIB}-{self.BIG - 1}/{self.BIG}"])
        self.assertTrue(all(e["method"] == "POST" and
                            e["headers"]["x-guploader-no-308"] == "yes"
                            for e in chunks))
        multipart = [e for e in log if e["kind"] == "multipart"][0]
        self.assertEqual(multipart["headers"].get("transfer-encoding"),
                         "chunked")

        out = json.loads(self.rclone("lsjson", "-R", "--hash",
                                     f"fakegcs:{BUCKET}/run").stdout)
        files = {e["Path"]: e for e in out if not e["IsDir"]}
        with open(os.path.join(self.src, "sub", "big.bin"), "rb") as f:
            big_md5 = hashlib.md5(f.read()).hexdigest()
        self.assertEqual(files["sub/big.bin"]["Size"], self.BIG)
        self.assertEqual(files["sub/big.bin"]["Hashes"]["md5"], big_md5)
        ls = self.rclone("ls", f"fakegcs:{BUCKET}").stdout.split()
        self.assertEqual(ls, ["23", "run/small.txt", str(self.BIG),
                              "run/sub/big.bin"])

        dst = os.path.join(self.tmp, "dst")
        self.addCleanup(shutil.rmtree, dst, True)
        self.rclone("copy", f"fakegcs:{BUCKET}/run", dst)
        for rel in ("small.txt", os.path.join("sub", "big.bin")):
            with open(os.path.join(self.src, rel), "rb") as a, \
                    open(os.path.join(dst, rel), "rb") as b:
                self.assertEqual(a.read(), b.read(), rel)
        p = self.rclone("check", self.src, f"fakegcs:{BUCKET}/run")
        self.assertIn("0 differences found", p.stderr)
        self.assertIn("2 matching files", p.stderr)
        p = self.rclone("check", "--download", self.src,
                        f"fakegcs:{BUCKET}/run")
        self.assertIn("0 differences found", p.stderr)
        # A changed object is caught by the MD5 comparison.
        self.srv.put_object(BUCKET, "run/small.txt",
                            b"small checkpoint indeX\n")
        p = self.rclone("check", self.src, f"fakegcs:{BUCKET}/run",
                        check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("1 differences found", p.stderr)

    def test_upload_survives_chunk_faults(self):
        self.srv.fault("status", code=503, upload_type="chunk", count=1)
        self.srv.fault("reset_mid_body", upload_type="chunk", count=1,
                       add=True)
        self.rclone("copy", self.src, f"fakegcs:{BUCKET}/faulty")
        with open(os.path.join(self.src, "sub", "big.bin"), "rb") as f:
            self.assertEqual(self.srv.get_object_bytes(
                BUCKET, "faulty/sub/big.bin"), f.read())
        outcomes = [e.get("fault") for e in self.srv.log()
                    if e["kind"] == "chunk"]
        self.assertEqual(outcomes[:2], ["status", "reset_mid_body"])
        self.assertEqual(self.srv.current_faults(), [])

    def test_bearer_token_auth(self):
        self.srv.set_require_token("rclone-token")
        token = json.dumps({"access_token": "rclone-token",
                            "token_type": "Bearer",
                            "expiry": "2099-01-01T00:00:00Z"})
        auth = {"RCLONE_CONFIG_FAKEGCS_ANONYMOUS": "false",
                "RCLONE_CONFIG_FAKEGCS_TOKEN": token}
        self.rclone("copyto", os.path.join(self.src, "small.txt"),
                    f"fakegcs:{BUCKET}/tok.txt", **auth)
        self.assertTrue(all(e["auth"] == "ok" for e in self.srv.log()))
        p = self.rclone("lsf", f"fakegcs:{BUCKET}", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("Error 401", p.stderr)

    def test_object_acls_rejected_on_uniform_bucket(self):
        # Without bucket_policy_only rclone sends predefinedAcl=private,
        # which real GCS rejects on uniform bucket-level access buckets.
        p = self.rclone("copyto", os.path.join(self.src, "small.txt"),
                        f"fakegcs:{BUCKET}/acl.txt", check=False,
                        RCLONE_CONFIG_FAKEGCS_BUCKET_POLICY_ONLY="false")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("Cannot insert legacy ACL", p.stderr)


if __name__ == "__main__":
    unittest.main()

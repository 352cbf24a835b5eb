#!/usr/bin/python3
"""Self-test of fake_gcs.py.

Run from the repo root (Debian's python3: the fake needs python3-crc32c or
python3-crcmod, and this test python3-crcmod for an independent CRC32C):
    /usr/bin/python3 tests/fakes/test_fake_gcs.py -v
    /usr/bin/python3 -m unittest tests/fakes/test_fake_gcs.py

No sleeps as synchronisation: tests wait on the fake's own counters
(inflight/hits/objects/retained bytes), which change under the lock the data
takes. TestRcloneInterop runs only when `rclone` is on PATH (Debian: rclone
1.60); its `rclone mount` tests also need /dev/fuse and fusermount3 (Debian:
fuse3). TestGoogleCloudStorageNodeInterop runs Google's @google-cloud/storage
for Node (tests/fakes/node/, installed by scripts/install-deps.sh with npm
ci) and is skipped, saying why, without node or the module.
"""

import base64
import ctypes.util
import hashlib
import http.client
import importlib.util
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
import fake_gcs  # noqa: E402
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
    """headers: lower-case names; a repeated header's lines joined with
    ", " (RFC 9110 5.3); lines: every (name, value) as sent."""

    def __init__(self, status, headers, body):
        self.status, self.body = status, body
        self.lines = [(k.lower(), v) for k, v in headers]
        self.headers = {}
        for k, v in self.lines:
            self.headers[k] = (self.headers[k] + ", " + v
                               if k in self.headers else v)

    def json(self):
        return json.loads(self.body)


class GcsTestCase(unittest.TestCase):
    require_token = None
    sink = False
    md5 = True

    def setUp(self):
        self.srv = FakeGcsServer(buckets=[BUCKET],
                                 require_token=self.require_token,
                                 sink=self.sink, md5=self.md5)
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
            return Response(r.status, r.getheaders(), r.read())
        finally:
            conn.close()

    def obj_path(self, name, bucket=BUCKET):
        return f"/storage/v1/b/{bucket}/o/{q(name)}"

    def media(self, name, data, bucket=BUCKET, headers=None, chunked=False,
              **query):
        qs = urllib.parse.urlencode(dict(query, uploadType="media",
                                         name=name))
        return self.request("POST", f"/upload/storage/v1/b/{bucket}/o?{qs}",
                            data, headers, chunked=chunked)

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

    def test_crc32c_module(self):
        """Debian's python3-crc32c is used when it is installed (crcmod is
        the fallback); either way the vectors hold."""
        impl = fake_gcs.CRC32C_IMPL.split(", ")[-1]
        if importlib.util.find_spec("crc32c") is None:
            self.assertEqual(impl, "crcmod")
        else:
            self.assertTrue(impl.startswith("python3-crc32c"), impl)
        # The fallback, with crc32c made unimportable (and ISA-L off).
        p = subprocess.run([PYTHON, "-c", "import sys; sys.modules['crc32c'] "
                            "= None; import fake_gcs as f; print(f.CRC32C_IMPL,"
                            " f._crc32c(b'6789', f._crc32c(b'12345')))"],
                           cwd=HERE, capture_output=True, text=True,
                           timeout=20, env=dict(os.environ,
                                                FAKE_GCS_NO_ISAL="1"))
        self.assertEqual(p.stdout.split(), ["crcmod", str(0xE3069283)],
                         p.stderr)
        self.assertEqual(fake_gcs._crc32c(b"123456789"), 0xE3069283)
        self.assertEqual(fake_gcs._crc32c(b"6789", fake_gcs._crc32c(b"12345")),
                         0xE3069283)
        a, b = pattern(1000, 1), pattern(5000, 2)
        self.assertEqual(fake_gcs._crc32c_combine(
            _crc32c_int(a), _crc32c_int(b), len(b)), _crc32c_int(a + b))
        self.assertEqual(fake_gcs._crc32c_combine(0, _crc32c_int(b), len(b)),
                         _crc32c_int(b))

    def test_isal_crc32c(self):
        """With Debian's libisal2 installed, big writable buffers are
        hashed by ISA-L (off the GIL); every size, start value, read-only
        and sliced buffer gives crcmod's answer."""
        if ctypes.util.find_library("isal") is None:
            self.skipTest("libisal2 is not installed (scripts/install-deps.sh"
                          " installs it)")
        self.assertTrue(fake_gcs.CRC32C_IMPL.startswith("ISA-L"),
                        fake_gcs.CRC32C_IMPL)
        big = bytearray(pattern(3 * MIB + 17, 5))
        for n in (0, 1, 9, 65535, 65536, 65537, MIB, 3 * MIB + 17):
            want = _crc32c_int(bytes(big[:n]))
            view = memoryview(big)[:n]
            self.assertEqual(fake_gcs._crc32c(view), want, n)
            self.assertEqual(fake_gcs._crc32c(bytes(view)), want, n)
            self.assertEqual(fake_gcs._crc32c(view.toreadonly()), want, n)
            # Continued from the CRC of what came before, at an odd offset.
            head = _crc32c_int(b"prefix")
            self.assertEqual(fake_gcs._crc32c(memoryview(big)[3:3 + n], head),
                             _crc32c_int(b"prefix" + bytes(big[3:3 + n])), n)
        # The buffer is not left exported: once this test's own view is
        # gone, it can be resized.
        view.release()
        big.extend(b"x")

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

    def test_open_ended_content_ranges(self):
        """bytes S-*/T: the chunk ends where its body ends (Google's Node
        client streams a whole upload in one request as bytes 0-*/*, and
        the rest after a resume as bytes S-*/*): with T = * the request
        ends the object."""
        data = pattern(3 * QUANTUM + 11, 6)
        uri = self.start_resumable("one")
        r = self.chunk(uri, data, "bytes 0-*/*", chunked=True)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.json()["md5Hash"], md5_b64(data))
        uri = self.start_resumable("two")
        r = self.chunk(uri, data[:2 * QUANTUM], f"bytes 0-*/{len(data)}")
        self.assertEqual(r.headers["range"], f"bytes=0-{2 * QUANTUM - 1}")
        self.assertGcsError(self.chunk(uri, data[2 * QUANTUM:-1],
                                       f"bytes {2 * QUANTUM}-*/{len(data)}"),
                            400, contains="multiple of")
        self.assertGcsError(self.chunk(uri, data[3 * QUANTUM:],
                                       f"bytes {3 * QUANTUM}-*/*"), 400,
                            contains="exceeds already uploaded size")
        r = self.chunk(uri, data[QUANTUM:], f"bytes {QUANTUM}-*/*")
        self.assertEqual(r.json()["crc32c"], crc32c_b64(data))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "two"), data)
        uri = self.start_resumable("three")
        self.chunk(uri, data[:QUANTUM], f"bytes 0-{QUANTUM - 1}/*")
        r = self.chunk(uri, b"", f"bytes {QUANTUM}-*/*")   # nothing more
        self.assertEqual(r.json()["size"], str(QUANTUM))

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
        # Two lines, crc32c= then md5=, as Cloud Storage sends them.
        self.assertEqual([v for k, v in r.lines if k == "x-goog-hash"],
                         [f"crc32c={crc32c_b64(self.data)}",
                          f"md5={md5_b64(self.data)}"])
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
                self.assertEqual([v for k, v in r.lines
                                  if k == "x-goog-hash"],
                                 [f"crc32c={crc32c_b64(self.data)}",
                                  f"md5={md5_b64(self.data)}"])
        # generation= with a range: the live one serves it, another is 404.
        gen = self.obj["generation"]
        r = self.request("GET", f"{self.path}&generation={gen}",
                         headers={"Range": "bytes=5-9"})
        self.assertEqual((r.status, r.body), (206, self.data[5:10]))
        self.assertGcsError(self.request(
            "GET", f"{self.path}&generation={int(gen) - 1}",
            headers={"Range": "bytes=5-9"}), 404)
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


# ---------------------------------------------------------------- copy
class TestCopyRewrite(GcsTestCase):
    """objects.copy and objects.rewrite (server-side copies)."""

    def seed(self, name="src/a", data=b"checkpoint bytes\x00\xff",
             bucket=BUCKET, **kw):
        kw.setdefault("content_type", "application/x-ckpt")
        kw.setdefault("metadata", {"step": "7"})
        return self.srv.put_object(bucket, name, data, **kw)

    def copy(self, src, dst, body=b"", src_bucket=BUCKET, dst_bucket=BUCKET,
             verb="copyTo", headers=None, **query):
        path = (f"/storage/v1/b/{src_bucket}/o/{q(src)}/{verb}/b/"
                f"{dst_bucket}/o/{q(dst)}")
        if query:
            path += "?" + urllib.parse.urlencode(query)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        return self.request("POST", path, body, dict(
            {"Content-Type": "application/json"}, **(headers or {})))

    def rewrite(self, src, dst, body=b"", **kw):
        return self.copy(src, dst, body, verb="rewriteTo", **kw)

    def assertSameContent(self, res, src_res, data):
        for key in ("size", "crc32c", "md5Hash"):
            self.assertEqual(res[key], src_res[key], key)
        self.assertEqual(res["crc32c"], crc32c_b64(data))
        self.assertEqual(res["md5Hash"], md5_b64(data))
        self.assertEqual(self.srv.get_object_bytes(res["bucket"],
                                                   res["name"]), data)
        r = self.request("GET", self.obj_path(res["name"], res["bucket"])
                         + "?alt=media")
        self.assertEqual(r.body, data)

    def test_copy_round_trip(self):
        data = pattern(100_000, 3)
        src = self.seed(data=data)
        for body in (b"", b"{}", b"null", b" \r\n"):
            with self.subTest(body=body):
                r = self.copy("src/a", "dst/b", body)
                self.assertEqual(r.status, 200, r.body)
                res = r.json()
                self.assertEqual(res["kind"], "storage#object")
                self.assertEqual((res["bucket"], res["name"]),
                                 (BUCKET, "dst/b"))
                self.assertSameContent(res, src, data)
                self.assertGreater(int(res["generation"]),
                                   int(src["generation"]))
                self.assertEqual(res["metageneration"], "1")
                self.assertEqual(res["contentType"], "application/x-ckpt")
                self.assertEqual(res["metadata"], {"step": "7"})
                self.assertEqual(res, self.srv.object_resource(BUCKET,
                                                               "dst/b"))
        # The source is untouched.
        self.assertEqual(self.srv.object_resource(BUCKET, "src/a"), src)
        self.assertEqual(self.srv.hits("copy"), 4)

    def test_rewrite_round_trip(self):
        data = pattern(3 * MIB + 5, 4)
        src = self.seed(data=data)
        r = self.rewrite("src/a", "dst/b", b"null")
        self.assertEqual(r.status, 200, r.body)
        out = r.json()
        self.assertEqual(out["kind"], "storage#rewriteResponse")
        self.assertEqual(out["totalBytesRewritten"], str(len(data)))
        self.assertEqual(out["objectSize"], str(len(data)))
        self.assertIs(out["done"], True)
        self.assertNotIn("rewriteToken", out)
        res = out["resource"]
        self.assertSameContent(res, src, data)
        self.assertEqual(res["metageneration"], "1")
        self.assertGreater(int(res["generation"]), int(src["generation"]))
        self.assertEqual((res["contentType"], res["metadata"]),
                         ("application/x-ckpt", {"step": "7"}))
        # An empty object is done at once too.
        self.srv.put_object(BUCKET, "empty", b"")
        out = self.rewrite("empty", "empty2",
                           maxBytesRewrittenPerCall=MIB).json()
        self.assertEqual((out["done"], out["totalBytesRewritten"],
                          out["objectSize"]), (True, "0", "0"))

    def test_body_overrides_metadata_field_by_field(self):
        self.srv.put_object(BUCKET, "s", b"abc", "text/plain",
                            {"a": "1", "b": "2"})
        # Fields from an upload's metadata are carried over.
        up = self.request(
            "POST", "/upload/storage/v1/b/ckpt/o?uploadType=multipart",
            b'--x\r\n\r\n{"name":"s2","cacheControl":"no-store",'
            b'"contentDisposition":"inline","metadata":{"m":"1"}}'
            b'\r\n--x\r\n\r\nxyz\r\n--x--',
            {"Content-Type": "multipart/related; boundary=x"})
        self.assertEqual(up.status, 200, up.body)
        for verb in ("copyTo", "rewriteTo"):
            with self.subTest(verb):
                r = self.copy("s", "d1", {"contentType": "text/x",
                                          "metadata": {"z": "9"},
                                          "name": "ignored",
                                          "bucket": "ignored"}, verb=verb)
                self.assertEqual(r.status, 200, r.body)
                res = self.srv.object_resource(BUCKET, "d1")
                self.assertEqual((res["contentType"], res["metadata"]),
                                 ("text/x", {"z": "9"}))
                self.copy("s2", "d2", {"cacheControl": "max-age=5"},
                          verb=verb)
                res = self.srv.object_resource(BUCKET, "d2")
                self.assertEqual((res["cacheControl"],
                                  res["contentDisposition"],
                                  res["metadata"]),
                                 ("max-age=5", "inline", {"m": "1"}))
                self.copy("s2", "d3", {"metadata": {}}, verb=verb)
                self.assertNotIn("metadata",
                                 self.srv.object_resource(BUCKET, "d3"))
                # Digests in the body must be the source's.
                good = {"crc32c": crc32c_b64(b"abc"),
                        "md5Hash": md5_b64(b"abc")}
                self.assertEqual(self.copy("s", "d4", good,
                                           verb=verb).status, 200)
                r = self.copy("s", "d5", {"crc32c": crc32c_b64(b"abd")},
                              verb=verb)
                self.assertGcsError(r, 400, "invalid",
                                    contains="doesn't match")
                self.assertGcsError(self.copy("s", "d5", b"[1]", verb=verb),
                                    400)
                self.assertGcsError(self.copy("s", "d5", b"{nope",
                                              verb=verb), 400, "parseError")
                self.assertGcsError(self.copy("s", "d5", {"metadata": [1]},
                                              verb=verb), 400)
        self.assertNotIn("d5", [o["name"] for o in self.srv.objects(BUCKET)])

    def test_copy_onto_itself_updates_metadata(self):
        # rclone's SetModTime: GET the resource, copy the object onto
        # itself with the whole resource (plus an mtime) as the body.
        src = self.seed(name="x", data=b"same")
        body = dict(src, metadata={"step": "7", "mtime": "2024"})
        r = self.copy("x", "x", body)
        self.assertEqual(r.status, 200, r.body)
        res = r.json()
        self.assertGreater(int(res["generation"]), int(src["generation"]))
        self.assertEqual(res["metadata"], {"step": "7", "mtime": "2024"})
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "x"), b"same")
        self.assertEqual(len(self.srv.objects(BUCKET)), 1)

    def test_cross_bucket(self):
        self.srv.create_bucket("other-bucket")
        data = pattern(5000, 5)
        src = self.seed(data=data)
        r = self.copy("src/a", "in/other", dst_bucket="other-bucket")
        self.assertEqual(r.status, 200, r.body)
        self.assertSameContent(r.json(), src, data)
        r = self.rewrite("in/other", "back/again", src_bucket="other-bucket")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.json()["resource"]["bucket"], BUCKET)
        self.assertSameContent(r.json()["resource"], src, data)
        self.assertEqual(self.srv.get_object_bytes("other-bucket",
                                                   "in/other"), data)
        e = [e for e in self.srv.log() if e["kind"] == "rewrite"][-1]
        self.assertEqual((e["kind"], e["bucket"], e["object"],
                          e["dst_bucket"], e["dst_object"]),
                         ("rewrite", "other-bucket", "in/other", BUCKET,
                          "back/again"))

    def test_missing_bucket_or_source_is_404(self):
        src = self.seed()
        gen = int(src["generation"])
        for verb in ("copyTo", "rewriteTo"):
            with self.subTest(verb):
                err = self.assertGcsError(self.copy(
                    "src/a", "d", src_bucket="nope", verb=verb), 404,
                    "notFound")
                self.assertIn("bucket does not exist", err["message"])
                self.assertGcsError(self.copy("src/a", "d", verb=verb,
                                              dst_bucket="nope"), 404)
                err = self.assertGcsError(self.copy("missing", "d",
                                                    verb=verb), 404)
                self.assertEqual(err["message"],
                                 f"No such object: {BUCKET}/missing")
                # Only the live generation exists.
                self.assertGcsError(self.copy(
                    "src/a", "d", verb=verb, sourceGeneration=gen - 1), 404)
                r = self.copy("src/a", f"d-{verb}", verb=verb,
                              sourceGeneration=gen)
                self.assertEqual(r.status, 200, r.body)
        self.assertEqual(sorted(o["name"] for o in self.srv.objects(BUCKET)),
                         ["d-copyTo", "d-rewriteTo", "src/a"])

    def test_destination_preconditions(self):
        self.seed()
        for verb in ("copyTo", "rewriteTo"):
            with self.subTest(verb):
                dst = f"d-{verb}"
                r = self.copy("src/a", dst, verb=verb, ifGenerationMatch=0)
                self.assertEqual(r.status, 200, r.body)
                gen = int(self.srv.object_resource(BUCKET, dst)
                          ["generation"])
                for bad in ({"ifGenerationMatch": 0},
                            {"ifGenerationMatch": gen + 1},
                            {"ifGenerationNotMatch": gen},
                            {"ifMetagenerationMatch": 2},
                            {"ifMetagenerationNotMatch": 1}):
                    err = self.assertGcsError(self.copy(
                        "src/a", dst, verb=verb, **bad), 412,
                        "conditionNotMet")
                    self.assertEqual(err["message"], "At least one of the "
                                     "pre-conditions you specified did not "
                                     "hold.")
                self.assertGcsError(self.copy("src/a", "new", verb=verb,
                                              ifGenerationNotMatch=1), 412)
                self.assertGcsError(self.copy("src/a", dst, verb=verb,
                                              ifGenerationMatch="x"), 400)
                self.assertEqual(int(self.srv.object_resource(
                    BUCKET, dst)["generation"]), gen)
                r = self.copy("src/a", dst, verb=verb, ifGenerationMatch=gen,
                              ifMetagenerationMatch=1)
                self.assertEqual(r.status, 200, r.body)

    def test_source_preconditions(self):
        gen = int(self.seed()["generation"])
        for verb in ("copyTo", "rewriteTo"):
            with self.subTest(verb):
                for bad in ({"ifSourceGenerationMatch": gen + 1},
                            {"ifSourceGenerationMatch": 0},
                            {"ifSourceGenerationNotMatch": gen},
                            {"ifSourceMetagenerationMatch": 2},
                            {"ifSourceMetagenerationNotMatch": 1}):
                    self.assertGcsError(self.copy("src/a", "d", verb=verb,
                                                  **bad), 412,
                                        "conditionNotMet")
                self.assertGcsError(self.copy(
                    "src/a", "d", verb=verb, ifSourceGenerationMatch="z"),
                    400)
                self.assertNotIn("d", [o["name"] for o in
                                       self.srv.objects(BUCKET)])
                r = self.copy("src/a", "d", verb=verb,
                              ifSourceGenerationMatch=gen,
                              ifSourceGenerationNotMatch=gen + 1,
                              ifSourceMetagenerationMatch=1)
                self.assertEqual(r.status, 200, r.body)
                self.srv.delete_object(BUCKET, "d")

    def test_multi_call_rewrite_with_tokens(self):
        data = pattern(2 * MIB + MIB // 2, 6)
        src = self.seed(data=data)
        r = self.rewrite("src/a", "dst", maxBytesRewrittenPerCall=MIB,
                         ifGenerationMatch=0)
        out = r.json()
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(out, {"kind": "storage#rewriteResponse",
                               "totalBytesRewritten": str(MIB),
                               "objectSize": str(len(data)), "done": False,
                               "rewriteToken": out["rewriteToken"]})
        tok1 = out["rewriteToken"]
        self.assertNotIn("dst", [o["name"] for o in
                                 self.srv.objects(BUCKET)])
        # A follow-up may omit the other parameters or repeat them.
        out = self.rewrite("src/a", "dst", maxBytesRewrittenPerCall=MIB,
                           rewriteToken=tok1).json()
        self.assertEqual((out["done"], out["totalBytesRewritten"]),
                         (False, str(2 * MIB)))
        tok2 = out["rewriteToken"]
        self.assertNotEqual(tok1, tok2)
        # Replaying a token redoes that step (a retry after a lost answer).
        again = self.rewrite("src/a", "dst", maxBytesRewrittenPerCall=MIB,
                             ifGenerationMatch=0, rewriteToken=tok1).json()
        self.assertEqual(again["totalBytesRewritten"], str(2 * MIB))
        self.assertEqual([t["done"] for t in self.srv.rewrites()
                          if t["token"] == tok2], [2 * MIB])
        self.assertNotIn("dst", [o["name"] for o in
                                 self.srv.objects(BUCKET)])
        out = self.rewrite("src/a", "dst", b"null", rewriteToken=tok2,
                           maxBytesRewrittenPerCall=MIB).json()
        self.assertIs(out["done"], True)
        self.assertEqual(out["totalBytesRewritten"], str(len(data)))
        self.assertNotIn("rewriteToken", out)
        self.assertSameContent(out["resource"], src, data)
        # The first call's ifGenerationMatch=0 still guards the write.
        r = self.rewrite("src/a", "dst", rewriteToken=again["rewriteToken"])
        self.assertGcsError(r, 412)
        self.assertEqual(self.srv.hits("rewrite"), 5)
        # maxBytesRewrittenPerCall must be a multiple of 1 MiB.
        for bad in (1000, MIB + 1, -MIB, "x"):
            self.assertGcsError(self.rewrite(
                "src/a", "d", maxBytesRewrittenPerCall=bad), 400)

    def test_bad_rewrite_tokens(self):
        data = pattern(3 * MIB, 7)
        self.seed(data=data)
        self.srv.create_bucket("other-bucket")
        err = self.assertGcsError(self.rewrite(
            "src/a", "d", rewriteToken="not-a-token"), 400, "invalid")
        self.assertIn("rewriteToken", err["message"])
        tok = self.rewrite("src/a", "d", {"contentType": "text/x"},
                           maxBytesRewrittenPerCall=MIB,
                           ifSourceGenerationNotMatch=1).json()[
                               "rewriteToken"]
        for kw in ({"dst": "other"}, {"src": "src/b"},
                   {"dst_bucket": "other-bucket"},
                   {"ifSourceGenerationNotMatch": 2},
                   {"ifGenerationMatch": 0},
                   {"body": {"contentType": "text/y"}}):
            with self.subTest(kw):
                args = {"src": "src/a", "dst": "d", "body": b"",
                        "rewriteToken": tok}
                args.update(kw)
                self.assertGcsError(self.rewrite(args.pop("src"),
                                                 args.pop("dst"),
                                                 args.pop("body"), **args),
                                    400, "invalid")
        out = self.rewrite("src/a", "d", {"contentType": "text/x"},
                           rewriteToken=tok,
                           ifSourceGenerationNotMatch=1).json()
        self.assertEqual(out["totalBytesRewritten"], str(2 * MIB))
        # The source is replaced mid-rewrite: its pinned generation is gone.
        self.seed(data=b"new")
        err = self.assertGcsError(self.rewrite(
            "src/a", "d", rewriteToken=out["rewriteToken"]), 404)
        self.assertIn("No such object", err["message"])
        self.assertNotIn("d", [o["name"] for o in self.srv.objects(BUCKET)])
        self.srv.reset()
        self.assertEqual(self.srv.rewrites(), [])
        self.assertGcsError(self.rewrite("src/a", "d", rewriteToken=tok),
                            400)

    def test_server_rewrite_limit_forces_multi_call(self):
        data = pattern(2500, 8)
        src = self.seed(data=data)
        self.srv.set_rewrite_limit(1000)
        totals, out = [], {"rewriteToken": None}
        while True:
            query = ({"rewriteToken": out["rewriteToken"]}
                     if out.get("rewriteToken") else {})
            out = self.rewrite("src/a", "d", **query).json()
            totals.append(out["totalBytesRewritten"])
            if out["done"]:
                break
        self.assertEqual(totals, ["1000", "2000", "2500"])
        self.assertSameContent(out["resource"], src, data)
        # maxBytesRewrittenPerCall and the limit: the smaller wins.
        self.srv.set_rewrite_limit(5 * MIB)
        self.srv.put_object(BUCKET, "big", pattern(3 * MIB, 9))
        out = self.rewrite("big", "d", maxBytesRewrittenPerCall=2 * MIB)
        self.assertEqual(out.json()["totalBytesRewritten"], str(2 * MIB))
        # Through the control API; null turns it off.
        r = self.request("POST", "/_fake/rewrite-limit", b'{"bytes":100}')
        self.assertEqual(r.status, 200)
        self.assertFalse(self.rewrite("src/a", "e").json()["done"])
        self.assertEqual(self.request("POST", "/_fake/rewrite-limit",
                                      b'{"bytes":0}').status, 400)
        self.request("POST", "/_fake/rewrite-limit", b'{"bytes":null}')
        self.assertTrue(self.rewrite("src/a", "e").json()["done"])
        # Tokens issued: 2 + 1 + 1 (kept, replayable, until reset()).
        self.assertEqual(len(self.request("GET", "/_fake/rewrites").json()),
                         4)
        with self.assertRaises(FakeError):
            self.srv.set_rewrite_limit(-1)

    def test_acls_follow_bucket_policy(self):
        self.seed()
        self.srv.create_bucket("legacy", uniform_access=False)
        for verb in ("copyTo", "rewriteTo"):
            with self.subTest(verb):
                err = self.assertGcsError(self.copy(
                    "src/a", "d", verb=verb,
                    destinationPredefinedAcl="private"), 400, "invalid")
                self.assertIn("uniform bucket-level access", err["message"])
                self.assertGcsError(self.copy(
                    "src/a", "d", {"acl": [{"entity": "allUsers",
                                            "role": "READER"}]},
                    verb=verb), 400)
                r = self.copy("src/a", "d", verb=verb, dst_bucket="legacy",
                              destinationPredefinedAcl="private",
                              projection="full")
                self.assertEqual(r.status, 200, r.body)
        self.assertEqual(len(self.srv.objects("legacy")), 1)

    def test_routes_faults_and_log(self):
        self.seed(data=b"abc")
        base = f"/storage/v1/b/{BUCKET}/o/{q('src/a')}"
        # Names must be percent-encoded; only POST; a full destination path.
        for method, path in (("POST", f"{base}/copyTo/b/{BUCKET}/o/x/y"),
                             ("POST", f"/storage/v1/b/{BUCKET}/o/src/a/"
                                      f"rewriteTo/b/{BUCKET}/o/x"),
                             ("GET", f"{base}/copyTo/b/{BUCKET}/o/x"),
                             ("POST", f"{base}/copyTo/b/{BUCKET}"),
                             ("POST", f"{base}/rewriteTo/b/{BUCKET}/x/y")):
            with self.subTest(f"{method} {path}"):
                self.assertGcsError(self.request(method, path, b"{}"
                                                 if method == "POST"
                                                 else None), 404)
        self.assertGcsError(self.copy("src/a", ""), 400)
        self.assertEqual(len(self.srv.objects(BUCKET)), 1)
        # Faults match by kind, and bucket/object_prefix on either end.
        self.srv.fault("status", code=503, kind="rewrite", count=1)
        self.srv.fault("status", code=429, object_prefix="hot/", add=True)
        self.assertGcsError(self.rewrite("src/a", "d"), 503)
        self.assertGcsError(self.copy("src/a", "hot/d"), 429)
        self.assertEqual(len(self.srv.objects(BUCKET)), 1)
        self.srv.fault("reset_after", kind="copy", count=1)
        self.assertReset(lambda: self.copy("src/a", "lost-answer"))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "lost-answer"),
                         b"abc")
        self.srv.fault("reset_mid_body", kind="rewrite", count=1)
        self.assertReset(lambda: self.rewrite("src/a", "cut-answer"))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "cut-answer"),
                         b"abc")
        log = [e for e in self.srv.log() if e["kind"] in ("copy",
                                                           "rewrite")]
        self.assertEqual([(e["kind"], e["dst_object"], e.get("fault"),
                           e["status"]) for e in log],
                         [("copy", "", None, 400),
                          ("rewrite", "d", "status", 503),
                          ("copy", "hot/d", "status", 429),
                          ("copy", "lost-answer", "reset_after", None),
                          ("rewrite", "cut-answer", "reset_mid_body", None)])
        self.assertTrue(all((e["bucket"], e["object"], e["dst_bucket"]) ==
                            (BUCKET, "src/a", BUCKET) for e in log))
        self.assertEqual(self.srv.hits_by_kind().get("copy"), 3)


# ---------------------------------------------------------------- compose
class TestCompose(GcsTestCase):
    """objects.compose: composite objects."""

    def compose(self, dest, sources, destination=None, bucket=BUCKET,
                body=None, **query):
        """POST .../o/DEST/compose; sources: names or sourceObjects dicts."""
        if body is None:
            body = {"kind": "storage#composeRequest", "sourceObjects": [
                s if isinstance(s, dict) else {"name": s} for s in sources]}
            if destination is not None:
                body["destination"] = destination
        path = f"/storage/v1/b/{bucket}/o/{q(dest)}/compose"
        if query:
            path += "?" + urllib.parse.urlencode(query)
        return self.request("POST", path, json.dumps(body).encode(),
                            {"Content-Type": "application/json"})

    def seed(self, **objects):
        return {name: self.srv.put_object(BUCKET, name, data,
                                          "text/x-source", {"src": name})
                for name, data in objects.items()}

    def assertComposite(self, res, data, components):
        self.assertEqual(res["kind"], "storage#object")
        self.assertEqual(res["size"], str(len(data)))
        self.assertEqual(res["crc32c"], crc32c_b64(data))
        self.assertNotIn("md5Hash", res)      # composite objects have none
        self.assertEqual(res["componentCount"], components)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, res["name"]),
                         data)

    def test_concatenates_in_request_order(self):
        a, b, c = pattern(1000, 1), pattern(300 * KIB + 7, 2), b"c" * 5
        srcs = self.seed(a=a, b=b, c=c)
        r = self.compose("out", ["c", "a", "b", "a"])
        self.assertEqual(r.status, 200, r.body)
        res = r.json()
        self.assertComposite(res, c + a + b + a, 4)
        self.assertEqual((res["bucket"], res["name"], res["metageneration"]),
                         (BUCKET, "out", "1"))
        self.assertGreater(int(res["generation"]),
                           max(int(o["generation"]) for o in srcs.values()))
        # No destination resource: default content type, no metadata (the
        # sources' are not inherited).
        self.assertEqual(res["contentType"], "application/octet-stream")
        self.assertNotIn("metadata", res)
        self.assertEqual(res, self.srv.object_resource(BUCKET, "out"))
        # Sources are unaffected.
        for name, obj in srcs.items():
            self.assertEqual(self.srv.object_resource(BUCKET, name), obj)
        summary = self.srv.objects(BUCKET, "out")[0]
        self.assertNotIn("md5Hash", summary)
        self.assertEqual(summary["componentCount"], 4)
        # A plain object has no componentCount.
        self.assertNotIn("componentCount", srcs["a"])
        self.assertEqual(self.srv.hits("compose"), 1)
        entry = self.srv.log()[-1]
        self.assertEqual((entry["kind"], entry["bucket"], entry["object"],
                          entry["sources"], entry["status"]),
                         ("compose", BUCKET, "out", ["c", "a", "b", "a"],
                          200))
        # The list shows it as GCS does.
        items = self.request("GET", f"/storage/v1/b/{BUCKET}/o?prefix=out"
                             ).json()["items"]
        self.assertEqual(items, [res])

    def test_downloads_carry_only_crc32c(self):
        data = pattern(2 * MIB + 3, 5)
        self.seed(x=data[:MIB], y=data[MIB:])
        res = self.compose("z", ["x", "y"]).json()
        r = self.request("GET", self.obj_path("z") + "?alt=media")
        self.assertEqual(r.body, data)
        self.assertEqual(r.headers["x-goog-hash"],
                         f"crc32c={crc32c_b64(data)}")
        self.assertEqual(r.headers["x-goog-component-count"], "2")
        # A range: the slice, with the whole object's hash; generation=
        # is honoured (only the live one exists).
        r = self.request("GET", self.obj_path("z") + "?alt=media&generation="
                         + res["generation"],
                         headers={"Range": f"bytes={MIB - 5}-{MIB + 4}"})
        self.assertEqual((r.status, r.body), (206, data[MIB - 5:MIB + 5]))
        self.assertEqual(r.headers["x-goog-hash"],
                         f"crc32c={crc32c_b64(data)}")
        self.assertEqual(r.headers["content-range"],
                         f"bytes {MIB - 5}-{MIB + 4}/{len(data)}")
        r = self.request("GET", self.obj_path("z") + "?alt=media&generation="
                         + str(int(res["generation"]) - 1),
                         headers={"Range": "bytes=0-9"})
        self.assertGcsError(r, 404)

    def test_source_count_limits(self):
        self.seed(a=b"a")
        self.assertGcsError(self.compose("d", []), 400, "required")
        self.assertGcsError(self.compose("d", None, body={}), 400,
                            "required")
        err = self.assertGcsError(self.compose("d", ["a"] * 33), 400,
                                  "invalid")
        self.assertEqual(err["message"], "The number of source components "
                                         "provided (33) exceeds the maximum "
                                         "(32)")
        self.assertEqual(self.srv.objects(BUCKET, "d"), [])
        r = self.compose("d", ["a"] * 32)
        self.assertComposite(r.json(), b"a" * 32, 32)

    def test_missing_or_mismatched_source(self):
        srcs = self.seed(a=b"A", b=b"B")
        gen_a = srcs["a"]["generation"]
        self.assertGcsError(self.compose("d", ["a", "nope"]), 404,
                            "notFound", contains=f"No such object: {BUCKET}"
                                                 "/nope")
        # generation: a number or an int64 string; the live one only.
        r = self.compose("d", [{"name": "a", "generation": gen_a},
                               {"name": "b", "generation":
                                int(srcs["b"]["generation"])}])
        self.assertEqual(r.status, 200, r.body)
        self.assertGcsError(self.compose("e", [
            {"name": "a", "generation": str(int(gen_a) + 1)}]), 404)
        # objectPreconditions.ifGenerationMatch: 412 as GCS.
        err = self.assertGcsError(self.compose("e", [
            "b", {"name": "a", "objectPreconditions":
                  {"ifGenerationMatch": int(gen_a) - 1}}]), 412,
            "conditionNotMet")
        self.assertEqual(err["message"], "At least one of the pre-conditions "
                                         "you specified did not hold.")
        r = self.compose("e", [{"name": "a", "objectPreconditions":
                                {"ifGenerationMatch": gen_a}}])
        self.assertEqual(r.status, 200, r.body)
        # Both given: they must agree.
        self.assertGcsError(self.compose("f", [
            {"name": "a", "generation": gen_a, "objectPreconditions":
             {"ifGenerationMatch": int(gen_a) + 1}}]), 400)
        for bad in ({"name": "a", "generation": "12x"}, {"name": ""},
                    {"generation": gen_a}, {"name": 7}, ["a"],
                    {"name": "a", "generation": True},
                    {"name": "a", "objectPreconditions": 3},
                    {"name": "a", "bucket": "other"}):
            with self.subTest(bad=bad):
                self.assertGcsError(self.compose("f", None, body={
                    "sourceObjects": [bad]}), 400)
        self.assertGcsError(self.compose("f", None, body={
            "sourceObjects": "a"}), 400)
        self.assertEqual(self.srv.objects(BUCKET, "f"), [])

    def test_destination_preconditions(self):
        self.seed(a=b"A", b=b"B")
        first = self.compose("d", ["a"], ifGenerationMatch=0).json()
        # ifGenerationMatch=0 on an existing object: GCS's 412.
        r = self.compose("d", ["b"], ifGenerationMatch=0)
        self.assertEqual(r.json(), {"error": {
            "code": 412, "message": "At least one of the pre-conditions you "
                                    "specified did not hold.",
            "errors": [{"message": "At least one of the pre-conditions you "
                                   "specified did not hold.",
                        "domain": "global", "reason": "conditionNotMet",
                        "locationType": "header", "location": "If-Match"}]}})
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "d"), b"A")
        self.assertGcsError(self.compose("d", ["b"], ifMetagenerationMatch=2),
                            412)
        self.assertGcsError(self.compose("d", ["b"], ifGenerationMatch="x"),
                            400)
        r = self.compose("d", ["b"], ifGenerationMatch=first["generation"],
                         ifMetagenerationMatch=1)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "d"), b"B")

    def test_composite_of_composites_and_component_count(self):
        a, b, c = b"alpha-", b"bravo-", b"charlie"
        self.seed(a=a, b=b, c=c)
        self.compose("ab", ["a", "b"])
        r = self.compose("abcab", ["ab", "c", "ab"])
        self.assertComposite(r.json(), a + b + c + a + b, 5)
        # Appending to an object in place (the documented use).
        for i in range(3):
            self.srv.put_object(BUCKET, "tail", bytes([48 + i]))
            r = self.compose("abcab", ["abcab", "tail"])
        self.assertComposite(r.json(), a + b + c + a + b + b"012", 8)
        # componentCount is the sum, past the old 1024 cap: GCS dropped that
        # limit (2019) and saturates the count at 2^31-1 instead.
        self.srv.put_object(BUCKET, "one", b"1")
        self.compose("c32", ["one"] * 32)
        self.compose("c1024", ["c32"] * 32)
        r = self.compose("c2048", ["c1024", "c1024"])
        self.assertComposite(r.json(), b"1" * 2048, 2048)
        name = "c2048"
        for level in range(3):
            r = self.compose(f"big{level}", [name] * 32)
            name = f"big{level}"
        self.assertEqual(r.json()["componentCount"], 2 ** 26)
        r = self.compose("huge", [name] * 32)      # 2^31 components
        res = r.json()
        self.assertEqual(res["componentCount"], 2 ** 31 - 1)
        self.assertEqual(res["size"], str(2 ** 31))   # never materialised
        r = self.request("GET", self.obj_path("huge") + "?alt=media",
                         headers={"Range": "bytes=-4"})
        self.assertEqual((r.status, r.body), (206, b"1111"))

    def test_destination_resource(self):
        self.seed(a=b"aa", b=b"bb")
        dest = {"contentType": "application/x-ckpt", "metadata": {"step": "9"},
                "contentEncoding": "identity", "cacheControl": "no-store",
                "contentDisposition": "inline", "name": "ignored",
                "md5Hash": "AAAAAAAAAAAAAAAAAAAAAA==",   # ignored (GCS)
                "crc32c": crc32c_b64(b"aabb")}
        res = self.compose("d", ["a", "b"], dest).json()
        self.assertComposite(res, b"aabb", 2)
        self.assertEqual((res["contentType"], res["metadata"],
                          res["contentEncoding"], res["cacheControl"],
                          res["contentDisposition"], res["name"]),
                         ("application/x-ckpt", {"step": "9"}, "identity",
                          "no-store", "inline", "d"))
        r = self.compose("e", ["a", "b"], {"crc32c": crc32c_b64(b"bbaa")})
        self.assertGcsError(r, 400, contains="CRC32C")
        for bad in ({"metadata": {"k": 1}}, [], "x"):
            with self.subTest(bad=bad):
                self.assertGcsError(self.compose("e", ["a"], bad), 400)
        self.assertGcsError(self.compose("e", ["a"], {"acl": [{}]}), 400,
                            contains="uniform bucket-level access")
        self.assertGcsError(self.compose("e", ["a"],
                                         destinationPredefinedAcl="private"),
                            400, contains="uniform bucket-level access")
        self.assertEqual(self.srv.objects(BUCKET, "e"), [])

    def test_routes_and_bad_requests(self):
        self.seed(a=b"a")
        base = f"/storage/v1/b/{BUCKET}/o/d/compose"
        self.assertGcsError(self.request("GET", base), 404)
        self.assertGcsError(self.request("POST", base + "/x", b"{}"), 404)
        self.assertGcsError(self.compose("d", ["a"], bucket="nobucket"), 404,
                            contains="bucket does not exist")
        self.assertGcsError(self.request("POST", base, b"{nope"), 400,
                            "parseError")
        self.assertGcsError(self.request("POST", base, b"[]"), 400)
        self.assertGcsError(self.compose(".", ["a"]), 400)
        self.assertEqual(self.srv.objects(BUCKET, "d"), [])
        # deleteSourceObjects=true: the sources go once the compose landed.
        self.seed(b=b"b")
        r = self.compose("d", ["a", "b"], deleteSourceObjects="true")
        self.assertComposite(r.json(), b"ab", 2)
        self.assertEqual([o["name"] for o in self.srv.objects(BUCKET)], ["d"])

    def test_copy_and_rewrite_of_a_composite_stay_composite(self):
        self.seed(a=b"left", b=b"right")
        self.compose("d", ["a", "b"])
        path = f"/storage/v1/b/{BUCKET}/o/d"
        for verb in ("copyTo", "rewriteTo"):
            r = self.request("POST", f"{path}/{verb}/b/{BUCKET}/o/{verb}",
                             b"", {"Content-Type": "application/json"})
            res = r.json().get("resource", r.json())
            self.assertComposite(res, b"leftright", 2)

    def test_faults(self):
        self.seed(a=b"A", b=b"B")
        self.srv.fault("status", code=503, kind="compose", count=1)
        self.assertGcsError(self.compose("d", ["a", "b"]), 503)
        self.assertEqual(self.srv.objects(BUCKET, "d"), [])
        # reset_after: the composite is written, the answer lost; the
        # guarded retry learns it already happened.
        self.srv.fault("reset_after", kind="compose", count=1)
        self.assertReset(lambda: self.compose("d", ["a", "b"],
                                              ifGenerationMatch=0))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "d"), b"AB")
        self.assertGcsError(self.compose("d", ["a", "b"],
                                         ifGenerationMatch=0), 412)
        # object_prefix matches the destination or any source.
        self.srv.fault("status", code=429, object_prefix="b", count=1)
        self.assertGcsError(self.compose("x", ["a", "b"]), 429)
        self.srv.fault("reset_before", kind="compose", object_prefix="y",
                       count=1)
        self.assertReset(lambda: self.compose("y", ["a"]))
        self.assertEqual(self.srv.objects(BUCKET, "x"), [])
        self.assertEqual(self.srv.objects(BUCKET, "y"), [])
        log = [(e["object"], e.get("fault"), e.get("outcome"), e["status"])
               for e in self.srv.log() if e["kind"] == "compose"]
        self.assertEqual(log, [("d", "status", None, 503),
                               ("d", "reset_after", "reset_after", None),
                               ("d", None, None, 412),
                               ("x", "status", None, 429),
                               ("y", "reset_before", "reset_before", None)])
        self.assertEqual(self.srv.hits("compose"), 5)
        with self.assertRaises(FakeError):
            self.srv.fault("status", kind="composer")


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


# ---------------------------------------------------------------- memory
class UploadHashing:
    """Uploads big enough for the hashing threads, resends and cut chunks:
    the digests must be those of the bytes, however they arrived. Run with
    the bytes kept and in sink mode (TestHashingKept, TestHashingSink)."""

    def assertDigests(self, res, data):
        self.assertEqual((res["size"], res["crc32c"], res.get("md5Hash")),
                         (str(len(data)), crc32c_b64(data),
                          md5_b64(data) if self.md5 else None))
        if not self.sink:
            self.assertEqual(self.srv.get_object_bytes(BUCKET, res["name"]),
                             data)

    def test_media_and_multipart(self):
        data = pattern(9 * MIB + 1, 11)
        self.assertDigests(self.media("m", data).json(), data)
        self.assertDigests(self.media("c", data, chunked=True).json(), data)
        body = (b"--b\r\n\r\n{\"name\":\"mp\"}\r\n--b\r\n\r\n" + data[:5 * MIB]
                + b"\r\n--b--")
        r = self.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType="
                                 "multipart", body,
                         {"Content-Type": "multipart/related; boundary=b"})
        self.assertDigests(r.json(), data[:5 * MIB])

    def test_big_chunks_resends_and_chunked_bodies(self):
        data = pattern(13 * MIB + 5, 12)
        uri = self.start_resumable("r")
        r = self.chunk(uri, data[:4 * MIB], f"bytes 0-{4 * MIB - 1}/*")
        self.assertEqual(r.headers["range"], f"bytes=0-{4 * MIB - 1}")
        # A lost answer: the client resends from an earlier offset; only
        # the new tail counts.
        self.srv.fault("reset_after", upload_type="chunk", count=1)
        self.assertReset(lambda: self.chunk(uri, data[4 * MIB:8 * MIB],
                                            f"bytes {4 * MIB}-{8 * MIB - 1}"
                                            "/*"))
        r = self.chunk(uri, data[6 * MIB:10 * MIB],
                       f"bytes {6 * MIB}-{10 * MIB - 1}/*", chunked=True)
        self.assertEqual(r.headers["range"], f"bytes=0-{10 * MIB - 1}")
        r = self.chunk(uri, data[10 * MIB:], f"bytes {10 * MIB}-"
                                             f"{len(data) - 1}/{len(data)}")
        self.assertEqual(r.status, 200, r.body)
        self.assertDigests(r.json(), data)

    def test_cut_chunks(self):
        """reset_mid_body persists a prefix of a chunk: the digests follow
        exactly that prefix (hashed as the body arrived, cut there)."""
        data = pattern(12 * MIB + 3, 13)
        uri = self.start_resumable("cut")
        self.srv.fault("reset_mid_body", upload_type="chunk", count=1)
        self.assertReset(lambda: self.chunk(uri, data[:8 * MIB],
                                            f"bytes 0-{8 * MIB - 1}/*"))
        self.assertEqual(self.srv.uploads()[0]["persisted"], 4 * MIB)
        self.srv.fault("reset_mid_body", upload_type="chunk", count=1,
                       bytes=3 * MIB + 5)
        self.assertReset(lambda: self.chunk(uri, data[2 * MIB:8 * MIB],
                                            f"bytes {2 * MIB}-{8 * MIB - 1}"
                                            "/*"))
        self.assertEqual(self.srv.uploads()[0]["persisted"], 5 * MIB)
        r = self.chunk(uri, data[5 * MIB:], f"bytes {5 * MIB}-"
                                            f"{len(data) - 1}/{len(data)}")
        self.assertEqual(r.status, 200, r.body)
        self.assertDigests(r.json(), data)

    def test_memory_is_released(self):
        data = pattern(6 * MIB, 14)
        uri = self.start_resumable("r")
        self.chunk(uri, data[:4 * MIB], f"bytes 0-{4 * MIB - 1}/*")
        self.assertTrue(self.srv.wait_for_retained(0 if self.sink
                                                   else 4 * MIB))
        self.assertEqual(self.srv.memory()["open_sessions"], 1)
        r = self.chunk(uri, data[4 * MIB:], f"bytes {4 * MIB}-"
                                            f"{len(data) - 1}/{len(data)}")
        self.assertEqual(r.status, 200, r.body)
        # The object holds the chunks' own buffers: one copy of the bytes,
        # none in sink mode; the finished session none.
        self.assertTrue(self.srv.wait_for_retained(0 if self.sink
                                                   else len(data)))
        self.assertEqual(self.srv.memory(), {
            "retained_bytes": 0 if self.sink else len(data),
            "buffers": 0 if self.sink else 2, "open_sessions": 0})
        self.assertEqual(self.request("DELETE", self.obj_path("r")).status,
                         204)
        self.assertTrue(self.srv.wait_for_retained(0))
        # The finished session still answers with its object's resource.
        r = self.chunk(uri, None, "bytes */*")
        self.assertEqual((r.status, r.json()["size"]), (200, str(len(data))))


class TestHashingKept(UploadHashing, GcsTestCase):
    pass


class TestHashingSink(UploadHashing, GcsTestCase):
    sink = True


class TestHashingSinkNoMd5(UploadHashing, GcsTestCase):
    sink = True
    md5 = False


class TestNoMd5(GcsTestCase):
    """md5=False: no MD5 anywhere; an MD5 given cannot be checked, so it is
    refused rather than taken on trust. CRC32C is checked as ever."""
    md5 = False

    def test_objects_have_no_md5_and_crc32c_is_still_checked(self):
        data = pattern(5 * MIB + 3, 21)
        res = self.media("m", data).json()
        self.assertNotIn("md5Hash", res)
        self.assertEqual(res["crc32c"], crc32c_b64(data))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "m"), data)
        self.srv.put_object(BUCKET, "seeded", b"abc")
        self.assertNotIn("md5Hash", self.request(
            "GET", self.obj_path("seeded")).json())
        self.assertGcsError(self.media("bad", data, headers={
            "x-goog-hash": "crc32c=" + crc32c_b64(b"other")}), 400)
        self.assertEqual([o["name"] for o in self.srv.objects(BUCKET)],
                         ["m", "seeded"])

    def test_an_md5_given_is_refused(self):
        err = self.assertGcsError(self.media("h", b"abc", headers={
            "x-goog-hash": "md5=" + md5_b64(b"abc")}), 400)
        self.assertIn("--no-md5", err["message"])
        body = (b'--b\r\n\r\n{"name":"mp","md5Hash":"' + md5_b64(b"xyz")
                .encode() + b'"}\r\n--b\r\n\r\nxyz\r\n--b--')
        self.assertGcsError(self.request(
            "POST", "/upload/storage/v1/b/ckpt/o?uploadType=multipart", body,
            {"Content-Type": "multipart/related; boundary=b"}), 400)
        uri = self.start_resumable("r", meta={"md5Hash": md5_b64(b"12")})
        self.assertGcsError(self.chunk(uri, b"12", "bytes 0-1/2"), 400)
        self.assertEqual(self.srv.objects(BUCKET), [])


class TestMemory(GcsTestCase):
    """Nothing holds upload bytes longer than the objects that own them."""

    def test_cancelled_and_failed_sessions_free_their_bytes(self):
        uri = self.start_resumable("c")
        self.chunk(uri, pattern(2 * MIB), f"bytes 0-{2 * MIB - 1}/*")
        self.assertTrue(self.srv.wait_for_retained(2 * MIB))
        self.assertEqual(self.request("DELETE", uri).status, 499)
        self.assertTrue(self.srv.wait_for_retained(0))
        uri = self.start_resumable("f")
        self.chunk(uri, pattern(2 * MIB), f"bytes 0-{2 * MIB - 1}/*")
        r = self.chunk(uri, b"x", f"bytes {2 * MIB}-{2 * MIB}/{2 * MIB + 1}",
                       headers={"X-Goog-Hash": "crc32c=AAAAAA=="})
        self.assertGcsError(r, 400, contains="CRC32C")
        self.assertTrue(self.srv.wait_for_retained(0))
        self.assertEqual(self.srv.memory()["buffers"], 0)
        # The failed session keeps answering its error.
        self.assertGcsError(self.chunk(uri, None, "bytes */*"), 400,
                            contains="CRC32C")

    def test_copies_share_and_overwrites_free(self):
        data = pattern(3 * MIB, 15)
        self.media("a", data)
        self.media("a", data)                    # the first copy is freed
        self.assertTrue(self.srv.wait_for_retained(len(data)))
        path = self.obj_path("a")
        for dst in ("b", "c"):
            self.request("POST", f"{path}/copyTo/b/{BUCKET}/o/{dst}", b"")
        self.request("POST", f"/storage/v1/b/{BUCKET}/o/d/compose",
                     b'{"sourceObjects":[{"name":"a"},{"name":"b"}]}')
        self.srv.wait_idle()
        self.assertEqual(self.srv.memory()["retained_bytes"], len(data))
        for name in ("a", "b", "c"):
            self.request("DELETE", self.obj_path(name))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "d"), data + data)
        self.request("DELETE", self.obj_path("d"))
        self.assertTrue(self.srv.wait_for_retained(0))

    def test_rewrite_tokens_keep_no_bytes(self):
        self.media("src", pattern(3 * MIB, 16))
        self.srv.set_rewrite_limit(MIB)
        out = self.request("POST", f"/storage/v1/b/{BUCKET}/o/src/rewriteTo"
                                   f"/b/{BUCKET}/o/dst", b"").json()
        self.assertIs(out["done"], False)
        self.request("DELETE", self.obj_path("src"))
        self.assertTrue(self.srv.wait_for_retained(0))
        self.assertEqual(self.srv.rewrites()[0]["size"], 3 * MIB)
        r = self.request("POST", f"/storage/v1/b/{BUCKET}/o/src/rewriteTo/b/"
                                 f"{BUCKET}/o/dst?rewriteToken="
                                 f"{out['rewriteToken']}", b"")
        self.assertGcsError(r, 404)

    def test_memory_control_api(self):
        self.media("a", b"12345")
        self.srv.wait_idle()
        r = self.request("GET", "/_fake/memory")
        self.assertEqual(r.json(), {"retained_bytes": 5, "buffers": 1,
                                    "open_sessions": 0})

    def test_one_chunk_streams_into_a_session_at_a_time(self):
        """While a chunk's bytes are being hashed into its session (here:
        read, then held by a slow fault), a query still answers, but a
        finalizing query or another chunk is a 503 to retry."""
        data = pattern(QUANTUM * 3, 17)
        uri = self.start_resumable("s")
        self.chunk(uri, data[:QUANTUM], f"bytes 0-{QUANTUM - 1}/*")
        self.srv.fault("slow", delay_ms=10000, upload_type="chunk", count=1)
        held = threading.Thread(target=lambda: self.chunk(
            uri, data[QUANTUM:2 * QUANTUM],
            f"bytes {QUANTUM}-{2 * QUANTUM - 1}/*"))
        held.start()
        # Counted once its body was read: it is streaming into s by then.
        self.assertTrue(self.srv.wait_for_hits("chunk", 2))
        r = self.chunk(uri, None, "bytes */*")
        self.assertEqual(r.headers["range"], f"bytes=0-{QUANTUM - 1}")
        self.assertGcsError(self.chunk(uri, None, f"bytes */{QUANTUM}"), 503)
        self.assertGcsError(self.chunk(uri, data[QUANTUM:],
                                       f"bytes {QUANTUM}-{3 * QUANTUM - 1}/"
                                       f"{3 * QUANTUM}"), 503)
        self.srv.fault("none")                   # releases the held chunk
        held.join()
        r = self.chunk(uri, data[2 * QUANTUM:], f"bytes {2 * QUANTUM}-"
                                                f"{3 * QUANTUM - 1}/"
                                                f"{3 * QUANTUM}")
        self.assertEqual(r.json()["md5Hash"], md5_b64(data))


class TestSink(GcsTestCase):
    """sink=True: uploads keep no bytes, only what resources report."""
    sink = True

    def test_downloads_say_why(self):
        res = self.media("m", b"sunk bytes").json()
        self.assertEqual((res["size"], res["md5Hash"]),
                         ("10", md5_b64(b"sunk bytes")))
        self.assertEqual(self.srv.objects(BUCKET)[0]["kept"], False)
        err = self.assertGcsError(self.request("GET", self.obj_path("m")
                                               + "?alt=media"), 501,
                                  "notImplemented")
        self.assertIn("--sink", err["message"])
        with self.assertRaises(FakeError):
            self.srv.get_object_bytes(BUCKET, "m")
        # Metadata, lists, copies and composes work; the results are sunk.
        self.assertEqual(self.request("GET", self.obj_path("m")).json(), res)
        self.media("n", b"!")
        out = self.request("POST", f"/storage/v1/b/{BUCKET}/o/mn/compose",
                           b'{"sourceObjects":[{"name":"m"},{"name":"n"}]}'
                           ).json()
        self.assertEqual(out["crc32c"], crc32c_b64(b"sunk bytes!"))
        self.assertGcsError(self.request("GET", self.obj_path("mn")
                                         + "?alt=media"), 501)
        # Seeded objects keep their bytes.
        self.srv.put_object(BUCKET, "seed", b"kept")
        r = self.request("GET", self.obj_path("seed") + "?alt=media")
        self.assertEqual(r.body, b"kept")
        self.srv.wait_idle()
        self.assertEqual(self.srv.memory()["retained_bytes"], 4)


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
        self.assertEqual(ctl("rewrite-limit", "1048576")[0], 0)
        self.assertEqual(ctl("rewrite-limit", "none")[0], 0)
        self.assertEqual(json.loads(ctl("rewrites")[1]), [])
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(10), 0)

    def test_serve_sink(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([PYTHON, SCRIPT, "serve", "--port-file",
                                 port_file, "--bucket", "ckpt", "--sink"],
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(),
                                                         proc.wait(5)))
        self.assertTrue(wait_until(lambda: os.path.exists(port_file), 10))
        self.assertIn("as an upload sink", proc.stdout.readline())
        with open(port_file) as f:
            port = int(f.read())
        data = pattern(5 * MIB, 8)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/upload/storage/v1/b/ckpt/o?uploadType=media&"
                             "name=big", data)
        res = json.loads(conn.getresponse().read())
        self.assertEqual((res["size"], res["md5Hash"]),
                         (str(len(data)), md5_b64(data)))
        conn.request("GET", "/storage/v1/b/ckpt/o/big?alt=media")
        r = conn.getresponse()
        self.assertEqual(r.status, 501)
        self.assertIn(b"--sink", r.read())
        conn.close()
        p = subprocess.run([PYTHON, SCRIPT, "ctl", "--port", str(port),
                            "memory"], capture_output=True, timeout=20)
        self.assertEqual(json.loads(p.stdout), {
            "retained_bytes": 0, "buffers": 0, "open_sessions": 0})
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(10), 0)

    def test_serve_rejects_bad_bucket(self):
        p = subprocess.run([PYTHON, SCRIPT, "serve", "--bucket", "B"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(p.returncode, 2)
        self.assertIn("invalid bucket name", p.stderr)


# ---------------------------------------------------------------- node
NODE_DIR = os.path.join(HERE, "node")
GCS_CLIENT = os.path.join(NODE_DIR, "gcs_client.js")


@unittest.skipUnless(shutil.which("node") and os.path.isdir(os.path.join(
    NODE_DIR, "node_modules", "@google-cloud", "storage")),
    "node or @google-cloud/storage is missing: run scripts/install-deps.sh "
    "(npm ci in tests/fakes/node) - compose not checked against Google's "
    "Node client")
class TestGoogleCloudStorageNodeInterop(GcsTestCase):
    """Google's @google-cloud/storage for Node against the fake: uploads of
    three kinds, bucket.combine() (objects.compose), a download with the
    library's own CRC32C validation, MD5 validation refused for a composite,
    a range, a list (node/gcs_client.js)."""

    def run_client(self, files):
        tmp = tempfile.mkdtemp(prefix="fake-gcs-node-")
        self.addCleanup(shutil.rmtree, tmp)
        paths = []
        for name, data in files:
            paths.append(os.path.join(tmp, name))
            with open(paths[-1], "wb") as f:
                f.write(data)
        out = os.path.join(tmp, "combined.out")
        p = subprocess.run(["node", GCS_CLIENT, BUCKET, out, *paths],
                           env=dict(os.environ,
                                    STORAGE_EMULATOR_HOST=self.srv.base_url),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        result = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertNotIn("error", result, result)
        with open(out, "rb") as f:
            return result, f.read()

    def test_combine_download_validate_list(self):
        files = [("a.bin", pattern(100 * KIB + 1, 21)),
                 ("b.bin", pattern(300 * KIB + 3, 22)),
                 ("c.bin", pattern(700 * KIB + 5, 23))]
        result, got = self.run_client(files)
        data = b"".join(d for _, d in files)
        # The library's uploads and its own upload validation passed (it
        # turns size into a number after a resumable upload).
        self.assertEqual([(u["name"], str(u["size"]), u["crc32c"],
                           u["md5Hash"])
                          for u in result["uploaded"]],
                         [(f"parts/{n}", str(len(d)), crc32c_b64(d),
                           md5_b64(d)) for n, d in files])
        kinds = [e["kind"] for e in self.srv.log()]
        self.assertEqual(kinds[:1], ["multipart"])
        self.assertGreaterEqual(kinds.count("chunk"), 4)  # 700 KiB / 256 KiB
        # bucket.combine() sent objects.compose, with the generations.
        entry = [e for e in self.srv.log() if e["kind"] == "compose"][0]
        self.assertEqual((entry["object"], entry["sources"], entry["status"]),
                         ("combined.bin", [f"parts/{n}" for n, _ in files],
                          200))
        comb = result["combined"]
        self.assertEqual((comb["name"], comb["size"], comb["crc32c"],
                          comb["componentCount"], comb["contentType"]),
                         ("combined.bin", str(len(data)), crc32c_b64(data),
                          3, "application/x-checkpoint"))
        self.assertNotIn("md5Hash", comb)
        # Downloaded with CRC32C validation on: the bytes are the parts'.
        self.assertEqual(got, data)
        self.assertEqual(result["download"]["size"], len(data))
        self.assertEqual(result["download"]["sha256"],
                         hashlib.sha256(data).hexdigest())
        # MD5 validation cannot be done on a composite object: the library
        # finds no md5= in x-goog-hash and says so.
        self.assertEqual(result["md5_download"]["code"], "MD5_NOT_AVAILABLE")
        self.assertEqual(bytes.fromhex(result["range"]), data[10:20])
        listed = {o["name"]: o for o in result["listed"]}
        self.assertEqual(sorted(listed), ["combined.bin", "parts/a.bin",
                                          "parts/b.bin", "parts/c.bin"])
        self.assertEqual(listed["combined.bin"]["componentCount"], 3)
        self.assertNotIn("componentCount", listed["parts/a.bin"])


# ---------------------------------------------------------------- rclone
RCLONE = shutil.which("rclone")
FUSERMOUNT = shutil.which("fusermount3")
MOUNT_SKIP = ("rclone mount needs /dev/fuse and fusermount3 (Debian: "
              "apt-get install fuse3)")


def is_mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


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

    def test_server_side_copyto_moveto_touch(self):
        data = pattern(3 * MIB + 11, 12)
        self.srv.put_object(BUCKET, "run/a.bin", data)
        # Make the fake answer done=false like GCS does for big or
        # cross-location rewrites: rclone must loop on the rewriteToken.
        self.srv.set_rewrite_limit(MIB)
        self.rclone("copyto", f"fakegcs:{BUCKET}/run/a.bin",
                    f"fakegcs:{BUCKET}/run/b.bin")
        rewrites = [e for e in self.srv.log() if e["kind"] == "rewrite"]
        self.assertEqual(len(rewrites), 4)
        self.assertNotIn("rewriteToken", rewrites[0]["query"])
        self.assertTrue(all("rewriteToken" in e["query"]
                            for e in rewrites[1:]))
        self.assertTrue(all(e["status"] == 200 and e["path"] ==
                            f"/storage/v1/b/{BUCKET}/o/run%2Fa.bin/rewriteTo"
                            f"/b/{BUCKET}/o/run%2Fb.bin" for e in rewrites))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "run/b.bin"), data)
        # Not a byte was uploaded: the copy was server-side.
        self.assertFalse(any(e["kind"] in ("media", "multipart", "resumable",
                                           "chunk") for e in self.srv.log()))
        self.srv.set_rewrite_limit(None)
        self.srv.reset_log()
        self.rclone("moveto", f"fakegcs:{BUCKET}/run/b.bin",
                    f"fakegcs:{BUCKET}/final/c.bin")
        kinds = [(e["kind"], e["object"], e["dst_object"])
                 for e in self.srv.log() if e["method"] != "GET"]
        self.assertEqual(kinds, [("rewrite", "run/b.bin", "final/c.bin"),
                                 ("delete", "run/b.bin", None)])
        objs = {o["name"]: o for o in self.srv.objects(BUCKET)}
        self.assertEqual(sorted(objs), ["final/c.bin", "run/a.bin"])
        self.assertEqual(objs["final/c.bin"]["crc32c"], crc32c_b64(data))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "final/c.bin"),
                         data)
        # rclone's SetModTime: objects.copy of the object onto itself.
        gen = objs["run/a.bin"]["generation"]
        self.srv.reset_log()
        self.rclone("touch", "-t", "2020-01-02T03:04:05",
                    f"fakegcs:{BUCKET}/run/a.bin")
        copies = [e for e in self.srv.log() if e["kind"] == "copy"]
        self.assertEqual([(e["object"], e["dst_object"], e["status"])
                          for e in copies], [("run/a.bin", "run/a.bin", 200)])
        obj = self.srv.objects(BUCKET, "run/a.bin")[0]
        self.assertGreater(obj["generation"], gen)
        self.assertTrue(obj["metadata"]["mtime"].startswith(
            "2020-01-02T03:04:05"), obj)
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "run/a.bin"), data)

    # ------------------------------------------------------------ mount
    RELEASED = "&{{{name} (rw)}}: >Release: err=<nil>"   # rclone -vv line

    def mount(self, *flags, cache_dir):
        """Start `rclone mount fakegcs:BUCKET` (VFS cache in cache_dir,
        -vv log in a new file); returns (proc, mountpoint, log path) once
        the mount is in /proc/self/mountinfo."""
        mnt = tempfile.mkdtemp(dir=self.tmp)
        fd, log_path = tempfile.mkstemp(dir=self.tmp, prefix="rclone-",
                                        suffix=".log")
        os.close(fd)
        e = dict(self.base_env, RCLONE_CONFIG_FAKEGCS_ENDPOINT=(
            self.srv.base_url + "/storage/v1/"))
        proc = subprocess.Popen(
            [RCLONE, "mount", f"fakegcs:{BUCKET}", mnt, "--cache-dir",
             cache_dir, "--vfs-cache-mode", "writes", "-vv", "--log-file",
             log_path, *flags], env=e, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def cleanup():
            if is_mounted(mnt):
                subprocess.run([FUSERMOUNT, "-u", "-z", mnt],
                               capture_output=True, timeout=20)
            if proc.poll() is None:
                proc.kill()
            proc.wait(20)
        self.addCleanup(cleanup)
        self.assertTrue(wait_until(lambda: is_mounted(mnt)
                                   or proc.poll() is not None, 20))
        self.assertTrue(is_mounted(mnt), self.read(log_path))
        return proc, mnt, log_path

    @staticmethod
    def read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def unmount(self, proc, mnt):
        """fusermount3 -u, then wait for rclone to exit; returns the
        seconds from the unmount to the exit."""
        t0 = time.monotonic()
        subprocess.run([FUSERMOUNT, "-u", mnt], check=True, timeout=20)
        proc.wait(30)
        return time.monotonic() - t0

    @unittest.skipUnless(os.path.exists("/dev/fuse") and FUSERMOUNT,
                         MOUNT_SKIP)
    def test_mount_rename_is_a_server_side_copy(self):
        cache = tempfile.mkdtemp(dir=self.tmp)
        proc, mnt, log_path = self.mount("--vfs-write-back", "0s",
                                         cache_dir=cache)
        data = pattern(3 * MIB + 7, 13)
        with open(os.path.join(mnt, "ckpt.tmp"), "wb") as f:
            f.write(data)
        # close() returns before rclone has handled FUSE's RELEASE, which
        # is where it uploads (write-back 0s). Renaming before that ends
        # races with the upload in rclone 1.60 (it re-hashes the cache
        # file after uploading, finds it renamed, deletes the upload and
        # never uploads the new name while mounted): wait for the end.
        released = self.RELEASED.format(name="ckpt.tmp")
        self.assertTrue(wait_until(lambda: released in self.read(log_path),
                                   30), self.read(log_path)[-3000:])
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "ckpt.tmp"), data)
        self.srv.reset_log()
        os.rename(os.path.join(mnt, "ckpt.tmp"),
                  os.path.join(mnt, "ckpt.bin"))
        self.assertTrue(self.srv.wait_idle(10))
        seconds = self.unmount(proc, mnt)
        self.assertEqual(proc.returncode, 0, self.read(log_path)[-3000:])
        self.assertLess(seconds, 30)
        # The rename was GET (destination absent), rewrite, delete.
        calls = [(e["method"], e["kind"], e["object"], e["dst_object"],
                  e["status"]) for e in self.srv.log()]
        self.assertEqual(calls, [
            ("GET", "get", "ckpt.bin", None, 404),
            ("POST", "rewrite", "ckpt.tmp", "ckpt.bin", 200),
            ("DELETE", "delete", "ckpt.tmp", None, 204)])
        self.assertEqual([o["name"] for o in self.srv.objects(BUCKET)],
                         ["ckpt.bin"])
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "ckpt.bin"), data)

    @unittest.skipUnless(os.path.exists("/dev/fuse") and FUSERMOUNT,
                         MOUNT_SKIP)
    def test_mount_unmount_does_not_wait_for_pending_uploads(self):
        # Pins down rclone 1.60's behaviour: on unmount it exits at once
        # ("Unmounted externally. Just exit now."); a write-back upload
        # still queued stays in the VFS cache dir and is only sent by the
        # next mount using the same --cache-dir.
        cache = tempfile.mkdtemp(dir=self.tmp)
        proc, mnt, log_path = self.mount("--vfs-write-back", "10s",
                                         cache_dir=cache)
        data = pattern(100_000, 14)
        with open(os.path.join(mnt, "late.bin"), "wb") as f:
            f.write(data)
        released = self.RELEASED.format(name="late.bin")
        self.assertTrue(wait_until(lambda: released in self.read(log_path),
                                   30), self.read(log_path)[-3000:])
        self.unmount(proc, mnt)
        self.assertEqual(proc.returncode, 0)
        self.assertEqual(self.srv.objects(BUCKET), [])
        self.assertIn("Unmounted externally", self.read(log_path))
        proc, mnt, _ = self.mount("--vfs-write-back", "0s", cache_dir=cache)
        self.assertTrue(self.srv.wait_for_object(BUCKET, "late.bin", 30))
        self.assertEqual(self.srv.get_object_bytes(BUCKET, "late.bin"), data)
        self.unmount(proc, mnt)

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

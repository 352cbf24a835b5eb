#!/usr/bin/python3
"""Fake Amazon S3 REST server for spotvisor tests.

Speaks the S3 subset in /work/shared/REFERENCE.md ("EC2 and S3") over
loopback, strict where S3 is strict: SigV4 (header and presigned query
auth, signed and unsigned aws-chunked bodies with trailers), PutObject,
GetObject (ranges, conditions), HeadObject, DeleteObject(s), multipart
uploads (CRC32C composite and full-object checksums), ListObjectsV2 and v1,
ListMultipartUploads, ListParts, conditional writes (If-None-Match: *,
If-Match) with 412/409/404 as S3 answers them, and the bucket calls the
AWS CLI makes (ListBuckets, HeadBucket, GetBucketLocation, Create/Delete
Bucket). Errors are S3's XML with S3's codes and statuses. Path-style
addressing (http://127.0.0.1:PORT/BUCKET/KEY); virtual-hosted style for
hosts ending in a configured suffix (default: BUCKET.localhost).

In-process:

    srv = FakeS3Server(buckets=("b",), credentials={"AKID": "secret"}).start()
    srv.endpoint                 # http://127.0.0.1:PORT (AWS_ENDPOINT_URL_S3)
    srv.fault("upload_part", code=503, count=2)
    srv.objects("b")
    srv.stop()

As a process:

    fake_s3.py serve [--port 0] [--port-file F] [--region R] [--bucket NAME[:REGION]]...
                     [--credentials AKID:SECRET[:SESSION_TOKEN]]...

Not implemented (answered 501 NotImplemented, or ignored as listed in the
"fake_s3.py" section of README.md next to this file): versioning, ACLs,
policies, tagging, CopyObject/UploadPartCopy, object lock, SSE (headers
ignored), storage classes (always STANDARD), SigV2, POST policy uploads,
CRC64NVME and S3's 2025 default checksums, HTTPS. Needs Debian's
/usr/bin/python3 with python3-crc32c.
"""

import argparse
import base64
import binascii
import bisect
import calendar
import collections
import email.utils
import hashlib
import hmac
import http.server
import json
import os
import re
import secrets
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import traceback
import urllib.parse
import xml.etree.ElementTree as ET
import zlib
from xml.sax.saxutils import escape as _xml_escape

try:
    import crc32c as _crc32c_module
except ImportError as _e:  # pragma: no cover - environment problem
    raise ImportError("fake_s3.py needs Debian's python3-crc32c: run it with "
                      "/usr/bin/python3") from _e

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
OWNER_ID = "75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a"
OWNER_NAME = "spotvisor-fake"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_SKEW = 15 * 60                     # seconds, as S3
MAX_PRESIGN_EXPIRES = 7 * 24 * 3600
MAX_OBJECT = 5 * 1024 ** 3             # single PUT / part limit
MIN_PART = 5 * 1024 * 1024
MAX_PARTS = 10000
MAX_KEYS = 1000
KEY_MAX_BYTES = 1024
DRAIN_MAX = 64 << 20                   # bigger unread bodies: close instead
XML_BODY_MAX = 16 << 20                # request XML documents
IO_BLOCK = 1 << 20
LOG_LIMIT = 10000
STREAMING = ("STREAMING-UNSIGNED-PAYLOAD-TRAILER",
             "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
             "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER")
UNSIGNED = "UNSIGNED-PAYLOAD"
CHECKSUM_ALGOS = ("crc32", "crc32c", "sha1", "sha256")
CHECKSUM_NAMES = {"crc32": "CRC32", "crc32c": "CRC32C", "sha1": "SHA1",
                  "sha256": "SHA256"}
CHECKSUM_BYTES = {"crc32": 4, "crc32c": 4, "sha1": 20, "sha256": 32}
# Query parameters that name a sub-resource this fake does not implement.
UNSUPPORTED_SUBRESOURCES = (
    "acl", "tagging", "versioning", "versions", "versionId", "policy",
    "policyStatus", "cors", "lifecycle", "website", "logging",
    "notification", "replication", "encryption", "object-lock",
    "legal-hold", "retention", "restore", "select", "torrent", "attributes",
    "accelerate", "analytics", "inventory", "metrics", "ownershipControls",
    "publicAccessBlock", "requestPayment", "intelligent-tiering", "session",
    "renameObject")
KINDS = ("put", "get", "head", "delete", "delete_objects", "list",
         "list_uploads", "list_parts", "create_multipart", "upload_part",
         "complete", "abort", "list_buckets", "head_bucket",
         "bucket_location", "create_bucket", "delete_bucket", "unsupported",
         "invalid")
FAULT_OPS = KINDS + ("any",)
# Default S3 error code and message for a status given to fault().
FAULT_ERRORS = {
    400: ("InvalidRequest", "Invalid Request"),
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchKey", "The specified key does not exist."),
    409: ("ConditionalRequestConflict", "The conditional request cannot "
          "succeed due to a conflicting operation against this resource."),
    412: ("PreconditionFailed", "At least one of the pre-conditions you "
          "specified did not hold"),
    500: ("InternalError", "We encountered an internal error. Please try "
          "again."),
    503: ("SlowDown", "Please reduce your request rate."),
}
# Request headers copied into requests() entries (never Authorization or
# the security token).
LOG_HEADERS = ("content-length", "content-type", "content-md5",
               "content-encoding", "transfer-encoding", "expect", "range",
               "if-match", "if-none-match", "x-amz-content-sha256",
               "x-amz-decoded-content-length", "x-amz-trailer",
               "x-amz-checksum-crc32", "x-amz-checksum-crc32c",
               "x-amz-checksum-sha1", "x-amz-checksum-sha256",
               "x-amz-checksum-algorithm", "x-amz-sdk-checksum-algorithm",
               "x-amz-checksum-mode", "x-amz-checksum-type", "user-agent")

_AMZ_DATE = re.compile(r"^(\d{8})T\d{6}Z$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

LogEntry = collections.namedtuple("LogEntry", "method path query status")


class S3Error(Exception):
    """An error answered to the client as S3's XML error document."""

    def __init__(self, status, code, message, extra=(), headers=()):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.extra = list(extra)          # (tag, text) after <Message>
        self.headers = list(headers)


class _Reset(Exception):
    """Drop the connection with a RST (fault or protocol failure)."""


class _ClientGone(Exception):
    """The client closed the connection before sending its whole body."""


# ---------------------------------------------------------------- helpers
def _uri_encode(s, keep_slash):
    """SigV4's UriEncode: every byte but A-Za-z0-9-_.~ as %XX (uppercase)."""
    return urllib.parse.quote(s, safe="/" if keep_slash else "")


def _unquote_strict(raw):
    """Percent-decode as UTF-8; None if the bytes are not UTF-8."""
    try:
        return urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError:
        return None


def _parse_query(raw):
    """The query string as a list of (name, value), decoded, in order.
    '+' is a literal plus (RFC 3986), as SigV4 clients encode a space %20."""
    pairs = []
    if not raw:
        return pairs
    for part in raw.split("&"):
        if part == "":
            continue
        name, _, value = part.partition("=")
        dn, dv = _unquote_strict(name), _unquote_strict(value)
        if dn is None or dv is None:
            raise S3Error(400, "InvalidURI", "Couldn't parse the specified "
                          "URI.", [("URI", raw)])
        pairs.append((dn, dv))
    return pairs


def _canonical_query(pairs, skip=()):
    enc = sorted((_uri_encode(n, False), _uri_encode(v, False))
                 for n, v in pairs if n not in skip)
    return "&".join(f"{n}={v}" for n, v in enc)


def _hmac(key, msg):
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def _signing_key(secret, date, region, service="s3"):
    k = _hmac(("AWS4" + secret).encode("utf-8"), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _b64(raw):
    return base64.b64encode(raw).decode("ascii")


def _checksum_raw(algo, data):
    if algo == "crc32c":
        return struct.pack(">I", _crc32c_module.crc32c(data))
    if algo == "crc32":
        return struct.pack(">I", zlib.crc32(data) & 0xFFFFFFFF)
    if algo == "sha1":
        return hashlib.sha1(data).digest()
    return hashlib.sha256(data).digest()


def _http_date(t):
    return email.utils.formatdate(int(t), usegmt=True)


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(int(t)))


def _amz_date(t):
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(int(t)))


def _parse_http_date(value):
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if dt is None or dt.tzinfo is None:
        return None
    return dt.timestamp()


def _request_id():
    return secrets.token_hex(8).upper()


def _host_id():
    return _b64(secrets.token_bytes(48))


def _etag_list(value):
    """An If-Match / If-None-Match value as a list of bare ETags ('*' kept)."""
    out = []
    for item in value.split(","):
        item = item.strip()
        if item.startswith("W/"):
            item = item[2:]
        out.append(item.strip('"'))
    return out


def _successor(p):
    """The smallest string greater than every string starting with p."""
    return p[:-1] + chr(ord(p[-1]) + 1) if p else None


# Characters XML 1.0 cannot carry, even escaped; written as numeric
# references, as S3 does for such key names (clients that may meet them ask
# for encoding-type=url).
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff"
                          "\ufffe\uffff]")


def _x(tag, text):
    text = _XML_INVALID.sub(lambda m: f"&#x{ord(m.group()):X};",
                            _xml_escape(str(text)))
    return f"<{tag}>{text}</{tag}>"


def _same(a, b):
    """Constant-time comparison of two signatures given as text."""
    return hmac.compare_digest(a.encode("utf-8", "surrogateescape"),
                               b.encode("utf-8", "surrogateescape"))


def _xml_doc(root, inner):
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{S3_NS}">'
            f"{inner}</{root}>").encode("utf-8")


def _parse_xml(body, root):
    """Parse a request XML document whose root element is `root` (with or
    without S3's namespace). No DTDs; anything malformed is MalformedXML."""
    bad = S3Error(400, "MalformedXML", "The XML you provided was not "
                  "well-formed or did not validate against our published "
                  "schema")
    if not body:
        raise S3Error(400, "MissingRequestBodyError", "Request Body is "
                      "empty.")
    low = bytes(body).lower()
    if b"<!doctype" in low or b"<!entity" in low:
        raise bad
    try:
        elem = ET.fromstring(bytes(body))
    except (ET.ParseError, ValueError):
        raise bad from None
    if _local(elem.tag) != root:
        raise bad
    return elem


def _local(tag):
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _children(elem, name):
    return [c for c in elem if _local(c.tag) == name]


def _child_text(elem, name):
    found = _children(elem, name)
    if not found:
        return None
    return found[0].text or ""


def _write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- state
class _Object:
    __slots__ = ("data", "etag", "last_modified", "checksums",
                 "checksum_type", "content_type", "content_encoding",
                 "metadata", "part_sizes")

    def info(self):
        crc = self.checksums.get("crc32c")
        return {"size": len(self.data), "etag": f'"{self.etag}"',
                "crc32c": crc,
                "checksums": {CHECKSUM_NAMES[a]: v
                              for a, v in self.checksums.items()},
                "checksum_type": self.checksum_type,
                "last_modified": self.last_modified,
                "content_type": self.content_type,
                "metadata": dict(self.metadata),
                "parts": (len(self.part_sizes) if self.part_sizes
                          else None)}


class _Part:
    __slots__ = ("data", "etag", "md5", "checksums", "last_modified")


class _Upload:
    def __init__(self, upload_id, bucket, key, algo, ctype, content_type,
                 content_encoding, metadata, delete_gen, now):
        self.upload_id = upload_id
        self.bucket = bucket
        self.key = key
        self.algo = algo                  # checksum algorithm or None
        self.ctype = ctype                # COMPOSITE / FULL_OBJECT / None
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.metadata = metadata
        self.delete_gen = delete_gen      # key's delete count at creation
        self.initiated = now
        self.parts = {}

    def info(self):
        return {"bucket": self.bucket, "key": self.key,
                "upload_id": self.upload_id, "initiated": self.initiated,
                "checksum_algorithm": (CHECKSUM_NAMES[self.algo]
                                       if self.algo else None),
                "parts": {n: {"size": len(p.data), "etag": f'"{p.etag}"',
                              "crc32c": p.checksums.get("crc32c")}
                          for n, p in sorted(self.parts.items())}}


class _Bucket:
    def __init__(self, name, region, now):
        self.name = name
        self.region = region
        self.created = now
        self.objects = {}
        self.keys = []                    # sorted (code point = UTF-8 order)
        self.deletes = {}                 # key -> deletes so far


class _Cred:
    __slots__ = ("akid", "secret", "token", "expires_at")

    def __init__(self, akid, secret, token=None, expires_at=None):
        self.akid, self.secret = akid, secret
        self.token, self.expires_at = token, expires_at


class _Reply:
    __slots__ = ("status", "headers", "body", "ctype")

    def __init__(self, status, body=b"", headers=(), ctype=None):
        self.status = status
        self.body = body
        self.headers = list(headers)
        self.ctype = ctype


class _Ctx:
    """One request as the handlers see it."""

    def __init__(self):
        self.method = self.raw_path = self.raw_query = None
        self.params = []
        self.q = {}
        self.headers = None
        self.bucket = self.key = None
        self.kind = "invalid"
        self.entry = None
        self.body = b""
        self.trailers = {}
        self.cred = None
        self.payload = None
        self.signing = None               # (key, amz_date, scope, seed sig)
        self.signing_region = None
        self.body_read = False
        self.src = None                   # the _BodySource being read
        self.delete_gen = 0

    def h(self, name, default=None):
        return self.headers.get(name, default)


# ---------------------------------------------------------------- server
class _Listener(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, fake):
        self.fake = fake
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self):
        # HTTPServer.server_bind does a reverse DNS lookup; never needed.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class FakeS3Server:
    """In-process fake S3 server. Thread-safe."""

    def __init__(self, host="127.0.0.1", port=0, region="us-east-1",
                 buckets=(), credentials=None,
                 vhost_suffixes=("localhost",), clock=time.time):
        """credentials: {akid: secret} or {akid: (secret, session_token)}
        or {akid: {"secret", "session_token", "expires_at"}}.
        vhost_suffixes: Host names ending in ".SUFFIX" address the bucket
        named by the labels before it (virtual-hosted style).
        clock: wall time in epoch seconds, for the signature's time window
        and Last-Modified (tests of AWS's 2013 signing examples pin it)."""
        self.host = host
        self.port = port
        self.region = region
        self.vhost_suffixes = tuple(s.lower().strip(".")
                                    for s in vhost_suffixes)
        self.clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._buckets = {}
        self._uploads = {}
        self._creds = {}
        self._faults = []
        self._fault_epoch = 0             # bumped by clear_faults()
        self._log = []
        self._hits = collections.Counter()
        self._inflight = 0
        self._stopping = False
        self._listener = None
        self._thread = None
        for name in buckets:
            self.create_bucket(name)
        for akid, value in (credentials or {}).items():
            if isinstance(value, str):
                self.add_credentials(akid, value)
            elif isinstance(value, dict):
                self.add_credentials(akid, value["secret"],
                                     value.get("session_token"),
                                     value.get("expires_at"))
            else:
                self.add_credentials(akid, *value)

    # ------------------------------------------------------------ lifecycle
    def start(self):
        with self._lock:
            self._stopping = False
        listener = _Listener((self.host, self.port), self)
        self.port = listener.server_address[1]
        thread = threading.Thread(target=listener.serve_forever,
                                  kwargs={"poll_interval": 0.05},
                                  name=f"fake-s3:{self.port}", daemon=True)
        thread.start()
        self._listener, self._thread = listener, thread
        return self

    def stop(self):
        with self._lock:
            self._stopping = True         # releases fault delays
            self._changed.notify_all()
        listener, thread = self._listener, self._thread
        self._listener = self._thread = None
        if listener is None:
            return
        listener.shutdown()
        listener.server_close()
        thread.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def endpoint(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # ------------------------------------------------------------ seeding
    def create_bucket(self, name, region=None):
        """Create a bucket (no name rules checked). Requests for it must be
        signed for `region` (default: the server's)."""
        with self._lock:
            if name not in self._buckets:
                self._buckets[name] = _Bucket(name, region or self.region,
                                              self.clock())
            self._changed.notify_all()

    def buckets(self):
        with self._lock:
            return {n: b.region for n, b in self._buckets.items()}

    def add_credentials(self, access_key_id, secret, session_token=None,
                        expires_at=None):
        """A key pair the server accepts. With session_token, requests must
        carry it in a signed X-Amz-Security-Token; expires_at (epoch
        seconds) makes them fail with ExpiredToken after that time."""
        with self._lock:
            self._creds[access_key_id] = _Cred(access_key_id, secret,
                                               session_token, expires_at)

    def remove_credentials(self, access_key_id):
        with self._lock:
            self._creds.pop(access_key_id, None)

    def put_object(self, bucket, key, data, content_type=None,
                   metadata=None, checksum_algorithm=None):
        """Store an object directly; returns its ETag (quoted)."""
        data = bytes(data)
        algo = checksum_algorithm.lower() if checksum_algorithm else None
        if algo is not None and algo not in CHECKSUM_ALGOS:
            raise ValueError(f"checksum_algorithm must be one of "
                             f"{', '.join(CHECKSUM_NAMES.values())}")
        checks = {algo: _b64(_checksum_raw(algo, data))} if algo else {}
        with self._lock:
            b = self._bucket_or_raise(bucket)
            obj = self._make_object(data, hashlib.md5(data).hexdigest(),
                                    checks, "FULL_OBJECT" if algo else None,
                                    content_type, None, metadata or {})
            self._commit_locked(b, key, obj)
            return f'"{obj.etag}"'

    def get_object_bytes(self, bucket, key):
        with self._lock:
            obj = self._bucket_or_raise(bucket).objects.get(key)
            if obj is None:
                raise KeyError(f"{bucket}/{key}")
            return obj.data

    def delete_object(self, bucket, key):
        """Delete directly; True if it existed."""
        with self._lock:
            b = self._bucket_or_raise(bucket)
            return self._remove_locked(b, key)

    def objects(self, bucket, prefix=""):
        """{key: {"size", "etag" (quoted), "crc32c" (base64 or None; a
        composite is "BASE64-N"), "checksums", "checksum_type",
        "last_modified" (epoch s), "content_type", "metadata", "parts"}}"""
        with self._lock:
            b = self._bucket_or_raise(bucket)
            i = bisect.bisect_left(b.keys, prefix)
            out = {}
            for k in b.keys[i:]:
                if not k.startswith(prefix):
                    break
                out[k] = b.objects[k].info()
            return out

    def uploads(self, bucket=None):
        """In-progress multipart uploads, oldest first: dicts with bucket,
        key, upload_id, initiated, checksum_algorithm and parts
        ({number: {size, etag, crc32c}})."""
        with self._lock:
            return [u.info() for u in sorted(self._uploads.values(),
                                             key=lambda u: u.initiated)
                    if bucket is None or u.bucket == bucket]

    def create_upload(self, bucket, key):
        """Start a multipart upload directly (as another client under way
        would have); returns its upload id."""
        uid = _b64(secrets.token_bytes(48)).replace("+", "-").replace(
            "/", "_").rstrip("=")
        with self._lock:
            b = self._bucket_or_raise(bucket)
            self._uploads[uid] = _Upload(uid, b.name, key, None, None, None,
                                         None, {}, b.deletes.get(key, 0),
                                         self.clock())
            self._changed.notify_all()
        return uid

    def backdate_upload(self, upload_id, seconds):
        """Make an upload look `seconds` older (one a crash left behind
        days ago), without waiting."""
        with self._lock:
            self._uploads[upload_id].initiated -= seconds

    def _bucket_or_raise(self, name):
        b = self._buckets.get(name)
        if b is None:
            raise KeyError(f"no bucket {name!r}")
        return b

    # ------------------------------------------------------------ faults
    def fault(self, op, code=None, count=1, after_bytes=None, delay=None,
              reset=False, error=None, message=None, bucket=None,
              key_prefix=None, after_commit=False):
        """Inject a failure into the next `count` requests of kind `op`
        (one of KINDS, or "any"; count=None: until clear_faults()).

        code=503 / 500 / ...: answer S3's XML error (503 SlowDown, 500
          InternalError, 409 ConditionalRequestConflict, 412
          PreconditionFailed, ...; `error`/`message` override the code and
          text). The request body is read first (kept alive), unless the
          client sent Expect: 100-continue: then it is refused unread and
          the connection closed.
        reset=True: drop the connection with a RST instead of answering:
          after reading the headers, or, with after_bytes=N, after reading
          N body bytes (uploads) / after sending the headers and N body
          bytes (GET).
        delay=S: wait S seconds before answering (alone: then answer
          normally; stop() or clear_faults() cuts the wait short).
        after_commit=True: carry the request out (the object lands, the
          upload completes), then answer the error / reset: a lost answer.
        bucket=, key_prefix=: only requests for that bucket / keys.
        fault("none") clears every fault. Returns the active faults."""
        if op == "none":
            self.clear_faults()
            return []
        if op not in FAULT_OPS:
            raise ValueError(f"op must be one of {', '.join(FAULT_OPS)}")
        if after_bytes is not None:
            if not isinstance(after_bytes, int) or after_bytes < 0:
                raise ValueError("after_bytes must be a non-negative int")
            reset = True
        if code is not None and reset:
            raise ValueError("give code or reset, not both")
        if code is None and not reset and delay is None:
            raise ValueError("give code, reset or delay")
        if code is not None and not (isinstance(code, int)
                                     and 300 <= code <= 599):
            raise ValueError("code must be an HTTP status 300-599")
        if count is not None and (not isinstance(count, int) or count < 1):
            raise ValueError("count must be a positive int or None")
        if delay is not None and (not isinstance(delay, (int, float))
                                  or delay < 0):
            raise ValueError("delay must be a non-negative number")
        spec = {"op": op, "code": code, "count": count,
                "after_bytes": after_bytes, "delay": delay,
                "reset": bool(reset), "error": error, "message": message,
                "bucket": bucket, "key_prefix": key_prefix,
                "after_commit": bool(after_commit)}
        with self._lock:
            self._faults.append(spec)
            return [dict(f) for f in self._faults]

    def faults(self):
        with self._lock:
            return [dict(f) for f in self._faults]

    def clear_faults(self):
        with self._lock:
            self._faults = []
            self._fault_epoch += 1
            self._changed.notify_all()    # cuts delays short

    def _take_fault(self, ctx):
        with self._lock:
            for f in self._faults:
                if f["op"] not in ("any", ctx.kind):
                    continue
                if f["bucket"] is not None and f["bucket"] != ctx.bucket:
                    continue
                if f["key_prefix"] is not None and not (
                        ctx.key or "").startswith(f["key_prefix"]):
                    continue
                if f["count"] is not None:
                    f["count"] -= 1
                    if f["count"] == 0:
                        self._faults.remove(f)
                return dict(f)
        return None

    def _fault_error(self, f):
        code, msg = FAULT_ERRORS.get(f["code"], ("InternalError",
                                                 FAULT_ERRORS[500][1]))
        return S3Error(f["code"], f["error"] or code, f["message"] or msg)

    def _sleep(self, seconds):
        with self._lock:
            epoch = self._fault_epoch
            self._changed.wait_for(
                lambda: self._stopping or self._fault_epoch != epoch,
                seconds)

    # ------------------------------------------------------------ observing
    def log(self):
        """[(method, raw path, raw query, status)], oldest first; status is
        None while a request is in flight or when it got no answer."""
        with self._lock:
            return [LogEntry(e["method"], e["path"], e["query"], e["status"])
                    for e in self._log]

    def requests(self):
        """The log with details: dicts with method, path, query, status,
        kind, bucket, key, error (S3 code or None), outcome ("answered",
        "reset", "client-gone", "early-reject"), phase ("headers" until
        the body is being read, "body" while it is, "done"), headers (a
        subset, lower case), time."""
        with self._lock:
            return [dict(e, headers=dict(e["headers"])) for e in self._log]

    def reset_log(self):
        with self._lock:
            self._log.clear()
            self._hits.clear()
            self._changed.notify_all()

    def hits(self, kind=None):
        """Requests of this kind (all if None) since the last reset_log()."""
        with self._lock:
            if kind is None:
                return sum(self._hits.values())
            return self._hits.get(kind, 0)

    def inflight(self):
        with self._lock:
            return self._inflight

    def wait_for(self, what, timeout=5.0, count=1, kind=None, bucket=None,
                 key=None):
        """Block until a condition holds; True if it did within timeout.
        what: a callable (re-checked whenever the server's state changes;
        it may call this object's methods), or "hits" (hits(kind) >=
        count), "inflight" (inflight() >= count), "idle" (inflight() == 0),
        "object" (bucket/key exists), "uploads" (>= count in-progress
        uploads, in bucket if given)."""
        if callable(what):
            pred = what
        elif what == "hits":
            pred = lambda: self.hits(kind) >= count  # noqa: E731
        elif what == "inflight":
            pred = lambda: self._inflight >= count  # noqa: E731
        elif what == "idle":
            pred = lambda: self._inflight == 0  # noqa: E731
        elif what == "object":
            pred = lambda: (bucket in self._buckets and  # noqa: E731
                            key in self._buckets[bucket].objects)
        elif what == "uploads":
            pred = lambda: len(self.uploads(bucket)) >= count  # noqa: E731
        else:
            raise ValueError("what must be a callable or hits, inflight, "
                             "idle, object, uploads")
        with self._lock:
            return self._changed.wait_for(pred, timeout)

    def _arrive(self, ctx):
        entry = {"method": ctx.method, "path": ctx.raw_path,
                 "query": ctx.raw_query, "status": None, "kind": ctx.kind,
                 "bucket": ctx.bucket, "key": ctx.key, "error": None,
                 "outcome": None, "phase": "headers", "time": time.time(),
                 "headers": {h: ctx.headers[h] for h in LOG_HEADERS
                             if h in ctx.headers}}
        with self._lock:
            self._log.append(entry)
            if len(self._log) > LOG_LIMIT:
                del self._log[:len(self._log) - LOG_LIMIT]
            self._hits[ctx.kind] += 1
            self._changed.notify_all()
        ctx.entry = entry

    def _note(self, entry, **fields):
        with self._lock:
            if "status" in fields or "outcome" in fields:
                fields.setdefault("phase", "done")
            entry.update(fields)
            self._changed.notify_all()

    def _inflight_delta(self, d):
        with self._lock:
            self._inflight += d
            self._changed.notify_all()

    # ------------------------------------------------------------ storage
    def _make_object(self, data, etag, checksums, checksum_type,
                     content_type, content_encoding, metadata,
                     part_sizes=None):
        obj = _Object()
        obj.data = data
        obj.etag = etag
        obj.last_modified = self.clock()
        obj.checksums = checksums
        obj.checksum_type = checksum_type
        obj.content_type = content_type or "binary/octet-stream"
        obj.content_encoding = content_encoding
        obj.metadata = dict(metadata)
        obj.part_sizes = part_sizes
        return obj

    def _commit_locked(self, b, key, obj):
        if key not in b.objects:
            bisect.insort(b.keys, key)
        b.objects[key] = obj
        self._changed.notify_all()

    def _remove_locked(self, b, key):
        if key not in b.objects:
            return False
        del b.objects[key]
        i = bisect.bisect_left(b.keys, key)
        del b.keys[i]
        b.deletes[key] = b.deletes.get(key, 0) + 1
        self._changed.notify_all()
        return True

    # ------------------------------------------------------------ routing
    def _route(self, ctx):
        """Fill ctx.bucket, ctx.key and ctx.kind from the request line."""
        path = _unquote_strict(ctx.raw_path)
        if path is None or not path.startswith("/"):
            raise S3Error(400, "InvalidURI", "Couldn't parse the specified "
                          "URI.", [("URI", ctx.raw_path)])
        host = (ctx.h("Host") or "").strip().lower()
        if host.startswith("["):
            hostname = host[:host.find("]") + 1]
        else:
            hostname = host.rsplit(":", 1)[0] if ":" in host else host
        vbucket = None
        for suffix in self.vhost_suffixes:
            if hostname.endswith("." + suffix):
                vbucket = hostname[:-len(suffix) - 1]
                break
        if vbucket is not None:
            bucket, key = vbucket, path[1:]
        else:
            rest = path[1:]
            bucket, sep, key = rest.partition("/")
            if not sep:
                key = ""
        ctx.bucket = bucket or None
        ctx.key = key or None
        if ctx.key is not None and len(ctx.key.encode("utf-8")) > \
                KEY_MAX_BYTES:
            raise S3Error(400, "KeyTooLongError", "Your key is too long",
                          [("Size", len(ctx.key.encode("utf-8"))),
                           ("MaxSizeAllowed", KEY_MAX_BYTES)])
        m, q = ctx.method, ctx.q
        if any(s in q for s in UNSUPPORTED_SUBRESOURCES) or (
                m in ("PUT", "POST") and "x-amz-copy-source" in ctx.headers):
            ctx.kind = "unsupported"
        elif ctx.bucket is None:
            ctx.kind = "list_buckets" if m in ("GET", "HEAD") else "invalid"
        elif ctx.key is None:
            if m == "GET" and "location" in q:
                ctx.kind = "bucket_location"
            elif m == "GET" and "uploads" in q:
                ctx.kind = "list_uploads"
            elif m == "GET":
                ctx.kind = "list"
            elif m == "HEAD":
                ctx.kind = "head_bucket"
            elif m == "PUT":
                ctx.kind = "create_bucket"
            elif m == "DELETE":
                ctx.kind = "delete_bucket"
            elif m == "POST" and "delete" in q:
                ctx.kind = "delete_objects"
            else:
                ctx.kind = "invalid"
        else:
            upload = "uploadId" in q
            if m == "PUT":
                ctx.kind = "upload_part" if (upload or "partNumber" in q) \
                    else "put"
            elif m == "GET":
                ctx.kind = "list_parts" if upload else "get"
            elif m == "HEAD":
                ctx.kind = "head"
            elif m == "DELETE":
                ctx.kind = "abort" if upload else "delete"
            elif m == "POST" and "uploads" in q:
                ctx.kind = "create_multipart"
            elif m == "POST" and upload:
                ctx.kind = "complete"
            else:
                ctx.kind = "invalid"

    def _expected_region(self, ctx):
        with self._lock:
            b = self._buckets.get(ctx.bucket) if ctx.bucket else None
            return b.region if b is not None else self.region

    # ------------------------------------------------------------ auth
    def _authenticate(self, ctx):
        """Check the request's SigV4 signature (header or presigned query)
        before its body is read. Sets ctx.cred and ctx.payload (the payload
        hash mode) and, for signed streaming, the chunk-signing context."""
        auth = ctx.h("Authorization")
        presigned = "X-Amz-Algorithm" in ctx.q
        if auth is not None and presigned:
            raise S3Error(400, "InvalidArgument", "Only one auth mechanism "
                          "allowed; only the X-Amz-Algorithm query parameter,"
                          " Signature query string parameter or the "
                          "Authorization header should be specified",
                          [("ArgumentName", "Authorization"),
                           ("ArgumentValue", auth)])
        if auth is None and not presigned:
            if "Signature" in ctx.q or "AWSAccessKeyId" in ctx.q:
                raise S3Error(400, "InvalidRequest", "The authorization "
                              "mechanism you have provided is not supported. "
                              "Please use AWS4-HMAC-SHA256.")
            raise S3Error(403, "AccessDenied", "Access Denied")
        if presigned:
            return self._auth_query(ctx)
        return self._auth_header(ctx, auth)

    def _auth_header(self, ctx, auth):
        malformed = "The authorization header is malformed; "
        if auth.startswith("AWS "):
            raise S3Error(400, "InvalidRequest", "The authorization mechanism"
                          " you have provided is not supported. Please use "
                          "AWS4-HMAC-SHA256.")
        algo, _, rest = auth.partition(" ")
        if algo != "AWS4-HMAC-SHA256":
            raise S3Error(400, "InvalidArgument", "Unsupported Authorization "
                          "Type", [("ArgumentName", "Authorization"),
                                   ("ArgumentValue", auth)])
        parts = {}
        for item in rest.split(","):
            name, eq, value = item.strip().partition("=")
            if eq:
                parts[name] = value.strip()
        if not all(k in parts for k in ("Credential", "SignedHeaders",
                                        "Signature")):
            raise S3Error(400, "AuthorizationHeaderMalformed", malformed +
                          "the authorization header requires three "
                          "components: Credential, SignedHeaders, and "
                          "Signature.", self._region_extra(ctx))
        amz_date = ctx.h("X-Amz-Date")
        signed = parts["SignedHeaders"].lower().split(";")
        return self._verify(ctx, parts["Credential"], signed,
                            parts["Signature"], amz_date,
                            ctx.h("X-Amz-Security-Token"), malformed,
                            presigned=False)

    def _auth_query(self, ctx):
        q = ctx.q
        malformed = "Error parsing the X-Amz-Credential parameter; "
        if q.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
            raise S3Error(400, "AuthorizationQueryParametersError",
                          "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256"
                          "\"")
        missing = [p for p in ("X-Amz-Credential", "X-Amz-Signature",
                               "X-Amz-SignedHeaders", "X-Amz-Date",
                               "X-Amz-Expires") if p not in q]
        if missing:
            raise S3Error(400, "AuthorizationQueryParametersError", "Query-"
                          "string authentication version 4 requires the "
                          "X-Amz-Algorithm, X-Amz-Credential, X-Amz-"
                          "Signature, X-Amz-Date, X-Amz-SignedHeaders, and "
                          "X-Amz-Expires parameters.")
        try:
            expires = int(q["X-Amz-Expires"])
            if expires < 0:
                raise ValueError
        except ValueError:
            raise S3Error(400, "AuthorizationQueryParametersError",
                          "X-Amz-Expires should be a number") from None
        if expires > MAX_PRESIGN_EXPIRES:
            raise S3Error(400, "AuthorizationQueryParametersError",
                          "X-Amz-Expires must be less than a week (in "
                          "seconds) that is 604800")
        cred = self._verify(ctx, q["X-Amz-Credential"],
                            q["X-Amz-SignedHeaders"].lower().split(";"),
                            q["X-Amz-Signature"], q["X-Amz-Date"],
                            q.get("X-Amz-Security-Token"), malformed,
                            presigned=True)
        m = _AMZ_DATE.match(q["X-Amz-Date"])
        t = calendar.timegm(time.strptime(q["X-Amz-Date"],
                                          "%Y%m%dT%H%M%SZ")) if m else 0
        now = self.clock()
        if now > t + expires:
            raise S3Error(403, "AccessDenied", "Request has expired",
                          [("X-Amz-Expires", expires),
                           ("Expires", _iso(t + expires)),
                           ("ServerTime", _iso(now))])
        return cred

    def _region_extra(self, ctx):
        return [("Region", self._expected_region(ctx))]

    def _verify(self, ctx, credential, signed, signature, amz_date, token,
                malformed, presigned):
        scope = credential.split("/")
        if len(scope) != 5 or not scope[0]:
            raise S3Error(400, "AuthorizationHeaderMalformed" if not presigned
                          else "AuthorizationQueryParametersError",
                          malformed + "the Credential is mal-formed; "
                          "expecting \"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/"
                          "aws4_request\".", self._region_extra(ctx))
        akid, cdate, cregion, cservice, cterm = scope
        err_code = ("AuthorizationQueryParametersError" if presigned
                    else "AuthorizationHeaderMalformed")
        with self._lock:
            cred = self._creds.get(akid)
        if cred is None or (cred.token is not None and token is None):
            # A temporary key id without its token is unknown to S3.
            raise S3Error(403, "InvalidAccessKeyId", "The AWS Access Key Id "
                          "you provided does not exist in our records.",
                          [("AWSAccessKeyId", akid)])
        if token is not None and token != cred.token:
            raise S3Error(400, "InvalidToken", "The provided token is "
                          "malformed or otherwise invalid.",
                          [("Token-0", token)])
        if cred.expires_at is not None and self.clock() >= cred.expires_at:
            raise S3Error(400, "ExpiredToken", "The provided token has "
                          "expired.", [("Token-0", token)])
        if amz_date is None and not presigned:
            date_hdr = ctx.h("Date")
            t = _parse_http_date(date_hdr) if date_hdr else None
            if t is None:
                raise S3Error(403, "AccessDenied", "AWS authentication "
                              "requires a valid Date or x-amz-date header")
            amz_date = _amz_date(t)
        m = _AMZ_DATE.match(amz_date or "")
        try:
            t = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ")) \
                if m else None
        except ValueError:
            t = None
        if t is None:
            if presigned:
                raise S3Error(400, "AuthorizationQueryParametersError",
                              "X-Amz-Date must be in the ISO8601 Long Format "
                              "\"yyyyMMdd'T'HHmmss'Z'\"")
            raise S3Error(403, "AccessDenied", "AWS authentication requires "
                          "a valid Date or x-amz-date header")
        if cdate != m.group(1):
            raise S3Error(400, err_code, malformed + "Invalid credential "
                          "date. Date is not the same as X-Amz-Date.",
                          self._region_extra(ctx))
        # CreateBucket names its region in its body (checked there).
        want_region = (cregion if ctx.kind == "create_bucket"
                       else self._expected_region(ctx))
        if cregion != want_region and not (
                ctx.kind == "bucket_location" and cregion == "us-east-1"):
            raise S3Error(400, err_code, malformed + f"the region "
                          f"'{cregion}' is wrong; expecting '{want_region}'",
                          [("Region", want_region)],
                          [("x-amz-bucket-region", want_region)])
        if cservice != "s3":
            raise S3Error(400, err_code, malformed + f"incorrect service "
                          f"\"{cservice}\". This endpoint belongs to \"s3\".",
                          self._region_extra(ctx))
        if cterm != "aws4_request":
            raise S3Error(400, err_code, malformed + f"incorrect terminal "
                          f"\"{cterm}\". This endpoint uses "
                          "\"aws4_request\".", self._region_extra(ctx))
        now = self.clock()
        if not presigned and abs(now - t) > MAX_SKEW:
            raise S3Error(403, "RequestTimeTooSkewed", "The difference "
                          "between the request time and the current time is "
                          "too large.",
                          [("RequestTime", amz_date),
                           ("ServerTime", _iso(now).replace(".000", "")),
                           ("MaxAllowedSkewMilliseconds", MAX_SKEW * 1000)])
        if presigned and t > now + MAX_SKEW:
            raise S3Error(403, "AccessDenied", "Request is not valid yet")
        payload = ctx.h("X-Amz-Content-SHA256")
        if payload is None:
            if not presigned:
                raise S3Error(400, "InvalidRequest", "Missing required "
                              "header for this request: "
                              "x-amz-content-sha256")
            payload = UNSIGNED
        if payload not in (UNSIGNED,) + STREAMING and \
                not _HEX64.match(payload):
            raise S3Error(400, "InvalidArgument", "x-amz-content-sha256 must "
                          "be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-"
                          "TRAILER, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, "
                          "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER or a "
                          "valid sha256 value.",
                          [("ArgumentName", "x-amz-content-sha256"),
                           ("ArgumentValue", payload)])
        if "host" not in signed:
            raise S3Error(403, "SignatureDoesNotMatch", "'Host' or "
                          "':authority' must be a 'SignedHeader' in the AWS "
                          "Authorization.")
        unsigned = sorted({h.lower() for h in ctx.headers.keys()
                           if h.lower().startswith("x-amz-")
                           and h.lower() not in signed})
        if unsigned:
            raise S3Error(403, "AccessDenied", "There were headers present "
                          "in the request which were not signed",
                          [("HeadersNotSigned", ", ".join(unsigned))])
        canon_headers = ""
        for name in signed:
            values = ctx.headers.get_all(name) or []
            joined = ",".join(" ".join(v.split()) for v in values)
            canon_headers += f"{name}:{joined}\n"
        skip = ("X-Amz-Signature",) if presigned else ()
        canonical = "\n".join([
            ctx.method,
            _uri_encode(_unquote_strict(ctx.raw_path) or "/", True),
            _canonical_query(ctx.params, skip),
            canon_headers,
            ";".join(signed),
            payload])
        cscope = f"{cdate}/{cregion}/s3/aws4_request"
        sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, cscope,
                         hashlib.sha256(canonical.encode("utf-8"))
                         .hexdigest()])
        key = _signing_key(cred.secret, cdate, cregion)
        want = hmac.new(key, sts.encode("utf-8"), hashlib.sha256).hexdigest()
        if not _same(want, signature):
            raise S3Error(403, "SignatureDoesNotMatch", "The request "
                          "signature we calculated does not match the "
                          "signature you provided. Check your key and "
                          "signing method.",
                          [("AWSAccessKeyId", akid), ("StringToSign", sts),
                           ("SignatureProvided", signature),
                           ("StringToSignBytes",
                            " ".join(f"{c:02x}" for c in sts.encode())),
                           ("CanonicalRequest", canonical),
                           ("CanonicalRequestBytes",
                            " ".join(f"{c:02x}"
                                     for c in canonical.encode()))])
        ctx.cred = cred
        ctx.payload = payload
        ctx.signing = (key, amz_date, cscope, signature)
        return cred

    # ------------------------------------------------------------ checksums
    def _declared_checksums(self, ctx, where):
        """x-amz-checksum-* values from headers (or, for trailers, from
        the trailer), validated in form: {algo: base64}."""
        found = {}
        for algo in CHECKSUM_ALGOS:
            name = f"x-amz-checksum-{algo}"
            value = where.get(name)
            if value is None:
                continue
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raw = None
            if raw is None or len(raw) != CHECKSUM_BYTES[algo]:
                raise S3Error(400, "InvalidRequest", f"Value for {name} "
                              "header is invalid.")
            found[algo] = value
        if len(found) > 1:
            raise S3Error(400, "InvalidRequest", "Expecting a single "
                          "x-amz-checksum- header. Multiple checksum Types "
                          "are not allowed.")
        return found

    def _check_integrity(self, ctx, data, checksums=True):
        """Verify Content-MD5 and (checksums=True) the x-amz-checksum-*
        header or trailer against the body; returns ({algo: base64}
        declared, md5 raw)."""
        md5 = hashlib.md5(data).digest()
        cmd5 = ctx.h("Content-MD5")
        if cmd5 is not None:
            try:
                raw = base64.b64decode(cmd5, validate=True)
            except (binascii.Error, ValueError):
                raw = None
            if raw is None or len(raw) != 16:
                raise S3Error(400, "InvalidDigest", "The Content-MD5 you "
                              "specified was invalid.",
                              [("Content-MD5", cmd5)])
            if raw != md5:
                raise S3Error(400, "BadDigest", "The Content-MD5 you "
                              "specified did not match what we received.",
                              [("ExpectedDigest", cmd5),
                               ("CalculatedDigest", _b64(md5))])
        if not checksums:
            return {}, md5
        declared = self._declared_checksums(ctx, ctx.headers)
        if ctx.trailers:
            from_trailer = self._declared_checksums(ctx, ctx.trailers)
            if declared and from_trailer:
                raise S3Error(400, "InvalidRequest", "Expecting a single "
                              "x-amz-checksum- header. Multiple checksum "
                              "Types are not allowed.")
            declared = declared or from_trailer
        for algo, value in declared.items():
            if _b64(_checksum_raw(algo, data)) != value:
                raise S3Error(400, "BadDigest", f"The "
                              f"{CHECKSUM_NAMES[algo]} you specified did not "
                              "match the calculated checksum.")
        sdk = (ctx.h("x-amz-sdk-checksum-algorithm") or "").lower()
        if sdk and sdk not in CHECKSUM_ALGOS:
            raise S3Error(400, "InvalidRequest", "Checksum algorithm "
                          "provided is unsupported. Please try again with "
                          "any of the valid types: [CRC32, CRC32C, SHA1, "
                          "SHA256]")
        return declared, md5

    # ------------------------------------------------------------ handlers
    def _handle(self, ctx):
        return getattr(self, "_do_" + ctx.kind)(ctx)

    def _do_unsupported(self, ctx):
        raise S3Error(501, "NotImplemented", "A header you provided implies "
                      "functionality that is not implemented (fake_s3.py: see"
                      " the fake_s3.py section of tests/fakes/README.md)")

    def _do_invalid(self, ctx):
        raise S3Error(405, "MethodNotAllowed", "The specified method is not "
                      "allowed against this resource.",
                      [("Method", ctx.method),
                       ("ResourceType", "OBJECT" if ctx.key else "BUCKET")])

    def _bucket(self, ctx):
        b = self._buckets.get(ctx.bucket)
        if b is None:
            raise S3Error(404, "NoSuchBucket", "The specified bucket does not"
                          " exist", [("BucketName", ctx.bucket)])
        return b

    def _no_such_key(self, ctx):
        return S3Error(404, "NoSuchKey", "The specified key does not exist.",
                       [("Key", ctx.key)])

    # ---- buckets
    def _do_list_buckets(self, ctx):
        with self._lock:
            items = "".join(
                "<Bucket>" + _x("Name", b.name) +
                _x("CreationDate", _iso(b.created)) + "</Bucket>"
                for b in sorted(self._buckets.values(), key=lambda b: b.name))
        return _Reply(200, _xml_doc(
            "ListAllMyBucketsResult",
            "<Owner>" + _x("ID", OWNER_ID) + _x("DisplayName", OWNER_NAME) +
            "</Owner><Buckets>" + items + "</Buckets>"))

    def _do_head_bucket(self, ctx):
        with self._lock:
            b = self._bucket(ctx)
            return _Reply(200, headers=[("x-amz-bucket-region", b.region)])

    def _do_bucket_location(self, ctx):
        with self._lock:
            b = self._bucket(ctx)
            loc = "" if b.region == "us-east-1" else _xml_escape(b.region)
        return _Reply(200, _xml_doc("LocationConstraint", loc))

    def _do_create_bucket(self, ctx):
        name = ctx.bucket
        if not _BUCKET_NAME.match(name) or ".." in name:
            raise S3Error(400, "InvalidBucketName", "The specified bucket is "
                          "not valid.", [("BucketName", name)])
        region = "us-east-1"
        if ctx.body:
            doc = _parse_xml(ctx.body, "CreateBucketConfiguration")
            loc = _child_text(doc, "LocationConstraint")
            if loc:
                region = loc
        signed_region = ctx.signing_region
        if region != signed_region:
            raise S3Error(400, "IllegalLocationConstraintException",
                          f"The {region} location constraint is incompatible "
                          "for the region specific endpoint this request was "
                          "sent to.")
        with self._lock:
            b = self._buckets.get(name)
            if b is not None and region != "us-east-1":
                raise S3Error(409, "BucketAlreadyOwnedByYou", "Your previous "
                              "request to create the named bucket succeeded "
                              "and you already own it.",
                              [("BucketName", name)])
            if b is None:
                self._buckets[name] = _Bucket(name, region, self.clock())
                self._changed.notify_all()
        return _Reply(200, headers=[("Location", "/" + name)])

    def _do_delete_bucket(self, ctx):
        with self._lock:
            b = self._bucket(ctx)
            if b.objects:
                raise S3Error(409, "BucketNotEmpty", "The bucket you tried to"
                              " delete is not empty",
                              [("BucketName", b.name)])
            del self._buckets[b.name]
            for uid in [u for u, up in self._uploads.items()
                        if up.bucket == b.name]:
                del self._uploads[uid]
            self._changed.notify_all()
        return _Reply(204)

    # ---- listing
    def _int_param(self, ctx, name, default, lo=0, cap=None):
        raw = ctx.q.get(name)
        if raw is None:
            return default
        try:
            v = int(raw)
            if v < lo or v > 2 ** 31 - 1:
                raise ValueError
        except ValueError:
            raise S3Error(400, "InvalidArgument", f"Provided {name} not an "
                          "integer or within integer range",
                          [("ArgumentName", name),
                           ("ArgumentValue", raw)]) from None
        return min(v, cap) if cap is not None else v

    def _encoding(self, ctx):
        enc = ctx.q.get("encoding-type")
        if enc is not None and enc != "url":
            raise S3Error(400, "InvalidArgument", "Invalid Encoding Method "
                          "specified in Request",
                          [("ArgumentName", "encoding-type"),
                           ("ArgumentValue", enc)])
        if enc == "url":
            return lambda s: urllib.parse.quote_plus(s, safe="/")
        return lambda s: s

    def _walk(self, b, prefix, delimiter, start, limit):
        """Up to `limit` entries >= `start`: ("key", k) or ("prefix", p);
        returns (entries, truncated). A common prefix sorting before
        `start` (the one a previous page ended on) is skipped whole."""
        keys = b.keys
        i = bisect.bisect_left(keys, max(start, prefix))
        out = []
        n = len(keys)
        while i < n:
            k = keys[i]
            if not k.startswith(prefix):
                break
            if delimiter:
                j = k.find(delimiter, len(prefix))
                if j >= 0:
                    cp = k[:j + len(delimiter)]
                    nxt = _successor(cp)
                    if cp < start:
                        i = bisect.bisect_left(keys, nxt)
                        continue
                    if len(out) == limit:
                        return out, True
                    out.append(("prefix", cp))
                    i = bisect.bisect_left(keys, nxt)
                    continue
            if len(out) == limit:
                return out, True
            out.append(("key", k))
            i += 1
        return out, False

    def _contents(self, obj, key, enc, v2, fetch_owner):
        inner = (_x("Key", enc(key)) + _x("LastModified",
                                          _iso(obj.last_modified)) +
                 _x("ETag", f'"{obj.etag}"'))
        if v2 and obj.checksums:
            algo = next(iter(obj.checksums))
            inner += _x("ChecksumAlgorithm", CHECKSUM_NAMES[algo])
            if obj.checksum_type:
                inner += _x("ChecksumType", obj.checksum_type)
        inner += _x("Size", len(obj.data))
        if fetch_owner:
            inner += ("<Owner>" + _x("ID", OWNER_ID) +
                      _x("DisplayName", OWNER_NAME) + "</Owner>")
        inner += _x("StorageClass", "STANDARD")
        return "<Contents>" + inner + "</Contents>"

    def _do_list(self, ctx):
        q = ctx.q
        v2 = q.get("list-type") == "2"
        if "list-type" in q and not v2:
            raise S3Error(400, "InvalidArgument", "Invalid List Type "
                          "specified in Request",
                          [("ArgumentName", "list-type"),
                           ("ArgumentValue", q["list-type"])])
        enc = self._encoding(ctx)
        prefix = q.get("prefix", "")
        delimiter = q.get("delimiter", "")
        max_keys = self._int_param(ctx, "max-keys", MAX_KEYS, cap=MAX_KEYS)
        token = q.get("continuation-token")
        start_after = q.get("start-after")
        marker = q.get("marker")
        start = ""
        if v2:
            if token is not None:
                try:
                    start = json.loads(base64.urlsafe_b64decode(
                        token.encode("ascii")))["from"]
                    if not isinstance(start, str):
                        raise ValueError
                except (ValueError, KeyError, TypeError,
                        binascii.Error, UnicodeError):
                    raise S3Error(400, "InvalidArgument", "The continuation "
                                  "token provided is incorrect",
                                  [("ArgumentName", "continuation-token")]) \
                        from None
            elif start_after:
                start = start_after + "\x00"
        elif marker:
            start = marker + "\x00"
        with self._lock:
            b = self._bucket(ctx)
            entries, truncated = self._walk(b, prefix, delimiter, start,
                                            max_keys)
            contents = "".join(
                self._contents(b.objects[v], v, enc, v2,
                               not v2 or q.get("fetch-owner") == "true")
                for kind, v in entries if kind == "key")
        cps = "".join("<CommonPrefixes>" + _x("Prefix", enc(v)) +
                      "</CommonPrefixes>"
                      for kind, v in entries if kind == "prefix")
        head = _x("Name", b.name) + _x("Prefix", enc(prefix))
        if v2:
            if token is not None:
                head += _x("ContinuationToken", token)
            if start_after:
                head += _x("StartAfter", enc(start_after))
            head += _x("KeyCount", len(entries))
        else:
            head += _x("Marker", enc(marker or ""))
        head += _x("MaxKeys", max_keys)
        if delimiter:
            head += _x("Delimiter", enc(delimiter))
        if "encoding-type" in q:
            head += _x("EncodingType", "url")
        head += _x("IsTruncated", "true" if truncated else "false")
        if truncated:
            last = entries[-1][1]
            if v2:
                nxt = base64.urlsafe_b64encode(json.dumps(
                    {"from": last + "\x00"}).encode()).decode("ascii")
                head += _x("NextContinuationToken", nxt)
            elif delimiter:
                head += _x("NextMarker", enc(last))
        root = "ListBucketResult"
        return _Reply(200, _xml_doc(root, head + contents + cps))

    def _do_list_uploads(self, ctx):
        enc = self._encoding(ctx)
        prefix = ctx.q.get("prefix", "")
        key_marker = ctx.q.get("key-marker", "")
        id_marker = ctx.q.get("upload-id-marker", "")
        limit = self._int_param(ctx, "max-uploads", 1000, cap=1000)
        with self._lock:
            b = self._bucket(ctx)
            ups = sorted((u for u in self._uploads.values()
                          if u.bucket == b.name and u.key.startswith(prefix)),
                         key=lambda u: (u.key, u.initiated, u.upload_id))
        if key_marker:
            # After key-marker; with upload-id-marker, also the uploads of
            # that key that sort after that upload.
            at = next((i for i, u in enumerate(ups)
                       if u.key == key_marker and u.upload_id == id_marker),
                      None) if id_marker else None
            ups = [u for i, u in enumerate(ups) if u.key > key_marker or (
                at is not None and u.key == key_marker and i > at)]
        truncated = len(ups) > limit
        ups = ups[:limit]
        body = (_x("Bucket", b.name) + _x("KeyMarker", enc(key_marker)) +
                _x("UploadIdMarker", id_marker) + _x("Prefix", enc(prefix)))
        if truncated:
            body += (_x("NextKeyMarker", enc(ups[-1].key)) +
                     _x("NextUploadIdMarker", ups[-1].upload_id))
        body += _x("MaxUploads", limit)
        if "encoding-type" in ctx.q:
            body += _x("EncodingType", "url")
        body += _x("IsTruncated", "true" if truncated else "false")
        owner = ("<Owner>" + _x("ID", OWNER_ID) +
                 _x("DisplayName", OWNER_NAME) + "</Owner>")
        for u in ups:
            body += ("<Upload>" + _x("Key", enc(u.key)) +
                     _x("UploadId", u.upload_id) +
                     owner.replace("Owner>", "Initiator>") + owner +
                     _x("StorageClass", "STANDARD") +
                     _x("Initiated", _iso(u.initiated)))
            if u.algo:
                body += _x("ChecksumAlgorithm", CHECKSUM_NAMES[u.algo])
            body += "</Upload>"
        return _Reply(200, _xml_doc("ListMultipartUploadsResult", body))

    # ---- objects
    def _precondition(self, ctx, b):
        """Evaluate If-Match / If-None-Match for a write against the current
        object, under the lock. Raises S3's answer."""
        cur = b.objects.get(ctx.key)
        im, inm = ctx.h("If-Match"), ctx.h("If-None-Match")
        if inm is not None:
            if inm.strip() != "*":
                raise S3Error(501, "NotImplemented", "A header you provided "
                              "implies functionality that is not "
                              "implemented", [("Header", "If-None-Match")])
            if cur is not None:
                raise S3Error(412, "PreconditionFailed", "At least one of the"
                              " pre-conditions you specified did not hold",
                              [("Condition", "If-None-Match")])
            if b.deletes.get(ctx.key, 0) != ctx.delete_gen:
                # A delete landed while this conditional write was in
                # flight: S3 answers 409 (retry).
                raise S3Error(409, "ConditionalRequestConflict", "The "
                              "conditional request cannot succeed due to a "
                              "conflicting operation against this resource.")
        if im is not None:
            if cur is None:
                raise self._no_such_key(ctx)
            tags = _etag_list(im)
            if "*" not in tags and cur.etag not in tags:
                raise S3Error(412, "PreconditionFailed", "At least one of the"
                              " pre-conditions you specified did not hold",
                              [("Condition", "If-Match")])

    def _metadata(self, ctx):
        return {k.lower()[len("x-amz-meta-"):]: v
                for k, v in ctx.headers.items()
                if k.lower().startswith("x-amz-meta-")}

    def _content_encoding(self, ctx):
        ce = ctx.h("Content-Encoding")
        if ce is None:
            return None
        rest = [c.strip() for c in ce.split(",")
                if c.strip() and c.strip().lower() != "aws-chunked"]
        return ", ".join(rest) or None

    def _do_put(self, ctx):
        data = bytes(ctx.body)
        declared, md5 = self._check_integrity(ctx, data)
        obj = self._make_object(data, md5.hex(), declared,
                                "FULL_OBJECT" if declared else None,
                                ctx.h("Content-Type"),
                                self._content_encoding(ctx),
                                self._metadata(ctx))
        with self._lock:
            b = self._bucket(ctx)
            self._precondition(ctx, b)
            self._commit_locked(b, ctx.key, obj)
        headers = [("ETag", f'"{obj.etag}"')]
        for algo, value in declared.items():
            headers.append((f"x-amz-checksum-{algo}", value))
            headers.append(("x-amz-checksum-type", "FULL_OBJECT"))
        return _Reply(200, headers=headers)

    def _read_preconditions(self, ctx, obj):
        """GET/HEAD conditions: If-Match, If-Unmodified-Since (412),
        If-None-Match, If-Modified-Since (304), as RFC 7232 orders them."""
        im = ctx.h("If-Match")
        lm = int(obj.last_modified)
        if im is not None:
            tags = _etag_list(im)
            if "*" not in tags and obj.etag not in tags:
                raise S3Error(412, "PreconditionFailed", "At least one of the"
                              " pre-conditions you specified did not hold",
                              [("Condition", "If-Match")])
        else:
            ius = ctx.h("If-Unmodified-Since")
            t = _parse_http_date(ius) if ius else None
            if t is not None and lm > t:
                raise S3Error(412, "PreconditionFailed", "At least one of the"
                              " pre-conditions you specified did not hold",
                              [("Condition", "If-Unmodified-Since")])
        inm = ctx.h("If-None-Match")
        if inm is not None:
            tags = _etag_list(inm)
            if "*" in tags or obj.etag in tags:
                return False
        else:
            ims = ctx.h("If-Modified-Since")
            t = _parse_http_date(ims) if ims else None
            if t is not None and lm <= t:
                return False
        return True

    def _object_headers(self, ctx, obj, whole):
        headers = [("ETag", f'"{obj.etag}"'),
                   ("Last-Modified", _http_date(obj.last_modified)),
                   ("Accept-Ranges", "bytes")]
        if obj.content_encoding:
            headers.append(("Content-Encoding", obj.content_encoding))
        for k, v in obj.metadata.items():
            headers.append(("x-amz-meta-" + k, v))
        if obj.part_sizes:
            headers.append(("x-amz-mp-parts-count", str(len(obj.part_sizes))))
        if whole and obj.checksums and \
                (ctx.h("x-amz-checksum-mode") or "").upper() == "ENABLED":
            for algo, value in obj.checksums.items():
                headers.append((f"x-amz-checksum-{algo}", value))
            if obj.checksum_type:
                headers.append(("x-amz-checksum-type", obj.checksum_type))
        return headers

    def _range(self, ctx, obj):
        """(first, end) for a satisfiable single Range, None for the whole
        object (no Range, or one S3 ignores); raises 416 InvalidRange."""
        size = len(obj.data)
        pn = ctx.q.get("partNumber")
        if pn is not None:
            n = self._int_param(ctx, "partNumber", None, lo=1)
            sizes = obj.part_sizes or [size]
            if n > len(sizes):
                raise S3Error(416, "InvalidPartNumber", "The requested "
                              "partnumber is not satisfiable",
                              [("PartNumberRequested", n),
                               ("ActualPartCount", len(sizes))])
            first = sum(sizes[:n - 1])
            return first, first + sizes[n - 1]
        raw = ctx.h("Range")
        if raw is None:
            return None
        m = _RANGE.match(raw.strip())
        if not m or (m.group(1) == "" and m.group(2) == ""):
            return None                   # S3 ignores what it cannot parse
        a, z = m.group(1), m.group(2)
        if a == "":
            n = int(z)
            if n == 0 or size == 0:
                raise self._invalid_range(raw, size)
            return max(0, size - n), size
        a = int(a)
        if z != "" and int(z) < a:
            return None
        if a >= size:
            raise self._invalid_range(raw, size)
        end = size if z == "" else min(int(z) + 1, size)
        return a, end

    @staticmethod
    def _invalid_range(raw, size):
        return S3Error(416, "InvalidRange", "The requested range is not "
                       "satisfiable", [("RangeRequested", raw),
                                       ("ActualObjectSize", size)],
                       [("Content-Range", f"bytes */{size}")])

    def _do_get(self, ctx):
        with self._lock:
            b = self._bucket(ctx)
            obj = b.objects.get(ctx.key)
        if obj is None:
            raise self._no_such_key(ctx)
        if not self._read_preconditions(ctx, obj):
            return _Reply(304, headers=[
                ("ETag", f'"{obj.etag}"'),
                ("Last-Modified", _http_date(obj.last_modified))])
        rng = self._range(ctx, obj)
        headers = self._object_headers(ctx, obj, rng is None)
        body = memoryview(obj.data)
        status = 200
        if rng is not None:
            first, end = rng
            body = body[first:end]
            status = 206
            headers.append(("Content-Range",
                            f"bytes {first}-{end - 1}/{len(obj.data)}"))
        for name, header in (("response-content-type", "Content-Type"),
                             ("response-content-disposition",
                              "Content-Disposition"),
                             ("response-cache-control", "Cache-Control"),
                             ("response-content-encoding",
                              "Content-Encoding")):
            if name in ctx.q:
                headers = [h for h in headers if h[0] != header]
                headers.append((header, ctx.q[name]))
        ctype = ctx.q.get("response-content-type", obj.content_type)
        return _Reply(status, body, headers, ctype=ctype)

    def _do_head(self, ctx):
        return self._do_get(ctx)      # the handler sends no body

    def _do_delete(self, ctx):
        im = ctx.h("If-Match")
        with self._lock:
            b = self._bucket(ctx)
            cur = b.objects.get(ctx.key)
            if im is not None:
                if cur is None:
                    raise self._no_such_key(ctx)
                tags = _etag_list(im)
                if "*" not in tags and cur.etag not in tags:
                    raise S3Error(412, "PreconditionFailed", "At least one of"
                                  " the pre-conditions you specified did not "
                                  "hold", [("Condition", "If-Match")])
            self._remove_locked(b, ctx.key)
        return _Reply(204)

    def _do_delete_objects(self, ctx):
        if ctx.h("Content-MD5") is None and not any(
                f"x-amz-checksum-{a}" in ctx.headers for a in CHECKSUM_ALGOS
        ) and not ctx.trailers:
            raise S3Error(400, "InvalidRequest", "Missing required header for"
                          " this request: Content-MD5 OR x-amz-checksum-*")
        self._check_integrity(ctx, bytes(ctx.body))
        doc = _parse_xml(ctx.body, "Delete")
        quiet = (_child_text(doc, "Quiet") or "").strip().lower() == "true"
        items = _children(doc, "Object")
        if not items or len(items) > 1000:
            raise S3Error(400, "MalformedXML", "The XML you provided was not "
                          "well-formed or did not validate against our "
                          "published schema")
        wanted = []
        for item in items:
            key = _child_text(item, "Key")
            if not key:
                raise S3Error(400, "MalformedXML", "The XML you provided was "
                              "not well-formed or did not validate against "
                              "our published schema")
            wanted.append((key, _child_text(item, "ETag")))
        out = []
        with self._lock:
            b = self._bucket(ctx)
            for key, etag in wanted:
                cur = b.objects.get(key)
                if etag is not None:
                    if cur is None:
                        out.append("<Error>" + _x("Key", key) +
                                   _x("Code", "NoSuchKey") +
                                   _x("Message", "The specified key does "
                                      "not exist.") + "</Error>")
                        continue
                    tags = _etag_list(etag)
                    if "*" not in tags and cur.etag not in tags:
                        out.append("<Error>" + _x("Key", key) +
                                   _x("Code", "PreconditionFailed") +
                                   _x("Message", "At least one of the pre-"
                                      "conditions you specified did not "
                                      "hold") + "</Error>")
                        continue
                self._remove_locked(b, key)
                if not quiet:
                    out.append("<Deleted>" + _x("Key", key) + "</Deleted>")
        return _Reply(200, _xml_doc("DeleteResult", "".join(out)))

    # ---- multipart
    def _upload(self, ctx):
        uid = ctx.q.get("uploadId", "")
        u = self._uploads.get(uid)
        if u is None or u.bucket != ctx.bucket or u.key != ctx.key:
            raise S3Error(404, "NoSuchUpload", "The specified upload does not"
                          " exist. The upload ID may be invalid, or the "
                          "upload may have been aborted or completed.",
                          [("UploadId", uid)])
        return u

    def _do_create_multipart(self, ctx):
        algo = ctx.h("x-amz-checksum-algorithm")
        if algo is not None:
            algo = algo.lower()
            if algo not in CHECKSUM_ALGOS:
                raise S3Error(400, "InvalidRequest", "Checksum algorithm "
                              "provided is unsupported. Please try again "
                              "with any of the valid types: [CRC32, CRC32C, "
                              "SHA1, SHA256]")
        ctype = ctx.h("x-amz-checksum-type")
        if ctype is not None:
            ctype = ctype.upper()
            if ctype not in ("COMPOSITE", "FULL_OBJECT") or algo is None:
                raise S3Error(400, "InvalidRequest", "The x-amz-checksum-type "
                              "header can only be used with the x-amz-"
                              "checksum-algorithm header.")
            if ctype == "FULL_OBJECT" and algo not in ("crc32", "crc32c"):
                raise S3Error(400, "InvalidRequest", "The FULL_OBJECT checksum"
                              " type cannot be used with the "
                              f"{CHECKSUM_NAMES[algo]} checksum algorithm.")
        elif algo is not None:
            ctype = "COMPOSITE"
        uid = _b64(secrets.token_bytes(48)).replace("+", "-").replace(
            "/", "_").rstrip("=")
        with self._lock:
            b = self._bucket(ctx)
            self._uploads[uid] = _Upload(
                uid, b.name, ctx.key, algo, ctype, ctx.h("Content-Type"),
                self._content_encoding(ctx), self._metadata(ctx),
                b.deletes.get(ctx.key, 0), self.clock())
            self._changed.notify_all()
        headers = []
        if algo:
            headers = [("x-amz-checksum-algorithm", CHECKSUM_NAMES[algo]),
                       ("x-amz-checksum-type", ctype)]
        return _Reply(200, _xml_doc(
            "InitiateMultipartUploadResult",
            _x("Bucket", b.name) + _x("Key", ctx.key) + _x("UploadId", uid)),
            headers)

    def _do_upload_part(self, ctx):
        raw = ctx.q.get("partNumber")
        try:
            n = int(raw)
            if not 1 <= n <= MAX_PARTS:
                raise ValueError
        except (TypeError, ValueError):
            raise S3Error(400, "InvalidArgument", "Part number must be an "
                          "integer between 1 and 10000, inclusive",
                          [("ArgumentName", "partNumber"),
                           ("ArgumentValue", raw)]) from None
        with self._lock:
            self._bucket(ctx)
            u = self._upload(ctx)
        data = bytes(ctx.body)
        declared, md5 = self._check_integrity(ctx, data)
        if u.algo is not None:
            got = next(iter(declared), None)
            if got is None:
                raise S3Error(400, "InvalidRequest", "The upload was created "
                              f"using a {u.algo} checksum. The complete "
                              "request must include the checksum for each "
                              f"part. It was missing for part {n} in the "
                              "request.")
            if got != u.algo:
                raise S3Error(400, "InvalidRequest", "Checksum Type mismatch "
                              f"occurred, expected checksum Type: {u.algo}, "
                              f"actual checksum Type: {got}")
        part = _Part()
        part.data = data
        part.md5 = md5
        part.etag = md5.hex()
        part.checksums = declared
        part.last_modified = self.clock()
        with self._lock:
            u = self._upload(ctx)         # may have been aborted meanwhile
            u.parts[n] = part
            self._changed.notify_all()
        headers = [("ETag", f'"{part.etag}"')]
        for algo, value in declared.items():
            headers.append((f"x-amz-checksum-{algo}", value))
        return _Reply(200, headers=headers)

    def _do_list_parts(self, ctx):
        marker = self._int_param(ctx, "part-number-marker", 0)
        limit = self._int_param(ctx, "max-parts", 1000, cap=1000)
        with self._lock:
            b = self._bucket(ctx)
            u = self._upload(ctx)
            parts = sorted((n, p) for n, p in u.parts.items() if n > marker)
        truncated = len(parts) > limit
        parts = parts[:limit]
        body = (_x("Bucket", b.name) + _x("Key", u.key) +
                _x("UploadId", u.upload_id) +
                _x("PartNumberMarker", marker))
        if parts:
            body += _x("NextPartNumberMarker", parts[-1][0])
        body += (_x("MaxParts", limit) +
                 _x("IsTruncated", "true" if truncated else "false"))
        if u.algo:
            body += _x("ChecksumAlgorithm", CHECKSUM_NAMES[u.algo])
        for n, p in parts:
            body += ("<Part>" + _x("PartNumber", n) +
                     _x("LastModified", _iso(p.last_modified)) +
                     _x("ETag", f'"{p.etag}"') + _x("Size", len(p.data)))
            for algo, value in p.checksums.items():
                body += _x("Checksum" + CHECKSUM_NAMES[algo], value)
            body += "</Part>"
        body += _x("StorageClass", "STANDARD")
        return _Reply(200, _xml_doc("ListPartsResult", body))

    def _do_abort(self, ctx):
        with self._lock:
            self._bucket(ctx)
            u = self._upload(ctx)
            del self._uploads[u.upload_id]
            self._changed.notify_all()
        return _Reply(204)

    def _do_complete(self, ctx):
        # x-amz-checksum-* here is the whole object's, checked below.
        self._check_integrity(ctx, bytes(ctx.body), checksums=False)
        expect = self._declared_checksums(ctx, ctx.headers)
        with self._lock:
            self._bucket(ctx)
            self._upload(ctx)
        doc = _parse_xml(ctx.body, "CompleteMultipartUpload")
        listed = []
        for p in _children(doc, "Part"):
            try:
                n = int((_child_text(p, "PartNumber") or "").strip())
            except ValueError:
                n = None
            etag = _child_text(p, "ETag")
            if n is None or etag is None:
                raise S3Error(400, "MalformedXML", "The XML you provided was "
                              "not well-formed or did not validate against "
                              "our published schema")
            sums = {a: _child_text(p, "Checksum" + CHECKSUM_NAMES[a])
                    for a in CHECKSUM_ALGOS}
            listed.append((n, etag.strip().strip('"'),
                           {a: v.strip() for a, v in sums.items()
                            if v is not None}))
        if not listed:
            raise S3Error(400, "MalformedXML", "The XML you provided was not "
                          "well-formed or did not validate against our "
                          "published schema")
        for (a, _, _), (b_, _, _) in zip(listed, listed[1:]):
            if b_ <= a:
                raise S3Error(400, "InvalidPartOrder", "The list of parts was "
                              "not in ascending order. Parts list must be "
                              "specified in order by part number.")
        with self._lock:
            b = self._bucket(ctx)
            u = self._upload(ctx)
            chosen = []
            for i, (n, etag, sums) in enumerate(listed):
                p = u.parts.get(n)
                if p is None or p.etag != etag:
                    raise S3Error(400, "InvalidPart", "One or more of the "
                                  "specified parts could not be found.  The "
                                  "part may not have been uploaded, or the "
                                  "specified entity tag may not match the "
                                  "part's entity tag.",
                                  [("UploadId", u.upload_id),
                                   ("PartNumber", n), ("ETag", etag)])
                if u.algo is not None:
                    want = p.checksums.get(u.algo)
                    if sums.get(u.algo) != want:
                        raise S3Error(400, "InvalidPart", "One or more of the"
                                      " specified parts could not be found.  "
                                      "The part may not have been uploaded, "
                                      "or the specified entity tag may not "
                                      "match the part's entity tag.",
                                      [("UploadId", u.upload_id),
                                       ("PartNumber", n), ("ETag", etag)])
                if i < len(listed) - 1 and len(p.data) < MIN_PART:
                    raise S3Error(400, "EntityTooSmall", "Your proposed upload"
                                  " is smaller than the minimum allowed size",
                                  [("ProposedSize", len(p.data)),
                                   ("MinSizeAllowed", MIN_PART),
                                   ("PartNumber", n), ("ETag", etag)])
                chosen.append(p)
            # Conditional completes are judged against the key's state at
            # commit; a delete since CreateMultipartUpload is a conflict.
            ctx.delete_gen = u.delete_gen
            self._precondition(ctx, b)
        data = b"".join(p.data for p in chosen)
        etag = hashlib.md5(b"".join(p.md5 for p in chosen)).hexdigest() + \
            f"-{len(chosen)}"
        checks = {}
        if u.algo is not None:
            if u.ctype == "FULL_OBJECT":
                checks[u.algo] = _b64(_checksum_raw(u.algo, data))
            else:
                joined = b"".join(base64.b64decode(p.checksums[u.algo])
                                  for p in chosen)
                checks[u.algo] = _b64(_checksum_raw(u.algo, joined)) + \
                    f"-{len(chosen)}"
        for algo, value in expect.items():
            if checks.get(algo, "").split("-")[0] != value.split("-")[0]:
                raise S3Error(400, "BadDigest", f"The "
                              f"{CHECKSUM_NAMES[algo]} you specified did not "
                              "match the calculated checksum.")
        obj = self._make_object(data, etag, checks, u.ctype, u.content_type,
                                u.content_encoding, u.metadata,
                                [len(p.data) for p in chosen])
        with self._lock:
            if self._uploads.get(u.upload_id) is not u:
                raise S3Error(404, "NoSuchUpload", "The specified upload does"
                              " not exist. The upload ID may be invalid, or "
                              "the upload may have been aborted or "
                              "completed.", [("UploadId", u.upload_id)])
            self._precondition(ctx, b)
            del self._uploads[u.upload_id]
            self._commit_locked(b, ctx.key, obj)
        body = (_x("Location", f"{self.endpoint}/{b.name}/"
                   f"{_uri_encode(ctx.key, True)}") +
                _x("Bucket", b.name) + _x("Key", ctx.key) +
                _x("ETag", f'"{etag}"'))
        for algo, value in checks.items():
            body += _x("Checksum" + CHECKSUM_NAMES[algo], value)
        if checks:
            body += _x("ChecksumType", u.ctype)
        return _Reply(200, _xml_doc("CompleteMultipartUploadResult", body))


# ---------------------------------------------------------------- HTTP
class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "AmazonS3"

    def version_string(self):
        return self.server_version

    def log_message(self, fmt, *args):
        pass                              # the fake keeps its own log

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_expect_100(self):
        # Answer 100 Continue only once the headers (auth included) have
        # been judged; an early error is sent instead, body unread.
        self._expect_100 = True
        return True

    def send_error(self, code, message=None, explain=None):
        # Malformed request lines and headers (http.server's own checks):
        # answer S3-style XML, then close.
        self.close_connection = True
        body = _error_body(S3Error(code, "BadRequest", message or
                                   "An error occurred when parsing the HTTP "
                                   "request."), _request_id())
        command = getattr(self, "command", None)
        # A request http.server could not parse is taken as HTTP/0.9, whose
        # answers have no status line; answer as HTTP/1.1 instead.
        self.request_version = self.protocol_version
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if command != "HEAD":
                self.wfile.write(body)
        except OSError:
            pass

    def do_GET(self):
        if self.request_version == "HTTP/0.9":
            self.send_error(400, "HTTP/0.9 requests are not supported.")
            return
        self._expect_100 = getattr(self, "_expect_100", False)
        fake = self.server.fake
        fake._inflight_delta(+1)
        try:
            self._serve(fake)
        finally:
            self._expect_100 = False
            fake._inflight_delta(-1)

    do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = do_GET

    # ------------------------------------------------------------ serving
    def _serve(self, fake):
        ctx = _Ctx()
        ctx.method = self.command
        ctx.headers = self.headers
        raw_path, _, raw_query = self.path.partition("?")
        if raw_path.startswith(("http://", "https://")):
            raw_path = "/" + raw_path.split("/", 3)[3] \
                if raw_path.count("/") >= 3 else "/"
        ctx.raw_path, ctx.raw_query = raw_path, raw_query
        rid = _request_id()
        early = None
        try:
            ctx.params = _parse_query(raw_query)
            ctx.q = {}
            for n, v in ctx.params:
                ctx.q.setdefault(n, v)
            fake._route(ctx)
        except S3Error as e:
            early = e
        fake._arrive(ctx)
        entry = ctx.entry
        try:
            framing = self._framing()
        except S3Error as e:
            self._answer_error(fake, ctx, e, rid, close=True)
            return
        fault = None if early else fake._take_fault(ctx)
        try:
            if early is not None:
                raise early
            if fault is not None and fault["delay"]:
                fake._sleep(fault["delay"])
            if fault is not None and not fault["after_commit"]:
                if fault["reset"] and fault["after_bytes"] is None:
                    raise _Reset()
                if fault["reset"] and ctx.kind != "get":
                    self._read_body(ctx, framing, cut=fault["after_bytes"])
                    raise _Reset()
                if fault["code"] is not None:
                    raise fake._fault_error(fault)
            fake._authenticate(ctx)
            ctx.signing_region = ctx.signing and \
                ctx.signing[2].split("/")[1]
            if ctx.kind in ("put", "complete") and \
                    ctx.h("If-None-Match") is not None:
                with fake._lock:
                    b = fake._buckets.get(ctx.bucket)
                    ctx.delete_gen = b.deletes.get(ctx.key, 0) if b else 0
            self._read_body(ctx, framing)
            self._check_payload(ctx)
            reply = fake._handle(ctx)
        except _Reset:
            fake._note(entry, outcome="reset")
            self._reset()
            return
        except (_ClientGone, OSError):
            fake._note(entry, outcome="client-gone")
            self.close_connection = True
            return
        except S3Error as e:
            self._answer_error(fake, ctx, e, rid, framing=framing)
            return
        except Exception as e:  # noqa: BLE001 - never a traceback to a client
            traceback.print_exc(file=sys.stderr)     # a bug in the fake
            self._answer_error(fake, ctx, S3Error(
                500, "InternalError", f"We encountered an internal error. "
                f"Please try again. (fake_s3.py: {type(e).__name__}: {e})"),
                rid, framing=framing)
            return
        if fault is not None and fault["after_commit"]:
            if fault["reset"]:
                fake._note(entry, outcome="reset")
                self._reset()
                return
            if fault["code"] is not None:
                self._answer_error(fake, ctx, fake._fault_error(fault), rid,
                                   framing=framing)
                return
        cut = fault["after_bytes"] if (fault is not None and fault["reset"]
                                       and ctx.kind == "get") else None
        self._send(fake, ctx, reply, rid, cut=cut)

    def _framing(self):
        """('length', n) / ('chunked', None) / ('none', 0)."""
        te = self.headers.get("Transfer-Encoding")
        cl = self.headers.get("Content-Length")
        if te is not None:
            if cl is not None:
                raise S3Error(400, "BadRequest", "An error occurred when "
                              "parsing the HTTP request.")
            if te.strip().lower() != "chunked":
                raise S3Error(501, "NotImplemented", "A header you provided "
                              "implies functionality that is not "
                              "implemented", [("Header",
                                               "Transfer-Encoding")])
            return ("chunked", None)
        if cl is None:
            return ("none", 0)
        try:
            n = int(cl.strip())
            if n < 0 or not cl.strip().isdigit():
                raise ValueError
        except ValueError:
            raise S3Error(400, "BadRequest", "An error occurred when parsing "
                          "the HTTP request.") from None
        if n > MAX_OBJECT + (1 << 20) * 64:
            raise S3Error(400, "EntityTooLarge", "Your proposed upload "
                          "exceeds the maximum allowed size",
                          [("ProposedSize", n),
                           ("MaxSizeAllowed", MAX_OBJECT)])
        return ("length", n)

    def _continue(self):
        if self._expect_100:
            self._expect_100 = False
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _read_body(self, ctx, framing, cut=None):
        """Read the request body into ctx.body (bytes), decoding aws-chunked
        (and checking its chunk signatures) when x-amz-content-sha256 says
        STREAMING-*. cut: read that many raw bytes, then stop."""
        kind, n = framing
        if ctx.method in ("PUT", "POST") and kind == "none" and \
                ctx.kind in ("put", "upload_part") and \
                ctx.h("Content-Length") is None:
            raise S3Error(411, "MissingContentLength", "You must provide the "
                          "Content-Length HTTP header.")
        if kind == "none":
            return
        if ctx.kind in ("put", "upload_part"):
            size = n
            if (ctx.payload or "").startswith("STREAMING-"):
                try:
                    size = int(ctx.h("x-amz-decoded-content-length") or 0)
                except ValueError:
                    size = 0
            if size is not None and size > MAX_OBJECT:
                raise S3Error(400, "EntityTooLarge", "Your proposed upload "
                              "exceeds the maximum allowed size",
                              [("ProposedSize", size),
                               ("MaxSizeAllowed", MAX_OBJECT)])
        elif kind == "length" and n > XML_BODY_MAX:
            raise S3Error(400, "MaxMessageLengthExceeded", "Your request was "
                          "too big.", [("MaxMessageLengthBytes",
                                        XML_BODY_MAX)])
        self.server.fake._note(ctx.entry, phase="body")
        self._continue()
        src = _BodySource(self.rfile, n if kind == "length" else None, cut)
        ctx.src = src
        if cut is not None:
            src.drain()
            return
        payload = ctx.payload or ""
        if payload.startswith("STREAMING-"):
            ctx.body, ctx.trailers = _decode_aws_chunked(ctx, src)
        else:
            ctx.body = src.read_all(ctx.kind in ("put", "upload_part"))
        ctx.body_read = True

    def _check_payload(self, ctx):
        p = ctx.payload
        if p and _HEX64.match(p):
            got = hashlib.sha256(ctx.body).hexdigest()
            if got != p:
                raise S3Error(400, "XAmzContentSHA256Mismatch", "The provided"
                              " 'x-amz-content-sha256' header does not match "
                              "what was computed.",
                              [("ClientComputedContentSHA256", p),
                               ("S3ComputedContentSHA256", got)])
        if p and p.startswith("STREAMING-"):
            declared = ctx.h("x-amz-decoded-content-length")
            if declared is None:
                raise S3Error(411, "MissingContentLength", "You must provide "
                              "the Content-Length HTTP header.")
            if declared.strip() != str(len(ctx.body)):
                raise S3Error(400, "IncompleteBody", "You did not provide the"
                              " number of bytes specified by the Content-"
                              "Length HTTP header")
            want = (ctx.h("x-amz-trailer") or "").strip().lower()
            if p.endswith("-TRAILER"):
                if not want or want not in ctx.trailers:
                    raise S3Error(400, "MalformedTrailerError", "The request "
                                  "contained trailing data that was not well-"
                                  "formed or did not conform to our "
                                  "published schema.")

    def _answer_error(self, fake, ctx, err, rid, framing=None, close=False):
        """Send err. The unread body is drained first (keep-alive) unless
        the client waits on 100-continue, or it is over DRAIN_MAX: then the
        connection closes."""
        if not close and not ctx.body_read and \
                framing is not None and framing[0] != "none":
            if self._expect_100 or (framing[0] == "length" and
                                    framing[1] > DRAIN_MAX):
                close = True
                fake._note(ctx.entry, outcome="early-reject")
            else:
                try:
                    src = ctx.src or _BodySource(
                        self.rfile,
                        framing[1] if framing[0] == "length" else None)
                    src.drain()
                except (_ClientGone, S3Error, OSError):
                    close = True
        if ctx.entry is not None:
            fake._note(ctx.entry, error=err.code)
        body = b"" if ctx.method == "HEAD" else _error_body(err, rid)
        reply = _Reply(err.status, body, err.headers,
                       ctype="application/xml")
        self._send(fake, ctx, reply, rid, close=close)

    def _send(self, fake, ctx, reply, rid, cut=None, close=False):
        if ctx.entry is not None:
            fake._note(ctx.entry, status=reply.status,
                       outcome=ctx.entry.get("outcome") or "answered")
        try:
            self.send_response(reply.status)
            body = reply.body
            n = len(body)
            if reply.ctype is not None:
                self.send_header("Content-Type", reply.ctype)
            elif n or reply.status == 200 and ctx.kind in (
                    "list", "list_uploads", "list_parts", "list_buckets",
                    "bucket_location", "create_multipart", "complete",
                    "delete_objects"):
                self.send_header("Content-Type", "application/xml")
            if reply.status != 204 and reply.status != 304:
                self.send_header("Content-Length", str(n))
            self.send_header("x-amz-request-id", rid)
            self.send_header("x-amz-id-2", _host_id())
            for name, value in reply.headers:
                self.send_header(name, value)
            if close or self.close_connection:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if ctx.method == "HEAD" or reply.status in (204, 304):
                return
            view = memoryview(body) if not isinstance(body, memoryview) \
                else body
            end = n if cut is None else min(cut, n)
            for i in range(0, end, IO_BLOCK):
                self.wfile.write(view[i:min(i + IO_BLOCK, end)])
            if cut is not None:
                fake._note(ctx.entry, outcome="reset")
                self._reset()
        except OSError:
            self.close_connection = True

    def _reset(self):
        """Abort with RST (SO_LINGER 0), as a dropped connection would."""
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.rfile.close()
        self.connection.close()


def _error_body(err, rid):
    extra = "".join(_x(tag, text) for tag, text in err.extra)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error>' +
            _x("Code", err.code) + _x("Message", err.message) + extra +
            _x("RequestId", rid) + _x("HostId", _host_id()) +
            "</Error>").encode("utf-8")


class _BodySource:
    """The raw request body: Content-Length bytes, or HTTP chunked."""

    def __init__(self, rfile, length, cut=None):
        self.rfile = rfile
        self.left = length                # None: HTTP chunked
        self.chunk_left = 0
        self.done = length == 0
        self.cut = cut                    # raw bytes to read at most

    def _raw(self, n):
        if self.cut is not None:
            n = min(n, self.cut)
            if n == 0:
                return b""
        data = self.rfile.read(n)
        if not data:
            raise _ClientGone()
        if self.cut is not None:
            self.cut -= len(data)
        return data

    def _raw_line(self):
        line = self.rfile.readline(4096)
        if not line:
            raise _ClientGone()
        if not line.endswith(b"\n"):
            raise S3Error(400, "BadRequest", "Bad chunked encoding.")
        return line

    def _next_http_chunk(self):
        line = self._raw_line()
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise S3Error(400, "BadRequest", "Bad chunked encoding.") \
                from None
        if size == 0:
            while self._raw_line() not in (b"\r\n", b"\n"):
                pass
            self.done = True
        self.chunk_left = size

    def read(self, n):
        """Up to n bytes (fewer only at the end of the body)."""
        out = []
        while n > 0 and not self.done:
            if self.left is not None:
                data = self._raw(min(n, self.left))
                if not data:
                    break
                self.left -= len(data)
                if self.left == 0:
                    self.done = True
            else:
                if self.chunk_left == 0:
                    self._next_http_chunk()
                    if self.done:
                        break
                data = self._raw(min(n, self.chunk_left))
                if not data:
                    break
                self.chunk_left -= len(data)
                if self.chunk_left == 0 and self.rfile.read(2) != b"\r\n":
                    raise S3Error(400, "BadRequest", "Bad chunked encoding.")
            out.append(data)
            n -= len(data)
            if self.cut == 0:
                break
        return b"".join(out)

    def read_exact(self, n):
        data = self.read(n)
        if len(data) != n:
            raise S3Error(400, "IncompleteBody", "The request body terminated"
                          " unexpectedly")
        return data

    def readline(self, limit=4096):
        out = bytearray()
        while len(out) < limit:
            c = self.read(1)
            if not c:
                break
            out += c
            if c == b"\n":
                break
        return bytes(out)

    def read_all(self, big):
        if self.left is not None and self.cut is None:
            buf = bytearray(self.left)
            view = memoryview(buf)
            got = 0
            while got < len(buf):
                k = self.rfile.readinto(view[got:got + IO_BLOCK])
                if not k:
                    raise _ClientGone()
                got += k
            self.left = 0
            self.done = True
            return bytes(buf) if not big else buf
        parts = []
        while True:
            data = self.read(IO_BLOCK)
            if not data:
                break
            parts.append(data)
        return b"".join(parts)

    def drain(self):
        while self.read(IO_BLOCK):
            pass


def _decode_aws_chunked(ctx, src):
    """Decode an aws-chunked body: 'HEX[;chunk-signature=SIG]\\r\\nDATA\\r\\n'
    ... '0[;chunk-signature=SIG]\\r\\n' + trailers + '\\r\\n'. Signed modes
    check every chunk signature (and the trailer's)."""
    mode = ctx.payload
    signed = "HMAC-SHA256" in mode
    key, amz_date, scope, prev = ctx.signing
    bad = S3Error(400, "IncompleteBody", "The request body terminated "
                  "unexpectedly")
    mismatch = S3Error(403, "SignatureDoesNotMatch", "The request signature "
                       "we calculated does not match the signature you "
                       "provided. Check your key and signing method.")
    parts = []
    while True:
        line = src.readline()
        if not line.endswith(b"\r\n"):
            raise bad
        head = line[:-2].decode("latin-1")
        size_hex, _, ext = head.partition(";")
        try:
            size = int(size_hex.strip(), 16)
        except ValueError:
            raise S3Error(400, "InvalidChunkSizeError", "Only the last chunk "
                          "is allowed to have a size less than 8192 bytes") \
                from None
        data = src.read_exact(size) if size else b""
        if signed:
            name, _, sig = ext.partition("=")
            if name.strip() != "chunk-signature":
                raise mismatch
            sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope,
                             prev, EMPTY_SHA256,
                             hashlib.sha256(data).hexdigest()])
            want = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
            if not _same(want, sig.strip()):
                raise mismatch
            prev = want
        if size == 0:
            break
        parts.append(data)
        if src.read_exact(2) != b"\r\n":
            raise bad
    trailers = {}
    if mode.endswith("-TRAILER"):
        lines = []
        while True:
            line = src.readline()
            if line == b"\r\n":
                break
            if not line.endswith(b"\r\n"):
                raise bad
            lines.append(line[:-2].decode("latin-1"))
        sig = None
        canon = ""
        for text in lines:
            name, sep, value = text.partition(":")
            if not sep:
                raise S3Error(400, "MalformedTrailerError", "The request "
                              "contained trailing data that was not well-"
                              "formed or did not conform to our published "
                              "schema.")
            name = name.strip().lower()
            if name == "x-amz-trailer-signature":
                sig = value.strip()
                continue
            trailers[name] = value.strip()
            canon += f"{name}:{value.strip()}\n"
        if signed:
            sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", amz_date, scope,
                             prev, hashlib.sha256(canon.encode())
                             .hexdigest()])
            want = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
            if sig is None or not _same(want, sig):
                raise mismatch
    else:
        if src.readline() != b"\r\n":
            raise bad
    if src.read(1):
        raise bad
    return b"".join(parts), trailers


# ---------------------------------------------------------------- CLI
def _serve(args):
    sigs = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    creds = {}
    for spec in args.credentials or ["AKIDEXAMPLE:secret"]:
        parts = spec.split(":", 2)
        if len(parts) < 2 or not parts[0] or not parts[1]:
            print(f"fake-s3: bad --credentials {spec!r} (want "
                  "AKID:SECRET[:SESSION_TOKEN])", file=sys.stderr)
            return 2
        creds[parts[0]] = (parts[1], parts[2] if len(parts) == 3 else None)
    try:
        srv = FakeS3Server(args.host, args.port, region=args.region,
                           credentials=creds,
                           vhost_suffixes=args.vhost_suffix or ("localhost",))
        for spec in args.bucket:
            name, _, region = spec.partition(":")
            srv.create_bucket(name, region or None)
        srv.start()
    except (OSError, ValueError) as e:
        print(f"fake-s3: {e}", file=sys.stderr, flush=True)
        return 2
    # The port file first: whoever sees the line finds the file too.
    if args.port_file:
        _write_atomic(args.port_file, f"{srv.port}\n")
    print(f"fake-s3 listening on {args.host}:{srv.port}", flush=True)
    signal.sigwait(sigs)
    srv.stop()
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the fake until SIGTERM/SIGINT")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--port-file")
    s.add_argument("--region", default="us-east-1")
    s.add_argument("--bucket", action="append", default=[],
                   help="NAME or NAME:REGION (repeatable)")
    s.add_argument("--credentials", action="append", default=[],
                   help="AKID:SECRET[:SESSION_TOKEN] (repeatable; default "
                        "AKIDEXAMPLE:secret)")
    s.add_argument("--vhost-suffix", action="append", default=[],
                   help="host suffix for virtual-hosted style (default "
                        "localhost)")
    args = parser.parse_args(argv)
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Fake Google Cloud Storage (JSON API) server for spotvisor tests.

Speaks the Cloud Storage JSON API subset described in
/work/shared/REFERENCE.md ("Cloud Storage JSON API") over loopback: media,
multipart and resumable uploads, listing, object metadata, downloads (with
Range), deletes, server-side copy, rewrite (multi-call with rewrite tokens)
and compose (composite objects: CRC32C only, componentCount), and
generation preconditions. A control API under /_fake/ on the same port lets
tests seed data, inject faults and observe exactly what the client did.
Point clients at it with STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT.

Use it in-process:

    srv = FakeGcsServer(buckets=["ckpt"]).start()
    srv.fault("reset_mid_body", upload_type="chunk", count=1)
    srv.objects("ckpt")
    srv.stop()

or as a script:

    fake_gcs.py serve [--port 0] [--port-file PATH] [--bucket NAME] [--sink] ...
    fake_gcs.py ctl --port PORT objects ckpt

sink=True (--sink) makes it a sink for upload benchmarks: uploads keep only
size, crc32c, md5Hash and generation, never the bytes. md5=False
(--no-md5) computes no MD5, the most costly part of taking an upload.

Needs Debian's /usr/bin/python3 (3.11) with python3-crc32c (preferred) or
python3-crcmod for CRC32C; Debian's libisal2, when installed, hashes big
buffers faster and off the GIL. Nothing else outside the standard library. See
the "fake_gcs.py" section of README.md next to this file for the contract,
the deviations from the real service and the performance notes.
"""

import argparse
import base64
import binascii
import bisect
import ctypes
import email.utils
import hashlib
import http.server
import json
import mmap
import os
import queue
import re
import secrets
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref

# CRC32C: Debian's python3-crc32c (ICRAR crc32c; Debian 12 builds it without
# the SSE4.2 path, still ~4.5x crcmod), else crcmod's C extension. Both hold
# the GIL; MD5 (hashlib) releases it, so MD5 is what runs on helper threads.
# When Debian's libisal2 (Intel's ISA-L) is installed, its crc32_iscsi
# (CRC32C with hardware folding, ~25 GB/s here) hashes big writable
# buffers through ctypes, which releases the GIL for the call; the Python
# module still takes small and read-only ones.
try:
    import crc32c as _crc32c_module

    def _crc32c_py(data, value=0):
        return _crc32c_module.crc32c(data, value)

    CRC32C_IMPL = ("python3-crc32c ("
                   + ("hardware" if getattr(_crc32c_module, "hardware_based",
                                            False) else "software") + ")")
except ImportError:
    try:
        import crcmod
    except ImportError as _e:  # pragma: no cover - environment problem
        raise ImportError("fake_gcs.py needs python3-crc32c or python3-crcmod"
                          " (Debian packages): run it with /usr/bin/python3"
                          ) from _e
    _crc32c_py = crcmod.mkCrcFun(0x11EDC6F41, initCrc=0, xorOut=0xFFFFFFFF,
                                 rev=True)     # _crc32c_py(data, value=0)
    CRC32C_IMPL = "crcmod"


def _load_isal():
    """ISA-L's crc32_iscsi(buf, int len, init) through ctypes, or None."""
    if os.environ.get("FAKE_GCS_NO_ISAL"):
        return None
    try:
        fn = ctypes.CDLL("libisal.so.2").crc32_iscsi
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    # ISA-L takes and returns the register without the final inversion.
    if fn(b"123456789", 9, 0xFFFFFFFF) ^ 0xFFFFFFFF != 0xE3069283:
        return None          # not the CRC32C this fake needs: do not use it
    return fn


_ISAL_CRC = _load_isal()
ISAL_MIN = 64 * 1024           # smaller buffers: the Python module is as fast
ISAL_STEP = 1 << 30            # crc32_iscsi's length is an int
if _ISAL_CRC is not None:
    CRC32C_IMPL = "ISA-L crc32_iscsi (libisal2, GIL released), " + CRC32C_IMPL


def _crc32c(data, value=0):
    """CRC32C of data continuing from value (the CRC of what came before)."""
    n = len(data) if not isinstance(data, memoryview) else data.nbytes
    if _ISAL_CRC is None or n < ISAL_MIN:
        return _crc32c_py(data, value)
    try:
        buf = (ctypes.c_char * n).from_buffer(data)
    except (TypeError, ValueError):    # read-only or not contiguous bytes
        return _crc32c_py(data, value)
    try:
        addr, reg = ctypes.addressof(buf), value ^ 0xFFFFFFFF
        for off in range(0, n, ISAL_STEP):
            reg = _ISAL_CRC(addr + off, min(ISAL_STEP, n - off), reg)
        return reg ^ 0xFFFFFFFF
    finally:
        del buf              # the export must end before the buffer is freed


CONTROL = "/_fake/"
JSON_PREFIX = "/storage/v1"
UPLOAD_PREFIX = "/upload/storage/v1"
DOWNLOAD_PREFIX = "/download/storage/v1"
QUANTUM = 256 * 1024           # resumable chunks: multiples of 256 KiB
IO_BLOCK = 1 << 20             # socket reads/writes in 1 MiB slices
SMALL_BODY = 64 * 1024         # bodies sent in the same write as headers
LOG_LIMIT = 10000              # newest entries kept; hit counters are exact
MAX_RESULTS = 1000             # list default and cap
PROJECT_NUMBER = "123456789"
NAME_MAX_BYTES = 1024
PARALLEL_HASH_MIN = 4 << 20    # MD5 on a helper thread for bodies this big
MMAP_MIN = 1 << 20             # bodies this big go to pre-faulted mmaps
SINK_BLOCKS = 8                # sink mode: blocks of a body in flight
POOL_KEEP = 32                 # sink mode: idle blocks kept for reuse
CHUNKED_BLOCK_MAX = 16 << 20   # blocks for chunked bodies grow up to this
COMPOSE_MAX_SOURCES = 32
COMPONENT_COUNT_MAX = 2 ** 31 - 1   # componentCount saturates here (GCS)
DATA_PARTS_MAX = 4096          # compose flattens sources' parts up to this

FAULT_MODES = ("none", "status", "reset_before", "reset_mid_body",
               "reset_after", "slow")
UPLOAD_TYPES = ("media", "multipart", "resumable", "chunk", "query")
DATA_KINDS = ("media", "chunk")  # bodies that are object data, hashed as read
KINDS = UPLOAD_TYPES + ("cancel", "download", "get", "list", "delete",
                        "copy", "rewrite", "compose", "bucket", "buckets",
                        "unsupported", "invalid", "unknown")
# Request headers copied into log entries (Authorization never is: the log
# records the auth outcome instead).
LOG_HEADERS = ("Content-Type", "Content-Length", "Transfer-Encoding",
               "Content-Range", "Range", "X-Guploader-No-308", "X-Goog-Hash",
               "X-Upload-Content-Length", "X-Upload-Content-Type", "Expect",
               "User-Agent")

REASONS = {400: "invalid", 401: "required", 403: "forbidden",
           404: "notFound", 405: "methodNotAllowed", 408: "requestTimeout",
           409: "conflict", 411: "lengthRequired", 412: "conditionNotMet",
           416: "requestedRangeNotSatisfiable", 429: "rateLimitExceeded",
           499: "clientClosedRequest", 500: "backendError",
           501: "notImplemented", 502: "badGateway", 503: "backendError",
           504: "gatewayTimeout"}
STATUS_TEXT = {308: "Resume Incomplete", 499: "Client Closed Request"}

UBLA_MESSAGE = ("Cannot insert legacy ACL for an object when uniform "
                "bucket-level access is enabled. Read more at "
                "https://cloud.google.com/storage/docs/"
                "uniform-bucket-level-access.")
UPLOAD_PARAMS_MESSAGE = ("Upload requests must include an uploadType URL "
                         "parameter and a URL-encoded object name.")
PRECONDITION_MESSAGE = ("At least one of the pre-conditions you specified "
                        "did not hold.")
# Object metadata fields taken from upload metadata and echoed back.
STORED_FIELDS = ("contentEncoding", "contentDisposition", "contentLanguage",
                 "cacheControl", "customTime")
PRECONDITIONS = ("ifGenerationMatch", "ifGenerationNotMatch",
                 "ifMetagenerationMatch", "ifMetagenerationNotMatch")
# copy/rewrite: preconditions on the source object, by the name of the
# destination-style check they map to.
SOURCE_PRECONDITIONS = {"ifSourceGenerationMatch": "ifGenerationMatch",
                        "ifSourceGenerationNotMatch": "ifGenerationNotMatch",
                        "ifSourceMetagenerationMatch":
                            "ifMetagenerationMatch",
                        "ifSourceMetagenerationNotMatch":
                            "ifMetagenerationNotMatch"}
# A rewrite continued with rewriteToken may repeat these parameters of the
# first call, but only with the same values.
REWRITE_FIXED_PARAMS = (PRECONDITIONS + tuple(SOURCE_PRECONDITIONS)
                        + ("sourceGeneration", "destinationPredefinedAcl",
                           "destinationKmsKeyName"))
REWRITE_UNIT = 1 << 20         # maxBytesRewrittenPerCall: multiples of 1 MiB
NOT_IMPLEMENTED_HINT = ("see the fake_gcs.py section of "
                        "tests/fakes/README.md")

# bytes */T (a query), bytes S-E/T, or bytes S-*/T: the end is wherever this
# request's body ends (Google's Node client streams whole uploads so).
_CONTENT_RANGE = re.compile(r"bytes (?:(\*)|(\d+)-(\d+|\*))/(\*|\d+)")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class FakeError(Exception):
    """A control-API error, carried to the HTTP client as (code, message)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class GcsError(Exception):
    """An error answered to a GCS client in the real JSON error shape."""

    def __init__(self, code, message, reason=None, headers=(),
                 location=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "backendError")
        self.headers = list(headers)
        self.location = location  # (locationType, location) or None

    def copy(self):
        """The same error without a traceback: errors kept for later (a
        failed session's) must not keep the failed request's frames, and
        with them its body, alive."""
        return GcsError(self.code, self.message, self.reason, self.headers,
                        self.location)

    def body(self):
        err = {"message": self.message, "domain": "global",
               "reason": self.reason}
        if self.location:
            err["locationType"], err["location"] = self.location
        return {"error": {"code": self.code, "message": self.message,
                          "errors": [err]}}


# ---------------------------------------------------------------- helpers
def _b64(raw):
    return base64.b64encode(raw).decode("ascii")


def _crc_b64(crc):
    return _b64(struct.pack(">I", crc))


# CRC32C of a concatenation from the parts' CRCs (zlib's crc32_combine, for
# the Castagnoli polynomial): compose never re-reads the sources' bytes.
_CRC32C_POLY = 0x82F63B78      # reflected


def _multmodp(a, b):
    """a * b modulo the CRC polynomial (reflected bit order)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _CRC32C_POLY if b & 1 else b >> 1


_X2N = [1 << 30]               # x^(2^k) modulo the polynomial
for _ in range(63):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def _crc32c_combine(crc1, crc2, len2):
    """CRC32C of A + B from crc1 = CRC32C(A), crc2 = CRC32C(B), len2 = |B|."""
    p, n, k = 1 << 31, len2, 3            # x^(8 * len2)
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 63], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


class _StreamHash:
    """CRC32C and MD5 of a byte stream, fed in order as a body is read.

    CRC32C runs in the feeding thread (both CRC modules hold the GIL); for
    big bodies MD5 runs on a helper thread (hashlib releases the GIL on
    large buffers), so it overlaps with the next socket read and CRC.
    """

    def __init__(self, threaded=False, md5=True):
        self.md5 = hashlib.md5() if md5 else None
        self.crc = 0
        self._queue = self._worker = None
        if threaded and md5:
            self._queue = queue.SimpleQueue()
            self._worker = threading.Thread(target=self._run, daemon=True,
                                            name="fake-gcs-md5")
            self._worker.start()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            view, release = item
            self.md5.update(view)
            if release is not None:
                release()
            item = view = release = None

    def feed(self, view, release=None):
        """Hash the next bytes; release() is called once view is no longer
        needed (sink blocks go back to their pool)."""
        self.crc = _crc32c(view, self.crc)
        if self._worker is not None:
            self._queue.put((view, release))
            return
        if self.md5 is not None:
            self.md5.update(view)
        if release is not None:
            release()

    def finish(self):
        """Wait for the helper thread; returns self."""
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None
        return self

    def b64(self):
        """(crc32c, md5Hash) in base64; md5Hash None without MD5."""
        return _crc_b64(self.crc), (None if self.md5 is None
                                    else _b64(self.md5.digest()))


class _SessionHash:
    """The MD5 of a resumable session's persisted bytes, updated in upload
    order on a helper thread of the session's own (started when needed,
    gone after a second idle), so neither a chunk's 308 nor the next chunk
    waits for MD5: only finalization does (digest()).

    A chunk's bytes are fed while they arrive, before it is known whether
    the chunk will be accepted: mark() first (the point to roll back to),
    cut() where a reset_mid_body fault would stop, then settle("all"),
    settle("cut") or settle("none"). Everything runs in submission order.
    """

    IDLE = 1.0
    INLINE_MAX = 64 * 1024     # hashed at once when no thread is running

    def __init__(self, md5=True):
        self._off = not md5        # md5=False: no MD5, digest() is None
        self._md5 = hashlib.md5()
        self._mark = self._cut = None
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False

    def _submit(self, op, arg=None, size=0):
        if self._off:
            if op == "data" and arg[1] is not None:
                arg[1]()               # nothing to hash: release at once
            return
        with self._lock:
            if not self._running and size <= self.INLINE_MAX:
                self._do(op, arg)
                return
            self._queue.put((op, arg))
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, daemon=True,
                                 name="fake-gcs-session-md5").start()

    def _run(self):
        while True:
            try:
                op, arg = self._queue.get(timeout=self.IDLE)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._running = False
                        return
                continue
            self._do(op, arg)
            op = arg = None      # an idle thread must not pin the last view

    def _do(self, op, arg):
        if op == "data":
            view, release = arg
            self._md5.update(view)
            if release is not None:
                release()
        elif op == "mark":
            self._mark, self._cut = self._md5.copy(), None
        elif op == "cut":
            self._cut = self._md5.copy()
        elif op == "settle":
            if arg == "none":
                self._md5 = self._mark
            elif arg == "cut":
                self._md5 = self._cut
            self._mark = self._cut = None
        elif op == "barrier":
            arg.set()

    def update(self, view, release=None):
        self._submit("data", (view, release), len(view))

    def mark(self):
        self._submit("mark")

    def cut(self):
        self._submit("cut")

    def settle(self, outcome):
        self._submit("settle", outcome)

    def digest(self):
        if self._off:
            return None
        done = threading.Event()
        self._submit("barrier", done)
        done.wait()
        return self._md5.digest()


class _ChunkHash:
    """Hashes a resumable chunk's new bytes as they arrive: CRC32C here,
    continuing the session's; MD5 through the session's _SessionHash.
    skip: leading bytes already persisted (a resent overlap), not hashed.
    snap_at: body offset where a reset_mid_body fault would cut the chunk;
    the digests there are kept too (snap_crc; the session's cut())."""

    def __init__(self, session_hash, crc, skip, snap_at):
        self.session_hash = session_hash
        self.crc, self.skip, self.snap_at = crc, skip, snap_at
        self.hashed = 0
        self.snap_crc = None
        self._pos = 0
        session_hash.mark()
        if snap_at is not None and snap_at <= skip:
            self._snap()

    def _snap(self):
        self.snap_crc = self.crc
        self.session_hash.cut()

    def feed(self, view, release=None):
        start = self._pos
        self._pos += len(view)
        lo = max(self.skip - start, 0)
        if lo >= len(view):
            if release is not None:
                release()
            return
        at = self.snap_at
        if at is not None and self.snap_crc is None and \
                start + lo < at <= self._pos:
            self._hash(view[lo:at - start], None)
            self._snap()
            lo = at - start
        self._hash(view[lo:], release)

    def _hash(self, view, release):
        self.crc = _crc32c(view, self.crc)
        self.hashed += len(view)
        self.session_hash.update(view, release)

    def finish(self):
        return self


def _hashes(data, md5=True):
    """(crc32c, md5Hash) of data (bytes-like or _Data), base64 of the
    big-endian digests; md5Hash None when md5 is False."""
    views = data.views(block=IO_BLOCK) if isinstance(data, _Data) \
        else [memoryview(data)[i:i + IO_BLOCK]
              for i in range(0, len(data), IO_BLOCK)]
    h = _StreamHash(threaded=len(data) >= PARALLEL_HASH_MIN, md5=md5)
    for view in views:
        h.feed(view)
    return h.finish().b64()


def _rfc3339(t):
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
            + ".%03dZ" % int((t % 1) * 1000))


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _etag(generation, metageneration):
    # Real object ETags are base64 of a tiny protobuf holding generation
    # (field 1) and metageneration (field 2); this is the same encoding.
    return _b64(b"\x08" + _varint(generation) + b"\x10"
                + _varint(metageneration))


def _quote(name):
    return urllib.parse.quote(name, safe="")


def _unquote_strict(raw, what):
    try:
        return urllib.parse.unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise GcsError(400, f"Invalid UTF-8 in the {what}.") from None


def _check_name(name):
    if not name:
        raise GcsError(400, "Required", "required")
    if len(name.encode("utf-8")) > NAME_MAX_BYTES:
        raise GcsError(400, "The maximum object length is 1024 "
                            "characters, but got a name with "
                            f"{len(name.encode('utf-8'))} characters.")
    if "\r" in name or "\n" in name or name in (".", "..") \
            or name.startswith(".well-known/acme-challenge/"):
        raise GcsError(400, f"Invalid object name: {name!r}")


def _int_param(query, key, lo=None):
    try:
        v = int(query[key])
    except ValueError:
        raise GcsError(400, f"Invalid argument: {key}={query[key]!r} is "
                            "not an integer") from None
    if lo is not None and v < lo:
        raise GcsError(400, f"Invalid argument: {key} must be >= {lo}")
    return v


def _preconditions(query):
    return {k: _int_param(query, k, 0) for k in PRECONDITIONS if k in query}


def _check_preconditions(pre, cur):
    """Raise 412 unless every precondition holds for cur (None = absent)."""
    def fail():
        raise GcsError(412, PRECONDITION_MESSAGE, "conditionNotMet",
                       location=("header", "If-Match"))
    gen = cur.generation if cur is not None else None
    mg = cur.metageneration if cur is not None else None
    if "ifGenerationMatch" in pre:
        want = pre["ifGenerationMatch"]
        if (gen is None and want != 0) or (gen is not None and gen != want):
            fail()
    if "ifGenerationNotMatch" in pre:
        if gen is None or gen == pre["ifGenerationNotMatch"]:
            fail()
    if "ifMetagenerationMatch" in pre:
        if mg is None or mg != pre["ifMetagenerationMatch"]:
            fail()
    if "ifMetagenerationNotMatch" in pre:
        if mg is None or mg == pre["ifMetagenerationNotMatch"]:
            fail()


def _expected_hash(value, size, what):
    """Validate a client-supplied base64 digest; returns it normalised."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raw = None
    if raw is None or len(raw) != size:
        raise GcsError(400, f"Invalid {what} value: {value!r}")
    return _b64(raw)


def _goog_hash(headers):
    """Expected digests from x-goog-hash headers: {"crc32c": .., "md5": ..}."""
    out = {}
    for value in headers.get_all("X-Goog-Hash") or ():
        for item in value.split(","):
            alg, sep, digest = item.strip().partition("=")
            alg = alg.strip().lower()
            if not sep:
                raise GcsError(400, f"Invalid x-goog-hash header: {value!r}")
            if alg == "crc32c":
                out["crc32c"] = _expected_hash(digest.strip(), 4, "crc32c")
            elif alg == "md5":
                out["md5"] = _expected_hash(digest.strip(), 16, "md5Hash")
    return out


def _verify(expected, crc, md5):
    exp = expected.get("crc32c")
    if exp is not None and exp != crc:
        raise GcsError(400, f'Provided CRC32C "{exp}" doesn\'t match '
                            f'calculated CRC32C "{crc}".')
    exp = expected.get("md5")
    if exp is not None and md5 is None:
        raise GcsError(400, "fake-gcs runs without MD5 (md5=False, serve "
                            "--no-md5): it cannot check the MD5 hash given; "
                            "send crc32c instead.")
    if exp is not None and exp != md5:
        raise GcsError(400, f'Provided MD5 hash "{exp}" doesn\'t match '
                            f'calculated MD5 hash "{md5}".')


def _metadata_fields(meta):
    """Validate JSON object metadata; returns (stored fields, expected)."""
    if not isinstance(meta, dict):
        raise GcsError(400, "Object metadata must be a JSON object.",
                       "parseError")
    stored = {}
    for key in STORED_FIELDS:
        if key in meta:
            if not isinstance(meta[key], str):
                raise GcsError(400, f"Invalid value for {key}.")
            stored[key] = meta[key]
    if "metadata" in meta and meta["metadata"] is not None:
        custom = meta["metadata"]
        if not isinstance(custom, dict) or not all(
                isinstance(v, str) for v in custom.values()):
            raise GcsError(400, "Invalid value for metadata: a map of "
                                "strings to strings is expected.")
        if custom:
            stored["metadata"] = dict(custom)
    if "contentType" in meta and not isinstance(meta["contentType"], str):
        raise GcsError(400, "Invalid value for contentType.")
    expected = {}
    if meta.get("crc32c") is not None:
        expected["crc32c"] = _expected_hash(meta["crc32c"], 4, "crc32c")
    if meta.get("md5Hash") is not None:
        expected["md5"] = _expected_hash(meta["md5Hash"], 16, "md5Hash")
    return stored, expected


def _parse_json(body):
    try:
        return json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise GcsError(400, "Parse Error", "parseError") from None


def _parse_multipart(body, boundary):
    """Split a multipart/related body (RFC 2046, CRLF line breaks).

    Returns [(headers, memoryview)]; headers keys are lower-case. A part
    may have no header lines at all (its body then starts right after the
    empty line). Raises GcsError(400) on any syntax error.
    """
    def bad(why):
        raise GcsError(400, f"Malformed multipart body: {why}.")
    delim = b"--" + boundary.encode("latin-1")
    if body[:len(delim)] == delim:
        pos = len(delim)
    else:
        i = body.find(b"\r\n" + delim)      # anything before is preamble
        if i < 0:
            bad("no boundary delimiter")
        pos = i + 2 + len(delim)
    view = memoryview(body)
    parts = []
    while True:
        if body[pos:pos + 2] == b"--":
            if not parts:
                bad("no parts")
            return parts                    # close delimiter; epilogue ignored
        while body[pos:pos + 1] in (b" ", b"\t"):
            pos += 1                        # transport padding
        if body[pos:pos + 2] != b"\r\n":
            bad("delimiter not followed by CRLF")
        pos += 2
        headers = {}
        if body[pos:pos + 2] == b"\r\n":
            start = pos + 2                 # no header lines
        else:
            end = body.find(b"\r\n\r\n", pos)
            if end < 0:
                bad("unterminated part headers")
            for line in bytes(body[pos:end]).split(b"\r\n"):
                name, sep, value = line.partition(b":")
                if not sep or not name.strip():
                    bad("bad part header line")
                headers[name.strip().decode("latin-1").lower()] = \
                    value.strip().decode("latin-1")
            start = end + 4
        k = body.find(b"\r\n" + delim, start)
        if k < 0:
            bad("missing closing boundary")
        parts.append((headers, view[start:k]))
        pos = k + 2 + len(delim)


def _cut_keep(fault, n):
    """What a reset_mid_body fault persists of an n-byte chunk: a 256
    KiB-aligned prefix, never all of it (default: half)."""
    want = fault.get("bytes", n // 2)
    return (min(want, max(n - 1, 0)) // QUANTUM) * QUANTUM


def _content_length(headers):
    """Content-Length as an int, None if absent, chunked or malformed."""
    if headers.get("Transfer-Encoding") is not None:
        return None
    try:
        n = int(headers.get("Content-Length", ""))
    except ValueError:
        return None
    return n if n >= 0 else None


def _json_int(obj, key, what):
    """An int64 field of a JSON request: a number or a decimal string."""
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, str)) or (
            isinstance(v, str) and not re.fullmatch(r"-?\d+", v)):
        raise GcsError(400, f"Invalid value for {what}: {v!r}")
    return int(v)


def _crc_int(b64):
    return struct.unpack(">I", base64.b64decode(b64))[0]


def _not_kept_message(obj):
    return (f"fake-gcs: the bytes of {obj.bucket}/{obj.name} were not kept: "
            "this fake runs as an upload sink (sink=True, serve --sink), "
            "which keeps only size, crc32c, md5Hash and generation "
            f"({NOT_IMPLEMENTED_HINT})")


def _content_type_param(ctype, param):
    for item in ctype.split(";")[1:]:
        key, sep, value = item.strip().partition("=")
        if sep and key.strip().lower() == param:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            return value
    return None


# ---------------------------------------------------------------- model
class _ByteBuffer(bytearray):
    """A small upload buffer (a subclass, so the fake can count it alive)."""
    __slots__ = ("__weakref__",)


class _MapBuffer(mmap.mmap):
    """A big upload buffer: an anonymous mapping faulted in by the kernel
    in one go (MAP_POPULATE). On this VM that is ~3x cheaper than
    bytearray(n), which zero-fills page by page, fault by fault."""

    def __new__(cls, n):
        return super().__new__(cls, -1, n, flags=mmap.MAP_PRIVATE
                               | mmap.MAP_ANONYMOUS
                               | getattr(mmap, "MAP_POPULATE", 0))


class _BlockPool:
    """Reusable IO_BLOCK buffers for sink mode: a body that is not kept
    flows through a few warm blocks instead of fresh memory."""

    def __init__(self):
        self._free = []
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        return bytearray(IO_BLOCK)

    def put(self, block):
        with self._lock:
            if len(self._free) < POOL_KEEP:
                self._free.append(block)


class _Data:
    """An object's bytes, immutable once made: a list of parts, each a
    memoryview of an upload buffer or another _Data (a compose source).
    Nothing is copied: copies, rewrites and composes share the parts,
    downloads send memoryview slices of them."""

    __slots__ = ("parts", "size")

    def __init__(self, parts=()):
        self.parts = [p for p in parts if len(p)]
        self.size = sum(len(p) for p in self.parts)

    def __len__(self):
        return self.size

    def views(self, first=0, end=None, block=None):
        """memoryviews covering bytes [first, end), in order; at most
        `block` bytes each if given, else as long as the parts allow."""
        end = self.size if end is None else min(end, self.size)
        off = 0
        for part in self.parts:
            n = len(part)
            if off + n <= first:
                off += n
                continue
            if off >= end:
                return
            a, b = max(first - off, 0), min(end - off, n)
            if isinstance(part, _Data):
                yield from part.views(a, b, block)
            elif block is None:
                yield part[a:b]
            else:
                for i in range(a, b, block):
                    yield part[i:min(i + block, b)]
            off += n

    def slice(self, first, end):
        return _Data(self.views(first, end))

    def tobytes(self, first=0, end=None):
        return b"".join(self.views(first, end))

    @staticmethod
    def concat(items):
        """The concatenation of _Data items: their parts side by side while
        that stays short, else the items themselves as parts (a tree:
        composing an object with itself over and over stays small)."""
        flat = [p for d in items for p in d.parts]
        return _Data(flat if len(flat) <= DATA_PARTS_MAX else items)


class _Object:
    """A live object. data is None when its bytes were not kept (sink
    mode, or the snapshot a finished resumable session remembers)."""

    __slots__ = ("bucket", "name", "data", "size", "generation",
                 "metageneration", "content_type", "fields", "crc32c", "md5",
                 "components", "created")

    def resource(self, base):
        q = _quote(self.name)
        t = _rfc3339(self.created)
        r = {"kind": "storage#object",
             "id": f"{self.bucket}/{self.name}/{self.generation}",
             "selfLink": f"{base}{JSON_PREFIX}/b/{self.bucket}/o/{q}",
             "mediaLink": (f"{base}{DOWNLOAD_PREFIX}/b/{self.bucket}/o/{q}"
                           f"?generation={self.generation}&alt=media"),
             "name": self.name,
             "bucket": self.bucket,
             "generation": str(self.generation),
             "metageneration": str(self.metageneration),
             "contentType": self.content_type,
             "storageClass": "STANDARD",
             "size": str(self.size),
             "md5Hash": self.md5,
             "crc32c": self.crc32c,
             "etag": _etag(self.generation, self.metageneration),
             "timeCreated": t,
             "updated": t,
             "timeStorageClassUpdated": t}
        if self.md5 is None:               # composite objects have no MD5
            del r["md5Hash"]
        if self.components is not None:
            r["componentCount"] = self.components
        r.update(self.fields)
        return r

    def summary(self):
        s = {"bucket": self.bucket, "name": self.name,
             "size": self.size, "generation": self.generation,
             "metageneration": self.metageneration,
             "crc32c": self.crc32c, "md5Hash": self.md5,
             "contentType": self.content_type,
             "updated": _rfc3339(self.created)}
        if self.md5 is None:
            del s["md5Hash"]
        if self.components is not None:
            s["componentCount"] = self.components
        if "metadata" in self.fields:
            s["metadata"] = dict(self.fields["metadata"])
        if self.data is None:
            s["kept"] = False
        return s

    def without_data(self):
        """A copy that does not hold the bytes (for records that outlive
        the object: finished sessions, rewrite tokens)."""
        o = _Object()
        for k in self.__slots__:
            setattr(o, k, getattr(self, k))
        o.data = None
        return o


class _Bucket:
    __slots__ = ("name", "created", "uniform", "objects", "names")

    def __init__(self, name, uniform):
        self.name = name
        self.created = time.time()
        self.uniform = uniform
        self.objects = {}
        self.names = []          # sorted (code point order = UTF-8 order)

    def resource(self, base):
        t = _rfc3339(self.created)
        return {"kind": "storage#bucket",
                "selfLink": f"{base}{JSON_PREFIX}/b/{self.name}",
                "id": self.name, "name": self.name,
                "projectNumber": PROJECT_NUMBER, "metageneration": "1",
                "location": "US", "locationType": "multi-region",
                "storageClass": "STANDARD", "etag": "CAE=", "rpo": "DEFAULT",
                "timeCreated": t, "updated": t,
                "iamConfiguration": {
                    "bucketPolicyOnly": {"enabled": self.uniform},
                    "uniformBucketLevelAccess": {"enabled": self.uniform},
                    "publicAccessPrevention": "inherited"}}


class _Session:
    """A resumable upload session. parts: the persisted bytes (memoryviews
    of the chunks' own buffers; None in sink mode and once the session
    ends, so a finished session never holds data); hash (a _SessionHash)
    and crc: the digests of the persisted bytes; streaming: the _ChunkPlan
    of the chunk whose bytes are being hashed as they arrive, if any;
    result: the finished object, without its bytes."""

    __slots__ = ("id", "bucket", "name", "content_type", "fields",
                 "expected", "pre", "total", "parts", "persisted", "hash",
                 "crc", "streaming", "state", "result", "error", "lock",
                 "created")

    def status(self):
        return {"upload_id": self.id, "bucket": self.bucket,
                "name": self.name, "persisted": self.persisted,
                "total": self.total, "state": self.state,
                "generation": (self.result.generation
                               if self.result is not None else None)}


class _ChunkPlan:
    """Decided before a chunk's body is read: where its new bytes start, so
    they are hashed (a _ChunkHash) while they arrive. One chunk per session
    at a time streams; settled (accepted, cut or rolled back) once."""

    __slots__ = ("session", "have", "hasher", "settled")


class _Rewrite:
    """A multi-call objects.rewrite: what the first call asked for. Each
    rewriteToken maps to (job, bytes done), so a token can be replayed.
    src is the source as the first call saw it, without its bytes (a
    token must not keep them alive): later calls find the bytes in the
    live object of that generation."""

    __slots__ = ("src", "dst_bucket", "dst_name", "content_type", "fields",
                 "pre", "params", "body", "step")


class _Route:
    """What a request is, decided from its line and headers (+ body)."""

    __slots__ = ("kind", "bucket", "object", "upload_id", "what", "error",
                 "dst_bucket", "dst_object", "sources")

    def __init__(self, kind="unknown"):
        self.kind = kind
        self.bucket = self.object = self.upload_id = None
        # copy/rewrite: bucket/object are the source, these the destination;
        # compose: bucket/object are the destination, sources the names of
        # its sources (from the body)
        self.dst_bucket = self.dst_object = None
        self.sources = None
        self.what = None     # for 'unsupported': what is not implemented
        self.error = None    # for 'invalid': the GcsError to answer


class _Reply:
    __slots__ = ("code", "body", "ctype", "headers")

    def __init__(self, code, body=b"", ctype="application/json; "
                 "charset=UTF-8", headers=()):
        self.code, self.body, self.ctype = code, body, ctype
        self.headers = list(headers)


def _json_reply(obj, code=200, headers=()):
    return _Reply(code, json.dumps(obj, separators=(",", ":")).encode(),
                  headers=headers)


def _error_reply(err):
    return _Reply(err.code, json.dumps(err.body(),
                                       separators=(",", ":")).encode(),
                  headers=err.headers)


class _BodyError(Exception):
    """The request body could not be read (truncated or bad framing)."""

    def __init__(self, answer):
        super().__init__(answer)
        self.answer = answer   # None = just drop the connection


class _Intake:
    """Where a request body goes while it is read.

    keep=True: into fresh buffers that become the object's data as they are
    (one buffer of Content-Length bytes; for a chunked body, blocks that
    grow with it from 1 MiB to CHUNKED_BLOCK_MAX). keep=False (sink mode,
    media uploads and chunks): through a few pooled blocks that are reused
    as soon as they are hashed, so memory stays at SINK_BLOCKS blocks per
    upload whatever its size. hasher: a _StreamHash or _ChunkHash fed as
    the bytes arrive.
    """

    def __init__(self, fake, keep=True, hasher=None):
        self.fake, self.keep, self.hasher = fake, keep, hasher
        self.size = 0
        self._bufs = []                  # keep: [buffer, bytes filled]
        self._slots = None if keep else threading.Semaphore(SINK_BLOCKS)

    def expect(self, n):
        """The body has n bytes (Content-Length)."""
        if self.keep and n:
            self._bufs.append([self.fake._alloc(n), 0])

    def region(self, want):
        """A writable view of at most want bytes to read into next."""
        if not self.keep:
            self._slots.acquire()
            return memoryview(self.fake._pool.get())[:want]
        if not self._bufs or self._bufs[-1][1] == len(self._bufs[-1][0]):
            grow = min(max(self.size, IO_BLOCK), CHUNKED_BLOCK_MAX)
            self._bufs.append([self.fake._alloc(max(want, grow)), 0])
        buf, filled = self._bufs[-1]
        return memoryview(buf)[filled:filled + want]

    def filled(self, view, k):
        """k bytes were read into view (from region())."""
        got = view[:k]
        self.size += k
        if self.keep:
            self._bufs[-1][1] += k
            if self.hasher is not None:
                self.hasher.feed(got)
            return
        block, pool, slots = view.obj, self.fake._pool, self._slots

        def release():
            pool.put(block)
            slots.release()
        if self.hasher is not None:
            self.hasher.feed(got, release)
        else:
            release()

    def finish(self):
        if self.hasher is not None:
            self.hasher.finish()
        return self

    def data(self):
        """The body as a _Data, or None if it was not kept."""
        if not self.keep:
            return None
        return _Data(memoryview(buf)[:filled] for buf, filled in self._bufs)

    def contiguous(self):
        """The kept body as one buffer (bytearray-like: find, slicing):
        the buffer itself, or for a chunked body a copy of its blocks."""
        if not self.size:
            return b""
        if len(self._bufs) == 1 and self._bufs[0][1] == len(self._bufs[0][0]):
            return self._bufs[0][0]
        buf = self.fake._alloc(self.size)
        off = 0
        for view in self.data().views():
            buf[off:off + len(view)] = view
            off += len(view)
        return buf


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
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that
        # can stall in sandboxes; we never need the name.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        # Resets we cause and clients that hang up surface as OSErrors.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


# ---------------------------------------------------------------- server
class FakeGcsServer:
    """In-process fake GCS JSON API server. Thread-safe."""

    def __init__(self, host="127.0.0.1", port=0, buckets=(),
                 require_token=None, fine_grained_buckets=(), sink=False,
                 md5=True):
        """sink=True: uploads keep only size, crc32c, md5Hash and generation
        (downloads of such objects are a 501 naming the option); for
        benchmarks that only upload. md5=False: no MD5 is computed, so no
        object has md5Hash (as composite objects do not) and an MD5 a
        client gives is refused with a 400 (it cannot be checked); for
        benchmarks where the fake's own MD5 would be the bottleneck."""
        self.host = host
        self.port = port
        self.sink = bool(sink)
        self.md5 = bool(md5)
        self._pool = _BlockPool()
        # Upload buffers alive, counted by their finalizers. Not under
        # self._lock (a buffer is often freed while that is held); an RLock
        # because a GC pass inside it may run a finalizer.
        self._mem = threading.Condition(threading.RLock())
        self._retained = self._buffers = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._buckets = {}
        self._sessions = {}
        self._rewrites = {}       # rewriteToken -> (_Rewrite, bytes done)
        self._rewrite_limit = None
        self._faults = []
        self._fault_epoch = 0     # bumped when the rules are replaced
        self._stopping = False
        self._log = []
        self._hits = {}
        self._inflight = 0
        self._auth_failures = 0
        self._last_gen = 0
        self._require_token = require_token
        self._listener = None
        self._thread = None
        for name in buckets:
            self.create_bucket(name)
        for name in fine_grained_buckets:
            self.create_bucket(name, uniform_access=False)

    # ------------------------------------------------------------ lifecycle
    def start(self):
        with self._lock:
            self._stopping = False
        listener = _Listener((self.host, self.port), self)
        self.port = listener.server_address[1]
        thread = threading.Thread(target=listener.serve_forever,
                                  kwargs={"poll_interval": 0.05},
                                  name=f"fake-gcs:{self.port}", daemon=True)
        thread.start()
        self._listener, self._thread = listener, thread
        return self

    def stop(self):
        with self._lock:
            self._stopping = True          # releases 'slow' delays
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
    def base_url(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    endpoint = base_url   # the value for STORAGE_EMULATOR_HOST

    # ------------------------------------------------------------ data
    def create_bucket(self, name, uniform_access=True):
        """Create a bucket (idempotent). uniform_access=True (the default)
        models uniform bucket-level access: object ACLs are rejected."""
        if not isinstance(name, str) or not re.fullmatch(
                r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]", name):
            raise FakeError(400, f"invalid bucket name {name!r}")
        with self._lock:
            b = self._buckets.get(name)
            if b is None:
                b = self._buckets[name] = _Bucket(name, bool(uniform_access))
            else:
                b.uniform = bool(uniform_access)
            self._changed.notify_all()
            return b.resource(self.base_url)

    def buckets(self):
        with self._lock:
            return sorted(self._buckets)

    def put_object(self, bucket, name, data, content_type=
                   "application/octet-stream", metadata=None):
        """Seed an object directly (no request, not logged; its bytes are
        kept even in sink mode). Returns the object resource."""
        if isinstance(data, str):
            data = data.encode()
        view = memoryview(data).cast("B")
        buf = self._alloc(len(view)) if len(view) else b""
        if len(view):
            buf[:] = view
        data = _Data([memoryview(buf)])
        crc, md5 = _hashes(data, self.md5)
        fields = {"metadata": dict(metadata)} if metadata else {}
        try:
            _check_name(name)
            obj = self._commit(bucket, name, data, len(data), content_type,
                               fields, {}, crc, md5)
        except GcsError as e:
            raise FakeError(e.code, e.message) from None
        return obj.resource(self.base_url)

    def get_object_bytes(self, bucket, name):
        with self._lock:
            obj = self._live_locked(bucket, name)
        if obj is None:
            raise FakeError(404, f"no object {bucket}/{name}")
        if obj.data is None:
            raise FakeError(501, _not_kept_message(obj))
        return obj.data.tobytes()

    def object_resource(self, bucket, name):
        with self._lock:
            obj = self._live_locked(bucket, name)
        if obj is None:
            raise FakeError(404, f"no object {bucket}/{name}")
        return obj.resource(self.base_url)

    def memory(self):
        """Upload data this fake holds right now: {"retained_bytes": bytes
        in upload buffers still alive (objects, open sessions, bodies being
        read), "buffers": how many, "open_sessions": resumable sessions
        still open}. Finished and cancelled sessions hold nothing."""
        with self._lock:
            open_sessions = sum(1 for s in self._sessions.values()
                                if s.state == "open")
        with self._mem:
            return {"retained_bytes": self._retained,
                    "buffers": self._buffers,
                    "open_sessions": open_sessions}

    def wait_for_retained(self, at_most, timeout=5.0):
        """Block until retained_bytes <= at_most. True if reached."""
        with self._mem:
            return self._mem.wait_for(lambda: self._retained <= at_most,
                                      timeout)

    def delete_object(self, bucket, name):
        with self._lock:
            b = self._buckets.get(bucket)
            if b is None or name not in b.objects:
                raise FakeError(404, f"no object {bucket}/{name}")
            self._remove_locked(b, name)
        return {"deleted": True}

    def objects(self, bucket, prefix=""):
        """Live objects under prefix, by name: name, size, generation,
        metageneration, crc32c, md5Hash, contentType, updated, metadata."""
        with self._lock:
            b = self._buckets.get(bucket)
            if b is None:
                raise FakeError(404, f"no bucket {bucket}")
            i = bisect.bisect_left(b.names, prefix)
            out = []
            for name in b.names[i:]:
                if not name.startswith(prefix):
                    break
                out.append(b.objects[name].summary())
            return out

    def uploads(self):
        """Resumable sessions: id, bucket, name, persisted, total, state."""
        with self._lock:
            sessions = list(self._sessions.values())
        return [s.status() for s in sessions]

    def reset(self, keep_buckets=True):
        """Drop all objects, sessions, faults, the log and counters."""
        with self._lock:
            if keep_buckets:
                for b in self._buckets.values():
                    b.objects.clear()
                    b.names.clear()
            else:
                self._buckets.clear()
            self._sessions.clear()
            self._rewrites.clear()
            self._faults.clear()
            self._log.clear()
            self._hits.clear()
            self._auth_failures = 0
            self._changed.notify_all()

    def set_require_token(self, token):
        """Require 'Authorization: Bearer TOKEN' (None = auth off)."""
        with self._lock:
            self._require_token = token or None

    def set_rewrite_limit(self, nbytes):
        """Make every objects.rewrite call copy at most nbytes (None = no
        limit), as real GCS does for large or cross-location rewrites:
        clients then get done=false and a rewriteToken and must loop. A
        maxBytesRewrittenPerCall in the request applies too (the smaller
        wins). Kept across reset()."""
        if nbytes is not None and (not isinstance(nbytes, int)
                                   or isinstance(nbytes, bool)
                                   or nbytes < 1):
            raise FakeError(400, "the rewrite limit must be a positive "
                                 "integer (bytes) or null")
        with self._lock:
            self._rewrite_limit = nbytes

    def rewrites(self):
        """Rewrite tokens issued: token, source, source_generation,
        destination, done (bytes), size. Tokens stay valid (replayable)
        until reset()."""
        with self._lock:
            items = list(self._rewrites.items())
        return [{"token": t, "source": f"{j.src.bucket}/{j.src.name}",
                 "source_generation": j.src.generation,
                 "destination": f"{j.dst_bucket}/{j.dst_name}",
                 "done": done, "size": j.src.size}
                for t, (j, done) in items]

    # ------------------------------------------------------------ faults
    def fault(self, mode="none", *, add=False, **params):
        """Install a fault rule for GCS requests; returns the active rules.

        fault("status", code=503, count=2, upload_type="chunk")
        fault("reset_before", method="GET", path_prefix="/download/")
        fault("reset_mid_body", upload_type="chunk", bytes=262144)
        fault("reset_after", upload_type="media", count=1)
        fault("slow", delay_ms=500, kind="download")
        fault("none")                       # clear every rule

        Matchers (all optional, all must hold): method, path_prefix (raw
        request path), bucket, object_prefix (object name; copy/rewrite
        match on their source or their destination), upload_type
        (media/multipart/resumable/chunk/query), kind (any request kind,
        e.g. copy, rewrite).
        count=N: the rule applies to the next N matching requests, then
        goes away. add=True appends the rule (the first matching rule
        wins); otherwise it replaces all rules. Replacing or clearing the
        rules (and stop()) releases requests currently held by 'slow'.
        A dict spec is accepted as the first argument.
        """
        spec = dict(mode) if isinstance(mode, dict) else dict(params,
                                                               mode=mode)
        add = bool(spec.pop("add", add))
        spec = self._validate_fault(spec)
        with self._lock:
            if spec["mode"] == "none":
                self._faults = []
            elif add:
                self._faults.append(spec)
            else:
                self._faults = [spec]
            if not add:
                self._fault_epoch += 1     # releases 'slow' delays
                self._changed.notify_all()
            return [dict(f) for f in self._faults]

    def current_faults(self):
        with self._lock:
            return [dict(f) for f in self._faults]

    @staticmethod
    def _validate_fault(spec):
        mode = spec.get("mode")
        if mode not in FAULT_MODES:
            raise FakeError(400, f"unknown fault mode {mode!r}; "
                                 f"one of {', '.join(FAULT_MODES)}")
        if mode == "none":
            return {"mode": "none"}
        allowed = {"mode", "count", "method", "path_prefix", "bucket",
                   "object_prefix", "upload_type", "kind"}
        if mode == "status":
            allowed.add("code")
            code = spec.setdefault("code", 503)
            if not isinstance(code, int) or not 400 <= code <= 599:
                raise FakeError(400, "code must be an HTTP error status "
                                     "(400-599)")
        if mode == "reset_mid_body":
            allowed.add("bytes")
            if "bytes" in spec and (not isinstance(spec["bytes"], int)
                                    or spec["bytes"] < 0):
                raise FakeError(400, "bytes must be a non-negative integer")
        if mode == "slow":
            allowed.add("delay_ms")
            delay = spec.setdefault("delay_ms", 1000)
            if not isinstance(delay, (int, float)) or delay < 0:
                raise FakeError(400, "delay_ms must be a non-negative number")
        if "count" in spec and (not isinstance(spec["count"], int)
                                or spec["count"] < 1):
            raise FakeError(400, "count must be a positive integer")
        if "upload_type" in spec and spec["upload_type"] not in UPLOAD_TYPES:
            raise FakeError(400, "upload_type must be one of "
                                 f"{', '.join(UPLOAD_TYPES)}")
        if "kind" in spec and spec["kind"] not in KINDS:
            raise FakeError(400, f"kind must be one of {', '.join(KINDS)}")
        for key in ("method", "path_prefix", "bucket", "object_prefix"):
            if key in spec and not isinstance(spec[key], str):
                raise FakeError(400, f"{key} must be a string")
        if "method" in spec:
            spec["method"] = spec["method"].upper()
        unknown = set(spec) - allowed
        if unknown:
            raise FakeError(400, f"unknown fault fields for {mode}: "
                                 f"{', '.join(sorted(unknown))}")
        return spec

    @staticmethod
    def _fault_matches(f, method, path, route):
        if "method" in f and f["method"] != method:
            return False
        if "path_prefix" in f and not path.startswith(f["path_prefix"]):
            return False
        # copy/rewrite match on their source or their destination, compose
        # on its destination or any of its sources.
        if "bucket" in f and f["bucket"] not in (route.bucket,
                                                 route.dst_bucket):
            return False
        if "object_prefix" in f and not any(
                o is not None and o.startswith(f["object_prefix"])
                for o in (route.object, route.dst_object,
                          *(route.sources or ()))):
            return False
        if "upload_type" in f and route.kind != f["upload_type"]:
            return False
        if "kind" in f and route.kind != f["kind"]:
            return False
        return True

    def _peek_fault(self, method, path, route):
        """The rule that would apply to this request, without using it up
        (to prepare for it while the body is read; _arrive decides)."""
        with self._lock:
            for f in self._faults:
                if self._fault_matches(f, method, path, route):
                    return dict(f)
        return None

    # ------------------------------------------------------------ observing
    def log(self):
        """GCS requests seen (newest LOG_LIMIT), oldest first."""
        with self._lock:
            return [dict(e) for e in self._log]

    def reset_log(self):
        """Forget the log, the hit counters and the auth-failure count."""
        with self._lock:
            self._log.clear()
            self._hits.clear()
            self._auth_failures = 0
            self._changed.notify_all()

    def hits(self, kind=None):
        """GCS requests of this kind since the last reset (all if None)."""
        with self._lock:
            return self._hits_locked(kind)

    def hits_by_kind(self):
        with self._lock:
            return dict(self._hits)

    def inflight(self):
        """GCS requests being handled right now (exact)."""
        with self._lock:
            return self._inflight

    def auth_failures(self):
        with self._lock:
            return self._auth_failures

    def _hits_locked(self, kind):
        if kind is None:
            return sum(self._hits.values())
        return self._hits.get(kind, 0)

    def wait_for(self, what, count=1, timeout=5.0, kind=None):
        """Block until hits(kind) >= count ('hits') or inflight() >= count
        ('inflight'), or inflight() == 0 ('idle'). True if reached."""
        if what == "hits":
            pred = lambda: self._hits_locked(kind) >= count  # noqa: E731
        elif what == "inflight":
            pred = lambda: self._inflight >= count  # noqa: E731
        elif what == "idle":
            pred = lambda: self._inflight == 0  # noqa: E731
        else:
            raise FakeError(400, "what must be hits, inflight or idle")
        with self._lock:
            return self._changed.wait_for(pred, timeout)

    def wait_for_hits(self, kind=None, count=1, timeout=5.0):
        return self.wait_for("hits", count, timeout, kind)

    def wait_for_inflight(self, count=1, timeout=5.0):
        return self.wait_for("inflight", count, timeout)

    def wait_idle(self, timeout=5.0):
        return self.wait_for("idle", 0, timeout)

    def wait_for_object(self, bucket, name, timeout=5.0, generation=None):
        """Block until bucket/name exists (with a generation > generation
        if given). True if it does."""
        def pred():
            obj = self._live_locked(bucket, name)
            return obj is not None and (generation is None
                                        or obj.generation > generation)
        with self._lock:
            return self._changed.wait_for(pred, timeout)

    # ------------------------------------------------------------ internals
    def _live_locked(self, bucket, name):
        b = self._buckets.get(bucket)
        return None if b is None else b.objects.get(name)

    def _remove_locked(self, b, name):
        del b.objects[name]
        i = bisect.bisect_left(b.names, name)
        del b.names[i]
        self._changed.notify_all()

    def _alloc(self, n):
        """A buffer for n bytes of upload data, counted while alive."""
        buf = _MapBuffer(n) if n >= MMAP_MIN else _ByteBuffer(n)
        with self._mem:
            self._retained += n
            self._buffers += 1
        weakref.finalize(buf, self._freed, n)
        return buf

    def _freed(self, n):
        with self._mem:
            self._retained -= n
            self._buffers -= 1
            self._mem.notify_all()

    def _commit(self, bucket, name, data, size, ctype, fields, pre, crc, md5,
                components=None):
        """Make data (a _Data, or None if not kept) the live object
        bucket/name (preconditions checked atomically with the write).
        Returns the new _Object."""
        with self._lock:
            b = self._buckets.get(bucket)
            if b is None:
                raise GcsError(404, "The specified bucket does not exist.")
            cur = b.objects.get(name)
            _check_preconditions(pre, cur)
            gen = max(self._last_gen + 1, time.time_ns() // 1000)
            self._last_gen = gen
            obj = _Object()
            obj.bucket, obj.name, obj.data, obj.size = bucket, name, data, size
            obj.generation, obj.metageneration = gen, 1
            obj.content_type = ctype
            obj.fields = fields
            obj.crc32c, obj.md5 = crc, md5
            obj.components = components
            obj.created = time.time()
            if cur is None:
                bisect.insort(b.names, name)
            b.objects[name] = obj
            self._changed.notify_all()
            return obj

    def _bucket(self, name):
        with self._lock:
            b = self._buckets.get(name)
        if b is None:
            raise GcsError(404, "The specified bucket does not exist.")
        return b

    def _inflight_delta(self, delta):
        with self._lock:
            self._inflight += delta
            self._changed.notify_all()

    def _arrive(self, method, path, query, headers, body_size, route, t0):
        """Log a GCS request, count it and pick its fault, atomically."""
        selected = {}
        for h in LOG_HEADERS:
            values = headers.get_all(h)
            if values:
                selected[h.lower()] = ", ".join(values)
        entry = {"method": method, "path": path, "query": query,
                 "headers": selected, "body_size": body_size,
                 "kind": route.kind, "bucket": route.bucket,
                 "object": route.object, "upload_id": route.upload_id,
                 "dst_bucket": route.dst_bucket,
                 "dst_object": route.dst_object,
                 "time": t0, "status": None}
        if route.kind == "compose":
            entry["sources"] = route.sources
        with self._lock:
            self._log.append(entry)
            if len(self._log) > LOG_LIMIT:
                del self._log[:len(self._log) - LOG_LIMIT]
            self._hits[route.kind] = self._hits.get(route.kind, 0) + 1
            fault = None
            for f in self._faults:
                if self._fault_matches(f, method, path, route):
                    fault = dict(f)
                    if "count" in f:
                        f["count"] -= 1
                        if f["count"] <= 0:
                            self._faults.remove(f)
                    entry["fault"] = f["mode"]
                    break
            self._changed.notify_all()
        return entry, fault

    def _intake(self, route, method, path, headers):
        """(an _Intake for this request's body, the _ChunkPlan or None)."""
        if route.kind == "media":
            n = _content_length(headers)
            return _Intake(self, keep=not self.sink, hasher=_StreamHash(
                threaded=n is None or n >= PARALLEL_HASH_MIN,
                md5=self.md5)), None
        if route.kind == "chunk":
            plan = self._chunk_plan(route, method, path, headers)
            return _Intake(self, keep=not self.sink, hasher=(
                plan.hasher if plan is not None else None)), plan
        return _Intake(self), None

    def _delay(self, seconds):
        """Sleep for a 'slow' fault; cut short when the rules are replaced
        or cleared, or the server stops."""
        deadline = time.monotonic() + seconds
        with self._lock:
            epoch = self._fault_epoch
            while not self._stopping and self._fault_epoch == epoch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._changed.wait(remaining)

    def _note(self, entry, **fields):
        with self._lock:
            entry.update(fields)

    def _check_auth(self, headers):
        """None if allowed, else the GcsError to answer (401)."""
        with self._lock:
            token = self._require_token
        if token is None:
            return None, None
        got = headers.get("Authorization")
        if got is None:
            outcome = "missing"
            err = GcsError(401, "Anonymous caller does not have access to "
                                "the Google Cloud Storage resource. "
                                "(fake-gcs requires 'Authorization: Bearer "
                                "<token>')", "required",
                           location=("header", "Authorization"))
        elif got != f"Bearer {token}":
            outcome = "invalid"
            err = GcsError(401, "Invalid Credentials", "authError",
                           location=("header", "Authorization"))
        else:
            return "ok", None
        err.headers.append(("WWW-Authenticate",
                            'Bearer realm="https://accounts.google.com/"'))
        with self._lock:
            self._auth_failures += 1
        return outcome, err

    # ------------------------------------------------------------ routing
    def _route(self, method, path, query, headers):
        try:
            return self._route_inner(method, path, query, headers)
        except GcsError as e:
            r = _Route("invalid")
            r.error = e
            return r

    def _route_inner(self, method, path, query, headers):
        def unsupported(what):
            r = _Route("unsupported")
            r.what = what
            return r

        if path.startswith(UPLOAD_PREFIX + "/b/"):
            bucket_raw, _, tail = path[len(UPLOAD_PREFIX) + 3:].partition("/")
            if tail != "o":
                return _Route()
            r = _Route()
            r.bucket = _unquote_strict(bucket_raw, "bucket name")
            if "upload_id" in query:
                r.upload_id = query["upload_id"]
                with self._lock:
                    s = self._sessions.get(r.upload_id)
                if s is not None:
                    r.object = s.name
                if method == "DELETE":
                    r.kind = "cancel"
                elif method in ("PUT", "POST"):
                    cr = headers.get("Content-Range", "")
                    r.kind = ("query" if cr.strip().startswith("bytes */")
                              else "chunk")
                return r
            if method != "POST":
                return r
            r.kind = query.get("uploadType")
            r.object = query.get("name")
            if r.kind not in ("media", "multipart", "resumable"):
                r.kind = "invalid"
                r.error = GcsError(400, UPLOAD_PARAMS_MESSAGE, "required")
            return r

        if path.startswith(DOWNLOAD_PREFIX + "/b/"):
            bucket_raw, _, tail = path[len(DOWNLOAD_PREFIX) + 3:].partition(
                "/")
            if not tail.startswith("o/") or "/" in tail[2:] or \
                    method not in ("GET", "HEAD"):
                return _Route()
            r = _Route("download")
            r.bucket = _unquote_strict(bucket_raw, "bucket name")
            r.object = _unquote_strict(tail[2:], "object name")
            return r

        if path == JSON_PREFIX + "/b":
            if method == "GET":
                return _Route("buckets")
            if method == "POST":
                return unsupported("bucket creation (create buckets with "
                                   "--bucket or POST /_fake/bucket)")
            return _Route()

        if path.startswith(JSON_PREFIX + "/b/"):
            bucket_raw, _, tail = path[len(JSON_PREFIX) + 3:].partition("/")
            bucket = _unquote_strict(bucket_raw, "bucket name")
            if tail == "":
                if method == "GET":
                    r = _Route("bucket")
                    r.bucket = bucket
                    return r
                return unsupported(f"{method} on a bucket (bucket update, "
                                   "patch and delete)")
            if tail == "o":
                if method == "GET":
                    r = _Route("list")
                    r.bucket = bucket
                    return r
                if method == "POST":
                    r = _Route("invalid")
                    r.error = GcsError(400, "Uploads go to "
                                            f"{UPLOAD_PREFIX}/b/BUCKET/o "
                                            "(fake-gcs)")
                    return r
                return _Route()
            if tail.startswith("o/"):
                name_raw = tail[2:]
                encoding_404 = GcsError(404, "Not Found (fake-gcs: object "
                                             "names must be percent-encoded "
                                             "in the path, '/' as %2F)")
                if "/" in name_raw:
                    src_raw, _, sub = name_raw.partition("/")
                    parts = sub.split("/")
                    if parts[0] in ("copyTo", "rewriteTo"):
                        r = _Route()
                        if len(parts) > 5 and parts[1] == "b" and \
                                parts[3] == "o":
                            r.error = encoding_404
                            return r
                        if len(parts) != 5 or parts[1] != "b" or \
                                parts[3] != "o" or not parts[2] or \
                                method != "POST":
                            return r
                        r.kind = "copy" if parts[0] == "copyTo" \
                            else "rewrite"
                        r.bucket = bucket
                        r.object = _unquote_strict(src_raw, "object name")
                        r.dst_bucket = _unquote_strict(parts[2],
                                                       "bucket name")
                        r.dst_object = _unquote_strict(parts[4],
                                                       "object name")
                        return r
                    if parts[0] == "compose":
                        r = _Route()
                        if sub != "compose" or method != "POST":
                            return r
                        r.kind = "compose"
                        r.bucket = bucket
                        r.object = _unquote_strict(src_raw, "object name")
                        return r
                    if sub == "acl" or sub.startswith("acl/"):
                        return unsupported("object ACLs")
                    r = _Route()
                    r.error = encoding_404
                    return r
                r = _Route()
                r.bucket = bucket
                r.object = _unquote_strict(name_raw, "object name")
                if method in ("GET", "HEAD"):
                    r.kind = ("download" if query.get("alt") == "media"
                              else "get")
                elif method == "DELETE":
                    r.kind = "delete"
                else:
                    return unsupported(f"{method} on an object (metadata "
                                       "update/patch)")
                return r
            for sub, what in (("acl", "bucket ACLs"),
                              ("defaultObjectAcl", "default object ACLs"),
                              ("iam", "IAM policies"),
                              ("notificationConfigs", "notifications"),
                              ("lockRetentionPolicy", "retention policies")):
                if tail == sub or tail.startswith(sub + "/"):
                    return unsupported(what)
            return _Route()

        if path.startswith(JSON_PREFIX + "/projects/"):
            return unsupported("project resources (HMAC keys, service "
                               "account)")
        if path.startswith(JSON_PREFIX + "/"):
            return _Route()
        if path.startswith("/batch/"):
            return unsupported("batch requests")
        return unsupported("the XML API")

    # ------------------------------------------------------------ handlers
    def _handle(self, route, req, cut):
        """Answer a routed request: returns a _Reply, or None when the
        request was cut (reset) inside the handler. Raises GcsError."""
        kind = route.kind
        if kind == "invalid" or route.error is not None:
            raise route.error
        if kind == "unsupported":
            raise GcsError(501, f"fake-gcs: {route.what} is not implemented "
                                f"by this fake ({NOT_IMPLEMENTED_HINT})")
        if kind == "unknown":
            raise GcsError(404, "Not Found")
        handler = getattr(self, "_do_" + kind)
        return handler(route, req, cut)

    def _do_buckets(self, route, req, cut):
        if not req.query.get("project"):
            raise GcsError(400, "Required parameter: project", "required")
        with self._lock:
            items = [self._buckets[n].resource(req.base)
                     for n in sorted(self._buckets)]
        out = {"kind": "storage#buckets"}
        if items:
            out["items"] = items
        return _json_reply(out)

    def _do_bucket(self, route, req, cut):
        return _json_reply(self._bucket(route.bucket).resource(req.base))

    def _check_acl(self, b, query, meta):
        if b.uniform and (query.get("predefinedAcl")
                          or (meta is not None and meta.get("acl"))):
            raise GcsError(400, UBLA_MESSAGE)

    def _do_media(self, route, req, cut):
        b = self._bucket(route.bucket)
        name = req.query.get("name")
        if not name:
            raise GcsError(400, UPLOAD_PARAMS_MESSAGE, "required")
        _check_name(name)
        self._check_acl(b, req.query, None)
        pre = _preconditions(req.query)
        expected = _goog_hash(req.headers)
        crc, md5 = req.hasher.b64()          # hashed while it was read
        _verify(expected, crc, md5)
        ctype = req.headers.get("Content-Type") or "application/octet-stream"
        obj = self._commit(b.name, name, req.data, req.size, ctype, {}, pre,
                           crc, md5)
        return _json_reply(obj.resource(req.base))

    def _do_multipart(self, route, req, cut):
        b = self._bucket(route.bucket)
        ctype = req.headers.get("Content-Type", "")
        if ctype.split(";")[0].strip().lower() != "multipart/related":
            raise GcsError(400, "Bad content type. Please use multipart.")
        boundary = _content_type_param(ctype, "boundary")
        if not boundary:
            raise GcsError(400, "Malformed multipart body: no boundary "
                                "parameter.")
        parts = _parse_multipart(req.body, boundary)
        if len(parts) != 2:
            raise GcsError(400, "Malformed multipart body: expected 2 parts "
                                f"(metadata, media), got {len(parts)}.")
        (meta_headers, meta_raw), (data_headers, data) = parts
        mt = meta_headers.get("content-type", "application/json")
        if mt.split(";")[0].strip().lower() != "application/json":
            raise GcsError(400, "Malformed multipart body: the first part "
                                "must be JSON metadata.")
        meta = _parse_json(meta_raw)
        fields, expected = _metadata_fields(meta)
        name = req.query.get("name") or meta.get("name")
        if not name or not isinstance(name, str):
            raise GcsError(400, UPLOAD_PARAMS_MESSAGE, "required")
        _check_name(name)
        self._check_acl(b, req.query, meta)
        pre = _preconditions(req.query)
        expected.update(_goog_hash(req.headers))
        crc, md5 = _hashes(data, self.md5)
        _verify(expected, crc, md5)
        ctype = (meta.get("contentType") or data_headers.get("content-type")
                 or "application/octet-stream")
        # The data part is a view into the body's buffer: kept, not copied.
        obj = self._commit(b.name, name, None if self.sink else _Data([data]),
                           len(data), ctype, fields, pre, crc, md5)
        return _json_reply(obj.resource(req.base))

    def _do_resumable(self, route, req, cut):
        b = self._bucket(route.bucket)
        meta = _parse_json(req.body) if bytes(req.body).strip() else {}
        fields, expected = _metadata_fields(meta)
        name = req.query.get("name") or meta.get("name")
        if not name or not isinstance(name, str):
            raise GcsError(400, UPLOAD_PARAMS_MESSAGE, "required")
        _check_name(name)
        self._check_acl(b, req.query, meta)
        pre = _preconditions(req.query)
        total = None
        if req.headers.get("X-Upload-Content-Length") is not None:
            try:
                total = int(req.headers["X-Upload-Content-Length"])
                if total < 0:
                    raise ValueError
            except ValueError:
                raise GcsError(400, "Invalid X-Upload-Content-Length "
                                    "header.") from None
        s = _Session()
        s.id = secrets.token_urlsafe(36)
        s.bucket, s.name = b.name, name
        s.content_type = (meta.get("contentType")
                          or req.headers.get("X-Upload-Content-Type")
                          or "application/octet-stream")
        s.fields, s.expected, s.pre, s.total = fields, expected, pre, total
        s.parts = None if self.sink else []
        s.persisted, s.hash, s.crc, s.streaming = 0, _SessionHash(self.md5), 0, None
        s.state, s.result, s.error = "open", None, None
        s.lock = threading.Lock()
        s.created = time.time()
        with self._lock:
            self._sessions[s.id] = s
        location = (f"{req.base}{UPLOAD_PREFIX}/b/{b.name}/o?uploadType="
                    f"resumable&name={_quote(name)}&upload_id={s.id}")
        return _Reply(200, b"", "text/plain; charset=utf-8",
                      [("Location", location),
                       ("X-GUploader-UploadID", s.id)])

    def _session(self, route):
        with self._lock:
            s = self._sessions.get(route.upload_id)
        if s is None or s.bucket != route.bucket or s.state == "cancelled":
            raise GcsError(404, "No such upload session (fake-gcs: unknown, "
                                "cancelled or for another bucket).")
        return s

    def _chunk_plan(self, route, method, path, headers):
        """Before a chunk's body is read: a _ChunkPlan whose hasher takes
        the chunk's new bytes (those past the persisted ones) as they
        arrive, continuing the session's digests; None if that cannot be
        known yet or another chunk of the session is streaming (the
        handler then hashes from the kept body)."""
        with self._lock:
            s = self._sessions.get(route.upload_id)
        if s is None or s.bucket != route.bucket:
            return None
        n = _content_length(headers)
        cr = headers.get("Content-Range")
        if cr is None:
            start = 0
        else:
            m = _CONTENT_RANGE.fullmatch(cr.strip())
            if m is None or m.group(1):
                return None
            start = int(m.group(2))
        snap_at = None
        f = self._peek_fault(method, path, route)
        if f is not None and f["mode"] == "reset_mid_body" and n is not None:
            snap_at = _cut_keep(f, n)
        with s.lock:
            if s.state != "open" or start > s.persisted or \
                    s.streaming is not None:
                return None
            plan = _ChunkPlan()
            plan.session, plan.have, plan.settled = s, s.persisted, False
            plan.hasher = _ChunkHash(s.hash, s.crc, s.persisted - start,
                                     snap_at)
            s.streaming = plan
        return plan

    @staticmethod
    def _settle(plan, outcome):
        """Close a chunk's streaming (under the session's lock): its bytes
        are accepted ("all"), accepted up to the cut ("cut") or not
        ("none")."""
        if plan is not None and not plan.settled:
            plan.settled = True
            plan.hasher.session_hash.settle(outcome)
            if plan.session.streaming is plan:
                plan.session.streaming = None

    def _drop_plan(self, plan):
        """A chunk that was not handled (fault, auth, unreadable body):
        its streamed bytes are rolled back."""
        if plan is not None and not plan.settled:
            with plan.session.lock:
                self._settle(plan, "none")

    def _incomplete(self, s, req):
        headers = [("X-GUploader-UploadID", s.id)]
        if s.persisted:
            headers.append(("Range", f"bytes=0-{s.persisted - 1}"))
        if req.headers.get("X-Guploader-No-308", "").lower() == "yes":
            headers.append(("X-Http-Status-Code-Override", "308"))
            return _Reply(200, b"", "text/plain; charset=utf-8", headers)
        return _Reply(308, b"", "text/plain; charset=utf-8", headers)

    def _done(self, s, req):
        return _json_reply(s.result.resource(req.base),
                           headers=[("X-GUploader-UploadID", s.id)])

    def _finalize(self, s, req):
        digest = s.hash.digest()
        crc, md5 = _crc_b64(s.crc), None if digest is None else _b64(digest)
        try:
            expected = dict(s.expected)
            expected.update(_goog_hash(req.headers))
            _verify(expected, crc, md5)
            data = None if s.parts is None else _Data(s.parts)
            obj = self._commit(s.bucket, s.name, data, s.persisted,
                               s.content_type, s.fields, s.pre, crc, md5)
        except GcsError as e:
            # A failed finalization ends the session; later requests on it
            # get the same answer.
            s.state, s.error, s.parts = "failed", e.copy(), None
            raise
        # The session remembers the object's resource, not its bytes.
        s.state, s.result, s.parts = "done", obj.without_data(), None
        return self._done(s, req)

    def _do_query(self, route, req, cut):
        return self._do_chunk(route, req, cut)

    def _do_chunk(self, route, req, cut):
        s = self._session(route)
        with s.lock:
            if s.state == "done":
                return self._done(s, req)
            if s.state == "failed":
                raise s.error.copy()
            if s.state == "cancelled":
                raise GcsError(404, "No such upload session.")
            plan = req.plan if req.plan is not None and \
                req.plan.session is s else None
            try:
                return self._chunk_locked(s, req, cut, plan)
            finally:
                self._settle(plan, "none")      # if not accepted

    def _chunk_locked(self, s, req, cut, plan):
        n = req.size
        have = s.persisted
        cr = req.headers.get("Content-Range")
        open_end = False
        if cr is None:
            # No Content-Range: the body is the whole object.
            start, end, total = (0, n - 1, n) if n else (None, None, 0)
        else:
            m = _CONTENT_RANGE.fullmatch(cr.strip())
            if m is None:
                raise GcsError(400, "Failed to parse Content-Range header.")
            star, a, z, t = m.groups()
            start = None if star else int(a)
            total = None if t == "*" else int(t)
            open_end = z == "*"
            if open_end:
                # bytes S-*/T: the body runs to its end; with T = * this
                # request ends the object.
                end = start + n - 1
                if total is None:
                    total = start + n
            else:
                end = None if star else int(z)
        if total is not None:
            if s.total is not None and total != s.total:
                raise GcsError(400, f"The total size {total} does not match "
                                    f"the size declared earlier ({s.total}).")
            if total < have:
                raise GcsError(400, f"The total size {total} is smaller than "
                                    f"the {have} byte(s) already persisted.")
        if start is None:                         # bytes */TOTAL or */*
            if n:
                raise GcsError(400, "A 'bytes */N' request must have an "
                                    "empty body.")
            if total is not None and total == have:
                self._not_streaming(s)
                return self._finalize(s, req)
            if total is not None:
                s.total = total
            return self._incomplete(s, req)
        if start > end and not (open_end and not n):
            raise GcsError(400, "Failed to parse Content-Range header.")
        if n != end - start + 1:
            raise GcsError(400, f"Content-Range {cr!r} does not match the "
                                f"body length {n}.")
        if total is not None and end + 1 > total:
            raise GcsError(400, f"Content-Range {cr!r} goes past the total "
                                "size.")
        final = total is not None and end + 1 == total
        if not final and n % QUANTUM:
            raise GcsError(400, "Invalid request. The number of bytes "
                                "uploaded is required to be a multiple of "
                                f"{QUANTUM} bytes, except for the final "
                                f"request. The received request contained "
                                f"{n} bytes, which does not meet this "
                                "requirement (fake-gcs is strict: "
                                f"{NOT_IMPLEMENTED_HINT}).")
        if start > have:
            raise GcsError(400, "Invalid request. According to the "
                                "Content-Range header, the upload offset is "
                                f"{start} byte(s), which exceeds already "
                                f"uploaded size of {have} byte(s).")
        overlap = min(end + 1, have) - start
        if overlap > 0 and s.parts is not None and \
                _Data(s.parts).tobytes(start, start + overlap) != \
                req.data.tobytes(0, overlap):
            raise GcsError(400, "Invalid request. The re-sent bytes "
                                f"{start}-{start + overlap - 1} differ from "
                                "the bytes already persisted (fake-gcs).")
        # Persist body[lo:stop]: the bytes past the persisted ones; with
        # reset_mid_body a 256 KiB-aligned prefix of the chunk (never all of
        # it), then the connection drops.
        lo = have - start
        stop = _cut_keep(cut, n) if cut is not None else n
        if plan is None:
            self._not_streaming(s)
        if stop > lo:
            crc = self._take_digests(s, req, plan, lo, stop, cut is not None)
            if crc is None and cut is None:
                raise GcsError(503, "fake-gcs (sink mode): this chunk could "
                                    "not be hashed as it arrived and its "
                                    "bytes were not kept; query the session "
                                    "and resend.")
            if crc is not None:
                s.crc = crc
                if s.parts is not None:
                    s.parts.extend(req.data.views(lo, stop))
                s.persisted = start + stop
        if total is not None:
            s.total = total
        if cut is not None:
            return None
        if final:
            return self._finalize(s, req)
        return self._incomplete(s, req)

    @staticmethod
    def _not_streaming(s):
        """503 while another request's chunk is being read into s (its bytes
        are in the session's MD5 until it is settled)."""
        if s.streaming is not None:
            raise GcsError(503, "fake-gcs: another request is uploading to "
                                "this session right now; retry.")

    def _take_digests(self, s, req, plan, lo, stop, cut):
        """Make body[lo:stop] part of the session's digests; returns the new
        CRC32C (the MD5 follows in the session's _SessionHash), or None in
        sink mode when the bytes were not hashed as they arrived."""
        if plan is not None:
            h = plan.hasher
            if not cut and h.hashed == stop - lo:
                self._settle(plan, "all")
                return h.crc
            if cut and h.snap_crc is not None and h.snap_at == stop:
                self._settle(plan, "cut")
                return h.snap_crc
            self._settle(plan, "none")
        if req.data is None:
            return None
        crc = s.crc
        for view in req.data.views(lo, stop, IO_BLOCK):
            crc = _crc32c(view, crc)
            s.hash.update(view)
        return crc

    def _do_cancel(self, route, req, cut):
        s = self._session(route)
        with s.lock:
            if s.state == "done":
                return self._done(s, req)
            s.state, s.parts = "cancelled", None
        return _Reply(499, b"", "text/plain; charset=utf-8")

    def _live(self, route, req, remove=False):
        """The object a GET/DELETE names, after generation/precondition
        checks (404 / 412 as GCS); removed atomically if remove."""
        gen = (_int_param(req.query, "generation", 0)
               if "generation" in req.query else None)
        pre = _preconditions(req.query)
        with self._lock:
            b = self._buckets.get(route.bucket)
            if b is None:
                raise GcsError(404, "The specified bucket does not exist.")
            obj = b.objects.get(route.object)
            if obj is None or (gen is not None and gen != obj.generation):
                raise GcsError(404, f"No such object: {route.bucket}/"
                                    f"{route.object}")
            _check_preconditions(pre, obj)
            if remove:
                self._remove_locked(b, route.object)
        return obj

    def _do_get(self, route, req, cut):
        return _json_reply(self._live(route, req).resource(req.base))

    def _do_delete(self, route, req, cut):
        self._live(route, req, remove=True)
        return _Reply(204, b"", "application/json; charset=UTF-8")

    # ------------------------------------------------ copy and rewrite
    def _copy_request(self, route, req):
        """Check a copy/rewrite request and resolve its source (the live
        object, pinned by reference: objects are immutable). Returns a
        _Rewrite describing the destination to write."""
        q = req.query
        _check_name(route.object)
        _check_name(route.dst_object)
        src_gen = (_int_param(q, "sourceGeneration", 0)
                   if "sourceGeneration" in q else None)
        src_pre = {SOURCE_PRECONDITIONS[k]: _int_param(q, k, 0)
                   for k in SOURCE_PRECONDITIONS if k in q}
        pre = _preconditions(q)
        meta = self._copy_body(req.body)
        stored, expected = _metadata_fields(meta)
        with self._lock:
            sb = self._buckets.get(route.bucket)
            db = self._buckets.get(route.dst_bucket)
            if sb is None or db is None:
                raise GcsError(404, "The specified bucket does not exist.")
            src = sb.objects.get(route.object)
            if src is None or (src_gen is not None
                               and src_gen != src.generation):
                raise GcsError(404, f"No such object: {route.bucket}/"
                                    f"{route.object}")
            _check_preconditions(src_pre, src)
        if db.uniform and (q.get("destinationPredefinedAcl")
                           or meta.get("acl")):
            raise GcsError(400, UBLA_MESSAGE)
        # Digests given for the destination must be the source's.
        _verify(expected, src.crc32c, src.md5)
        # The source's metadata, overridden field by field by the body's.
        fields = {k: (dict(v) if k == "metadata" else v)
                  for k, v in src.fields.items()}
        for key in STORED_FIELDS:
            if key in stored:
                fields[key] = stored[key]
        if meta.get("metadata") is not None:
            if stored.get("metadata"):
                fields["metadata"] = stored["metadata"]
            else:
                fields.pop("metadata", None)     # "metadata": {} clears
        job = _Rewrite()
        job.src = src
        job.dst_bucket, job.dst_name = route.dst_bucket, route.dst_object
        job.content_type = meta.get("contentType") or src.content_type
        job.fields, job.pre = fields, pre
        job.params = {k: q[k] for k in REWRITE_FIXED_PARAMS if k in q}
        job.body = meta
        job.step = None
        return job

    @staticmethod
    def _copy_body(body):
        """The optional destination resource: empty, JSON null or an
        object (the Go client sends null when it has no metadata)."""
        if not bytes(body).strip():
            return {}
        meta = _parse_json(body)
        if meta is None:
            return {}
        if not isinstance(meta, dict):
            raise GcsError(400, "Object metadata must be a JSON object.",
                           "parseError")
        return meta

    def _commit_copy(self, job, src):
        """Write the destination: src's bytes (shared, not copied) and
        digests; a copy of a composite object is composite too."""
        return self._commit(job.dst_bucket, job.dst_name, src.data, src.size,
                            job.content_type, job.fields, job.pre,
                            src.crc32c, src.md5, src.components)

    def _do_copy(self, route, req, cut):
        job = self._copy_request(route, req)
        return _json_reply(self._commit_copy(job, job.src).resource(
            req.base))

    def _do_rewrite(self, route, req, cut):
        q = req.query
        step = None
        if "maxBytesRewrittenPerCall" in q:
            step = _int_param(q, "maxBytesRewrittenPerCall", 0)
            if step % REWRITE_UNIT:
                raise GcsError(400, "Invalid argument: "
                                    "maxBytesRewrittenPerCall must be an "
                                    "integral multiple of 1048576 (1 MiB).")
        token = q.get("rewriteToken")
        if token:
            with self._lock:
                found = self._rewrites.get(token)
            if found is None:
                raise GcsError(400, "Invalid argument: rewriteToken (fake-"
                                    "gcs: not a token this server issued).")
            job, done = found
            src = self._check_continuation(job, route, req)
            if "maxBytesRewrittenPerCall" not in q:
                step = job.step              # omitted: the first call's
        else:
            job, done = self._copy_request(route, req), 0
            job.step = step
            src = job.src
        step = step or None                  # 0 = no limit, as unset
        with self._lock:
            limit = self._rewrite_limit
        if limit is not None:
            step = limit if step is None else min(step, limit)
        size = src.size
        end = size if step is None else min(size, done + step)
        out = {"kind": "storage#rewriteResponse",
               "totalBytesRewritten": str(end), "objectSize": str(size)}
        if end < size:
            with self._lock:
                if self._buckets.get(job.dst_bucket) is None:
                    raise GcsError(404, "The specified bucket does not "
                                        "exist.")
                # Fail early; checked again atomically when it completes.
                _check_preconditions(job.pre, self._live_locked(
                    job.dst_bucket, job.dst_name))
                new = secrets.token_urlsafe(48)
                job.src = src.without_data()     # tokens keep no bytes
                self._rewrites[new] = (job, end)
            out.update(done=False, rewriteToken=new)
            return _json_reply(out)
        obj = self._commit_copy(job, src)
        out.update(done=True, resource=obj.resource(req.base))
        return _json_reply(out)

    def _check_continuation(self, job, route, req):
        """A call carrying a rewriteToken: same source and destination; any
        parameter or body it repeats must equal the first call's. The
        pinned source generation must still be live (there is no version
        history to copy it from). Returns that live object."""
        src = job.src
        if (route.bucket, route.object, route.dst_bucket,
                route.dst_object) != (src.bucket, src.name, job.dst_bucket,
                                      job.dst_name):
            raise GcsError(400, "Invalid argument: rewriteToken was issued "
                                "for another source or destination.")
        for k in REWRITE_FIXED_PARAMS:
            if k in req.query and req.query[k] != job.params.get(k):
                raise GcsError(400, f"Invalid argument: {k} differs from "
                                    "the first call of this rewrite.")
        meta = self._copy_body(req.body)
        if meta and meta != job.body:
            raise GcsError(400, "Invalid argument: the object resource "
                                "differs from the first call of this "
                                "rewrite.")
        with self._lock:
            if self._buckets.get(src.bucket) is None:
                raise GcsError(404, "The specified bucket does not exist.")
            live = self._live_locked(src.bucket, src.name)
            if live is None or live.generation != src.generation:
                raise GcsError(404, f"No such object: {src.bucket}/"
                                    f"{src.name} (fake-gcs: generation "
                                    f"{src.generation} was replaced or "
                                    "deleted during the rewrite)")
        return live

    def _do_download(self, route, req, cut):
        obj = self._live(route, req)
        if obj.data is None:
            raise GcsError(501, _not_kept_message(obj))
        size = obj.size
        # x-goog-hash is the whole object's, also for a range, and comes as
        # two lines, crc32c= then md5=, as Cloud Storage sends it; composite
        # objects have no MD5.
        headers = [("X-Goog-Hash", f"crc32c={obj.crc32c}")]
        if obj.md5 is not None:
            headers.append(("X-Goog-Hash", f"md5={obj.md5}"))
        headers += [
            ("X-Goog-Generation", str(obj.generation)),
            ("X-Goog-Metageneration", str(obj.metageneration)),
            ("X-Goog-Stored-Content-Length", str(size)),
            ("X-Goog-Stored-Content-Encoding", "identity"),
            ("ETag", _etag(obj.generation, obj.metageneration)),
            ("Last-Modified", email.utils.formatdate(obj.created,
                                                     usegmt=True)),
            ("Accept-Ranges", "bytes")]
        if obj.components is not None:
            headers.append(("X-Goog-Component-Count", str(obj.components)))
        rng = req.headers.get("Range")
        m = _RANGE.fullmatch(rng.strip()) if rng else None
        if m is not None and (m.group(1) or m.group(2)):
            a, z = m.groups()
            if a:
                first = int(a)
                last = min(int(z), size - 1) if z else size - 1
                bad = first >= size or (z and int(z) < first)
            else:                                  # suffix: last N bytes
                first, last = max(size - int(z), 0), size - 1
                bad = int(z) == 0 or size == 0
            if bad:
                raise GcsError(416, "The requested range cannot be "
                                    "satisfied.", headers=[
                                        ("Content-Range", f"bytes */{size}")])
            headers.append(("Content-Range", f"bytes {first}-{last}/{size}"))
            return _Reply(206, obj.data.slice(first, last + 1),
                          obj.content_type, headers)
        return _Reply(200, obj.data, obj.content_type, headers)

    # ------------------------------------------------------------ compose
    def _do_compose(self, route, req, cut):
        """objects.compose: the destination (the path's object) becomes the
        sources' bytes in order, shared not copied, with the CRC32C
        combined from theirs, no MD5, and componentCount the sum of the
        sources' (a non-composite object counts 1)."""
        q = req.query
        _check_name(route.object)
        b = self._bucket(route.bucket)
        body = _parse_json(req.body) if bytes(req.body).strip() else None
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise GcsError(400, "A compose request must be a JSON object "
                                "(storage#composeRequest).", "parseError")
        wanted = self._compose_sources(body.get("sourceObjects"), b.name)
        dest = body.get("destination")
        if dest is None:
            dest = {}
        if not isinstance(dest, dict):
            raise GcsError(400, "Invalid value for destination: an object "
                                "resource is expected.")
        fields, expected = _metadata_fields(dest)
        expected.pop("md5", None)    # GCS ignores MD5s in compose requests
        pre = _preconditions(q)
        if b.uniform and (q.get("destinationPredefinedAcl")
                          or dest.get("acl")):
            raise GcsError(400, UBLA_MESSAGE)
        with self._lock:
            srcs = []
            for name, gen, if_gen in wanted:
                o = b.objects.get(name)
                if o is None or (gen is not None and gen != o.generation):
                    raise GcsError(404, f"No such object: {b.name}/{name}")
                if if_gen is not None and if_gen != o.generation:
                    raise GcsError(412, PRECONDITION_MESSAGE,
                                   "conditionNotMet",
                                   location=("header", "If-Match"))
                srcs.append(o)
        crc, size, count = 0, 0, 0
        for o in srcs:
            crc = _crc32c_combine(crc, _crc_int(o.crc32c), o.size)
            size += o.size
            count += o.components if o.components is not None else 1
        crc = _crc_b64(crc)
        _verify(expected, crc, None)
        data = None if any(o.data is None for o in srcs) else \
            _Data.concat([o.data for o in srcs])
        ctype = dest.get("contentType") or "application/octet-stream"
        obj = self._commit(b.name, route.object, data, size, ctype, fields,
                           pre, crc, None, min(count, COMPONENT_COUNT_MAX))
        if q.get("deleteSourceObjects", "").lower() == "true":
            with self._lock:
                for o in srcs:
                    live = b.objects.get(o.name)
                    if live is not None and live.generation == o.generation:
                        self._remove_locked(b, o.name)
        return _json_reply(obj.resource(req.base))

    @staticmethod
    def _compose_sources(sources, bucket):
        """[(name, generation or None, ifGenerationMatch or None)] from a
        compose request's sourceObjects; 400 when malformed."""
        if sources is None or sources == []:
            raise GcsError(400, "Required", "required")
        if not isinstance(sources, list):
            raise GcsError(400, "Invalid value for sourceObjects: a list is "
                                "expected.")
        if len(sources) > COMPOSE_MAX_SOURCES:
            raise GcsError(400, "The number of source components provided "
                                f"({len(sources)}) exceeds the maximum "
                                f"({COMPOSE_MAX_SOURCES})")
        out = []
        for i, src in enumerate(sources):
            what = f"sourceObjects[{i}]"
            if not isinstance(src, dict):
                raise GcsError(400, f"Invalid value for {what}.")
            name = src.get("name")
            if not isinstance(name, str) or not name:
                raise GcsError(400, "Required", "required")
            if src.get("bucket") not in (None, bucket):
                raise GcsError(400, f"Invalid value for {what}.bucket: "
                                    "source objects must be in the "
                                    "destination's bucket (fake-gcs).")
            gen = _json_int(src, "generation", f"{what}.generation")
            pre = src.get("objectPreconditions") or {}
            if not isinstance(pre, dict):
                raise GcsError(400, f"Invalid value for "
                                    f"{what}.objectPreconditions.")
            if_gen = _json_int(pre, "ifGenerationMatch", f"{what}."
                               "objectPreconditions.ifGenerationMatch")
            if gen is not None and if_gen is not None and gen != if_gen:
                raise GcsError(400, f"Invalid value for {what}: generation "
                                    f"{gen} and objectPreconditions."
                                    f"ifGenerationMatch {if_gen} differ.")
            out.append((name, gen, if_gen))
        return out

    def _do_list(self, route, req, cut):
        b = self._bucket(route.bucket)
        q = req.query
        prefix = q.get("prefix", "")
        delim = q.get("delimiter", "")
        start_off = q.get("startOffset", "")
        end_off = q.get("endOffset", "")
        trailing = q.get("includeTrailingDelimiter", "").lower() == "true"
        limit = MAX_RESULTS
        if "maxResults" in q:
            limit = min(_int_param(q, "maxResults", 1), MAX_RESULTS)
        resume = None
        if q.get("pageToken"):
            try:
                resume = json.loads(base64.urlsafe_b64decode(
                    q["pageToken"].encode("ascii")).decode("utf-8"))
                if not (isinstance(resume, list) and len(resume) == 2 and
                        resume[0] in ("n", "p") and
                        isinstance(resume[1], str)):
                    raise ValueError
            except (ValueError, UnicodeError, binascii.Error):
                raise GcsError(400, "Invalid argument: pageToken") from None
        items, prefixes = [], []
        with self._lock:
            names = b.names
            i = bisect.bisect_left(names, max(prefix, start_off))
            if resume is not None:
                kind, key = resume
                i = max(i, bisect.bisect_right(names, key) if kind == "n"
                        else bisect.bisect_left(names, _successor(key)))
            last = None
            while i < len(names) and len(items) + len(prefixes) < limit:
                name = names[i]
                if not name.startswith(prefix) or (end_off and
                                                   name >= end_off):
                    i = len(names)
                    break
                if delim:
                    j = name.find(delim, len(prefix))
                    if j >= 0:
                        p = name[:j + len(delim)]
                        prefixes.append(p)
                        if trailing and name == p:
                            items.append(b.objects[name].resource(req.base))
                        last = ["p", p]
                        i = bisect.bisect_left(names, _successor(p))
                        continue
                items.append(b.objects[name].resource(req.base))
                last = ["n", name]
                i += 1
            more = (i < len(names) and names[i].startswith(prefix)
                    and not (end_off and names[i] >= end_off))
        out = {"kind": "storage#objects"}
        if prefixes:
            out["prefixes"] = prefixes
        if items:
            out["items"] = items
        if more and last is not None:
            out["nextPageToken"] = base64.urlsafe_b64encode(
                json.dumps(last).encode()).decode("ascii")
        return _json_reply(out)


def _successor(p):
    """The smallest string greater than every string starting with p."""
    while p:
        c = ord(p[-1])
        if c < 0x10FFFF:
            return p[:-1] + chr(c + 1)
        p = p[:-1]
    return "\U0010ffff" * 2


class _Request:
    """A request for a handler. body: the contiguous body (None for media
    uploads and chunks, whose bytes are data: a _Data, or None when not
    kept, and size); hasher: the _StreamHash that hashed a media body as it
    arrived; plan: a chunk's _ChunkPlan (or None)."""

    __slots__ = ("method", "path", "query", "headers", "body", "data",
                 "size", "hasher", "plan", "base")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"      # keep-alive, like the real service
    server_version = "UploadServer"

    def version_string(self):
        return self.server_version

    def log_message(self, fmt, *args):
        pass  # the fake keeps its own structured log

    def setup(self):
        super().setup()
        # Headers and body may leave in separate writes: without NODELAY,
        # Nagle + the client's delayed ACK stall every keep-alive request
        # by ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self):
        self._dispatch()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_GET

    # ------------------------------------------------------------ plumbing
    def _read_body(self, intake):
        """Read the request body into intake (an _Intake)."""
        te = self.headers.get("Transfer-Encoding")
        if te is not None:
            if te.strip().lower() != "chunked":
                raise _BodyError(GcsError(501, f"Transfer-Encoding {te!r} "
                                               "is not supported."))
            self._read_chunked(intake)
            return
        cl = self.headers.get("Content-Length")
        if cl is None:
            if self.command in ("POST", "PUT", "PATCH"):
                raise _BodyError("411")
            return
        try:
            n = int(cl)
            if n < 0:
                raise ValueError
        except ValueError:
            raise _BodyError(GcsError(400, "Bad Content-Length.")) from None
        intake.expect(n)
        self._read_into(intake, n)

    def _read_into(self, intake, n):
        """n bytes from the socket into intake, IO_BLOCK at a time, read
        straight into their final buffer (readinto: no copy)."""
        while n:
            view = intake.region(min(IO_BLOCK, n))
            k = self.rfile.readinto(view)
            if not k:
                intake.filled(view, 0)
                raise _BodyError(None)
            intake.filled(view, k)
            n -= k

    def _read_chunked(self, intake):
        while True:
            line = self.rfile.readline(4096)
            if not line.endswith(b"\n"):
                raise _BodyError(None if not line else GcsError(
                    400, "Bad chunked encoding."))
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BodyError(GcsError(400, "Bad chunked encoding.")) \
                    from None
            if size == 0:
                while True:                      # trailers, then CRLF
                    t = self.rfile.readline(4096)
                    if t in (b"\r\n", b"\n"):
                        return
                    if not t:
                        raise _BodyError(None)
            self._read_into(intake, size)
            if self.rfile.read(2) != b"\r\n":
                raise _BodyError(GcsError(400, "Bad chunked encoding."))

    def _reset(self):
        """Abort with RST (SO_LINGER 0), as a dropped connection would."""
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                   struct.pack("ii", 1, 0))
        self.rfile.close()       # makefile() holds a ref that defers close
        self.connection.close()

    def _send(self, reply, entry=None, cut_bytes=None, close=False):
        """Write a reply. cut_bytes: send only that much of the body, then
        reset (reset_mid_body)."""
        if entry is not None:
            # Recorded before the bytes leave, so a client that reads the
            # log right after its response always sees the status.
            self.fake._note(entry, status=reply.code)
        self.send_response(reply.code, STATUS_TEXT.get(reply.code))
        body = reply.body
        self.send_header("Content-Type", reply.ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in reply.headers:
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        data = body if isinstance(body, _Data) else _Data([memoryview(body)])
        end = len(data) if cut_bytes is None else min(cut_bytes, len(data))
        if self.command == "HEAD":
            end = 0
        self._headers_buffer.append(b"\r\n")
        if end <= SMALL_BODY:
            # One write for headers + small body.
            self._headers_buffer.append(data.tobytes(0, end))
            self.flush_headers()
        else:
            self.flush_headers()
            for view in data.views(0, end, IO_BLOCK):   # no copies
                self.wfile.write(view)
        if self.command == "HEAD":
            return
        if cut_bytes is not None:
            self._reset()

    def _dispatch(self):
        self.fake = self.server.fake
        url = urllib.parse.urlsplit(self.path)
        if url.path.startswith(CONTROL):
            self._control(url)
            return
        self.fake._inflight_delta(+1)
        try:
            self._serve(url)
        finally:
            self.fake._inflight_delta(-1)

    def _serve(self, url):
        fake = self.fake
        t0 = time.time()
        query = dict(urllib.parse.parse_qsl(url.query,
                                            keep_blank_values=True))
        route = fake._route(self.command, url.path, query, self.headers)
        intake, plan = fake._intake(route, self.command, url.path,
                                    self.headers)
        try:
            self._serve_read(url, query, route, intake, plan, t0)
        finally:
            fake._drop_plan(plan)

    def _serve_read(self, url, query, route, intake, plan, t0):
        fake = self.fake
        try:
            self._read_body(intake)
        except _BodyError as e:
            intake.finish()
            entry, _ = fake._arrive(self.command, url.path, query,
                                    self.headers, None, route, t0)
            if e.answer is None:
                fake._note(entry, outcome="aborted")
                self.close_connection = True
            elif e.answer == "411":
                self._send(_Reply(411, b"<p>POST requests require a "
                                       b"<code>Content-length</code> "
                                       b"header. That's all we know.</p>",
                                  "text/html; charset=UTF-8"), entry)
            else:
                self._send(_error_reply(e.answer), entry, close=True)
            return
        intake.finish()
        data_kind = route.kind in DATA_KINDS
        body = None if data_kind else intake.contiguous()
        if route.kind in ("multipart", "resumable") and route.object is None:
            route.object = _peek_name(route.kind, self.headers, body)
        if route.kind == "compose":
            route.sources = _peek_sources(body)
        entry, fault = fake._arrive(self.command, url.path, query,
                                    self.headers, intake.size, route, t0)
        mode = fault["mode"] if fault else None
        if mode == "slow":
            fake._delay(fault["delay_ms"] / 1000.0)
        elif mode == "status":
            code = fault["code"]
            text = http.server.BaseHTTPRequestHandler.responses.get(
                code, ("",))[0]
            err = GcsError(code, f"fake-gcs: injected HTTP {code}"
                                 + (f" ({text})" if text else ""))
            self._send(_error_reply(err), entry)
            return
        elif mode == "reset_before" or (
                mode == "reset_mid_body" and route.kind in (
                    "media", "multipart", "resumable", "query", "cancel")):
            fake._note(entry, outcome=mode)
            self._reset()
            return

        req = _Request()
        req.method, req.path, req.query = self.command, url.path, query
        req.headers, req.body = self.headers, body
        req.data, req.size = intake.data(), intake.size
        req.hasher, req.plan = intake.hasher, plan
        host = self.headers.get("Host") or f"{fake.host}:{fake.port}"
        req.base = f"http://{host}"

        auth, err = fake._check_auth(self.headers)
        if auth is not None:
            fake._note(entry, auth=auth)
        if err is not None:
            self._send(_error_reply(err), entry)
            return

        chunk_cut = fault if (mode == "reset_mid_body"
                              and route.kind == "chunk") else None
        try:
            reply = fake._handle(route, req, chunk_cut)
        except GcsError as e:
            reply = _error_reply(e)
        if reply is None:                       # chunk cut mid-body
            fake._note(entry, outcome=mode)
            self._reset()
            return
        if mode == "reset_after":
            fake._note(entry, outcome=mode, would_status=reply.code)
            self._reset()
            return
        if mode == "reset_mid_body":
            n = len(reply.body)
            fake._note(entry, outcome=mode, would_status=reply.code)
            if n == 0:              # nothing to cut: the answer is lost
                self._reset()
            else:
                self._send(reply, None, cut_bytes=min(
                    fault.get("bytes", n // 2), n - 1))
            return
        self._send(reply, entry)

    # ------------------------------------------------------------ control
    def _control(self, url):
        fake = self.fake
        name = url.path[len(CONTROL):].strip("/")
        q = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        method = self.command
        status, raw = 200, None
        intake = _Intake(fake)
        try:
            self._read_body(intake)
        except _BodyError:
            self.close_connection = True
            return
        body = intake.contiguous()
        try:
            def data():
                return json.loads(body) if bytes(body).strip() else {}
            if method == "POST" and name == "bucket":
                d = data()
                result = fake.create_bucket(d["name"],
                                            d.get("uniform_access", True))
            elif method == "GET" and name == "buckets":
                result = fake.buckets()
            elif method == "GET" and name == "objects":
                result = fake.objects(q["bucket"], q.get("prefix", ""))
            elif method == "GET" and name == "object":
                raw = fake.get_object_bytes(q["bucket"], q["name"])
            elif method in ("PUT", "POST") and name == "object":
                meta = json.loads(q["metadata"]) if "metadata" in q else None
                result = fake.put_object(
                    q["bucket"], q["name"], bytes(body),
                    q.get("content_type", "application/octet-stream"), meta)
            elif method == "DELETE" and name == "object":
                result = fake.delete_object(q["bucket"], q["name"])
            elif method == "GET" and name == "uploads":
                result = fake.uploads()
            elif method == "POST" and name == "fault":
                result = fake.fault(data())
            elif method == "GET" and name == "fault":
                result = fake.current_faults()
            elif method == "GET" and name == "log":
                result = fake.log()
            elif method == "POST" and name == "reset-log":
                fake.reset_log()
                result = {"ok": True}
            elif method == "POST" and name == "reset":
                fake.reset(keep_buckets=data().get("keep_buckets", True))
                result = {"ok": True}
            elif method == "GET" and name == "hits":
                result = {"count": fake.hits(q.get("kind")),
                          "by_kind": fake.hits_by_kind()}
            elif method == "GET" and name == "inflight":
                result = {"count": fake.inflight()}
            elif method == "POST" and name == "auth":
                fake.set_require_token(data().get("token"))
                result = {"ok": True}
            elif method == "POST" and name == "rewrite-limit":
                fake.set_rewrite_limit(data().get("bytes"))
                result = {"ok": True}
            elif method == "GET" and name == "rewrites":
                result = fake.rewrites()
            elif method == "GET" and name == "memory":
                result = fake.memory()
            elif method == "GET" and name == "wait":
                what = q.get("what", "hits")
                timeout = float(q.get("timeout", "5"))
                if what == "object":
                    ok = fake.wait_for_object(q["bucket"], q["name"], timeout)
                    result = {"ok": ok}
                else:
                    count = int(q.get("count", "1"))
                    ok = fake.wait_for(what, count, timeout, q.get("kind"))
                    result = {"ok": ok, "hits": fake.hits(q.get("kind")),
                              "inflight": fake.inflight()}
                status = 200 if ok else 408
            else:
                raise FakeError(404, f"no control operation {method} "
                                     f"/_fake/{name}")
        except FakeError as e:
            status, result, raw = e.code, {"error": e.message}, None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            status, result, raw = 400, {"error": f"bad request: {e!r}"}, None
        if raw is not None:
            reply = _Reply(200, raw, "application/octet-stream")
        else:
            reply = _Reply(status, json.dumps(result).encode(),
                           "application/json")
        self._send(reply, close=True)


def _peek_name(kind, headers, body):
    """Object name from multipart/resumable metadata, for logs and fault
    matching only (errors are reported by the real handler)."""
    try:
        if kind == "resumable":
            meta = json.loads(bytes(body)) if bytes(body).strip() else {}
        else:
            boundary = _content_type_param(headers.get("Content-Type", ""),
                                           "boundary")
            meta = json.loads(bytes(_parse_multipart(body, boundary)[0][1]))
        name = meta.get("name")
        return name if isinstance(name, str) else None
    except Exception:  # noqa: BLE001 - malformed input is answered later
        return None


def _peek_sources(body):
    """Source names of a compose request, for logs and fault matching only
    (errors are reported by the handler)."""
    try:
        sources = json.loads(bytes(body))["sourceObjects"]
        return [src["name"] for src in sources
                if isinstance(src, dict) and isinstance(src.get("name"), str)]
    except Exception:  # noqa: BLE001 - malformed input is answered later
        return None


# ---------------------------------------------------------------- script
def _write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _serve(args):
    # Block the stop signals in every thread (threads inherit the mask)
    # and take them synchronously with sigwait.
    sigs = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        srv = FakeGcsServer(args.host, args.port, buckets=args.bucket,
                            require_token=args.require_token,
                            fine_grained_buckets=args.fine_grained_bucket,
                            sink=args.sink, md5=not args.no_md5)
        srv.start()
    except (FakeError, OSError) as e:
        print(f"fake-gcs: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"fake-gcs listening on {args.host}:{srv.port} "
          f"(STORAGE_EMULATOR_HOST={srv.base_url})"
          + (" as an upload sink" if srv.sink else "")
          + (" without MD5" if not srv.md5 else ""), flush=True)
    if args.port_file:
        _write_atomic(args.port_file, f"{srv.port}\n")
    signal.sigwait(sigs)
    srv.stop()
    return 0


def _ctl(args):
    base = f"http://{args.host}:{args.port}{CONTROL}"
    op, rest = args.op, args.args
    raw_out = False

    def need(lo, hi, usage):
        if not lo <= len(rest) <= hi:
            raise SystemExit(f"usage: ctl {op} {usage}")

    def qs(**kw):
        return "?" + urllib.parse.urlencode({k: v for k, v in kw.items()
                                             if v is not None})
    payload = None
    if op == "bucket":
        need(1, 2, "NAME [fine-grained]")
        req = ("POST", "bucket", {"name": rest[0], "uniform_access":
                                  rest[1:] != ["fine-grained"]})
    elif op == "buckets":
        need(0, 0, "")
        req = ("GET", "buckets", None)
    elif op == "objects":
        need(1, 2, "BUCKET [PREFIX]")
        req = ("GET", "objects" + qs(bucket=rest[0],
                                     prefix=rest[1] if len(rest) > 1
                                     else None), None)
    elif op == "get":
        need(2, 2, "BUCKET NAME   (bytes to stdout)")
        req = ("GET", "object" + qs(bucket=rest[0], name=rest[1]), None)
        raw_out = True
    elif op == "put":
        need(3, 4, "BUCKET NAME FILE|- [CONTENT_TYPE]")
        if rest[2] == "-":
            payload = sys.stdin.buffer.read()
        else:
            with open(rest[2], "rb") as f:
                payload = f.read()
        req = ("PUT", "object" + qs(bucket=rest[0], name=rest[1],
                                    content_type=rest[3] if len(rest) > 3
                                    else None), None)
    elif op == "delete":
        need(2, 2, "BUCKET NAME")
        req = ("DELETE", "object" + qs(bucket=rest[0], name=rest[1]), None)
    elif op == "uploads":
        need(0, 0, "")
        req = ("GET", "uploads", None)
    elif op == "fault":
        need(1, 1, "JSON")
        req = ("POST", "fault", json.loads(rest[0]))
    elif op == "faults":
        need(0, 0, "")
        req = ("GET", "fault", None)
    elif op in ("log", "inflight"):
        need(0, 0, "")
        req = ("GET", op, None)
    elif op in ("reset-log", "reset"):
        need(0, 0, "")
        req = ("POST", op, {})
    elif op == "hits":
        need(0, 1, "[KIND]")
        req = ("GET", "hits" + qs(kind=rest[0] if rest else None), None)
    elif op == "auth":
        need(1, 1, "TOKEN|none")
        req = ("POST", "auth", {"token": None if rest[0] == "none"
                                else rest[0]})
    elif op == "rewrite-limit":
        need(1, 1, "BYTES|none")
        req = ("POST", "rewrite-limit", {"bytes": None if rest[0] == "none"
                                         else int(rest[0])})
    elif op == "rewrites":
        need(0, 0, "")
        req = ("GET", "rewrites", None)
    elif op == "memory":
        need(0, 0, "")
        req = ("GET", "memory", None)
    elif op == "wait":
        usage = ("hits KIND [COUNT] | inflight [COUNT] | idle | "
                 "object BUCKET NAME")
        if not rest:
            raise SystemExit(f"usage: ctl wait {usage}")
        what = rest[0]
        params = {"what": what, "timeout": str(args.timeout)}
        if what == "hits" and len(rest) in (2, 3):
            params.update(kind=rest[1], count=rest[2] if len(rest) == 3
                          else "1")
        elif what == "inflight" and len(rest) in (1, 2):
            params["count"] = rest[1] if len(rest) == 2 else "1"
        elif what == "idle" and len(rest) == 1:
            pass
        elif what == "object" and len(rest) == 3:
            params.update(bucket=rest[1], name=rest[2])
        else:
            raise SystemExit(f"usage: ctl wait {usage}")
        req = ("GET", "wait?" + urllib.parse.urlencode(params), None)
    else:
        raise SystemExit(f"unknown ctl operation {op!r}")
    method, name, body = req
    data = payload if payload is not None else (
        None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(base + name, data=data, method=method)
    if payload is None and body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout + 5) as r:
            out = r.read()
            if raw_out:
                sys.stdout.buffer.write(out)
                sys.stdout.buffer.flush()
            else:
                print(out.decode(), flush=True)
            return 0
    except urllib.error.HTTPError as e:
        print(e.read().decode(), flush=True)
        return 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the fake until SIGTERM/SIGINT")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--port-file")
    s.add_argument("--bucket", action="append", default=[],
                   help="create this bucket (uniform bucket-level access)")
    s.add_argument("--fine-grained-bucket", action="append", default=[],
                   help="create this bucket with ACLs allowed (ignored)")
    s.add_argument("--require-token",
                   help="answer 401 unless 'Authorization: Bearer TOKEN'")
    s.add_argument("--sink", action="store_true",
                   help="keep no uploaded bytes, only size, crc32c, "
                        "md5Hash and generation (for upload benchmarks; "
                        "downloads of such objects answer 501)")
    s.add_argument("--no-md5", action="store_true",
                   help="compute no MD5: objects have no md5Hash, and an "
                        "MD5 a client sends is refused with 400 (for "
                        "benchmarks: MD5 is most of the fake's CPU)")
    c = sub.add_parser("ctl", help="talk to a running fake's control API")
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--timeout", type=float, default=5.0,
                   help="for 'wait': seconds to wait (default 5)")
    c.add_argument("op", help="bucket|buckets|objects|get|put|delete|uploads|"
                              "fault|faults|log|reset-log|reset|hits|"
                              "inflight|auth|rewrite-limit|rewrites|memory|"
                              "wait")
    c.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    return _serve(args) if args.cmd == "serve" else _ctl(args)


if __name__ == "__main__":
    sys.exit(main())

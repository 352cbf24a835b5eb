#!/usr/bin/python3
"""Fake Amazon CloudWatch Logs API on loopback, for spotvisor's CloudWatch Logs sink (issue #13).

The AWS JSON 1.1 protocol as the service speaks it: POST / with Content-Type
application/x-amz-json-1.1 and X-Amz-Target: Logs_20140328.<Operation>, a JSON body; answers are
JSON with an x-amzn-RequestId header; errors are HTTP 400 (500 for ServiceUnavailableException and
InternalFailure) with {"__type": CODE, "message": TEXT}, which botocore reads into
ClientError.response["Error"]["Code"].

Strict where the service is:
  - SigV4 verified (Authorization header, service "logs", the fake's region, the body's real
    SHA-256 as the payload hash; the signing rules are fake_s3.py's): an unknown key is
    UnrecognizedClientException, a wrong signature InvalidSignatureException, a session key
    without its X-Amz-Security-Token UnrecognizedClientException, an expired one
    ExpiredTokenException, a request signed more than 15 min away from the fake's clock
    InvalidSignatureException "Signature expired: ..." (or "Signature not yet current: ...");
  - PutLogEvents as the API reference documents it: 1..10,000 events; batch size (UTF-8 message
    bytes + 26 per event) <= 1,048,576; each event (message + 26) <= 262,144 bytes (the
    long-standing limit; max_event_bytes=1048576 for the current docs' 1 MB); non-empty
    messages; chronological order (equal timestamps allowed); a batch spanning more than 24 h
    fails; events more than 2 h in the future / older than 14 days (or older than the group's
    retention, create_group(..., retention_days=N)) come back in rejectedLogEventsInfo and the
    rest are stored; sequenceToken accepted and ignored (as AWS has done since 2023),
    nextSequenceToken still returned;
  - missing groups and streams are ResourceNotFoundException with the service's messages;
    existing ones ResourceAlreadyExistsException.
Operations: CreateLogGroup, CreateLogStream, DescribeLogGroups, DescribeLogStreams, PutLogEvents,
GetLogEvents, FilterLogEvents (filterPattern: plain terms only -- every term must appear,
case-sensitive, "?term" for any-of, "-term" to exclude, "quoted phrases"; JSON and
space-delimited patterns are refused with InvalidParameterException). Everything else is
UnknownOperationException. Not implemented: Logs Insights, metric filters, subscriptions,
KMS, tags (accepted on CreateLogGroup, then dropped), retention deletes, log classes,
deletions, account-level throttling unless injected with fault(), presigned requests, HTTPS.

  srv = FakeCloudWatchLogsServer(region="us-east-1", credentials={"AKID": "secret"}).start()
  srv.endpoint                          # "http://127.0.0.1:PORT" (AWS_ENDPOINT_URL_CLOUDWATCH_LOGS)
  srv.create_group("g"); srv.create_stream("g", "s"); srv.events("g", "s")
  srv.deny("PutLogEvents"); srv.fault("ThrottlingException", count=2, operation="PutLogEvents")
  srv.log(); srv.hits("PutLogEvents"); srv.wait_for("PutLogEvents", count=3, timeout=5)
  srv.stop()

As a process:

  fake_cloudwatch_logs.py serve [--port 0] [--port-file F] [--region R]
                                [--credentials AKID:SECRET[:SESSION_TOKEN]]... [--group G]...
                                [--stream G:S]...
prints "fake-cloudwatch-logs listening on http://HOST:PORT" and runs until SIGTERM/SIGINT.
"""
import argparse
import calendar
import collections
import hashlib
import hmac
import http.server
import json
import re
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import uuid

from fake_s3 import _canonical_query, _parse_query, _signing_key  # the same SigV4 rules

TARGET_PREFIX = "Logs_20140328."
CONTENT_TYPE = "application/x-amz-json-1.1"
OPERATIONS = ("CreateLogGroup", "CreateLogStream", "DescribeLogGroups", "DescribeLogStreams",
              "PutLogEvents", "GetLogEvents", "FilterLogEvents")
MAX_BATCH_EVENTS = 10_000
MAX_BATCH_BYTES = 1_048_576
EVENT_OVERHEAD = 26
DEFAULT_MAX_EVENT_BYTES = 262_144
DAY_MS = 24 * 3600 * 1000
MAX_FUTURE_MS = 2 * 3600 * 1000
MAX_AGE_MS = 14 * DAY_MS
SKEW_S = 15 * 60
LOG_LIMIT = 10_000
GROUP_NAME = re.compile(r"[\.\-_/#A-Za-z0-9]+\Z")
# The error kinds fault() knows: (HTTP status, message).
FAULT_ERRORS = {
    "ThrottlingException": (400, "Rate exceeded"),
    "ServiceUnavailableException": (500, "The service cannot complete the request."),
    "InternalFailure": (500, "The request processing has failed because of an unknown error, exception or "
                             "failure."),
}
FAULT_KINDS = tuple(FAULT_ERRORS) + ("reset", "lost_answer", "delay")
SIG_MISMATCH = ("The request signature we calculated does not match the signature you provided. Check your "
                "AWS Secret Access Key and signing method. Consult the service documentation for details.")


class _Err(Exception):
    def __init__(self, code, message, status=400):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _bad(message):
    return _Err("InvalidParameterException", message)


def _amz(t):
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


class _Stream:
    def __init__(self, name, created_ms):
        self.name, self.created = name, created_ms
        self.events = []  # [(timestamp, seq, message, ingestionTime)] in stored (arrival) order
        self.last_ingestion = None
        self.uploads = 0

    def sorted_events(self):
        return sorted(self.events, key=lambda e: (e[0], e[1]))


class _Group:
    def __init__(self, name, created_ms, retention_days=None):
        self.name, self.created, self.retention_days = name, created_ms, retention_days
        self.streams = {}


class _Listener(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def server_bind(self):  # no reverse DNS lookup
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], OSError):  # a reset or lost_answer fault, a client gone
            return
        super().handle_error(request, client_address)


class FakeCloudWatchLogsServer:
    """In-process fake CloudWatch Logs server. Thread-safe."""

    def __init__(self, host="127.0.0.1", port=0, region="us-east-1", credentials=None, clock=time.time,
                 account_id="123456789012", principal=None, max_event_bytes=DEFAULT_MAX_EVENT_BYTES):
        """credentials: {akid: secret} or {akid: (secret, session_token[, expires_at])}.
        clock: epoch seconds; judges signature times, token expiry and event timestamps.
        principal: the caller named in AccessDeniedException messages.
        max_event_bytes: per-event limit, message bytes + 26 (262144, or 1048576 as the current
        docs say)."""
        self.host, self.port, self.region, self.clock = host, port, region, clock
        self.account_id = account_id
        self.principal = principal or f"arn:aws:sts::{account_id}:assumed-role/spotvisor-node/i-0123456789abcdef0"
        self.max_event_bytes = max_event_bytes
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._creds = {}
        self._groups = {}
        self._denied = set()
        self._faults = []
        self._fault_epoch = 0
        self._log = []
        self._hits = collections.Counter()
        self._seq = 0
        self._stopping = False
        self._listener = None
        self._thread = None
        for akid, v in (credentials or {}).items():
            if isinstance(v, (tuple, list)):
                self.add_credentials(akid, *v)
            else:
                self.add_credentials(akid, v)

    # ------------------------------------------------------------ lifecycle
    def start(self):
        with self._lock:
            self._stopping = False
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def version_string(self):
                return "Server"

            def do_POST(self):
                outer._handle(self)

            def do_GET(self):
                outer._handle(self)

        listener = _Listener((self.host, self.port), Handler)
        self.port = listener.server_address[1]
        thread = threading.Thread(target=listener.serve_forever, kwargs={"poll_interval": 0.05},
                                  name=f"fake-logs:{self.port}", daemon=True)
        thread.start()
        self._listener, self._thread = listener, thread
        return self

    def stop(self):
        with self._lock:
            self._stopping = True  # cuts delay faults short
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
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------ control
    def add_credentials(self, access_key_id, secret, session_token=None, expires_at=None):
        """A key pair the fake accepts. With session_token, requests must carry it in
        X-Amz-Security-Token; after expires_at (epoch s, the fake's clock) ExpiredTokenException."""
        with self._lock:
            self._creds[access_key_id] = (secret, session_token, expires_at)

    def remove_credentials(self, access_key_id):
        with self._lock:
            self._creds.pop(access_key_id, None)

    def create_group(self, name, retention_days=None):
        """Create a log group (no-op if it exists); retention_days makes older events expired."""
        with self._lock:
            g = self._groups.get(name)
            if g is None:
                self._groups[name] = _Group(name, self._now_ms(), retention_days)
            else:
                g.retention_days = retention_days
            self._changed.notify_all()

    def create_stream(self, group, stream):
        with self._lock:
            if group not in self._groups:
                self.create_group(group)
            g = self._groups[group]
            if stream not in g.streams:
                g.streams[stream] = _Stream(stream, self._now_ms())
            self._changed.notify_all()

    def groups(self):
        with self._lock:
            return sorted(self._groups)

    def streams(self, group):
        with self._lock:
            return sorted(self._groups[group].streams)

    def events(self, group, stream):
        """[{timestamp, message, ingestionTime}] in stored (arrival) order."""
        with self._lock:
            s = self._groups[group].streams[stream]
            return [{"timestamp": e[0], "message": e[2], "ingestionTime": e[3]} for e in s.events]

    def deny(self, operation):
        """Answer AccessDeniedException (as IAM words it) to every later call of operation."""
        with self._lock:
            self._denied.add(operation)

    def allow(self, operation):
        with self._lock:
            self._denied.discard(operation)

    def fault(self, kind, count=1, operation=None, seconds=None, message=None, status=None):
        """Inject a failure into the next `count` authenticated requests (count=None: until
        clear_faults()) of `operation` (None: any). kind:
          an error code: ThrottlingException (400 "Rate exceeded"), ServiceUnavailableException
            (500), InternalFailure (500), or any other code with status= (default 400);
            message= overrides the text; nothing is applied;
          "reset": read the request, then drop the connection with a RST, nothing applied;
          "lost_answer": apply the request, then close the connection without an answer;
          "delay": wait `seconds` (cut short by stop() or clear_faults()), then answer normally.
        Returns the active faults."""
        if kind not in FAULT_KINDS and not (status and re.fullmatch(r"[A-Za-z]+", kind)):
            raise ValueError(f"kind must be one of {', '.join(FAULT_KINDS)} (or a code with status=)")
        if kind == "delay" and (not isinstance(seconds, (int, float)) or seconds < 0):
            raise ValueError("delay needs seconds >= 0")
        if count is not None and (not isinstance(count, int) or count < 1):
            raise ValueError("count must be a positive int or None")
        if operation is not None and operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {', '.join(OPERATIONS)}")
        spec = {"kind": kind, "count": count, "operation": operation, "seconds": seconds,
                "message": message, "status": status}
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
            self._changed.notify_all()

    # ------------------------------------------------------------ observing
    def log(self):
        """Requests, oldest first: dicts with time, operation (None if X-Amz-Target was not a
        Logs_20140328 one), akid, request (the parsed JSON body, or None), status (None while in
        flight or when no answer was sent), error (code or None), outcome (None in flight,
        "answered", "reset", "lost_answer")."""
        with self._lock:
            return [dict(e) for e in self._log]

    def reset_log(self):
        with self._lock:
            self._log.clear()
            self._hits.clear()
            self._changed.notify_all()

    def hits(self, operation=None):
        """Finished requests (answered or closed) of operation (all if None) since reset_log()."""
        with self._lock:
            return sum(self._hits.values()) if operation is None else self._hits.get(operation, 0)

    def wait_for(self, what=None, count=1, timeout=5.0):
        """Block until hits(what) >= count (what: an operation name or None for any), or until
        what() is true if it is a callable (re-checked whenever the fake's state changes).
        Returns whether it happened within timeout seconds."""
        pred = what if callable(what) else (lambda: self.hits(what) >= count)
        with self._lock:
            return self._changed.wait_for(pred, timeout)

    # ------------------------------------------------------------ helpers
    def _now_ms(self):
        return int(self.clock() * 1000)

    def _group_arn(self, name):
        return f"arn:aws:logs:{self.region}:{self.account_id}:log-group:{name}"

    def _take_fault(self, op):
        with self._lock:
            for f in self._faults:
                if f["operation"] not in (None, op):
                    continue
                if f["count"] is not None:
                    f["count"] -= 1
                    if f["count"] == 0:
                        self._faults.remove(f)
                return dict(f)
        return None

    def _sleep(self, seconds):
        with self._lock:
            epoch = self._fault_epoch
            self._changed.wait_for(lambda: self._stopping or self._fault_epoch != epoch, seconds)

    def _finish(self, entry, **fields):
        with self._lock:
            entry.update(fields)
            if entry["operation"] is not None:
                self._hits[entry["operation"]] += 1
            else:
                self._hits[None] += 1
            self._changed.notify_all()

    # ------------------------------------------------------------ requests
    def _handle(self, h):
        rid = str(uuid.uuid4())
        target = h.headers.get("X-Amz-Target", "")
        op = target[len(TARGET_PREFIX):] if target.startswith(TARGET_PREFIX) else None
        entry = {"time": time.time(), "operation": op, "akid": None, "request": None, "status": None,
                 "error": None, "outcome": None}
        with self._lock:
            self._log.append(entry)
            if len(self._log) > LOG_LIMIT:
                del self._log[:len(self._log) - LOG_LIMIT]
            self._changed.notify_all()
        lost = False
        try:
            try:
                n = int(h.headers.get("Content-Length", ""))
            except ValueError:
                h.close_connection = True
                raise _Err("SerializationException", "A Content-Length header is required.")
            if n < 0 or n > 2 * MAX_BATCH_BYTES:
                h.close_connection = True
                raise _Err("SerializationException", "Request too large.")
            body = h.rfile.read(n) if n else b""
            path, _, query = h.path.partition("?")
            entry["akid"] = self._verify(h, path, query, body)
            if h.command != "POST" or path != "/" or op not in OPERATIONS:
                raise _Err("UnknownOperationException", "")
            ctype = h.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if ctype != CONTENT_TYPE:
                raise _Err("SerializationException", f"Content-Type must be {CONTENT_TYPE}, not {ctype!r}.")
            fault = self._take_fault(op)
            if fault is not None:
                kind = fault["kind"]
                if kind == "delay":
                    self._sleep(fault["seconds"])
                elif kind == "reset":
                    self._finish(entry, outcome="reset")
                    self._reset(h)
                    return
                elif kind == "lost_answer":
                    lost = True
                else:
                    status, msg = FAULT_ERRORS.get(kind, (fault["status"] or 400, ""))
                    raise _Err(kind, fault["message"] or msg, fault["status"] or status)
            try:
                params = json.loads(body.decode("utf-8")) if body else {}
            except (UnicodeDecodeError, ValueError):
                raise _Err("SerializationException", "Start of structure or map found where not expected.")
            if not isinstance(params, dict):
                raise _Err("SerializationException", "Start of structure or map found where not expected.")
            entry["request"] = params
            answer = getattr(self, "_op_" + op)(params)
            if lost:
                self._finish(entry, outcome="lost_answer")
                h.close_connection = True
                return
            status, payload, code = 200, answer, None
        except _Err as e:
            status, payload, code = e.status, {"__type": e.code, "message": e.message}, e.code
        data = json.dumps(payload, separators=(",", ":")).encode()
        h.send_response(status)
        h.send_header("x-amzn-RequestId", rid)
        h.send_header("Content-Type", CONTENT_TYPE)
        h.send_header("Content-Length", str(len(data)))
        if h.close_connection:
            h.send_header("Connection", "close")
        h.end_headers()
        self._finish(entry, status=status, error=code, outcome="answered")
        h.wfile.write(data)

    @staticmethod
    def _reset(h):
        h.close_connection = True
        try:
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        h.rfile.close()
        h.connection.close()

    def _verify(self, h, path, query, body):
        """SigV4 as the JSON services check it; returns the access key id."""
        auth = h.headers.get("Authorization", "")
        if not auth:
            raise _Err("MissingAuthenticationTokenException", "Request is missing Authentication Token")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            raise _Err("IncompleteSignatureException", "Unsupported authorization type")
        fields = {}
        for part in auth[len("AWS4-HMAC-SHA256 "):].split(","):
            k, _, v = part.strip().partition("=")
            fields[k] = v
        cred = fields.get("Credential", "").split("/")
        if len(cred) != 5 or cred[4] != "aws4_request" or "SignedHeaders" not in fields \
                or "Signature" not in fields:
            raise _Err("IncompleteSignatureException", "Authorization header requires 'Credential', "
                                                       "'Signature' and 'SignedHeaders' parameters.")
        akid, date, region, service = cred[0], cred[1], cred[2], cred[3]
        with self._lock:
            c = self._creds.get(akid)
        if c is None:
            raise _Err("UnrecognizedClientException", "The security token included in the request is invalid.")
        secret, token, expires_at = c
        if token is not None:
            if h.headers.get("X-Amz-Security-Token") != token:
                raise _Err("UnrecognizedClientException", "The security token included in the request is invalid.")
            if expires_at is not None and self.clock() >= expires_at:
                raise _Err("ExpiredTokenException", "The security token included in the request is expired")
        if service != "logs":
            raise _Err("InvalidSignatureException", "Credential should be scoped to correct service: 'logs'. ")
        if region != self.region:
            raise _Err("InvalidSignatureException", "Credential should be scoped to a valid region. ")
        amz_date = h.headers.get("X-Amz-Date", "")
        try:
            sent = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
        except ValueError:
            raise _Err("IncompleteSignatureException", "Authorization header requires existence of either a "
                                                       "'X-Amz-Date' or a 'Date' header.")
        if not amz_date.startswith(date):
            raise _Err("InvalidSignatureException", f"Date in Credential scope does not match YYYYMMDD from "
                                                    f"ISO-8601 version of date from HTTP: '{date}' != "
                                                    f"'{amz_date[:8]}', from '{amz_date}'.")
        now = self.clock()
        if sent < now - SKEW_S:
            raise _Err("InvalidSignatureException", f"Signature expired: {amz_date} is now earlier than "
                                                    f"{_amz(now - SKEW_S)} ({_amz(now)} - 15 min.)")
        if sent > now + SKEW_S:
            raise _Err("InvalidSignatureException", f"Signature not yet current: {amz_date} is still later than "
                                                    f"{_amz(now + SKEW_S)} ({_amz(now)} + 15 min.)")
        signed = fields["SignedHeaders"].split(";")
        if "host" not in signed:
            raise _Err("InvalidSignatureException", "'Host' or ':authority' must be a 'SignedHeader' in the "
                                                    "AWS Authorization.")
        canon_headers = ""
        for name in signed:
            values = h.headers.get_all(name) or []
            canon_headers += name + ":" + ",".join(" ".join(v.split()) for v in values) + "\n"
        try:
            canon_query = _canonical_query(_parse_query(query))
        except Exception:
            raise _Err("InvalidSignatureException", SIG_MISMATCH)
        # The payload hash is always the body's own: a declared x-amz-content-sha256 that differs
        # (or UNSIGNED-PAYLOAD) cannot make a signature match.
        payload = hashlib.sha256(body).hexdigest()
        creq = "\n".join([h.command, path, canon_query, canon_headers, ";".join(signed), payload])
        scope = f"{date}/{region}/logs/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
        want = hmac.new(_signing_key(secret, date, region, "logs"), to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want.encode(), fields["Signature"].encode("ascii", "replace")):
            raise _Err("InvalidSignatureException", SIG_MISMATCH)
        declared = h.headers.get("X-Amz-Content-Sha256")
        if declared is not None and declared != payload:
            raise _Err("InvalidSignatureException", SIG_MISMATCH)
        return akid

    # ------------------------------------------------------------ validation
    @staticmethod
    def _str(params, key, required=True, min_len=1, max_len=512, pattern=None):
        v = params.get(key)
        if v is None:
            if required:
                raise _bad(f"1 validation error detected: Value null at '{key}' failed to satisfy constraint: "
                           "Member must not be null")
            return None
        if not isinstance(v, str):
            raise _Err("SerializationException", f"Unexpected value type for {key}")
        if not (min_len <= len(v) <= max_len):
            raise _bad(f"1 validation error detected: Value '{v}' at '{key}' failed to satisfy constraint: "
                       f"Member must have length between {min_len} and {max_len}")
        if pattern is not None and not pattern.match(v):
            raise _bad(f"1 validation error detected: Value '{v}' at '{key}' failed to satisfy constraint: "
                       f"Member must satisfy regular expression pattern: {pattern.pattern[:-2]}")
        return v

    @staticmethod
    def _int(params, key, lo=None, hi=None):
        v = params.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Err("SerializationException", f"Unexpected value type for {key}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise _bad(f"1 validation error detected: Value '{v}' at '{key}' failed to satisfy constraint: "
                       f"Member must have value between {lo} and {hi}")
        return v

    def _group_param(self, params, required=True):
        """logGroupName, or logGroupIdentifier (a name or an ARN); not both."""
        name = self._str(params, "logGroupName", required=False, pattern=GROUP_NAME)
        ident = self._str(params, "logGroupIdentifier", required=False, max_len=2048)
        if name is not None and ident is not None:
            raise _bad("LogGroup name and LogGroup ARN are mutually exclusive parameters.")
        if ident is not None:
            m = re.fullmatch(r"arn:aws[a-z-]*:logs:([^:]*):([^:]*):log-group:([^:]+)(:\*)?", ident)
            if m:
                if m.group(1) != self.region or m.group(2) != self.account_id:
                    raise _Err("ResourceNotFoundException", "The specified log group does not exist.")
                name = m.group(3)
            else:
                name = ident
        if name is None and required:
            raise _bad("Either LogGroupName or LogGroupIdentifier must be specified.")
        return name

    def _check_denied(self, op, group=None, stream=None):
        if op not in self._denied:
            return
        if stream is not None:
            res = f"arn:aws:logs:{self.region}:{self.account_id}:log-group:{group}:log-stream:{stream}"
        else:
            res = f"arn:aws:logs:{self.region}:{self.account_id}:log-group:{group or ''}:log-stream:"
        raise _Err("AccessDeniedException", f"User: {self.principal} is not authorized to perform: logs:{op} on "
                                            f"resource: {res} because no identity-based policy allows the "
                                            f"logs:{op} action")

    def _group(self, name):
        g = self._groups.get(name)
        if g is None:
            raise _Err("ResourceNotFoundException", "The specified log group does not exist.")
        return g

    def _stream(self, group, stream):
        s = self._group(group).streams.get(stream)
        if s is None:
            raise _Err("ResourceNotFoundException", "The specified log stream does not exist.")
        return s

    @staticmethod
    def _page_token(params, n):
        tok = params.get("nextToken")
        if tok is None:
            return 0
        m = re.fullmatch(r"fake/(\d+)", tok) if isinstance(tok, str) else None
        if not m or int(m.group(1)) > n:
            raise _bad("The specified nextToken is invalid.")
        return int(m.group(1))

    # ------------------------------------------------------------ operations
    def _op_CreateLogGroup(self, params):
        name = self._str(params, "logGroupName", pattern=GROUP_NAME)
        self._str(params, "kmsKeyId", required=False, min_len=0, max_len=256)  # accepted, not used
        with self._lock:
            self._check_denied("CreateLogGroup", name)
            if name in self._groups:
                raise _Err("ResourceAlreadyExistsException", "The specified log group already exists")
            self._groups[name] = _Group(name, self._now_ms())
            self._changed.notify_all()
        return {}

    def _op_CreateLogStream(self, params):
        group = self._str(params, "logGroupName", pattern=GROUP_NAME)
        name = self._str(params, "logStreamName", pattern=re.compile(r"[^:*]*\Z"))
        with self._lock:
            self._check_denied("CreateLogStream", group, name)
            g = self._group(group)
            if name in g.streams:
                raise _Err("ResourceAlreadyExistsException", "The specified log stream already exists")
            g.streams[name] = _Stream(name, self._now_ms())
            self._changed.notify_all()
        return {}

    def _op_DescribeLogGroups(self, params):
        prefix = self._str(params, "logGroupNamePrefix", required=False, pattern=GROUP_NAME)
        pattern = self._str(params, "logGroupNamePattern", required=False, min_len=0)
        if prefix is not None and pattern is not None:
            raise _bad("LogGroup name prefix and LogGroup name pattern are mutually exclusive parameters.")
        limit = self._int(params, "limit", 1, 50) or 50
        with self._lock:
            self._check_denied("DescribeLogGroups")
            names = sorted(n for n in self._groups
                           if (prefix is None or n.startswith(prefix))
                           and (pattern is None or pattern.lower() in n.lower()))
            start = self._page_token(params, len(names))
            out = []
            for n in names[start:start + limit]:
                g = self._groups[n]
                d = {"logGroupName": n, "creationTime": g.created, "metricFilterCount": 0,
                     "arn": self._group_arn(n) + ":*", "storedBytes": 0, "logGroupClass": "STANDARD",
                     "logGroupArn": self._group_arn(n)}
                if g.retention_days is not None:
                    d["retentionInDays"] = g.retention_days
                out.append(d)
        res = {"logGroups": out}
        if start + limit < len(names):
            res["nextToken"] = f"fake/{start + limit}"
        return res

    def _op_DescribeLogStreams(self, params):
        group = self._group_param(params)
        prefix = self._str(params, "logStreamNamePrefix", required=False, pattern=re.compile(r"[^:*]*\Z"))
        order = params.get("orderBy", "LogStreamName")
        if order not in ("LogStreamName", "LastEventTime"):
            raise _bad(f"1 validation error detected: Value '{order}' at 'orderBy' failed to satisfy "
                       "constraint: Member must satisfy enum value set: [LogStreamName, LastEventTime]")
        if order == "LastEventTime" and prefix is not None:
            raise _bad("Cannot order by LastEventTime with a logStreamNamePrefix.")
        descending = bool(params.get("descending", False))
        limit = self._int(params, "limit", 1, 50) or 50
        with self._lock:
            self._check_denied("DescribeLogStreams", group)
            g = self._group(group)
            streams = [s for n, s in g.streams.items() if prefix is None or n.startswith(prefix)]
            if order == "LogStreamName":
                streams.sort(key=lambda s: s.name, reverse=descending)
            else:
                streams.sort(key=lambda s: (max((e[0] for e in s.events), default=-1), s.name),
                             reverse=descending)
            start = self._page_token(params, len(streams))
            out = []
            for s in streams[start:start + limit]:
                d = {"logStreamName": s.name, "creationTime": s.created,
                     "arn": f"{self._group_arn(group)}:log-stream:{s.name}", "storedBytes": 0}
                if s.events:
                    d["firstEventTimestamp"] = min(e[0] for e in s.events)
                    d["lastEventTimestamp"] = max(e[0] for e in s.events)
                    d["lastIngestionTime"] = s.last_ingestion
                    d["uploadSequenceToken"] = self._seq_token(s)
                out.append(d)
        res = {"logStreams": out}
        if start + limit < len(streams):
            res["nextToken"] = f"fake/{start + limit}"
        return res

    @staticmethod
    def _seq_token(s):
        return f"{49600000000000000000000000000000000000000000000000000000 + s.uploads:d}"

    def _op_PutLogEvents(self, params):
        group = self._str(params, "logGroupName", pattern=GROUP_NAME)
        stream = self._str(params, "logStreamName", pattern=re.compile(r"[^:*]*\Z"))
        self._str(params, "sequenceToken", required=False)  # accepted and ignored, as AWS does
        events = params.get("logEvents")
        if events is None:
            raise _bad("1 validation error detected: Value null at 'logEvents' failed to satisfy constraint: "
                       "Member must not be null")
        if not isinstance(events, list):
            raise _Err("SerializationException", "Unexpected value type for logEvents")
        if not (1 <= len(events) <= MAX_BATCH_EVENTS):
            raise _bad(f"1 validation error detected: Value '{len(events)}' at 'logEvents' failed to satisfy "
                       f"constraint: Member must have length between 1 and {MAX_BATCH_EVENTS}")
        batch = []
        total = 0
        for i, ev in enumerate(events):
            if not isinstance(ev, dict):
                raise _Err("SerializationException", "Unexpected value type in logEvents")
            ts, msg = ev.get("timestamp"), ev.get("message")
            if ts is None or msg is None:
                which = "timestamp" if ts is None else "message"
                raise _bad(f"1 validation error detected: Value null at 'logEvents.{i + 1}.member.{which}' "
                           "failed to satisfy constraint: Member must not be null")
            if isinstance(ts, bool) or not isinstance(ts, int) or not isinstance(msg, str):
                raise _Err("SerializationException", f"Unexpected value type in logEvents.{i + 1}")
            if ts < 0:
                raise _bad(f"1 validation error detected: Value '{ts}' at 'logEvents.{i + 1}.member.timestamp' "
                           "failed to satisfy constraint: Member must have value greater than or equal to 0")
            if msg == "":
                raise _bad(f"1 validation error detected: Value '' at 'logEvents.{i + 1}.member.message' "
                           "failed to satisfy constraint: Member must have length greater than or equal to 1")
            size = len(msg.encode("utf-8", "surrogatepass")) + EVENT_OVERHEAD
            if size > self.max_event_bytes:
                raise _bad(f"Log event too large: {size} bytes exceeds limit of {self.max_event_bytes}")
            total += size
            batch.append((ts, msg))
        if total > MAX_BATCH_BYTES:
            raise _bad(f"Upload too large: {total} bytes exceeds limit of {MAX_BATCH_BYTES}")
        for i in range(1, len(batch)):
            if batch[i][0] < batch[i - 1][0]:
                raise _bad("Log events in a single PutLogEvents request must be in chronological order.")
        if batch[-1][0] - batch[0][0] > DAY_MS:
            raise _bad("The batch of log events in a single PutLogEvents request cannot span more than 24 hours.")
        with self._lock:
            self._check_denied("PutLogEvents", group, stream)
            s = self._stream(group, stream)
            g = self._groups[group]
            now = self._now_ms()
            too_new = next((i for i, (ts, _) in enumerate(batch) if ts > now + MAX_FUTURE_MS), None)
            too_old = max((i for i, (ts, _) in enumerate(batch) if ts < now - MAX_AGE_MS), default=None)
            expired = None
            if g.retention_days is not None:
                expired = max((i for i, (ts, _) in enumerate(batch)
                               if ts < now - g.retention_days * DAY_MS), default=None)
            lo = max(x for x in (too_old, expired, -1) if x is not None) + 1
            hi = too_new if too_new is not None else len(batch)
            for ts, msg in batch[lo:hi]:
                self._seq += 1
                s.events.append((ts, self._seq, msg, now))
            if hi > lo:
                s.last_ingestion = now
            s.uploads += 1
            self._changed.notify_all()
            res = {"nextSequenceToken": self._seq_token(s)}
        info = {}
        if too_new is not None:
            info["tooNewLogEventStartIndex"] = too_new
        if too_old is not None:
            info["tooOldLogEventEndIndex"] = too_old
        if expired is not None:
            info["expiredLogEventEndIndex"] = expired
        if info:
            res["rejectedLogEventsInfo"] = info
        return res

    @staticmethod
    def _event_token(direction, key):
        return f"{direction}/{key[0]:020d}{key[1]:020d}/s"

    def _op_GetLogEvents(self, params):
        group = self._group_param(params)
        stream = self._str(params, "logStreamName", pattern=re.compile(r"[^:*]*\Z"))
        start_t = self._int(params, "startTime", 0)
        end_t = self._int(params, "endTime", 0)
        limit = self._int(params, "limit", 1, 10_000) or 10_000
        head = bool(params.get("startFromHead", False))
        tok = params.get("nextToken")
        cursor = None
        if tok is not None:
            m = re.fullmatch(r"([fb])/(\d{20})(\d{20})/s", tok) if isinstance(tok, str) else None
            if not m:
                raise _bad("The specified nextToken is invalid.")
            cursor = (m.group(1), (int(m.group(2)), int(m.group(3))))
        with self._lock:
            self._check_denied("GetLogEvents", group, stream)
            s = self._stream(group, stream)
            evs = [e for e in s.sorted_events()
                   if (start_t is None or e[0] >= start_t) and (end_t is None or e[0] < end_t)]
        if cursor is not None:
            forward = cursor[0] == "f"
            evs = [e for e in evs if ((e[0], e[1]) > cursor[1] if forward else (e[0], e[1]) < cursor[1])]
        else:
            forward = head
        # At most `limit` events and 1 MB, from the start (forward) or from the end (backward).
        page, size = [], 0
        for e in (evs if forward else reversed(evs)):
            size += len(e[2].encode("utf-8", "surrogatepass")) + EVENT_OVERHEAD
            if len(page) >= limit or (page and size > MAX_BATCH_BYTES):
                break
            page.append(e)
        if not forward:
            page.reverse()
        if page:
            first, last = (page[0][0], page[0][1]), (page[-1][0], page[-1][1])
            fwd, back = self._event_token("f", last), self._event_token("b", first)
        elif cursor is not None:  # the end: the same token again, as the service answers
            fwd, back = self._event_token("f", cursor[1]), self._event_token("b", cursor[1])
        else:
            fwd, back = self._event_token("f", (0, 0)), self._event_token("b", (0, 0))
        return {"events": [{"timestamp": e[0], "message": e[2], "ingestionTime": e[3]} for e in page],
                "nextForwardToken": fwd, "nextBackwardToken": back}

    @staticmethod
    def _matcher(pattern):
        if pattern is None or pattern.strip() == "":
            return lambda m: True
        p = pattern.strip()
        if p[0] in "{[" or "%" in p:
            raise _bad("fake_cloudwatch_logs: only plain-term filter patterns are implemented")
        terms = re.findall(r'([?-]?)(?:"((?:[^"\\]|\\.)*)"|(\S+))', p)
        need, anyof, exclude = [], [], []
        for sign, quoted, bare in terms:
            t = quoted.replace('\\"', '"') if quoted or not bare else bare
            {"": need, "?": anyof, "-": exclude}[sign].append(t)
        return lambda m: (all(t in m for t in need) and (not anyof or any(t in m for t in anyof))
                          and not any(t in m for t in exclude))

    def _op_FilterLogEvents(self, params):
        group = self._group_param(params)
        names = params.get("logStreamNames")
        prefix = self._str(params, "logStreamNamePrefix", required=False)
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise _Err("SerializationException", "Unexpected value type for logStreamNames")
            if not (1 <= len(names) <= 100):
                raise _bad("1 validation error detected: Value at 'logStreamNames' failed to satisfy constraint: "
                           "Member must have length between 1 and 100")
            if prefix is not None:
                raise _bad("logStreamNames and logStreamNamePrefix are mutually exclusive parameters.")
        start_t = self._int(params, "startTime", 0)
        end_t = self._int(params, "endTime", 0)
        limit = self._int(params, "limit", 1, 10_000) or 10_000
        match = self._matcher(self._str(params, "filterPattern", required=False, min_len=0, max_len=1024))
        with self._lock:
            self._check_denied("FilterLogEvents", group)
            g = self._group(group)
            hits = []
            for sname, s in g.streams.items():
                if names is not None and sname not in names:
                    continue
                if prefix is not None and not sname.startswith(prefix):
                    continue
                for e in s.events:
                    if (start_t is None or e[0] >= start_t) and (end_t is None or e[0] <= end_t) and match(e[2]):
                        hits.append((e[0], e[1], sname, e[2], e[3]))
        hits.sort()
        start = self._page_token(params, len(hits))
        page = hits[start:start + limit]
        res = {"events": [{"logStreamName": h[2], "timestamp": h[0], "message": h[3], "ingestionTime": h[4],
                           "eventId": f"{h[0]:020d}{h[1]:020d}"} for h in page],
               "searchedLogStreams": []}
        if start + limit < len(hits):
            res["nextToken"] = f"fake/{start + limit}"
        return res


# ---------------------------------------------------------------- CLI
def _write_atomic(path, text):
    import os
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _serve(args):
    sigs = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    creds = {}
    for spec in args.credentials or ["AKIDEXAMPLE:secret"]:
        parts = spec.split(":", 2)
        if len(parts) < 2 or not parts[0] or not parts[1]:
            print(f"fake-cloudwatch-logs: bad --credentials {spec!r} (want AKID:SECRET[:SESSION_TOKEN])",
                  file=sys.stderr)
            return 2
        creds[parts[0]] = (parts[1], parts[2] if len(parts) == 3 else None)
    try:
        srv = FakeCloudWatchLogsServer(args.host, args.port, region=args.region, credentials=creds)
        for g in args.group:
            srv.create_group(g)
        for spec in args.stream:
            g, sep, s = spec.partition(":")
            if not sep or not g or not s:
                print(f"fake-cloudwatch-logs: bad --stream {spec!r} (want GROUP:STREAM)", file=sys.stderr)
                return 2
            srv.create_stream(g, s)
        srv.start()
    except (OSError, ValueError) as e:
        print(f"fake-cloudwatch-logs: {e}", file=sys.stderr, flush=True)
        return 2
    if args.port_file:  # the file first: whoever sees the line finds the file too
        _write_atomic(args.port_file, f"{srv.port}\n")
    print(f"fake-cloudwatch-logs listening on {srv.endpoint}", flush=True)
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
    s.add_argument("--credentials", action="append", default=[],
                   help="AKID:SECRET[:SESSION_TOKEN] (repeatable; default AKIDEXAMPLE:secret)")
    s.add_argument("--group", action="append", default=[], help="a log group to create (repeatable)")
    s.add_argument("--stream", action="append", default=[], help="GROUP:STREAM to create (repeatable)")
    return _serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

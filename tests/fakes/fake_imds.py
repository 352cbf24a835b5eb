#!/usr/bin/env python3
"""Fake EC2 Instance Metadata Service (IMDSv2) for spotvisor tests.

Speaks the IMDS protocol over loopback, as strictly as AWS documents it,
plus a control API under /_fake/ on the same port for tests and demo
scripts (set a spot notice, inject faults, read the request log).

In-process:

    srv = FakeImdsServer(role="spotvisor-role").start()
    os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = srv.endpoint
    srv.set_instance_action("terminate")      # 2 minutes ahead
    srv.stop()

(botocore 1.29 joins that endpoint and "latest/..." with a "/"; aws-cli
2.9's bundled botocore does not and rejects an endpoint without a trailing
slash: give it `srv.endpoint + "/"`.)

As a process:

    fake_imds.py serve [--port 0] [--port-file F] [--tag K=V]... [--role NAME]
    fake_imds.py ctl --port PORT instance-action terminate

`serve` prints "fake-imds listening on HOST:PORT", writes the port file
atomically and runs until SIGTERM/SIGINT; SIGUSR1 posts a terminate notice
two minutes ahead, SIGUSR2 clears every fault (the only way to lift
`refuse` from outside, since the control API shares the port).

Standard library only; runs on Debian 12's python3 (3.11). README.md next
to this file has the same contract in more words.

What is implemented (sources: the EC2 User Guide pages "How Instance
Metadata Service Version 2 works", "Retrieve instance metadata", "Instance
metadata categories", "Spot Instance interruption notices", "View tags
using instance metadata"; and what botocore 1.29 / aws-cli 2.9 send):

- Tokens. `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
  = a decimal integer 1..21600 answers a fresh opaque token (56 characters
  of base64url) as text/plain, echoing the TTL in the same header. A
  missing or invalid TTL is 400; a PUT carrying `X-Forwarded-For` is 403
  (AWS: "PUT requests are rejected if they contain an X-Forwarded-For
  header"); a PUT to a version-specific token path (`/2021-03-23/api/token`,
  and here any path other than `/latest/api/token` that ends in `/api/token`
  or `/api/token/`) is 403, as AWS documents; any other method on the token
  path is 405.
- Every GET/HEAD (anything not under /_fake/) needs a valid, unexpired
  `X-aws-ec2-metadata-token`, else 401: the instance is "IMDSv2 required"
  (HttpTokens=required). With `allow_v1=True` ("optional") a request with
  no token header is served; a request that carries a token header is
  still checked (401 when it is wrong or expired), since AWS says the
  header is what makes a request IMDSv2. Answers to a token-carrying GET
  carry the token's remaining lifetime, rounded up to whole seconds, in
  `X-aws-ec2-metadata-token-ttl-seconds`.
- Token lifetimes follow the fake's clock: `clock()` (default time.time)
  plus whatever `advance()` added, so tests expire tokens without
  sleeping; `expire_tokens()` forgets every token at once. The same clock
  gives the default notice times and the credentials' timestamps.
- Paths under /latest/: `meta-data/` and its tree (below), `dynamic/`,
  `dynamic/instance-identity/document`, `user-data` (404 when none). `/`
  lists `latest` only and `/latest/` lists `dynamic`, `meta-data` and, when
  set, `user-data`. meta-data:
      ami-id, ami-launch-index, hostname, instance-action (always "none":
      the old bundling item, not the spot notice), instance-id,
      instance-life-cycle ("spot"), instance-type, local-hostname,
      local-ipv4, mac, reservation-id, security-groups,
      placement/{availability-zone, availability-zone-id, region},
      services/{domain, partition},
      events/maintenance/{scheduled, history} (JSON arrays, "[]" when none),
      events/recommendations/rebalance (only while set),
      spot/{instance-action, termination-time} (only while a notice is set),
      tags/instance/KEY (only while instance-metadata tags are enabled),
      iam/info and iam/security-credentials/ROLE (only with a role),
      autoscaling/target-lifecycle-state (only while set: the instance is
      in an Auto Scaling group; see set_target_lifecycle_state).
- Directory answers list the children, one per line, separated by "\n"
  with no newline after the last one (botocore reads the role name as the
  whole body of iam/security-credentials/, so a trailing newline would
  break it); sub-directories end in "/". Built-in names are sorted; tag
  keys keep the order they were set in (as in AWS's example). A directory
  is served with or without its trailing slash, and so is a leaf
  (botocore asks for `placement/availability-zone/`, with the slash).
  A directory that would be empty does not exist (spot/ before a notice,
  events/recommendations/ before a rebalance recommendation), except
  tags/instance/ with tags enabled and no tags: 200 with an empty body.
- spot/instance-action: `{"action": "terminate", "time": "2026-11-25T10:00:00Z"}`
  (json.dumps spacing, as in AWS's examples); the time defaults to the
  fake's now + 120 s. spot/termination-time (legacy) is the same time as
  bare text, present only while the action is "terminate" (AWS: present
  "only if the Spot Instance has been marked for termination").
  events/recommendations/rebalance: `{"noticeTime": "..."}` (default: now).
- autoscaling/target-lifecycle-state: the lifecycle state EC2 Auto Scaling
  is moving the instance to ("Retrieve the target lifecycle state through
  instance metadata", EC2 Auto Scaling User Guide), as bare text without a
  newline: InService, Terminated, Detached, Standby, Warmed:Hibernated,
  Warmed:Running, Warmed:Stopped or Warmed:Terminated, the steady states
  that page lists; anything else is refused by the setter. Not set (the
  default: an instance in no group) it is 404 and autoscaling/ is not
  listed. fake_autoscaling.FakeAutoScalingServer.link_imds() keeps it in
  step with a fake group (Terminated once a termination begins).
- iam/info and iam/security-credentials/ROLE, iam credentials and the
  identity document are rendered the way IMDS pretty-prints JSON
  (`{` newline, two-space indent, `"Key" : value`), fields in AWS's order.
  Credentials: Code "Success", LastUpdated, Type "AWS-HMAC", AccessKeyId,
  SecretAccessKey, Token, Expiration; times `YYYY-MM-DDTHH:MM:SSZ`.
- Content types: text/plain for every 200 (user-data included: AWS says
  "all instance metadata is returned as text/plain"); errors are text/html
  with an XHTML page ("<title>404 - Not Found</title>"; the text as
  third-party IMDS mocks reproduce it). `Server: EC2ws`. Keep-alive works;
  every error answer closes the connection (`Connection: close`, as on a
  real 404 captured with `curl -I`, which also had `Content-Length: 0`).
- Methods: GET and HEAD on metadata (HEAD: the GET's headers and no body;
  for errors `Content-Length: 0`, as in that capture); PUT elsewhere and
  any other method: 405.
- Faults (decided when a request has been read; never applied to
  /_fake/): refuse (listener closed, open connections dropped; clearing
  re-binds the same port), hang (read, never answered; held until the
  fault is cleared or the server stops, then closed without a response),
  reset (read, then RST), fail (answer a status to requests under a path
  prefix, `count` times or until cleared). hang and reset may be limited
  to a path prefix too.
- Malformed requests (bad request line, huge headers, bad Content-Length,
  bad chunking, a body over 64 KiB, bytes that are not text) get a 4xx
  with the connection closed, never a traceback or a stuck thread; a
  connection silent for 60 s (half a request, or an idle keep-alive) is
  closed.

Not implemented (404 like any unknown path, unless said otherwise):
- Version-specific trees (`/2021-03-23/meta-data/...`) and the version
  list at `/`; IPv6 endpoint specifics; the PUT hop limit (a loopback fake
  has no hops; `X-Forwarded-For` on the PUT is the one proxy check).
- `network/interfaces/macs/...`, `block-device-mapping/`, `public-keys/`,
  `public-ipv4`, `public-hostname`, `product-codes`, `kernel-id`,
  `ramdisk-id`, `ami-manifest-path`, `metrics/`,
  `identity-credentials/`, `elastic-*`, `dynamic/instance-identity/pkcs7`,
  `signature`, `rsa2048` and `dynamic/fws/`. The identity document is not
  signed.
- Throttling, the connection limit, "IMDS turned off" (403 for
  everything) and the separate IMDSv1 credentials AWS hands to token-less
  requests (here both kinds of request get the same keys). Credentials
  never rotate by themselves (a test calls set_role() again).
- Not verified against a real instance, chosen here: 405 (not 403/404) for
  PUT to other paths and other methods; 200 with an empty body for enabled
  tags with no tags; "[]" exactly for no maintenance events; the order of
  the listing; the 403 for a PUT to `/latest/api/token/` (trailing slash);
  the token format; text/plain for user-data (some say IMDS sends
  application/octet-stream); `Connection: close` on errors but keep-alive
  on 200s; the exact bytes of the error pages.
"""

import argparse
import base64
import datetime
import http
import http.server
import json
import math
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
import urllib.error
import urllib.parse
import urllib.request

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL = 21600
NOTICE_LEAD_SEC = 120
CREDENTIALS_LIFETIME_SEC = 6 * 3600
CONTROL = "/_fake/"
LOG_LIMIT = 100000          # newest entries kept; enough for any test
MAX_BODY = 64 * 1024        # IMDS requests have no body worth the name
IDLE_TIMEOUT_SEC = 60       # silent connections are closed after this
ACCOUNT_ID = "123456789012"
ACTIONS = ("terminate", "stop", "hibernate")
# The steady states autoscaling/target-lifecycle-state names (EC2 Auto
# Scaling User Guide, "Retrieve the target lifecycle state through instance
# metadata").
TARGET_LIFECYCLE_STATES = ("InService", "Terminated", "Detached", "Standby",
                           "Warmed:Hibernated", "Warmed:Running",
                           "Warmed:Stopped", "Warmed:Terminated")
OTHER_TOKEN_PATH = re.compile(r"^/.*/api/token/?$")
REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed",
           413: "Request Entity Too Large", 500: "Internal Server Error",
           502: "Bad Gateway", 503: "Service Unavailable"}


class FakeError(Exception):
    """A control-API error, carried to the HTTP client as (code, message)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def error_page(code):
    """The XHTML page IMDS answers errors with."""
    try:
        reason = REASONS.get(code) or http.HTTPStatus(code).phrase
    except ValueError:          # a status http.HTTPStatus does not know
        reason = "Error"
    title = f"{code} - {reason}"
    return ('<?xml version="1.0" encoding="iso-8859-1"?>\n'
            '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
            '\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
            '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" '
            'lang="en">\n'
            ' <head>\n'
            f'  <title>{title}</title>\n'
            ' </head>\n'
            ' <body>\n'
            f'  <h1>{title}</h1>\n'
            ' </body>\n'
            '</html>')


def iso_utc(ts):
    """Epoch seconds -> 2026-11-25T10:00:00Z (IMDS's format, no fraction)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(ts)))


def _as_time(value, default_ts):
    """A notice/expiry time given as None, datetime, epoch number or text.

    Text is used verbatim, so a test can serve a malformed time on purpose.
    """
    if value is None:
        return iso_utc(default_ts)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return iso_utc(value.timestamp())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return iso_utc(value)
    if isinstance(value, str):
        return value
    raise FakeError(400, f"a time must be a datetime, epoch seconds or text, "
                         f"not {type(value).__name__}")


def aws_json(value, indent=0):
    """JSON the way IMDS pretty-prints it: `{\\n  "Key" : value,\\n}`."""
    pad = "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{ }"
        items = [f'{pad}{json.dumps(k)} : {aws_json(v, indent + 1)}'
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        return "[ " + ", ".join(aws_json(v, indent) for v in value) + " ]"
    return json.dumps(value)


class _Conn:
    """One accepted connection, so refuse/stop can close it from outside."""

    __slots__ = ("sock", "killed")

    def __init__(self, sock):
        self.sock = sock
        self.killed = False


class _Listener(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True          # held (hang) requests must not block exit
    allow_reuse_address = True     # 'refuse' re-binds the same port
    request_queue_size = 128

    def __init__(self, address, fake):
        self.fake = fake
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self):
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can
        # stall in sandboxes; the name is never needed.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        # Connections the client drops, or the fake kills on purpose,
        # surface as OSErrors in handler threads: expected. Anything else
        # was already turned into a 500 by the handler.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class FakeImdsServer:
    """In-process fake IMDS. Thread-safe; every setter takes effect at once."""

    def __init__(self, host="127.0.0.1", port=0,
                 instance_id="i-0123456789abcdef0", region="us-east-1",
                 zone=None, local_ipv4="10.0.0.5",
                 instance_type="g4dn.xlarge", tags=None, tags_enabled=True,
                 user_data=None, role=None, allow_v1=False, clock=None,
                 ami_id="ami-0abcdef1234567890"):
        self.host = host
        self.port = port
        self.instance_id = instance_id
        self.region = region
        self.zone = zone or f"{region}a"
        self.local_ipv4 = local_ipv4
        self.instance_type = instance_type
        self.ami_id = ami_id
        self.allow_v1 = allow_v1
        self._clock = clock or time.time
        self._offset = 0.0
        # RLock: wait_for() predicates may call hits()/log() while the
        # condition holds the lock.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._started_at = self._now()
        self._tokens = {}             # token -> expiry (fake clock)
        self._tags = dict(tags or {})
        self._tags_enabled = bool(tags_enabled)
        self._user_data = self._user_data_bytes(user_data)
        self._action = None           # (action, time text)
        self._rebalance = None        # notice time text
        self._maintenance = []
        self._target_lifecycle_state = None   # None: in no Auto Scaling group
        self._role = None
        if role is not None:
            if isinstance(role, str):
                self.set_role(role)
            elif isinstance(role, dict):
                self.set_role(**role)
            else:
                raise TypeError("role must be a name or a dict of set_role "
                                "arguments")
        # faults
        self._refuse = False
        self._hang = None             # None or path prefix ("" = all)
        self._reset = None
        self._fails = []              # [{"path_prefix","status","count"}]
        self._fault_gen = 0
        self._fault_lock = threading.Lock()  # serialises listener changes
        self._log = []
        self._conns = set()
        self._stopping = False
        self._listener = None
        self._serve_thread = None

    # ------------------------------------------------------------ lifecycle
    def start(self):
        self._open_listener(self.port)
        return self

    def stop(self):
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        with self._fault_lock:
            self._close_listener()
        self._kill_conns(None)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def endpoint(self):
        """Base URL: the value for AWS_EC2_METADATA_SERVICE_ENDPOINT."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _open_listener(self, port):
        # Re-binding after 'refuse' can briefly collide with the old socket;
        # retry for a bounded time rather than fail at once.
        deadline = time.monotonic() + 2.0
        while True:
            try:
                listener = _Listener((self.host, port), self)
                break
            except OSError:
                if port == 0 or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self.port = listener.server_address[1]
        thread = threading.Thread(target=listener.serve_forever,
                                  kwargs={"poll_interval": 0.05},
                                  name=f"fake-imds:{self.port}", daemon=True)
        thread.start()
        self._listener, self._serve_thread = listener, thread

    def _close_listener(self):
        listener, thread = self._listener, self._serve_thread
        self._listener = self._serve_thread = None
        if listener is None:
            return
        listener.shutdown()
        listener.server_close()   # queued, unaccepted connections get RST
        thread.join()

    def _register_conn(self, sock):
        conn = _Conn(sock)
        with self._lock:
            # A connection accepted just before 'refuse' closed the
            # listener must not be served.
            if self._stopping or self._refuse:
                conn.killed = True
            self._conns.add(conn)
        return conn

    def _unregister_conn(self, conn):
        with self._lock:
            self._conns.discard(conn)

    def _kill_conns(self, exclude_sock):
        with self._lock:
            victims = [c for c in self._conns if c.sock is not exclude_sock]
            for c in victims:
                c.killed = True
            self._changed.notify_all()
        for c in victims:
            # Unblocks handler threads sitting in recv() on idle keep-alive
            # connections; held ones wake via 'killed' + notify above.
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ------------------------------------------------------------ clock
    def _now(self):
        return self._clock() + self._offset

    def now(self):
        """The fake's current time (epoch seconds)."""
        with self._lock:
            return self._now()

    def advance(self, seconds):
        """Move the fake's clock forward: tokens expire, notices age."""
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise FakeError(400, "seconds must be a number >= 0")
        with self._lock:
            self._offset += seconds
            self._changed.notify_all()

    def expire_tokens(self):
        """Make every token issued so far invalid (401 from now on)."""
        with self._lock:
            self._tokens.clear()
            self._changed.notify_all()

    def live_tokens(self):
        """How many issued tokens are still valid."""
        with self._lock:
            now = self._now()
            return sum(1 for exp in self._tokens.values() if exp > now)

    def _issue_token(self, ttl):
        token = base64.urlsafe_b64encode(secrets.token_bytes(42)).decode()
        with self._lock:
            now = self._now()
            for t in [t for t, exp in self._tokens.items() if exp <= now]:
                del self._tokens[t]
            self._tokens[token] = now + ttl
            self._changed.notify_all()
        return token

    def _token_remaining(self, token):
        """Seconds left for TOKEN, or None if unknown/expired."""
        with self._lock:
            exp = self._tokens.get(token)
            if exp is None:
                return None
            left = exp - self._now()
            return left if left > 0 else None

    # ------------------------------------------------------------ state
    def set_instance_action(self, action="terminate", time=None):
        """Post a spot interruption notice; action None clears it.

        time: datetime, epoch seconds, text (served verbatim) or None for
        the fake's now + 120 s.
        """
        with self._lock:
            if action is None:
                self._action = None
            else:
                if action not in ACTIONS:
                    raise FakeError(400, f"action must be one of "
                                         f"{', '.join(ACTIONS)} or None")
                self._action = (action, _as_time(
                    time, self._now() + NOTICE_LEAD_SEC))
            self._changed.notify_all()

    def clear_instance_action(self):
        self.set_instance_action(None)

    def set_rebalance(self, notice_time=None):
        """Post a rebalance recommendation (default time: now)."""
        with self._lock:
            self._rebalance = _as_time(notice_time, self._now())
            self._changed.notify_all()

    def clear_rebalance(self):
        with self._lock:
            self._rebalance = None
            self._changed.notify_all()

    def set_target_lifecycle_state(self, state):
        """autoscaling/target-lifecycle-state: one of
        TARGET_LIFECYCLE_STATES, or None (the instance is in no Auto Scaling
        group: the item and autoscaling/ are 404)."""
        if state is not None and state not in TARGET_LIFECYCLE_STATES:
            raise FakeError(400, f"target lifecycle state must be one of "
                                 f"{', '.join(TARGET_LIFECYCLE_STATES)} or "
                                 f"None, not {state!r}")
        with self._lock:
            self._target_lifecycle_state = state
            self._changed.notify_all()

    def set_maintenance(self, events):
        """events/maintenance/scheduled: a list of event dicts ([] = none)."""
        if not isinstance(events, list):
            raise FakeError(400, "events must be a list")
        with self._lock:
            self._maintenance = [dict(e) for e in events]
            self._changed.notify_all()

    def set_tags(self, tags):
        """Replace the instance tags (keys keep this order in listings)."""
        if not isinstance(tags, dict) or not all(
                isinstance(k, str) and isinstance(v, str)
                for k, v in tags.items()):
            raise FakeError(400, "tags must map strings to strings")
        with self._lock:
            self._tags = dict(tags)
            self._changed.notify_all()

    def set_tags_enabled(self, enabled):
        """Instance-metadata tags on or off (off: tags/ is 404)."""
        with self._lock:
            self._tags_enabled = bool(enabled)
            self._changed.notify_all()

    @staticmethod
    def _user_data_bytes(data):
        if data is None or isinstance(data, bytes):
            return data
        if isinstance(data, str):
            return data.encode()
        raise FakeError(400, "user data must be bytes, text or None")

    def set_user_data(self, data):
        """User data as bytes or text; None = no user data (404)."""
        data = self._user_data_bytes(data)
        with self._lock:
            self._user_data = data
            self._changed.notify_all()

    def set_role(self, name, access_key_id=None, secret=None, token=None,
                 expiration=None):
        """Attach an instance profile role (None detaches).

        Defaults: made-up keys, expiration = the fake's now + 6 h (the
        lifetime IMDS role credentials have); expiration may be a
        datetime, epoch seconds or text (verbatim).
        """
        with self._lock:
            if name is None:
                self._role = None
                self._changed.notify_all()
                return
            if not isinstance(name, str) or not name or "/" in name:
                raise FakeError(400, "role name must be a non-empty string "
                                     "without '/'")
            now = self._now()
            self._role = {
                "name": name,
                "LastUpdated": iso_utc(now),
                "AccessKeyId": access_key_id or "ASIAFAKEIMDSEXAMPLE1",
                "SecretAccessKey": secret or
                "fakeImdsSecretKey/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "Token": token or "FakeImdsSessionToken//////////wEaCXVz",
                "Expiration": _as_time(expiration,
                                       now + CREDENTIALS_LIFETIME_SEC),
            }
            self._changed.notify_all()

    def state(self):
        """What the fake serves now (for tests and `ctl state`)."""
        with self._lock:
            return {
                "now": iso_utc(self._now()),
                "instance_action": (None if self._action is None else
                                    {"action": self._action[0],
                                     "time": self._action[1]}),
                "rebalance": self._rebalance,
                "maintenance": list(self._maintenance),
                "target_lifecycle_state": self._target_lifecycle_state,
                "tags": dict(self._tags),
                "tags_enabled": self._tags_enabled,
                "user_data": (None if self._user_data is None else
                              self._user_data.decode("utf-8", "replace")),
                "role": None if self._role is None else dict(self._role),
                "allow_v1": self.allow_v1,
                "live_tokens": sum(1 for e in self._tokens.values()
                                   if e > self._now()),
                "faults": self._faults_locked(),
            }

    def _tree_locked(self):
        """The whole served tree: dict = directory, str/bytes = leaf."""
        zone, region = self.zone, self.region
        host = "ip-" + self.local_ipv4.replace(".", "-")
        host += (".ec2.internal" if region == "us-east-1"
                 else f".{region}.compute.internal")
        md = {
            "ami-id": self.ami_id,
            "ami-launch-index": "0",
            "events": {"maintenance": {
                "history": "[]",
                "scheduled": aws_json(self._maintenance),
            }},
            "hostname": host,
            "instance-action": "none",
            "instance-id": self.instance_id,
            "instance-life-cycle": "spot",
            "instance-type": self.instance_type,
            "local-hostname": host,
            "local-ipv4": self.local_ipv4,
            "mac": "0e:49:61:0f:c3:11",
            "placement": {
                "availability-zone": zone,
                "availability-zone-id": "use1-az4" if zone == "us-east-1a"
                else f"{region[:2]}{region.split('-')[-1]}-az1",
                "region": region,
            },
            "reservation-id": "r-0123456789abcdef0",
            "security-groups": "default",
            "services": {"domain": "amazonaws.com", "partition": "aws"},
        }
        if self._rebalance is not None:
            md["events"]["recommendations"] = {
                "rebalance": json.dumps({"noticeTime": self._rebalance})}
        if self._action is not None:
            action, when = self._action
            md["spot"] = {"instance-action": json.dumps(
                {"action": action, "time": when})}
            if action == "terminate":
                md["spot"]["termination-time"] = when
        if self._tags_enabled:
            md["tags"] = {"instance": dict(self._tags)}
        if self._target_lifecycle_state is not None:
            md["autoscaling"] = {
                "target-lifecycle-state": self._target_lifecycle_state}
        if self._role is not None:
            r = self._role
            md["iam"] = {
                "info": aws_json({
                    "Code": "Success",
                    "LastUpdated": r["LastUpdated"],
                    "InstanceProfileArn": f"arn:aws:iam::{ACCOUNT_ID}:"
                                          f"instance-profile/{r['name']}",
                    "InstanceProfileId": "AIPAFAKEIMDSPROFILE01",
                }),
                "security-credentials": {r["name"]: aws_json({
                    "Code": "Success",
                    "LastUpdated": r["LastUpdated"],
                    "Type": "AWS-HMAC",
                    "AccessKeyId": r["AccessKeyId"],
                    "SecretAccessKey": r["SecretAccessKey"],
                    "Token": r["Token"],
                    "Expiration": r["Expiration"],
                })},
            }
        document = aws_json({
            "accountId": ACCOUNT_ID,
            "architecture": "x86_64",
            "availabilityZone": zone,
            "billingProducts": None,
            "devpayProductCodes": None,
            "marketplaceProductCodes": None,
            "imageId": self.ami_id,
            "instanceId": self.instance_id,
            "instanceType": self.instance_type,
            "kernelId": None,
            "pendingTime": iso_utc(self._started_at),
            "privateIp": self.local_ipv4,
            "ramdiskId": None,
            "region": region,
            "version": "2017-09-30",
        })
        latest = {"dynamic": {"instance-identity": {"document": document}},
                  "meta-data": md}
        if self._user_data is not None:
            latest["user-data"] = self._user_data
        return {"latest": latest}

    def _lookup(self, path):
        """(status, body) a GET of PATH gets now (token already checked)."""
        parts = [p for p in path.split("/") if p]
        with self._lock:
            node = self._tree_locked()
        for p in parts:
            if not isinstance(node, dict) or p not in node:
                return 404, None
            node = node[p]
        if isinstance(node, dict):
            ordered = node if parts[-2:] == ["tags", "instance"] \
                else dict(sorted(node.items()))
            body = "\n".join(n + ("/" if isinstance(v, dict) else "")
                             for n, v in ordered.items())
            return 200, body.encode()
        return 200, node if isinstance(node, bytes) else node.encode()

    # ------------------------------------------------------------ faults
    def refuse(self, on=True):
        """Close the listener (ECONNREFUSED) and drop open connections.

        The control API shares the port: clear with refuse(False), or
        SIGUSR2 to a `serve` process.
        """
        self._set_fault(refuse=bool(on))

    def hang(self, on=True, path_prefix=None):
        """Read requests (under path_prefix, default all), never answer."""
        self._set_fault(hang=(path_prefix or "") if on else None)

    def reset(self, on=True, path_prefix=None):
        """Read requests (under path_prefix, default all), then RST."""
        self._set_fault(reset=(path_prefix or "") if on else None)

    def fail(self, path_prefix="/", status=500, count=1):
        """Answer STATUS to the next COUNT requests under PATH_PREFIX
        (count None: until clear_faults). path_prefix None clears fails."""
        if path_prefix is None:
            self._set_fault(fails=[])
            return
        if not isinstance(status, int) or not 100 <= status <= 599:
            raise FakeError(400, "status must be an HTTP status code")
        if count is not None and (not isinstance(count, int) or count < 1):
            raise FakeError(400, "count must be a positive integer or None")
        with self._lock:
            fails = self._fails + [{"path_prefix": path_prefix,
                                    "status": status, "count": count}]
        self._set_fault(fails=fails)

    def clear_faults(self):
        self._set_fault(refuse=False, hang=None, reset=None, fails=[])

    def faults(self):
        with self._lock:
            return self._faults_locked()

    def _faults_locked(self):
        return {"refuse": self._refuse, "hang": self._hang,
                "reset": self._reset,
                "fails": [dict(f) for f in self._fails]}

    def _set_fault(self, _exclude=None, **change):
        with self._fault_lock:
            with self._lock:
                was_refusing = self._refuse
                if "refuse" in change:
                    self._refuse = change["refuse"]
                if "hang" in change:
                    self._hang = change["hang"]
                if "reset" in change:
                    self._reset = change["reset"]
                if "fails" in change:
                    self._fails = change["fails"]
                self._fault_gen += 1
                self._changed.notify_all()
                refusing = self._refuse
            if refusing and not was_refusing:
                self._close_listener()
                self._kill_conns(_exclude)
            elif was_refusing and not refusing:
                self._open_listener(self.port)

    # ------------------------------------------------------------ observing
    def log(self, detail=False):
        """Requests seen, oldest first: (method, path, status, had_token).

        status is None for requests that got no answer (hang, reset,
        refuse). detail=True gives dicts with the headers, the client's
        (address, port), the time and, for those, "outcome".
        """
        with self._lock:
            if detail:
                return [dict(e, headers=dict(e["headers"])) for e in self._log]
            return [(e["method"], e["path"], e["status"], e["had_token"])
                    for e in self._log]

    def reset_log(self):
        with self._lock:
            self._log.clear()
            self._changed.notify_all()

    def hits(self, path_prefix=None):
        """Requests whose path starts with PATH_PREFIX (all if None)."""
        with self._lock:
            return sum(1 for e in self._log
                       if path_prefix is None
                       or e["path"].startswith(path_prefix))

    def hung(self):
        """Requests held by the hang fault right now."""
        with self._lock:
            return sum(1 for e in self._log if e.get("outcome") == "held")

    def wait_for(self, pred, timeout=5.0):
        """Block until pred() is true (re-checked on every request, state
        change and fault change); returns its last value's truth."""
        with self._changed:
            return bool(self._changed.wait_for(pred, timeout))

    # ------------------------------------------------------------ requests
    def _arrive(self, method, path, headers, conn, client=None):
        """Log a request and decide its fault, atomically.

        Returns (entry, action): action None (serve), "killed", "reset",
        "hang" or ("fail", status).
        """
        with self._lock:
            entry = {"method": method, "path": path,
                     "had_token": any(k.lower() == TOKEN_HEADER.lower()
                                      for k in headers),
                     "headers": headers, "client": client,
                     "time": time.time(), "status": None}
            self._log.append(entry)
            if len(self._log) > LOG_LIMIT:
                del self._log[:len(self._log) - LOG_LIMIT]
            self._changed.notify_all()
            if conn.killed or self._stopping or self._refuse:
                entry["outcome"] = "dropped"
                return entry, "killed"
            if self._hang is not None and path.startswith(self._hang):
                entry["outcome"] = "held"
                return entry, "hang"
            if self._reset is not None and path.startswith(self._reset):
                entry["outcome"] = "reset"
                return entry, "reset"
            for f in self._fails:
                if path.startswith(f["path_prefix"]):
                    if f["count"] is not None:
                        f["count"] -= 1
                        if f["count"] == 0:
                            self._fails.remove(f)
                    return entry, ("fail", f["status"])
            return entry, None

    def _hold(self, entry, conn):
        """Park a request under 'hang' until the fault changes or stop."""
        with self._lock:
            gen = self._fault_gen
            try:
                while (self._fault_gen == gen and not self._stopping
                       and not conn.killed):
                    self._changed.wait()
            finally:
                entry["outcome"] = "hang"
                self._changed.notify_all()

    def _set_status(self, entry, status):
        with self._lock:
            entry["status"] = status
            self._changed.notify_all()


class _BadRequest(Exception):
    pass


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "EC2ws"
    # http.server answers a one-word request line as HTTP/0.9 (a bare body,
    # no status line); IMDS speaks HTTP/1.x only.
    default_request_version = "HTTP/1.0"
    # A client that sends half a request and goes quiet (or idles on a
    # keep-alive connection) is dropped after this long, so no thread waits
    # forever on the network. Requests held by 'hang' wait on a condition,
    # not on the socket, and are not affected.
    timeout = IDLE_TIMEOUT_SEC

    def version_string(self):
        return self.server_version

    def log_message(self, fmt, *args):
        pass  # the fake keeps its own structured log

    def setup(self):
        super().setup()
        # Headers and body go out as separate writes: without TCP_NODELAY,
        # Nagle + delayed ACK stall each keep-alive answer by ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.fake = self.server.fake
        self.conn = self.fake._register_conn(self.connection)

    def handle(self):
        if not self.conn.killed:
            super().handle()

    def finish(self):
        try:
            super().finish()
        finally:
            self.fake._unregister_conn(self.conn)

    def __getattr__(self, name):
        # Every method token reaches _dispatch (IMDS answers 405 for the
        # ones it does not serve), instead of http.server's 501.
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    # ------------------------------------------------------------ plumbing
    def _read_body(self):
        """Read (and bound) the request body so the connection stays sane."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            total, chunks = 0, []
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise _BadRequest("bad chunk size") from None
                if size < 0:
                    raise _BadRequest("bad chunk size")
                total += size
                if total > MAX_BODY:
                    raise _BadRequest("body too large")
                if size == 0:
                    for _ in range(100):
                        if self.rfile.readline(1024) in (b"\r\n", b"\n", b""):
                            return b"".join(chunks)
                    raise _BadRequest("too many trailers")
                data = self.rfile.read(size)
                if len(data) != size:
                    raise _BadRequest("truncated chunk")
                chunks.append(data)
                if self.rfile.readline(1024) not in (b"\r\n", b"\n"):
                    raise _BadRequest("bad chunk end")
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return b""
        if len(set(v.strip() for v in values)) != 1 or \
                not values[0].strip().isdigit():
            raise _BadRequest("bad Content-Length")
        length = int(values[0])
        if length > MAX_BODY:
            raise _BadRequest("body too large")
        data = self.rfile.read(length) if length else b""
        if len(data) != length:
            raise _BadRequest("truncated body")
        return data

    def _reply(self, code, body=None, ctype="text/plain", headers=(),
               entry=None, close=None):
        if body is None:
            body = error_page(code) if code >= 400 else b""
            if code >= 400:
                ctype = "text/html"
                if self.command == "HEAD":
                    body = b""
        if isinstance(body, str):
            body = body.encode()
        if close is None:
            close = code >= 400
        if entry is not None:
            # Recorded before the bytes leave, so a client that reads the
            # log right after its answer always sees the status.
            self.fake._set_status(entry, code)
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reset_conn(self):
        """Abort with RST (SO_LINGER 0)."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                   struct.pack("ii", 1, 0))
        self.rfile.close()       # makefile() holds a ref that defers close
        self.connection.close()

    def _dispatch(self):
        try:
            try:
                body = self._read_body()
            except _BadRequest:
                self._reply(400)
                return
            path = self.path
            if path.startswith(("http://", "https://")):   # absolute form
                path = urllib.parse.urlsplit(path).path or "/"
            path = path.split("?", 1)[0].split("#", 1)[0]
            if path.startswith(CONTROL):
                self._control(path, body)
            else:
                self._imds(path)
        except OSError:
            raise
        except Exception as e:  # a bug in the fake: say so in one line
            print(f"fake-imds: internal error on {self.command} "
                  f"{self.path!r}: {e!r}", file=sys.stderr, flush=True)
            self.close_connection = True
            try:
                self._reply(500)
            except Exception:
                pass

    # ------------------------------------------------------------ IMDS
    def _imds(self, raw_path):
        fake = self.fake
        try:
            path = urllib.parse.unquote(raw_path, errors="strict")
        except UnicodeDecodeError:
            path = raw_path
        headers = {k: v for k, v in self.headers.items()}
        entry, action = fake._arrive(self.command, path, headers, self.conn,
                                     tuple(self.client_address[:2]))
        if action == "killed":
            self.close_connection = True
            return
        if action == "reset":
            self._reset_conn()
            return
        if action == "hang":
            fake._hold(entry, self.conn)
            self.close_connection = True
            return
        if action is not None:
            self._reply(action[1], entry=entry)
            return

        if self.command == "PUT":
            if path == TOKEN_PATH:
                self._put_token(entry)
            elif OTHER_TOKEN_PATH.match(path):
                self._reply(403, entry=entry)
            else:
                self._reply(405, headers=[("Allow", "GET, HEAD")],
                            entry=entry)
            return
        if path == TOKEN_PATH:
            self._reply(405, headers=[("Allow", "PUT")], entry=entry)
            return
        if self.command not in ("GET", "HEAD"):
            self._reply(405, headers=[("Allow", "GET, HEAD")], entry=entry)
            return

        extra = []
        token = self.headers.get(TOKEN_HEADER)
        if token is not None:
            left = fake._token_remaining(token.strip())
            if left is None:
                self._reply(401, entry=entry)
                return
            extra.append((TTL_HEADER, str(math.ceil(left))))
        elif not fake.allow_v1:
            self._reply(401, entry=entry)
            return

        if path == "/":
            status, body = 200, b"latest"
        elif path.strip("/") == "latest":
            # The real server lists these without trailing slashes.
            status, body = fake._lookup(path)
            body = body.replace(b"/", b"")
        else:
            status, body = fake._lookup(path)
        if status != 200:
            self._reply(status, headers=extra, entry=entry)
            return
        self._reply(200, body, headers=extra, entry=entry)

    def _put_token(self, entry):
        if "X-Forwarded-For" in self.headers:
            self._reply(403, entry=entry)
            return
        values = self.headers.get_all(TTL_HEADER) or []
        ttl = values[0].strip() if len(values) == 1 else ""
        if not (ttl.isascii() and ttl.isdigit()
                and 1 <= int(ttl) <= MAX_TTL):
            self._reply(400, entry=entry)
            return
        ttl = int(ttl)
        token = self.fake._issue_token(ttl)
        self._reply(200, token, headers=[(TTL_HEADER, str(ttl))],
                    entry=entry)

    # ------------------------------------------------------------ control
    def _control(self, path, body):
        name = path[len(CONTROL):].strip("/")
        query = dict(urllib.parse.parse_qsl(
            urllib.parse.urlsplit(self.path).query))
        try:
            data = json.loads(body) if body.strip() else {}
            if not isinstance(data, dict):
                raise FakeError(400, "the body must be a JSON object")
            status, result = _control_call(self.fake, self.command, name,
                                           query, data, self.connection)
        except FakeError as e:
            status, result = e.code, {"error": e.message}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            status, result = 400, {"error": f"bad request: {e!r}"}
        # Control connections close after each answer: a refuse fault may
        # have just taken the listener away.
        self._reply(status, json.dumps(result), "application/json",
                    close=True)


def _control_call(fake, method, name, query, data, exclude_sock):
    """One control-API call -> (status, result dict)."""
    def arg(key, default=None):
        return data.get(key, default)

    ok = {"ok": True}
    if method == "POST" and name == "instance-action":
        fake.set_instance_action(arg("action"), arg("time"))
        return 200, fake.state()["instance_action"] or {"action": None}
    if method == "POST" and name == "rebalance":
        if arg("clear"):
            fake.clear_rebalance()
        else:
            fake.set_rebalance(arg("notice_time"))
        return 200, {"rebalance": fake.state()["rebalance"]}
    if method == "POST" and name == "target-lifecycle-state":
        fake.set_target_lifecycle_state(arg("state"))
        return 200, {"target_lifecycle_state":
                     fake.state()["target_lifecycle_state"]}
    if method == "POST" and name == "maintenance":
        fake.set_maintenance(arg("events", []))
        return 200, ok
    if method == "POST" and name == "tags":
        fake.set_tags(arg("tags", {}))
        return 200, ok
    if method == "POST" and name == "tags-enabled":
        fake.set_tags_enabled(arg("enabled", True))
        return 200, ok
    if method == "POST" and name == "user-data":
        fake.set_user_data(arg("user_data"))
        return 200, ok
    if method == "POST" and name == "role":
        fake.set_role(arg("name"), arg("access_key_id"), arg("secret"),
                      arg("token"), arg("expiration"))
        return 200, ok
    if method == "POST" and name == "advance":
        fake.advance(arg("seconds", 0))
        return 200, {"now": iso_utc(fake.now())}
    if method == "POST" and name == "expire-tokens":
        fake.expire_tokens()
        return 200, ok
    if method == "POST" and name == "fault":
        mode = arg("mode", "none")
        on = bool(arg("on", True))
        if mode == "none":
            fake.clear_faults()
        elif mode == "refuse":
            fake._set_fault(_exclude=exclude_sock, refuse=on)
        elif mode == "hang":
            fake.hang(on, arg("path_prefix"))
        elif mode == "reset":
            fake.reset(on, arg("path_prefix"))
        elif mode == "fail":
            fake.fail(arg("path_prefix", "/"), arg("status", 500),
                      arg("count", 1))
        else:
            raise FakeError(400, "mode must be none, refuse, hang, reset "
                                 "or fail")
        return 200, fake.faults()
    if method == "GET" and name == "fault":
        return 200, fake.faults()
    if method == "GET" and name == "state":
        return 200, fake.state()
    if method == "GET" and name == "log":
        return 200, {"log": [list(e) for e in fake.log()]}
    if method == "POST" and name == "reset-log":
        fake.reset_log()
        return 200, ok
    if method == "GET" and name == "hits":
        return 200, {"count": fake.hits(query.get("prefix"))}
    if method == "GET" and name == "wait":
        prefix = query.get("prefix")
        count = int(query.get("count", "1"))
        timeout = float(query.get("timeout", "5"))
        if not 0 <= timeout <= 600:
            raise FakeError(400, "timeout must be 0..600")
        reached = fake.wait_for(lambda: fake.hits(prefix) >= count, timeout)
        return (200 if reached else 408), {"ok": reached,
                                           "count": fake.hits(prefix)}
    raise FakeError(404, f"no control operation {method} /_fake/{name}")


# ---------------------------------------------------------------- script
def _kv(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _role(text):
    parts = text.split(":", 3)
    if not parts[0]:
        raise argparse.ArgumentTypeError("expected NAME[:AKID:SECRET:TOKEN]")
    if len(parts) not in (1, 4):
        raise argparse.ArgumentTypeError("expected NAME or "
                                         "NAME:AKID:SECRET:TOKEN")
    keys = ("name", "access_key_id", "secret", "token")
    return dict(zip(keys, parts))


def _write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _serve(args):
    # Block the signals in every thread (threads inherit the mask) and take
    # them synchronously with sigwait: no handler races the server threads.
    sigs = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    user_data = None
    if args.user_data_file:
        with open(args.user_data_file, "rb") as f:
            user_data = f.read()
    srv = FakeImdsServer(host=args.host, port=args.port,
                         instance_id=args.instance_id, region=args.region,
                         zone=args.zone, local_ipv4=args.local_ipv4,
                         instance_type=args.instance_type,
                         tags=dict(args.tag),
                         tags_enabled=not args.tags_disabled,
                         user_data=user_data, role=args.role,
                         allow_v1=args.allow_v1)
    if args.instance_action:
        srv.set_instance_action(args.instance_action)
    if args.target_lifecycle_state:
        srv.set_target_lifecycle_state(args.target_lifecycle_state)
    srv.start()
    print(f"fake-imds listening on {args.host}:{srv.port}", flush=True)
    if args.port_file:
        _write_atomic(args.port_file, f"{srv.port}\n")
    while True:
        sig = signal.sigwait(sigs)
        if sig == signal.SIGUSR1:
            # For scripts and the boot test: a terminate notice 2 min ahead.
            srv.set_instance_action("terminate")
            continue
        if sig == signal.SIGUSR2:
            # The one way to lift 'refuse' from outside: the control API
            # shares the refused port.
            srv.clear_faults()
            continue
        break
    srv.stop()
    return 0


def _ctl(args):
    op, rest = args.op, args.args
    method, payload, query = "POST", {}, {}

    def need(lo, hi, usage):
        if not lo <= len(rest) <= hi:
            raise SystemExit(f"usage: ctl {op} {usage}")

    if op == "instance-action":
        need(1, 2, "terminate|stop|hibernate|none [TIME]")
        payload = {"action": None if rest[0] == "none" else rest[0],
                   "time": rest[1] if len(rest) == 2 else None}
    elif op == "rebalance":
        need(0, 1, "[TIME|clear]")
        payload = ({"clear": True} if rest == ["clear"] else
                   {"notice_time": rest[0] if rest else None})
    elif op == "tags":
        payload = {"tags": dict(_kv(t) for t in rest)}
    elif op == "target-lifecycle-state":
        need(1, 1, "STATE|none")
        payload = {"state": None if rest[0] == "none" else rest[0]}
    elif op == "tags-enabled":
        need(1, 1, "true|false")
        payload = {"enabled": rest[0].lower() in ("1", "true", "yes", "on")}
    elif op == "advance":
        need(1, 1, "SECONDS")
        payload = {"seconds": float(rest[0])}
    elif op in ("expire-tokens", "reset-log"):
        need(0, 0, "")
    elif op == "fault":
        need(1, 1, "JSON (e.g. '{\"mode\":\"fail\",\"path_prefix\":"
                   "\"/latest/meta-data/spot/\",\"status\":500,\"count\":2}')")
        payload = json.loads(rest[0])
    elif op in ("state", "log"):
        need(0, 0, "")
        method = "GET"
    elif op == "hits":
        need(0, 1, "[PREFIX]")
        method, query = "GET", ({"prefix": rest[0]} if rest else {})
    elif op == "wait":
        need(1, 2, "PREFIX [COUNT]")
        method = "GET"
        query = {"prefix": rest[0], "count": rest[1] if len(rest) == 2
                 else "1", "timeout": str(args.timeout)}
    elif op == "call":
        need(1, 2, "NAME [JSON]")
        op = rest[0]
        payload = json.loads(rest[1]) if len(rest) == 2 else None
        method = "POST" if payload is not None else "GET"
    else:
        raise SystemExit(f"unknown ctl operation {op!r}")
    url = f"http://{args.host}:{args.port}{CONTROL}{op}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = None if method == "GET" else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type":
                                              "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=args.timeout + 5) as r:
            print(r.read().decode(), flush=True)
            return 0
    except urllib.error.HTTPError as e:
        print(e.read().decode(), flush=True)
        return 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the fake until SIGTERM/SIGINT "
                                     "(SIGUSR1: terminate notice in 2 min; "
                                     "SIGUSR2: clear faults)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--port-file")
    s.add_argument("--instance-id", default="i-0123456789abcdef0")
    s.add_argument("--region", default="us-east-1")
    s.add_argument("--zone", default=None, help="default: REGION + 'a'")
    s.add_argument("--local-ipv4", default="10.0.0.5")
    s.add_argument("--instance-type", default="g4dn.xlarge")
    s.add_argument("--tag", type=_kv, action="append", default=[])
    s.add_argument("--tags-disabled", action="store_true",
                   help="instance-metadata tags not enabled (tags/ is 404)")
    s.add_argument("--user-data-file")
    s.add_argument("--role", type=_role, default=None,
                   help="NAME or NAME:AKID:SECRET:TOKEN")
    s.add_argument("--instance-action", choices=ACTIONS)
    s.add_argument("--target-lifecycle-state",
                   choices=TARGET_LIFECYCLE_STATES,
                   help="serve autoscaling/target-lifecycle-state (the "
                        "instance is in an Auto Scaling group)")
    s.add_argument("--allow-v1", action="store_true",
                   help="serve requests without a token (IMDSv1 allowed)")
    c = sub.add_parser("ctl", help="talk to a running fake's control API")
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--timeout", type=float, default=5.0,
                   help="for 'wait': seconds to wait (default 5)")
    c.add_argument("op", help="instance-action|rebalance|tags|tags-enabled|"
                              "target-lifecycle-state|advance|expire-tokens|"
                              "fault|state|log|reset-log|hits|wait|call")
    c.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    return _serve(args) if args.cmd == "serve" else _ctl(args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fake GCE metadata server for spotvisor tests.

Speaks the metadata protocol (as described in /work/shared/REFERENCE.md,
"GCE metadata server") over loopback, plus a control API under /_fake/ on
the same port that tests and demo scripts use to change values, inject
faults and observe what the client did.

Use it in-process:

    srv = FakeMetadataServer().start()
    srv.set("instance/preempted", "TRUE")
    srv.stop()

or as a script:

    fake_metadata.py serve [--port 0] [--port-file PATH] [--attr K=V] ...
    fake_metadata.py ctl --port PORT set instance/preempted TRUE

Standard library only; runs on Debian 12's python3 (3.11).
See README.md next to this file for the full contract and the deviations
from the real server.
"""

import argparse
import hashlib
import http.server
import json
import os
import random
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

V1 = "/computeMetadata/v1/"
CONTROL = "/_fake/"
TOKEN_PATH = "instance/service-accounts/default/token"
# Leaves rendered as JSON numbers by ?recursive=true / ?alt=json, as the
# real server does for these ids.
NUMERIC_LEAVES = {"instance/id", "project/numeric-project-id"}
# Children of these built-in directories are user- or account-named, so the
# recursive JSON keeps their names verbatim instead of camelCasing them.
VERBATIM_CHILDREN = {"attributes", "guest-attributes", "service-accounts"}
# Keys left out of a *parent's* recursive JSON (still readable directly):
# the real server never inlines access tokens, and guest attributes are a
# separate, guest-written store.
HIDDEN_IN_PARENT = {TOKEN_PATH, "instance/guest-attributes"}
LOG_LIMIT = 10000  # newest entries kept by /_fake/log; hit counters are exact

FLAVOR_403 = ("Your client does not have permission to get URL {path} from "
              "this server. Missing Metadata-Flavor:Google header.")
XFF_403 = ("Your client does not have permission to get URL {path} from "
           "this server. Requests with X-Forwarded-For are rejected.")

FAULT_MODES = ("none", "status", "hang", "reset", "refuse", "no-flavor",
               "flap")


class _Token:
    """Marker for the generated access-token leaf."""


TOKEN = _Token()


class FakeError(Exception):
    """A control-API error, carried to the HTTP client as (code, message)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


UPCOMING_MAINTENANCE = "instance/upcoming-maintenance"
NO_NOTIFICATIONS_BODY = ('{"error": "no notifications have been received yet, '
                         'try again later"}')


def _norm(path):
    """Control-API path: drop the /computeMetadata/v1/ prefix and slashes."""
    path = path or ""
    if path.startswith(V1):
        path = path[len(V1):]
    elif path.startswith(V1.lstrip("/")):
        path = path[len(V1) - 1:]
    return path.strip("/")


def _camel(name):
    head, *rest = name.split("-")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _etag(kind, key, payload):
    digest = hashlib.sha256(f"{kind}\0{key}\0{payload}".encode()).hexdigest()
    return digest[:16]


def default_tree(instance_name="spotvisor-test", attrs=None,
                 project_attrs=None):
    """The built-in metadata tree: dict = directory, str = leaf."""
    zone = "us-central1-a"
    project = "spotvisor-test-project"
    number = "123456789"
    return {
        "instance": {
            "name": instance_name,
            "id": "1234567890123456789",
            "hostname": f"{instance_name}.{zone}.c.{project}.internal",
            "zone": f"projects/{number}/zones/{zone}",
            "preempted": "FALSE",
            "maintenance-event": "NONE",
            "scheduling": {
                "preemptible": "TRUE",
                "provisioning-model": "SPOT",
                "on-host-maintenance": "TERMINATE",
                "automatic-restart": "FALSE",
            },
            "network-interfaces": {"0": {"ip": "10.128.0.2"}},
            "attributes": dict(attrs or {}),
            "guest-attributes": {},
            "service-accounts": {
                "default": {
                    "email": f"{number}-compute@developer.gserviceaccount.com",
                    "scopes": ("https://www.googleapis.com/auth/"
                               "devstorage.read_write\n"
                               "https://www.googleapis.com/auth/"
                               "logging.write\n"
                               "https://www.googleapis.com/auth/"
                               "monitoring.write\n"),
                    "token": TOKEN,
                },
            },
        },
        "project": {
            "project-id": project,
            "numeric-project-id": number,
            "attributes": dict(project_attrs or {}),
        },
    }


class _Snapshot:
    """What a GET would answer right now."""

    __slots__ = ("body", "ctype", "etag")

    def __init__(self, body, ctype, etag):
        self.body, self.ctype, self.etag = body, ctype, etag


class _Conn:
    """One accepted connection, so refuse/stop can close it from outside."""

    __slots__ = ("sock", "killed")

    def __init__(self, sock):
        self.sock = sock
        self.killed = False


class _Listener(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True          # hanging long-polls must not block exit
    allow_reuse_address = True     # 'refuse' re-binds the same port
    request_queue_size = 128

    def __init__(self, address, fake):
        self.fake = fake
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self):
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can
        # stall in sandboxes; we never need the name.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        # Resets and connections we kill on purpose surface as OSErrors in
        # handler threads; they are expected, anything else is a bug.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class FakeMetadataServer:
    """In-process fake metadata server. Thread-safe."""

    def __init__(self, host="127.0.0.1", port=0, instance_name="spotvisor-test",
                 attrs=None, project_attrs=None):
        self.host = host
        self.port = port
        self._tree = default_tree(instance_name, attrs, project_attrs)
        # One lock; two conditions so counter watchers do not wake every
        # parked long-poll and vice versa.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)   # data/fault/stop
        self._counters = threading.Condition(self._lock)  # log/waiters/hung
        self._fault = {"mode": "none"}
        self._fault_gen = 0
        self._rng = random.Random(0)
        self._fault_lock = threading.Lock()  # serialises listener changes
        self._timers = []
        self._log = []
        self._hits = {}
        self._waiters = {}
        self._hung = {}
        self._conns = set()
        self._token_serial = 0
        # How instance/upcoming-maintenance answers while it is not set:
        # "404" (not defined) or "503" (Google's sapagent has seen 503 with
        # a "no notifications" body). set(..., "NONE") is the third form.
        self._no_maintenance = "404"
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
            self._counters.notify_all()
            timers, self._timers = self._timers, []
        for t in timers:
            t.cancel()
        with self._fault_lock:
            self._close_listener()
        self._kill_conns(None)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base_url(self):
        return f"http://{self.host}:{self.port}"

    def _open_listener(self, port):
        # Re-binding after 'refuse' can briefly collide with the old socket
        # on some kernels; retry for a bounded time rather than fail at once.
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
                                  name=f"fake-metadata:{self.port}",
                                  daemon=True)
        thread.start()
        self._listener, self._serve_thread = listener, thread

    def _close_listener(self):
        listener, thread = self._listener, self._serve_thread
        self._listener = self._serve_thread = None
        if listener is None:
            return
        listener.shutdown()
        listener.server_close()  # queued, unaccepted connections get RST
        thread.join()

    def _register_conn(self, sock):
        conn = _Conn(sock)
        with self._lock:
            # A connection accepted in the instant before 'refuse' closed
            # the listener must not be served.
            if self._stopping or self._fault["mode"] == "refuse":
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
            # connections; parked ones wake via 'killed' + notify above.
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ------------------------------------------------------------ data
    def _lookup(self, parts):
        node = self._tree
        for p in parts:
            if not isinstance(node, dict) or p not in node:
                return None
            node = node[p]
        return node

    def set_no_maintenance_answer(self, style):
        """What instance/upcoming-maintenance answers while it is not set:
        "404" (the default) or "503" with the body sapagent treats as "none"."""
        if style not in ("404", "503"):
            raise FakeError(400, "style must be '404' or '503'")
        with self._lock:
            self._no_maintenance = style

    def set(self, path, value):
        """Set a leaf (creating directories on the way). Returns its state."""
        parts = _norm(path).split("/")
        if parts == [""]:
            raise FakeError(400, "path is empty")
        if not isinstance(value, str):
            raise FakeError(400, "value must be a string")
        with self._lock:
            node = self._tree
            for i, p in enumerate(parts[:-1]):
                child = node.setdefault(p, {})
                if not isinstance(child, dict):
                    raise FakeError(
                        400, f"{'/'.join(parts[:i + 1])} is a leaf")
                node = child
            if isinstance(node.get(parts[-1]), dict):
                raise FakeError(400, f"{'/'.join(parts)} is a directory")
            node[parts[-1]] = value
            self._changed.notify_all()
            return self._state_locked(parts)

    def delete(self, path):
        """Remove a leaf or a whole directory; later GETs answer 404."""
        parts = _norm(path).split("/")
        if parts == [""]:
            raise FakeError(400, "cannot delete the root")
        with self._lock:
            parent = self._lookup(parts[:-1])
            if not isinstance(parent, dict) or parts[-1] not in parent:
                raise FakeError(404, f"{'/'.join(parts)} does not exist")
            del parent[parts[-1]]
            self._changed.notify_all()
        return {"path": "/".join(parts), "deleted": True}

    def state(self, path):
        """Current value and ETag of a leaf or directory (no side effects)."""
        parts = [p for p in _norm(path).split("/") if p]
        with self._lock:
            return self._state_locked(parts)

    def _state_locked(self, parts):
        node = self._lookup(parts)
        if node is None:
            raise FakeError(404, f"{'/'.join(parts)} does not exist")
        key = "/".join(parts)
        if isinstance(node, dict):
            snap = self._snapshot_locked(parts, True, True, None)
            return {"path": key, "kind": "directory",
                    "value": json.loads(snap.body), "etag": snap.etag}
        value = "<generated token>" if node is TOKEN else node
        return {"path": key, "kind": "leaf", "value": value,
                "etag": _etag("L", key, value)}

    def _json_tree(self, node, parts, deep_verbatim):
        """Recursive-JSON rendering of a subtree (real-server conventions).

        Built-in directory keys are camelCased; names chosen by users or
        accounts (children of attributes/, guest-attributes/ and
        service-accounts/) are kept verbatim. deep_verbatim is set inside
        attributes/ and guest-attributes/, where nothing is built-in.
        """
        key = "/".join(parts)
        if not isinstance(node, dict):
            if key in NUMERIC_LEAVES and node.isdigit():
                return int(node)
            if parts[-1:] == ["scopes"] and "service-accounts" in parts:
                return [s for s in node.split("\n") if s]
            return node
        here = parts[-1] if parts else ""
        own_verbatim = deep_verbatim or here in VERBATIM_CHILDREN
        child_deep = deep_verbatim or here in ("attributes", "guest-attributes")
        names = sorted(n for n in node
                       if "/".join(parts + [n]) not in HIDDEN_IN_PARENT)
        children = {n: self._json_tree(node[n], parts + [n], child_deep)
                    for n in names}
        if not own_verbatim and names and all(n.isdigit() for n in names):
            # network-interfaces/0/... is a JSON array on the real server
            return [children[n] for n in sorted(names, key=int)]
        return {(n if own_verbatim else _camel(n)): v
                for n, v in children.items()}

    def _snapshot_locked(self, parts, is_dir, recursive, alt):
        """Body/ctype/ETag a GET would get now, or None if it would 404."""
        node = self._lookup(parts)
        if node is None or isinstance(node, dict) != is_dir:
            return None
        key = "/".join(parts)
        if not is_dir:
            if node is TOKEN:
                self._token_serial += 1
                body = json.dumps({"access_token":
                                   f"fake-token-{self._token_serial}",
                                   "expires_in": 3599,
                                   "token_type": "Bearer"},
                                  separators=(",", ":"))
                return _Snapshot(body.encode(), "application/json",
                                 _etag("L", key, body))
            etag = _etag("L", key, node)
            if alt == "json":
                body = json.dumps(self._json_tree(node, parts, False))
                return _Snapshot(body.encode(), "application/json", etag)
            return _Snapshot(node.encode(), "text/plain; charset=utf-8", etag)
        deep = any(p in ("attributes", "guest-attributes")
                   for p in parts[:-1])
        tree = self._json_tree(node, parts, deep)
        canonical = json.dumps(tree, sort_keys=True, separators=(",", ":"))
        # A directory's ETag is a hash of its whole rendered subtree, so a
        # recursive long-poll wakes exactly when its answer would change.
        etag = _etag("D", key, canonical)
        if recursive:
            return _Snapshot(canonical.encode(), "application/json", etag)
        lines = "".join(n + ("/" if isinstance(node[n], dict) else "") + "\n"
                        for n in sorted(node))
        return _Snapshot(lines.encode(), "text/plain; charset=utf-8", etag)

    # ------------------------------------------------------------ faults
    def fault(self, mode="none", *, _exclude=None, **params):
        """Set the fault mode for metadata requests; returns the new spec.

        fault("status", code=503, count=2, path_prefix="instance/")
        fault("hang"); fault("reset"); fault("refuse"); fault("no-flavor")
        fault("flap", code=503, ratio=0.5, seed=1); fault("none")
        Any mode takes for_sec=S: clear automatically after S seconds.
        A dict spec ({"mode": ..., ...}) is accepted as the first argument.
        """
        spec = dict(mode) if isinstance(mode, dict) else dict(params,
                                                               mode=mode)
        spec = self._validate_fault(spec)
        with self._fault_lock:
            with self._lock:
                old = self._fault
                self._fault = spec
                self._fault_gen += 1
                gen = self._fault_gen
                if spec["mode"] == "flap":
                    self._rng = random.Random(spec["seed"])
                self._changed.notify_all()
                self._counters.notify_all()
            if spec["mode"] == "refuse" and old["mode"] != "refuse":
                self._close_listener()
                self._kill_conns(_exclude)
            elif spec["mode"] != "refuse" and old["mode"] == "refuse":
                self._open_listener(self.port)
        if "for_sec" in spec:
            timer = threading.Timer(spec["for_sec"], self._expire_fault,
                                    args=(gen,))
            timer.daemon = True
            with self._lock:
                self._timers.append(timer)
            timer.start()
        return dict(spec)

    def _expire_fault(self, gen):
        with self._lock:
            current = self._fault_gen == gen and not self._stopping
        if current:
            self.fault("none")

    def current_fault(self):
        with self._lock:
            return dict(self._fault)

    @staticmethod
    def _validate_fault(spec):
        mode = spec.get("mode")
        if mode not in FAULT_MODES:
            raise FakeError(400, f"unknown fault mode {mode!r}; "
                                 f"one of {', '.join(FAULT_MODES)}")
        allowed = {"mode", "for_sec"}
        if mode in ("status", "flap"):
            allowed |= {"code", "path_prefix"}
            code = spec.get("code", 503)
            if not isinstance(code, int) or not 100 <= code <= 599:
                raise FakeError(400, "code must be an HTTP status code")
            spec["code"] = code
        if mode == "status":
            allowed.add("count")
            if "count" in spec and (not isinstance(spec["count"], int)
                                    or spec["count"] < 1):
                raise FakeError(400, "count must be a positive integer")
        if mode == "flap":
            allowed |= {"ratio", "seed"}
            ratio = spec.setdefault("ratio", 0.5)
            if not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
                raise FakeError(400, "ratio must be in [0, 1]")
            spec.setdefault("seed", 1)
        if "path_prefix" in spec:
            spec["path_prefix"] = spec["path_prefix"].lstrip("/")
        if "for_sec" in spec and (not isinstance(spec["for_sec"], (int, float))
                                  or spec["for_sec"] <= 0):
            raise FakeError(400, "for_sec must be a positive number")
        unknown = set(spec) - allowed
        if unknown:
            raise FakeError(400, f"unknown fault fields for {mode}: "
                                 f"{', '.join(sorted(unknown))}")
        return spec

    def _no_flavor(self):
        with self._lock:
            return self._fault["mode"] == "no-flavor"

    # ------------------------------------------------------------ observing
    def log(self):
        """Metadata requests seen (newest LOG_LIMIT), oldest first."""
        with self._lock:
            return [dict(e) for e in self._log]

    def reset_log(self):
        """Forget the log and the hit counters (not parked waiters)."""
        with self._lock:
            self._log.clear()
            self._hits.clear()
            self._counters.notify_all()

    def hits(self, path=None):
        """Metadata requests for PATH (trailing slash ignored); all if None."""
        with self._lock:
            return self._count_locked(self._hits, path)

    def waiters(self, path=None):
        """Long-polls parked on PATH right now (exact); all if None."""
        with self._lock:
            return self._count_locked(self._waiters, path)

    def hung(self, path=None):
        """Requests held by the 'hang' fault right now; all if None."""
        with self._lock:
            return self._count_locked(self._hung, path)

    def wait_for(self, what, path=None, count=1, timeout=5.0):
        """Block until hits/waiters/hung for PATH >= count. True if reached."""
        table = {"hits": self._hits, "waiters": self._waiters,
                 "hung": self._hung}.get(what)
        if table is None:
            raise FakeError(400, "what must be hits, waiters or hung")
        with self._lock:
            return self._counters.wait_for(
                lambda: self._count_locked(table, path) >= count, timeout)

    def wait_for_waiters(self, path, count=1, timeout=5.0):
        return self.wait_for("waiters", path, count, timeout)

    def wait_for_hung(self, path=None, count=1, timeout=5.0):
        return self.wait_for("hung", path, count, timeout)

    def wait_for_hits(self, path, count=1, timeout=5.0):
        return self.wait_for("hits", path, count, timeout)

    @staticmethod
    def _count_locked(table, path):
        if path is None:
            return sum(table.values())
        return table.get(_norm(path), 0)

    @staticmethod
    def _bump(table, key, delta):
        n = table.get(key, 0) + delta
        if n:
            table[key] = n
        else:
            table.pop(key, None)

    # ------------------------------------------------------------ requests
    def _arrive(self, method, rel, query, headers, conn):
        """Log a metadata request and decide its fault, atomically.

        Returns (entry, action); action is None (serve normally),
        "killed", "reset", "hang" (already counted as hung) or
        ("status", code).
        """
        key = rel.strip("/")
        with self._lock:
            entry = {"method": method, "path": rel, "query": query,
                     "headers": headers, "time": time.time(), "status": None}
            self._log.append(entry)
            if len(self._log) > LOG_LIMIT:
                del self._log[:len(self._log) - LOG_LIMIT]
            self._bump(self._hits, key, 1)
            self._counters.notify_all()
            if conn.killed or self._stopping:
                return entry, "killed"
            f = self._fault
            mode = f["mode"]
            if mode == "refuse":
                return entry, "killed"
            if mode in ("reset", "hang"):
                entry["outcome"] = mode
                if mode == "hang":
                    self._bump(self._hung, key, 1)
                    self._counters.notify_all()
                return entry, mode
            if mode in ("status", "flap") and \
                    rel.lstrip("/").startswith(f.get("path_prefix", "")):
                if mode == "flap" and self._rng.random() >= f["ratio"]:
                    return entry, None
                if "count" in f:
                    f["count"] -= 1
                    if f["count"] <= 0:
                        self._fault = {"mode": "none"}
                        self._fault_gen += 1
                return entry, ("status", f["code"])
            return entry, None

    def _hold_hung_locked(self, key, conn):
        """Park a request under the 'hang' fault until it is cleared.

        Caller has already counted it in self._hung. The connection is
        then closed without a response, like a server that wedged.
        """
        gen = self._fault_gen
        try:
            while (self._fault_gen == gen and not self._stopping
                   and not conn.killed):
                self._changed.wait()
        finally:
            self._bump(self._hung, key, -1)
            self._counters.notify_all()

    def _hold_hung(self, key, conn):
        with self._lock:
            self._hold_hung_locked(key, conn)

    def _set_status(self, entry, status):
        with self._lock:
            entry["status"] = status

    def _snapshot(self, parts, is_dir, recursive, alt):
        with self._lock:
            return self._snapshot_locked(parts, is_dir, recursive, alt)

    def _long_poll(self, parts, is_dir, recursive, alt, last_etag, timeout,
                   conn):
        """Wait for a change. Returns a _Snapshot, None (404) or "killed"."""
        key = "/".join(parts)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            snap = self._snapshot_locked(parts, is_dir, recursive, alt)
            if snap is None:
                return None
            if last_etag is not None and last_etag != snap.etag:
                return snap
            target = snap.etag if last_etag is None else last_etag
            # Counted under the same lock that set() needs, so once
            # waiters() reports this request a later set() cannot be missed.
            self._bump(self._waiters, key, 1)
            self._counters.notify_all()
            parked = True
            try:
                while True:
                    if self._stopping or conn.killed:
                        return "killed"
                    snap = self._snapshot_locked(parts, is_dir, recursive,
                                                 alt)
                    remaining = (None if deadline is None
                                 else deadline - time.monotonic())
                    if (snap is None or snap.etag != target
                            or (remaining is not None and remaining <= 0)):
                        if self._fault["mode"] == "hang":
                            # The answer is due but the server is wedged:
                            # the request becomes a hung one.
                            self._bump(self._waiters, key, -1)
                            parked = False
                            self._bump(self._hung, key, 1)
                            self._counters.notify_all()
                            self._hold_hung_locked(key, conn)
                            return "killed"
                        return snap
                    self._changed.wait(remaining)
            finally:
                if parked:
                    self._bump(self._waiters, key, -1)
                    self._counters.notify_all()

    def _put_guest_attribute(self, parts, value):
        with self._lock:
            ga = self._tree.setdefault("instance", {}).setdefault(
                "guest-attributes", {})
            ns = ga.setdefault(parts[2], {})
            ns[parts[3]] = value
            self._changed.notify_all()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"      # keep-alive, like the real server
    server_version = "Metadata Server for VM"

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

    def do_GET(self):
        self._dispatch()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_GET

    # ------------------------------------------------------------ plumbing
    def _read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, code, body, ctype="text/plain; charset=utf-8",
               headers=(), close=False, entry=None, flavor=True):
        if isinstance(body, str):
            body = body.encode()
        if entry is not None:
            # Recorded before the bytes leave, so a client that reads the
            # log right after its response always sees the status.
            self.fake._set_status(entry, code)
        self.send_response(code)
        if flavor and not self.fake._no_flavor():
            self.send_header("Metadata-Flavor", "Google")
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

    def _drop(self):
        """Close the connection without answering."""
        self.close_connection = True

    def _reset(self):
        """Abort with RST (SO_LINGER 0), as a crashing proxy would."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                   struct.pack("ii", 1, 0))
        self.rfile.close()       # makefile() holds a ref that defers close
        self.connection.close()

    def _dispatch(self):
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self._drop()
            return
        if self.path.startswith(CONTROL):
            self._control(body)
        else:
            self._metadata(body)

    # ------------------------------------------------------------ control
    def _control(self, body):
        url = urllib.parse.urlsplit(self.path)
        name = url.path[len(CONTROL):].strip("/")
        q = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        fake = self.fake
        status = 200
        try:
            data = json.loads(body) if body.strip() else {}
            method = self.command
            if method == "POST" and name == "set":
                result = fake.set(data["path"], data["value"])
            elif method == "POST" and name == "delete":
                result = fake.delete(data["path"])
            elif method == "POST" and name == "fault":
                result = fake.fault(data, _exclude=self.connection)
            elif method == "GET" and name == "fault":
                result = fake.current_fault()
            elif method == "GET" and name == "log":
                result = fake.log()
            elif method == "POST" and name == "reset-log":
                fake.reset_log()
                result = {"ok": True}
            elif method == "GET" and name == "hits":
                result = {"count": fake.hits(q.get("path"))}
            elif method == "GET" and name == "waiters":
                result = {"count": fake.waiters(q.get("path")),
                          "hung": fake.hung(q.get("path"))}
            elif method == "GET" and name == "state":
                result = fake.state(q.get("path", ""))
            elif method == "GET" and name == "wait":
                what = q.get("what", "waiters")
                count = int(q.get("count", "1"))
                ok = fake.wait_for(what, q.get("path"), count,
                                   float(q.get("timeout", "5")))
                table = {"hits": fake.hits, "waiters": fake.waiters,
                         "hung": fake.hung}[what]
                result = {"ok": ok, "count": table(q.get("path"))}
                status = 200 if ok else 408
            else:
                raise FakeError(404, f"no control operation {method} "
                                     f"/_fake/{name}")
        except FakeError as e:
            status, result = e.code, {"error": e.message}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            status, result = 400, {"error": f"bad request: {e!r}"}
        # Control connections close after each answer: a refuse fault may
        # have just taken the listener away.
        self._reply(status, json.dumps(result), "application/json",
                    close=True, flavor=False)

    # ------------------------------------------------------------ metadata
    def _metadata(self, body):
        fake = self.fake
        url = urllib.parse.urlsplit(self.path)
        raw = urllib.parse.unquote(url.path)
        rel = raw[len(V1):] if raw.startswith(V1) else raw
        query = dict(urllib.parse.parse_qsl(url.query,
                                            keep_blank_values=True))
        headers = {k: v for k, v in self.headers.items()}
        entry, action = fake._arrive(self.command, rel, query, headers,
                                     self.conn)
        if action == "killed":
            self._drop()
            return
        if action == "reset":
            self._reset()
            return
        if action == "hang":
            fake._hold_hung(rel.strip("/"), self.conn)
            self._drop()
            return
        if action is not None:
            code = action[1]
            self._reply(code, f"fake-metadata: injected HTTP {code}\n",
                        entry=entry)
            return

        if "X-Forwarded-For" in self.headers:
            self._reply(403, XFF_403.format(path=raw), close=True,
                        entry=entry)
            return
        if self.headers.get("Metadata-Flavor") != "Google":
            self._reply(403, FLAVOR_403.format(path=raw), close=True,
                        entry=entry)
            return

        if not raw.startswith(V1):
            listing = {"/": "computeMetadata/\n",
                       "/computeMetadata/": "v1/\n"}.get(raw)
            if self.command == "GET" and listing is not None:
                self._reply(200, listing, entry=entry)
            else:
                self._reply(404, "fake-metadata: not found\n", entry=entry)
            return

        trailing = rel.endswith("/") or rel == ""
        parts = [p for p in rel.split("/") if p]

        if self.command == "PUT":
            self._put(parts, trailing, body, entry)
            return
        if self.command != "GET":
            self._reply(405, "fake-metadata: method not allowed\n",
                        headers=[("Allow", "GET")], entry=entry)
            return
        self._get(parts, trailing, query, raw, url.query, entry)

    def _put(self, parts, trailing, body, entry):
        if parts[:2] != ["instance", "guest-attributes"]:
            self._reply(405, "fake-metadata: only guest attributes are "
                             "writable\n",
                        headers=[("Allow", "GET")], entry=entry)
            return
        if len(parts) != 4 or trailing:
            self._reply(400, "fake-metadata: PUT "
                             "instance/guest-attributes/NAMESPACE/KEY\n",
                        entry=entry)
            return
        try:
            value = body.decode("utf-8")
        except UnicodeDecodeError:
            self._reply(400, "fake-metadata: value is not UTF-8\n",
                        entry=entry)
            return
        self.fake._put_guest_attribute(parts, value)
        self._reply(200, b"", entry=entry)

    def _get(self, parts, trailing, query, raw, raw_query, entry):
        fake = self.fake

        def flag(name):
            return query.get(name, "").lower() == "true"

        def bad(msg):
            self._reply(400, f"fake-metadata: {msg}\n", entry=entry)

        recursive, wait = flag("recursive"), flag("wait_for_change")
        alt = query.get("alt")
        if alt not in (None, "json", "text"):
            return bad("alt must be json or text")
        timeout = None
        if "timeout_sec" in query:
            try:
                timeout = int(query["timeout_sec"])
            except ValueError:
                timeout = -1
            if timeout <= 0:
                return bad("timeout_sec must be a positive integer")

        with fake._lock:
            node = fake._lookup(parts)
            no_maintenance = fake._no_maintenance
        if (node is None and "/".join(parts) == UPCOMING_MAINTENANCE
                and no_maintenance == "503"):
            self._reply(503, NO_NOTIFICATIONS_BODY, "application/json",
                        entry=entry)
            return
        if node is None or (trailing and parts and not isinstance(node, dict)):
            self._reply(404, "fake-metadata: not found\n", entry=entry)
            return
        is_dir = isinstance(node, dict)
        if is_dir and not trailing:
            host = self.headers.get("Host", f"{fake.host}:{fake.port}")
            location = f"http://{host}{raw}/" + (f"?{raw_query}"
                                                 if raw_query else "")
            self._reply(301, f"Moved to {location}\n",
                        headers=[("Location", location)], entry=entry)
            return
        if "/".join(parts) == TOKEN_PATH and wait:
            return bad("the token cannot be watched (wait_for_change)")
        if is_dir and wait and not recursive:
            return bad("wait_for_change on a directory needs recursive=true")
        if is_dir and recursive and alt == "text":
            return bad("alt=text is not implemented by the fake")

        if wait:
            snap = fake._long_poll(parts, is_dir, recursive, alt,
                                   query.get("last_etag"), timeout, self.conn)
            if snap == "killed":
                self._drop()
                return
        else:
            snap = fake._snapshot(parts, is_dir, recursive, alt)
        if snap is None:
            self._reply(404, "fake-metadata: not found\n", entry=entry)
            return
        self._reply(200, snap.body, snap.ctype, headers=[("ETag", snap.etag)],
                    entry=entry)


# ---------------------------------------------------------------- script
def _kv(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _serve(args):
    # Block the stop signals in every thread (threads inherit the mask) and
    # take them synchronously with sigwait: no handler races with the
    # server threads.
    sigs = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    srv = FakeMetadataServer(args.host, args.port, args.instance_name,
                             dict(args.attr), dict(args.project_attr))
    srv.start()
    print(f"fake-metadata listening on {args.host}:{srv.port}", flush=True)
    if args.port_file:
        _write_atomic(args.port_file, f"{srv.port}\n")
    while True:
        sig = signal.sigwait(sigs)
        if sig == signal.SIGUSR1:
            # The only way to clear 'refuse' from outside without for_sec,
            # since the control API shares the refused port.
            srv.fault("none")
            continue
        break
    srv.stop()
    return 0


def _ctl(args):
    base = f"http://{args.host}:{args.port}{CONTROL}"
    op, rest = args.op, args.args

    def need(n, usage):
        if len(rest) != n:
            raise SystemExit(f"usage: ctl {op} {usage}")

    if op == "set":
        need(2, "PATH VALUE")
        req = ("POST", "set", {"path": rest[0], "value": rest[1]})
    elif op == "delete":
        need(1, "PATH")
        req = ("POST", "delete", {"path": rest[0]})
    elif op == "fault":
        need(1, "JSON")
        req = ("POST", "fault", json.loads(rest[0]))
    elif op in ("log", "reset-log"):
        need(0, "")
        req = ("GET" if op == "log" else "POST", op, None)
    elif op in ("hits", "waiters", "state"):
        need(1, "PATH")
        req = ("GET", f"{op}?" + urllib.parse.urlencode({"path": rest[0]}),
               None)
    elif op == "wait":
        if len(rest) not in (2, 3):
            raise SystemExit("usage: ctl wait hits|waiters|hung PATH [COUNT]")
        params = {"what": rest[0], "path": rest[1],
                  "count": rest[2] if len(rest) == 3 else "1",
                  "timeout": str(args.timeout)}
        req = ("GET", "wait?" + urllib.parse.urlencode(params), None)
    else:
        raise SystemExit(f"unknown ctl operation {op!r}")
    method, name, payload = req
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(base + name, data=data, method=method,
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
    s = sub.add_parser("serve", help="run the fake until SIGTERM/SIGINT")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--port-file")
    s.add_argument("--attr", type=_kv, action="append", default=[])
    s.add_argument("--project-attr", type=_kv, action="append", default=[])
    s.add_argument("--instance-name", default="spotvisor-test")
    c = sub.add_parser("ctl", help="talk to a running fake's control API")
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--timeout", type=float, default=5.0,
                   help="for 'wait': seconds to wait (default 5)")
    c.add_argument("op", help="set|delete|fault|log|hits|waiters|state|"
                              "reset-log|wait")
    c.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    return _serve(args) if args.cmd == "serve" else _ctl(args)


if __name__ == "__main__":
    sys.exit(main())

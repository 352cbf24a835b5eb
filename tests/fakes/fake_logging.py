"""A fake Cloud Logging API: POST /v2/entries:write, validated like the real one.

Checks (a violation answers 400 with the reason, as the API does):
  - a bearer token (else 401);
  - a JSON body of at most 10 MB with a non-empty `entries` list;
  - `resource` of type gce_instance with project_id, instance_id and zone
    (on the request or on every entry);
  - every entry's logName (its own or the request's) is
    projects/PROJECT/logs/LOG_ID with LOG_ID URL-encoded and under 512
    characters, for this project;
  - severity, if present, is one of Cloud Logging's names; timestamp is RFC 3339;
  - each entry is at most 256 KB.
  - insertId, if present, is a string.
fault(code, count) answers `code` (e.g. 429, 503) to the next `count` requests;
fault(code, count, applied=True) writes the entries first, then answers `code`
(a lost answer: the write landed, the client heard a failure).
distinct(log_id) is what a query returns: entries with the same logName,
timestamp and insertId count once, as Cloud Logging documents for insertId.
delay_ms = N makes every request take N ms longer (a slow API, to fill the
client's queue).
Not implemented: partialSuccess per-entry errors, entries.list/tail, log
buckets, sinks, quotas.
"""
import json
import re
import threading
import time
import urllib.parse

from loopback_json import JsonServer

SEVERITIES = {"DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"}
_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


class FakeLoggingServer:
    def __init__(self, project, host="127.0.0.1", port=0):
        self.project = project
        self._lock = threading.Condition()
        self._entries = []
        self._requests = []
        self._faults = []
        self.delay_ms = 0
        self._http = JsonServer(self._handle, host, port)
        self.port = self._http.port

    def start(self):
        self._http.start()
        return self

    def stop(self):
        self._http.stop()

    def _handle(self, method, path, headers, body):
        if method != "POST":
            return 404, {"error": {"code": 404, "message": f"no such method {method} {path}"}}
        if self.delay_ms:
            time.sleep(self.delay_ms / 1000)  # the fake's own slowness, by request
        return self._write(path, headers.get("Authorization", ""), body)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def fault(self, code, count=1, applied=False):
        with self._lock:
            self._faults += [(code, applied)] * count

    def distinct(self, log_id=None):
        seen, out = set(), []
        for e in self.entries(log_id):
            key = (e["logName"], e.get("timestamp"), e.get("insertId"))
            if e.get("insertId") is not None and key in seen:
                continue
            seen.add(key)
            out.append(e)
        return out

    def entries(self, log_id=None):
        with self._lock:
            return [dict(e) for e in self._entries if log_id is None or e["logName"].endswith("/logs/" + log_id)]

    def requests(self):
        with self._lock:
            return list(self._requests)

    def wait_for(self, predicate, timeout=10):
        with self._lock:
            return self._lock.wait_for(lambda: predicate(self._entries), timeout)

    @staticmethod
    def _bad(message):
        return 400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}

    def _write(self, path, auth, body):
        with self._lock:
            self._requests.append({"path": path, "bytes": len(body), "auth": bool(auth)})
            fault = self._faults.pop(0) if self._faults else None
            if fault and not fault[1]:
                code = fault[0]
                return code, {"error": {"code": code, "message": f"injected {code}"}}
        if path.split("?")[0] != "/v2/entries:write":
            return 404, {"error": {"code": 404, "message": f"no such method {path}"}}
        if not auth.startswith("Bearer ") or len(auth) <= len("Bearer "):
            return 401, {"error": {"code": 401, "message": "Request had invalid authentication credentials."}}
        if len(body) > 10 * 1024 * 1024:
            return self._bad("Request payload size exceeds the limit: 10485760 bytes.")
        try:
            req = json.loads(body)
        except ValueError as e:
            return self._bad(f"Invalid JSON payload received. {e}")
        entries = req.get("entries")
        if not isinstance(entries, list) or not entries:
            return self._bad("entries: at least one entry is required")
        accepted = []
        for i, e in enumerate(entries):
            resource = e.get("resource", req.get("resource"))
            if not resource or resource.get("type") != "gce_instance" or \
                    set(resource.get("labels", {})) != {"project_id", "instance_id", "zone"}:
                return self._bad(f"entries[{i}].resource: a gce_instance with project_id, instance_id and zone is required")
            log_name = e.get("logName", req.get("logName", ""))
            m = re.match(r"^projects/([^/]+)/logs/([^/]+)$", log_name)
            if not m or m.group(1) != self.project or len(m.group(2)) >= 512:
                return self._bad(f"entries[{i}].logName: \"{log_name}\" is not projects/{self.project}/logs/LOG_ID")
            if urllib.parse.quote(urllib.parse.unquote(m.group(2)), safe="") != m.group(2):
                return self._bad(f"entries[{i}].logName: LOG_ID must be URL-encoded")
            if "severity" in e and e["severity"] not in SEVERITIES:
                return self._bad(f"entries[{i}].severity: \"{e['severity']}\" is not a LogSeverity")
            if "timestamp" in e and not _RFC3339.match(e["timestamp"]):
                return self._bad(f"entries[{i}].timestamp: not RFC 3339")
            if "insertId" in e and not isinstance(e["insertId"], str):
                return self._bad(f"entries[{i}].insertId: a string is required")
            if len(json.dumps(e)) > 256 * 1024:
                return self._bad(f"entries[{i}]: entry too large (256 KB at most)")
            accepted.append(dict(e, logName=log_name, resource=resource))
        with self._lock:
            self._entries += accepted
            self._lock.notify_all()
        if fault:
            return fault[0], {"error": {"code": fault[0], "message": f"injected {fault[0]} after the write was applied"}}
        return 200, {}

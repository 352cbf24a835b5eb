"""A fake Compute Engine API endpoint, just enough for a VM to stop or delete itself.

Implements, under /compute/v1 (so the client's compute-endpoint is
http://127.0.0.1:PORT/compute/v1):
  POST   /projects/P/zones/Z/instances/N/stop  -> 200 + a zonal operation
  DELETE /projects/P/zones/Z/instances/N       -> 200 + a zonal operation
  GET    /projects/P/zones/Z/instances/N       -> the instance (name, status)
Like the real API it checks the method, the path (an unknown project, zone
or instance is 404), and the bearer token (none or a wrong one is 401);
deny("compute.instances.stop") makes that call answer 403 with the real
message shape. Everything else is 404. Not implemented: operations polling
(the operation is returned RUNNING and never advances), start, other
resources, request bodies, quotas.
"""
import re
import threading
import time

from loopback_json import JsonServer

_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)(/stop)?$")


class FakeComputeServer:
    def __init__(self, project, zone, instance, token_ok=lambda token: bool(token), host="127.0.0.1", port=0):
        self.project, self.zone, self.instance = project, zone, instance
        self.status = "RUNNING"
        self._token_ok = token_ok
        self._denied = set()
        self._log = []
        self._lock = threading.Lock()
        self._http = JsonServer(lambda method, path, headers, body: self._route(method, path, headers.get("Authorization", "")),
                                host, port)
        self.port = self._http.port

    def start(self):
        self._http.start()
        return self

    def stop(self):
        self._http.stop()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}/compute/v1"

    def deny(self, permission):
        """Answer 403 to the call needing this permission (compute.instances.stop / .delete)."""
        with self._lock:
            self._denied.add(permission)

    def log(self):
        with self._lock:
            return [dict(e) for e in self._log]

    @staticmethod
    def _error(code, message, reason):
        return code, {"error": {"code": code, "message": message, "errors": [{"message": message, "domain": "global", "reason": reason}]}}

    def _route(self, method, path, auth):
        path = path.split("?", 1)[0]
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        with self._lock:
            self._log.append({"method": method, "path": path, "token": token, "time": time.time()})
            m = _PATH.match(path)
            if not token or not self._token_ok(token):
                return self._error(401, "Request is missing required authentication credential. Expected OAuth 2 access token.", "required")
            if not m:
                return self._error(404, f"The requested URL {path} was not found.", "notFound")
            project, zone, name, stop = m.groups()
            if (project, zone, name) != (self.project, self.zone, self.instance) or self.status == "DELETED":
                return self._error(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found", "notFound")
            resource = f"projects/{project}/zones/{zone}/instances/{name}"
            if method == "GET" and not stop:
                return 200, {"kind": "compute#instance", "name": name, "status": self.status}
            if (method, bool(stop)) == ("POST", True):
                verb, permission = "stop", "compute.instances.stop"
            elif (method, bool(stop)) == ("DELETE", False):
                verb, permission = "delete", "compute.instances.delete"
            else:
                return self._error(404, f"The requested URL {path} was not found.", "notFound")
            if permission in self._denied:
                return self._error(403, f"Required '{permission}' permission for '{resource}'", "forbidden")
            self.status = "STOPPING" if verb == "stop" else "DELETED"
            return 200, {"kind": "compute#operation", "name": f"operation-{int(time.time() * 1000)}-{verb}",
                         "operationType": verb, "targetLink": f"https://compute.googleapis.com/compute/v1/{resource}",
                         "status": "RUNNING", "zone": f"projects/{project}/zones/{zone}"}

#!/usr/bin/python3
"""A fake Compute Engine API on loopback: instances (stop, delete, get), global instance
templates, zonal and regional managed instance groups (MIGs) and their operations, enough for a
VM to stop or delete itself, or to leave its group, and for a test to play the group's
controller. Python 3 standard library + loopback_json.py.

Everything is under /compute/v1, so the client's compute-endpoint is
http://127.0.0.1:PORT/compute/v1 (srv.endpoint). Paths take the project id or the project
number (project_number=, default "123456789"); answers name the project by id, except the
instance attribute created-by, which names it by number as GCE does.

Implemented (P = project, Z = zone, R = region; every answer is JSON):
  GET    projects/P/zones/Z/instances/N             compute#instance (status, zone, metadata:
                                                    created-by and instance-template on members)
  POST   projects/P/zones/Z/instances/N/stop        operation "stop"; status -> STOPPING
  DELETE projects/P/zones/Z/instances/N             operation "delete"; then 404
  POST   projects/P/global/instanceTemplates        insert (name, properties.machineType
                                                    required; properties stored as given)
  GET    projects/P/global/instanceTemplates[/N]    list / get
  DELETE projects/P/global/instanceTemplates/N      400 resourceInUseByAnotherResource while a
                                                    group uses it
  .../zones/Z/instanceGroupManagers                 instanceGroupManagers.*
  .../regions/R/instanceGroupManagers               regionInstanceGroupManagers.*, the same set:
      POST (insert: name, instanceTemplate or versions[0].instanceTemplate, targetSize (default
      0), baseInstanceName (default: the name), statefulPolicy, instanceLifecyclePolicy,
      updatePolicy, description, distributionPolicy (regional)), GET (list), GET .../N, DELETE
      .../N (the group and its members), POST .../N/resize?size=S, POST .../N/deleteInstances,
      POST .../N/abandonInstances, POST .../N/listManagedInstances (paged only when the group's
      listManagedInstancesResults is PAGINATED, as the API does)
  GET    .../zones/Z/operations/O, POST .../zones/Z/operations/O/wait, and the same under
         regions/R and global: zoneOperations, regionOperations, globalOperations get / wait.
Resources carry kind, id (a decimal string), creationTimestamp, selfLink
(https://www.googleapis.com/compute/v1/projects/P/...), and a group its zone or region URL,
instanceGroup, versions, fingerprint, currentActions, status, targetSize, updatePolicy,
instanceLifecyclePolicy and listManagedInstancesResults. Mutations answer 200 with a
compute#operation (kind, id, name operation-..., operationType, targetLink, targetId, status,
progress, user, insertTime, startTime, endTime, selfLink, zone / region URL).

Operations: the answer to the mutating call says RUNNING; each later get or wait counts one
poll, and the operation is DONE once operation_polls polls have seen it RUNNING (default 0: the
first get/wait says DONE) and operation_seconds have passed since it began (default 0). wait
blocks until then, at most wait_cap_s (default 2 s; the real API waits up to 2 minutes), and
answers RUNNING if it is still not done, as the real one does. A failed operation is DONE with
error.errors[{code, message}], httpErrorStatusCode and httpErrorMessage. The effect of a call
(a group created, members deleted, a size changed) is applied when the call is accepted; the
operation only reports. requestId (a UUID, else 400) makes a mutation idempotent: the same
requestId answers the first call's operation and applies nothing again.

deleteInstances / abandonInstances: body {"instances": [...], "skipInstancesOnValidationError":
bool}. An entry is a full URL (https://www.googleapis.com/compute/v1/...,
https://compute.googleapis.com/compute/v1/..., or this fake's endpoint), a partial URL
(projects/P/zones/Z/instances/N or zones/Z/instances/N) or, for zonal groups, a bare name (URLs
and names not mixed). A malformed entry, an instance in a zone outside the group's zone or
region, another project, or an empty list: 400 invalid, nothing applied. A well-formed
non-member (or a listed twice instance): with skip, skipped; without, the call fails and nothing
is applied: by default (non_member_error="operation") as the API reference says, "the
operation fails": 200, then an operation that is DONE with error code CONDITION_NOT_MET; with
non_member_error="request", a 400 invalid at once (which of the two the real API does is not
confirmed). The deleted members disappear from the group at once (no DELETING phase) and
targetSize drops by the number actually deleted; abandoned ones stay as plain instances without
created-by. resize sets targetSize only. instances.delete of a member removes it from the group
WITHOUT lowering targetSize (what makes a real MIG recreate it) and is recorded in
deleted_outside_group() (so is instances.stop of a member). The fake never creates or deletes
members by itself unless create_members=True (then insert and resize add members named
BASE-xxxx, RUNNING, and a resize down removes the newest): the test is the group's controller
(add_group, add_member, remove_member, set_member_status), recreating a member with the same
name as a MIG does.

Strictness: the bearer token on every call (none, or one token_ok refuses: 401); unknown
paths, methods, projects, zones, regions and resources: 404 notFound ("The resource '...' was
not found"); deny(permission) answers 403 forbidden "Required 'PERMISSION' permission for
'RESOURCE'" (checked before existence, as IAM is); a duplicate insert 409 alreadyExists; bad
names, sizes, bodies, unknown top-level body fields ("Unknown name"), bad JSON: 400 invalid /
parseError. Permissions: compute.instances.get/stop/delete, compute.instanceTemplates.create/
get/list/delete, compute.instanceGroupManagers.create/get/list/delete/update (update for
resize, deleteInstances, abandonInstances; get for listManagedInstances),
compute.zoneOperations.get / regionOperations.get / globalOperations.get (get and wait).
Errors are {"error": {"code", "message", "errors": [{"message", "domain": "global",
"reason"}]}}. fail_next(call, code) answers a transient error (503 by default) before anything
is applied.

Not implemented: instance insert/start and every other instance method, regional instance
templates, autoscalers, per-instance configs, health checks and auto-healing, update policies
beyond storing them, instance flexibility, target pools, aggregated lists, filters and orderBy,
operation list/delete, real IAM (everything is allowed unless deny()), quotas, HTTPS, the real
texts of messages not quoted above, and the real instance life cycle (stop leaves the instance
STOPPING; tests move it with set_status / set_member_status).

Zones: zones= (default: the given zone and the -a, -b, -c, -f zones of its region); regions
are theirs. A regional group's zones are its distributionPolicy's, by default the region's
first three; its members spread over them.

    srv = FakeComputeServer("my-project", "us-central1-a", "trainer-7", token_ok=lambda t: t == "tok",
                            project_number="123456789", operation_polls=0, operation_seconds=0.0,
                            non_member_error="operation", create_members=False).start()
    srv.endpoint; srv.status (the VM's own, settable); srv.deny(perm); srv.allow(perm)
    srv.log()                 # every request: method, path, token, time, call, status
    srv.calls()               # [(call, resource)], e.g. ("instanceGroupManagers.deleteInstances",
                              #  "projects/P/zones/Z/instanceGroupManagers/G")
    srv.add_group("trainers", zone=None, region=None, target_size=None, members=["trainer-7"])
    srv.add_member("trainers", "trainers-ab12", zone=None, status="RUNNING", current_action="NONE")
    srv.members("trainers")   # [{name, zone, status, current_action, url, id}]
    srv.target_size("trainers"); srv.set_target_size("trainers", 3); srv.group("trainers")
    srv.set_member_status("trainers-ab12", "STOPPING", current_action=None); srv.remove_member(name)
    srv.add_instance(name, zone=None); srv.set_status(name, status); srv.template(name)
    srv.deleted_outside_group()   # [{group, instance, zone, call}]: instances.delete/stop on members
    srv.operations(); srv.fail_next(call, code=503, count=1)
    srv.wait_for(lambda: srv.target_size("trainers") == 2, timeout=5.0)
    srv.stop()
(group-taking methods accept location= when a zonal and a regional group share a name).

As a process:
    fake_compute.py serve --project P --zone Z --instance N [--project-number NUM] [--port 0]
                          [--port-file F] [--token T]
prints "fake-compute listening on http://127.0.0.1:PORT/compute/v1" (after writing the port
file) and runs until SIGTERM/SIGINT.
"""
import argparse
import base64
import datetime
import itertools
import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback_json import JsonServer  # noqa: E402

SELF_LINK_BASE = "https://www.googleapis.com/compute/v1"
_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_BASE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,57})$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_API_TZ = datetime.timezone(datetime.timedelta(hours=-7))  # the API answers in Pacific time
_HTTP_REASON = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 409: "CONFLICT", 412: "PRECONDITION FAILED"}

# Top-level fields the API knows (an unknown one is 400 "Unknown name").
_IGM_FIELDS = {
    "allInstancesConfig", "autoHealingPolicies", "baseInstanceName", "creationTimestamp", "currentActions",
    "description", "distributionPolicy", "fingerprint", "id", "instanceFlexibilityPolicy", "instanceGroup",
    "instanceLifecyclePolicy", "instanceTemplate", "kind", "listManagedInstancesResults", "name", "namedPorts",
    "region", "resourcePolicies", "satisfiesPzi", "satisfiesPzs", "selfLink", "standbyPolicy", "statefulPolicy",
    "status", "targetPools", "targetSize", "targetSizePolicy", "targetStoppedSize", "targetSuspendedSize",
    "updatePolicy", "versions", "zone"}
_TEMPLATE_FIELDS = {"creationTimestamp", "description", "id", "kind", "name", "properties", "region", "selfLink",
                    "sourceInstance", "sourceInstanceParams"}
_ACTIONS = ["abandoning", "creating", "creatingWithoutRetries", "deleting", "none", "recreating", "refreshing",
            "restarting", "resuming", "starting", "stopping", "suspending", "verifying"]
_INSTANCE_STATUSES = {"PROVISIONING", "STAGING", "RUNNING", "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED",
                      "REPAIRING", "TERMINATED", "PENDING", "PENDING_STOP", "DEPROVISIONING"}


class ApiError(Exception):
    def __init__(self, code, message, reason):
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason


def _not_found(resource):
    return ApiError(404, f"The resource '{resource}' was not found", "notFound")


def _invalid(message):
    return ApiError(400, message, "invalid")


def _rfc3339(t):
    return datetime.datetime.fromtimestamp(t, _API_TZ).isoformat(timespec="milliseconds")


def _region_of(zone):
    return zone.rsplit("-", 1)[0]


# (HTTP method, path after /compute/v1/projects/P/, handler: _h_<handler>)
_ROUTES = [(m, re.compile(p + "$"), h) for m, p, h in [
    ("GET", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "instance_get"),
    ("POST", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/stop", "instance_stop"),
    ("DELETE", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "instance_delete"),
    ("POST", r"global/instanceTemplates", "template_insert"),
    ("GET", r"global/instanceTemplates", "template_list"),
    ("GET", r"global/instanceTemplates/(?P<name>[^/]+)", "template_get"),
    ("DELETE", r"global/instanceTemplates/(?P<name>[^/]+)", "template_delete"),
    ("POST", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/instanceGroupManagers", "igm_insert"),
    ("GET", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/instanceGroupManagers", "igm_list"),
    ("GET", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)", "igm_get"),
    ("DELETE", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)", "igm_delete"),
    ("POST", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)/resize", "igm_resize"),
    ("POST", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)/deleteInstances",
     "igm_delete_instances"),
    ("POST", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)/abandonInstances",
     "igm_abandon_instances"),
    ("POST", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/instanceGroupManagers/(?P<name>[^/]+)/listManagedInstances",
     "igm_list_managed"),
    ("GET", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/operations/(?P<name>[^/]+)", "op_get"),
    ("POST", r"(?P<kind>zones|regions)/(?P<loc>[^/]+)/operations/(?P<name>[^/]+)/wait", "op_wait"),
    ("GET", r"(?P<kind>global)/operations/(?P<name>[^/]+)", "op_get"),
    ("POST", r"(?P<kind>global)/operations/(?P<name>[^/]+)/wait", "op_wait"),
]]

# handler -> (call name as "resource.method" with {igm} for the group flavour, IAM permission)
_CALLS = {
    "instance_get": ("instances.get", "compute.instances.get"),
    "instance_stop": ("instances.stop", "compute.instances.stop"),
    "instance_delete": ("instances.delete", "compute.instances.delete"),
    "template_insert": ("instanceTemplates.insert", "compute.instanceTemplates.create"),
    "template_list": ("instanceTemplates.list", "compute.instanceTemplates.list"),
    "template_get": ("instanceTemplates.get", "compute.instanceTemplates.get"),
    "template_delete": ("instanceTemplates.delete", "compute.instanceTemplates.delete"),
    "igm_insert": ("{igm}.insert", "compute.instanceGroupManagers.create"),
    "igm_list": ("{igm}.list", "compute.instanceGroupManagers.list"),
    "igm_get": ("{igm}.get", "compute.instanceGroupManagers.get"),
    "igm_delete": ("{igm}.delete", "compute.instanceGroupManagers.delete"),
    "igm_resize": ("{igm}.resize", "compute.instanceGroupManagers.update"),
    "igm_delete_instances": ("{igm}.deleteInstances", "compute.instanceGroupManagers.update"),
    "igm_abandon_instances": ("{igm}.abandonInstances", "compute.instanceGroupManagers.update"),
    "igm_list_managed": ("{igm}.listManagedInstances", "compute.instanceGroupManagers.get"),
    "op_get": ("{ops}.get", "compute.{ops}.get"),
    "op_wait": ("{ops}.wait", "compute.{ops}.get"),
}
_OPS = {"zones": "zoneOperations", "regions": "regionOperations", "global": "globalOperations"}


class FakeComputeServer:
    def __init__(self, project, zone, instance, token_ok=lambda token: bool(token), host="127.0.0.1", port=0, *,
                 project_number="123456789", zones=None, instances=(), operation_polls=0, operation_seconds=0.0,
                 wait_cap_s=2.0, non_member_error="operation", create_members=False,
                 service_account=None, seed=None):
        """zones: the zones that exist (default: `zone` and the a/b/c/f zones of its region);
        regions are those of the zones. instances: more instances (names in `zone`, or
        (name, zone) pairs) besides `instance`."""
        if non_member_error not in ("operation", "request"):
            raise ValueError("non_member_error must be 'operation' or 'request'")
        self.project, self.zone, self.instance = project, zone, instance
        self.project_number = str(project_number)
        region = _region_of(zone)
        self.zones = sorted(set(zones or [zone] + [f"{region}-{c}" for c in "abcf"]) | {zone})
        self.operation_polls, self.operation_seconds, self.wait_cap_s = operation_polls, operation_seconds, wait_cap_s
        self.non_member_error, self.create_members = non_member_error, create_members
        self.user = service_account or f"{self.project_number}-compute@developer.gserviceaccount.com"
        self._rand = random.Random(seed)
        self._token_ok = token_ok
        self._denied = set()
        self._faults = []
        self._log, self._calls, self._outside = [], [], []
        self._instances = {}    # (zone, name) -> record; deleted ones stay with status DELETED
        self._templates = {}    # name -> resource
        self._groups = {}       # (kind, location, name) -> record
        self._ops = {}          # name -> record
        self._request_ids = {}  # requestId -> operation name
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stopping = False
        self._seq = itertools.count()
        self._new_instance(zone, instance)
        for spec in instances:
            name, z = (spec, zone) if isinstance(spec, str) else spec
            self._require_zone(z)
            self._new_instance(z, name)
        self._http = JsonServer(self._serve_request, host, port)
        self.port = self._http.port

    # ------------------------------------------------------------ life cycle
    def start(self):
        self._http.start()
        return self

    def stop(self):
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        # JsonServer.stop() waits for serve_forever's next look at its shutdown flag, up to its
        # 0.5 s poll; a connection wakes it sooner (its handler reads nothing and ends).
        stopper = threading.Thread(target=self._http.stop)
        stopper.start()
        while stopper.is_alive():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                pass
            stopper.join(0.01)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}/compute/v1"

    # ------------------------------------------------------------ control API (tests)
    @property
    def status(self):
        """The status of the VM itself (`instance`): RUNNING, STOPPING after stop, DELETED after delete."""
        with self._lock:
            return self._instances[(self.zone, self.instance)]["status"]

    @status.setter
    def status(self, value):
        with self._lock:
            self._instances[(self.zone, self.instance)]["status"] = value
            self._changed.notify_all()

    def deny(self, permission):
        """Answer 403 to every call needing this permission (e.g. compute.instances.stop)."""
        with self._lock:
            self._denied.add(permission)

    def allow(self, permission):
        with self._lock:
            self._denied.discard(permission)

    def fail_next(self, call, code=503, count=1):
        """The next `count` calls named `call` (e.g. "instanceGroupManagers.deleteInstances") answer
        `code` (backendError / rateLimitExceeded for 429) before anything is applied."""
        with self._lock:
            self._faults.append({"call": call, "code": code, "count": count})

    def log(self):
        """Every request: method, path, token, time, call (None for an unknown path), status."""
        with self._lock:
            return [dict(e) for e in self._log]

    def calls(self):
        """[(call, resource)] in order for every authenticated request that named a method, e.g.
        ("regionInstanceGroupManagers.deleteInstances", "projects/P/regions/R/instanceGroupManagers/G")."""
        with self._lock:
            return list(self._calls)

    def operations(self):
        with self._lock:
            return [self._render_op(op) for op in self._ops.values()]

    def add_instance(self, name, zone=None, status="RUNNING"):
        """A plain instance (no group)."""
        with self._lock:
            zone = zone or self.zone
            self._require_zone(zone)
            self._require_status(status)
            if self._live(zone, name):
                raise ValueError(f"instance {zone}/{name} exists")
            self._new_instance(zone, name, status=status)
            self._changed.notify_all()

    def set_status(self, name, status, zone=None):
        """Any instance's status (RUNNING, STOPPING, TERMINATED, ...)."""
        with self._lock:
            self._require_status(status)
            inst = self._find_instance(name, zone)
            inst["status"] = status
            self._changed.notify_all()

    def add_group(self, name, *, zone=None, region=None, target_size=None, members=(), template=None,
                  base_instance_name=None, stateful_policy=None, instance_lifecycle_policy=None):
        """A group as if inserted through the API (zonal in `zone`, default the fake's zone, or
        regional in `region`), using instance template `template` (created with machineType
        e2-small if missing; default NAME-template), then add_member() for each name in
        `members`. target_size defaults to len(members). Returns the group resource."""
        if zone and region:
            raise ValueError("a group is zonal (zone=) or regional (region=), not both")
        kind, loc = ("regions", region) if region else ("zones", zone or self.zone)
        template = template or f"{name}-template"
        with self._lock:
            if template not in self._templates:
                self._store_template({"name": template, "properties": {"machineType": "e2-small"}})
            data = {"name": name, "instanceTemplate": f"global/instanceTemplates/{template}",
                    "targetSize": len(members) if target_size is None else target_size}
            for k, v in (("baseInstanceName", base_instance_name), ("statefulPolicy", stateful_policy),
                         ("instanceLifecyclePolicy", instance_lifecycle_policy)):
                if v is not None:
                    data[k] = v
            try:
                (self._require_region if kind == "regions" else self._require_zone)(loc)
                self._create_group(kind, loc, data)
            except ApiError as e:
                raise ValueError(e.message)
            for m in members:
                self.add_member(name, m, location=loc)
            return self.group(name, location=loc)

    def add_member(self, igm_name, instance_name, zone=None, status="RUNNING", current_action="NONE", location=None):
        """The group's controller creating a member (or recreating one with the same name): an
        instance with created-by = projects/NUMBER/{zones|regions}/L/instanceGroupManagers/NAME. A
        regional group's member goes to `zone`, or to the group's zone with the fewest members.
        An existing instance in no group (the VM itself, say) is adopted as it is."""
        with self._lock:
            self._require_status(status)
            g = self._group_by_name(igm_name, location)
            if zone is None:
                existing = [i for (z, n), i in self._instances.items() if n == instance_name
                            and i["status"] != "DELETED"]
                zone = existing[0]["zone"] if len(existing) == 1 else self._pick_zone(g)
            if zone not in self._group_zones(g):
                raise ValueError(f"zone {zone} is not one of group {igm_name}'s zones {self._group_zones(g)}")
            inst = self._live(zone, instance_name)
            if inst is not None and inst["group"] is not None:
                raise ValueError(f"instance {zone}/{instance_name} is already a member of {inst['group'][2]}")
            if inst is not None:
                inst["group"], inst["current_action"] = g["key"], current_action
            else:
                self._new_instance(zone, instance_name, status=status, group=g["key"], current_action=current_action)
            self._changed.notify_all()

    def members(self, igm_name, location=None):
        """[{name, zone, status, current_action, url, id}] in creation order."""
        with self._lock:
            g = self._group_by_name(igm_name, location)
            return [{"name": i["name"], "zone": i["zone"], "status": i["status"],
                     "current_action": i["current_action"], "url": self._instance_url(i), "id": i["id"]}
                    for i in self._members(g["key"])]

    def target_size(self, igm_name, location=None):
        with self._lock:
            return self._group_by_name(igm_name, location)["resource"]["targetSize"]

    def set_target_size(self, igm_name, size, location=None):
        with self._lock:
            self._group_by_name(igm_name, location)["resource"]["targetSize"] = size
            self._changed.notify_all()

    def group(self, igm_name, location=None):
        """The stored group resource as the API renders it, or None."""
        with self._lock:
            try:
                g = self._group_by_name(igm_name, location)
            except KeyError:
                return None
            return json.loads(json.dumps(self._render_group(g)))

    def set_member_status(self, name, status=None, current_action=None, zone=None):
        """A member's instanceStatus (RUNNING, STOPPING, TERMINATED, ...) and/or its currentAction
        (NONE, CREATING, RECREATING, DELETING, ...), as listManagedInstances shows them."""
        with self._lock:
            if status is not None:
                self._require_status(status)
            inst = self._find_instance(name, zone)
            if inst["group"] is None:
                raise ValueError(f"instance {name} is not a member of any group")
            if status is not None:
                inst["status"] = status
            if current_action is not None:
                inst["current_action"] = current_action
            self._changed.notify_all()

    def remove_member(self, name, zone=None):
        """The member vanishes (deleted by the controller, say); targetSize is unchanged."""
        with self._lock:
            inst = self._find_instance(name, zone)
            if inst["group"] is None:
                raise ValueError(f"instance {name} is not a member of any group")
            inst["status"], inst["group"] = "DELETED", None
            self._changed.notify_all()

    def template(self, name):
        with self._lock:
            t = self._templates.get(name)
            return json.loads(json.dumps(t)) if t else None

    def deleted_outside_group(self):
        """[{group, instance, zone, call}]: members deleted (or stopped) with instances.delete /
        instances.stop rather than through their group: a real MIG would bring them back."""
        with self._lock:
            return [dict(e) for e in self._outside]

    def wait_for(self, predicate, timeout=5.0):
        """Block until predicate() is true (re-checked whenever the fake's state changes);
        returns whether it became true within `timeout` seconds."""
        with self._lock:
            return self._changed.wait_for(predicate, timeout)

    # ------------------------------------------------------------ HTTP
    @staticmethod
    def _error_body(code, message, reason):
        return {"error": {"code": code, "message": message,
                          "errors": [{"message": message, "domain": "global", "reason": reason}]}}

    def _serve_request(self, method, raw_path, headers, body):
        auth = headers.get("Authorization", "") or ""
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        path, _, query = raw_path.partition("?")
        entry = {"method": method, "path": path, "token": token, "time": time.time(), "call": None, "status": None}
        with self._lock:
            self._log.append(entry)
        try:
            code, answer = self._dispatch(method, path, query, token, body, entry)
        except ApiError as e:
            code, answer = e.code, self._error_body(e.code, e.message, e.reason)
        except Exception as e:  # a bug in the fake: say so rather than hang up
            code, answer = 500, self._error_body(500, f"fake_compute.py bug: {e!r}", "backendError")
        with self._lock:
            entry["status"] = code
            self._changed.notify_all()
        return code, answer

    def _dispatch(self, method, path, query, token, body, entry):
        see = ("Expected OAuth 2 access token, login cookie or other valid authentication credential. "
               "See https://developers.google.com/identity/sign-in/web/devconsole-project.")
        if not token:
            raise ApiError(401, f"Request is missing required authentication credential. {see}", "required")
        if not self._token_ok(token):
            raise ApiError(401, f"Request had invalid authentication credentials. {see}", "authError")
        m = re.match(r"^/compute/v1/projects/([^/]+)/(.+)$", path)
        route = None
        if m:
            rest = m.group(2)
            for verb, pattern, handler in _ROUTES:
                pm = pattern.match(rest)
                if pm and verb == method:
                    route = (handler, pm.groupdict())
                    break
        if route is None:
            raise ApiError(404, f"The requested URL {path} was not found.", "notFound")
        project = urllib.parse.unquote(m.group(1))
        handler, params = route
        params = {k: urllib.parse.unquote(v) for k, v in params.items()}
        params["project"] = project
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
        kind = params.get("kind")
        name_tpl, perm_tpl = _CALLS[handler]
        fmt = {"igm": "regionInstanceGroupManagers" if kind == "regions" else "instanceGroupManagers",
               "ops": _OPS.get(kind, "")}
        call, permission = name_tpl.format(**fmt), perm_tpl.format(**fmt)
        resource = self._call_resource(handler, path, project, body)
        with self._lock:
            entry["call"] = call
            self._calls.append((call, resource))
            if permission in self._denied:
                raise ApiError(403, f"Required '{permission}' permission for '{resource}'", "forbidden")
            self._take_fault(call)
            # A missing item is named in full; a collection call names the missing project or scope.
            collection = handler in ("template_insert", "template_list", "igm_insert", "igm_list")
            if project not in (self.project, self.project_number):
                raise _not_found(f"projects/{project}" if collection else resource)
            if kind in ("zones", "regions"):
                scope = f"projects/{project}/{kind}/{params['loc']}"
                (self._check_zone if kind == "zones" else self._check_region)(params["loc"],
                                                                              scope if collection else resource)
            if "zone" in params:
                self._check_zone(params["zone"], resource)
        if handler == "op_wait":
            return 200, self._op_wait(params)
        with self._lock:
            return getattr(self, "_h_" + handler)(params, q, body)

    @staticmethod
    def _call_resource(handler, path, project, body):
        rest = path.split("/compute/v1/", 1)[1]
        parts = rest.split("/")
        if handler in ("template_insert", "igm_insert"):
            try:  # IAM names the resource being created
                name = json.loads(body or b"{}").get("name")
            except (ValueError, AttributeError):
                name = None
            return f"{rest}/{name}" if isinstance(name, str) and name else rest
        if handler in ("template_list", "igm_list"):
            return f"projects/{project}"
        if handler in ("instance_stop", "igm_resize", "igm_delete_instances", "igm_abandon_instances",
                       "igm_list_managed", "op_wait"):
            return "/".join(parts[:-1])
        return rest

    def _take_fault(self, call):
        for f in self._faults:
            if f["call"] == call:
                f["count"] -= 1
                if f["count"] <= 0:
                    self._faults.remove(f)
                reason = {429: "rateLimitExceeded", 500: "backendError", 503: "backendError"}.get(f["code"], "error")
                message = ("Internal error. Please try again or contact Google Support." if f["code"] >= 500
                           else "Rate Limit Exceeded")
                raise ApiError(f["code"], message, reason)

    # ------------------------------------------------------------ helpers
    def _new_id(self):
        return str(self._rand.randrange(10 ** 18, 2 ** 63))

    def _require_zone(self, zone):
        if zone not in self.zones:
            raise ValueError(f"unknown zone {zone}: the fake's zones are {self.zones}")

    def _require_region(self, region):
        if region not in {_region_of(z) for z in self.zones}:
            raise ValueError(f"unknown region {region}: the fake's zones are {self.zones}")

    @staticmethod
    def _require_status(status):
        if status not in _INSTANCE_STATUSES:
            raise ValueError(f"unknown instance status {status}: one of {sorted(_INSTANCE_STATUSES)}")

    def _check_zone(self, zone, resource=None):
        if zone not in self.zones:
            raise _not_found(resource or f"projects/{self.project}/zones/{zone}")

    def _check_region(self, region, resource=None):
        if region not in {_region_of(z) for z in self.zones}:
            raise _not_found(resource or f"projects/{self.project}/regions/{region}")

    def _live(self, zone, name):
        inst = self._instances.get((zone, name))
        return inst if inst and inst["status"] != "DELETED" else None

    def _new_instance(self, zone, name, status="RUNNING", group=None, current_action="NONE"):
        self._instances.pop((zone, name), None)  # a deleted one's tombstone: recreated with the same name
        self._instances[(zone, name)] = {"name": name, "zone": zone, "status": status, "id": self._new_id(),
                                         "created": time.time(), "group": group, "current_action": current_action,
                                         "seq": next(self._seq)}
        return self._instances[(zone, name)]

    def _find_instance(self, name, zone=None):
        found = [i for (z, n), i in self._instances.items()
                 if n == name and (zone is None or z == zone) and i["status"] != "DELETED"]
        if not found:
            raise KeyError(f"no instance {name}" + (f" in {zone}" if zone else ""))
        if len(found) > 1:
            raise ValueError(f"instance {name} exists in several zones: pass zone=")
        return found[0]

    def _instance_url(self, inst):
        return f"{SELF_LINK_BASE}/projects/{self.project}/zones/{inst['zone']}/instances/{inst['name']}"

    def _members(self, key):
        return [i for i in sorted(self._instances.values(), key=lambda i: i["seq"])
                if i["group"] == key and i["status"] != "DELETED"]

    def _group_by_name(self, name, location=None):
        found = [g for (k, loc, n), g in self._groups.items() if n == name and location in (None, loc)]
        if not found:
            raise KeyError(f"no group {name}")
        if len(found) > 1:
            raise ValueError(f"several groups named {name}: pass location=")
        return found[0]

    def _group_zones(self, g):
        kind, loc, _ = g["key"]
        return [loc] if kind == "zones" else g["zones"]

    def _pick_zone(self, g):
        zones = self._group_zones(g)
        counts = {z: 0 for z in zones}
        for i in self._members(g["key"]):
            counts[i["zone"]] = counts.get(i["zone"], 0) + 1
        return min(zones, key=lambda z: (counts[z], zones.index(z)))

    def _scope_url(self, kind, loc):
        return f"{SELF_LINK_BASE}/projects/{self.project}/{kind}/{loc}"

    def _group_path(self, key, project=None):
        kind, loc, name = key
        return f"projects/{project or self.project}/{kind}/{loc}/instanceGroupManagers/{name}"

    @staticmethod
    def _parse_body(body):
        if not body or not body.strip():
            raise _invalid("Required field 'resource' not specified")
        try:
            data = json.loads(body)
        except ValueError:
            raise ApiError(400, "Invalid JSON payload received. Unexpected token.", "parseError")
        if not isinstance(data, dict):
            raise ApiError(400, "Invalid JSON payload received. Expected an object.", "parseError")
        return data

    @staticmethod
    def _check_fields(data, known):
        for k in data:
            if k not in known:
                raise ApiError(400, f"Invalid JSON payload received. Unknown name \"{k}\": Cannot find field.",
                               "invalid")

    @staticmethod
    def _check_name(name, field="resource.name"):
        if not isinstance(name, str) or not _NAME.match(name):
            raise _invalid(f"Invalid value for field '{field}': '{name if name is not None else ''}'. Must be a "
                           "match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'")

    def _request_id(self, q):
        rid = q.get("requestId")
        if rid is None:
            return None
        if not _UUID.match(rid) or rid == "00000000-0000-0000-0000-000000000000":
            raise _invalid(f"Invalid value for field 'requestId': '{rid}'. The request ID must be a valid UUID.")
        return rid

    def _replayed(self, q):
        rid = self._request_id(q)
        if rid and rid in self._request_ids:
            return self._render_op(self._ops[self._request_ids[rid]])
        return None

    # ------------------------------------------------------------ operations
    def _operation(self, q, scope, op_type, target_link, target_id, error=None):
        kind, loc = scope
        now = time.time()
        name = (f"operation-{int(now * 1000)}-{self._rand.getrandbits(52):013x}-"
                f"{self._rand.getrandbits(32):08x}-{self._rand.getrandbits(32):08x}")
        op = {"name": name, "kind": kind, "loc": loc, "id": self._new_id(), "type": op_type, "target": target_link,
              "target_id": target_id, "start": now, "polls": 0, "need_polls": self.operation_polls,
              "ready_at": now + self.operation_seconds, "done_at": None, "error": error}
        self._ops[name] = op
        rid = self._request_id(q)
        if rid:
            self._request_ids[rid] = name
        return self._render_op(op)

    def _op_done(self, op):
        """DONE once more than need_polls gets/waits have asked and ready_at has come."""
        if op["done_at"] is None and op["polls"] > op["need_polls"] and time.time() >= op["ready_at"]:
            op["done_at"] = time.time()
        return op["done_at"] is not None

    def _render_op(self, op):
        done = op["done_at"] is not None
        r = {"kind": "compute#operation", "id": op["id"], "name": op["name"], "operationType": op["type"],
             "targetLink": op["target"], "targetId": op["target_id"], "status": "DONE" if done else "RUNNING",
             "user": self.user, "progress": 100 if done else 0, "insertTime": _rfc3339(op["start"]),
             "startTime": _rfc3339(op["start"])}
        if op["kind"] == "global":
            r["selfLink"] = f"{SELF_LINK_BASE}/projects/{self.project}/global/operations/{op['name']}"
        else:
            r["zone" if op["kind"] == "zones" else "region"] = self._scope_url(op["kind"], op["loc"])
            r["selfLink"] = f"{self._scope_url(op['kind'], op['loc'])}/operations/{op['name']}"
        if done:
            r["endTime"] = _rfc3339(op["done_at"])
            if op["error"]:
                code, http_code, message = op["error"]
                r["error"] = {"errors": [{"code": code, "message": message}]}
                r["httpErrorStatusCode"] = http_code
                r["httpErrorMessage"] = _HTTP_REASON.get(http_code, "BAD REQUEST")
        return r

    def _find_op(self, params):
        kind, loc = params["kind"], params.get("loc")
        op = self._ops.get(params["name"])
        if op is None or op["kind"] != kind or op["loc"] != loc:
            scope = "global" if kind == "global" else f"{kind}/{loc}"
            raise _not_found(f"projects/{params['project']}/{scope}/operations/{params['name']}")
        return op

    def _h_op_get(self, params, q, body):
        op = self._find_op(params)
        op["polls"] += 1
        self._op_done(op)
        return 200, self._render_op(op)

    def _op_wait(self, params):
        with self._lock:
            op = self._find_op(params)
            op["polls"] += 1
            if op["polls"] > op["need_polls"]:  # else: a poll that still counts; answer RUNNING at once
                deadline = time.time() + self.wait_cap_s
                while not self._op_done(op) and not self._stopping:
                    now = time.time()
                    if now >= deadline:
                        break  # the cap: answer RUNNING, as the API does after its 2 minutes
                    self._changed.wait(max(0.001, min(deadline, op["ready_at"]) - now))
            return self._render_op(op)

    # ------------------------------------------------------------ instances
    def _instance_or_404(self, params):
        inst = self._live(params["zone"], params["name"])
        if inst is None:
            raise _not_found(f"projects/{params['project']}/zones/{params['zone']}/instances/{params['name']}")
        return inst

    def _h_instance_get(self, params, q, body):
        inst = self._instance_or_404(params)
        r = {"kind": "compute#instance", "id": inst["id"], "creationTimestamp": _rfc3339(inst["created"]),
             "name": inst["name"], "status": inst["status"], "zone": self._scope_url("zones", inst["zone"]),
             "selfLink": self._instance_url(inst)}
        g = self._groups.get(inst["group"]) if inst["group"] else None
        if g:
            kind, loc, name = g["key"]
            template = g["resource"]["instanceTemplate"].split("/compute/v1/", 1)[-1]
            template = template.replace(f"projects/{self.project}/", f"projects/{self.project_number}/", 1)
            r["metadata"] = {"kind": "compute#metadata", "fingerprint": g["resource"]["fingerprint"], "items": [
                {"key": "instance-template", "value": template},
                {"key": "created-by", "value": self._group_path(g["key"], self.project_number)}]}
        return 200, r

    def _instance_verb(self, params, q, verb):
        replay = self._replayed(q)
        if replay:
            return 200, replay
        inst = self._instance_or_404(params)
        if inst["group"] is not None:
            self._outside.append({"group": inst["group"][2], "instance": inst["name"], "zone": inst["zone"],
                                  "call": f"instances.{verb}"})
        if verb == "stop":
            inst["status"] = "STOPPING"
        else:
            inst["status"] = "DELETED"
            inst["group"] = None  # gone from the group; the group's targetSize is left as it was
        return 200, self._operation(q, ("zones", inst["zone"]), verb, self._instance_url(inst), inst["id"])

    def _h_instance_stop(self, params, q, body):
        return self._instance_verb(params, q, "stop")

    def _h_instance_delete(self, params, q, body):
        return self._instance_verb(params, q, "delete")

    # ------------------------------------------------------------ instance templates
    def _template_or_404(self, params):
        t = self._templates.get(params["name"])
        if t is None:
            raise _not_found(f"projects/{params['project']}/global/instanceTemplates/{params['name']}")
        return t

    def _h_template_insert(self, params, q, body):
        replay = self._replayed(q)
        if replay:
            return 200, replay
        data = self._parse_body(body)
        self._check_fields(data, _TEMPLATE_FIELDS)
        self._check_name(data.get("name"))
        props = data.get("properties")
        if not isinstance(props, dict) or not props.get("machineType"):
            raise _invalid("Invalid value for field 'resource.properties.machineType': ''. "
                           "Machine type must be specified.")
        if data["name"] in self._templates:
            raise ApiError(409, f"The resource 'projects/{self.project}/global/instanceTemplates/{data['name']}' "
                           "already exists", "alreadyExists")
        t = self._store_template(data)
        return 200, self._operation(q, ("global", None), "compute.instanceTemplates.insert", t["selfLink"], t["id"])

    def _store_template(self, data):
        name = data["name"]
        t = {"kind": "compute#instanceTemplate", "id": self._new_id(), "creationTimestamp": _rfc3339(time.time()),
             "name": name, "properties": data["properties"],
             "selfLink": f"{SELF_LINK_BASE}/projects/{self.project}/global/instanceTemplates/{name}"}
        if data.get("description"):
            t["description"] = data["description"]
        self._templates[name] = t
        return t

    def _h_template_get(self, params, q, body):
        return 200, self._template_or_404(params)

    def _h_template_list(self, params, q, body):
        items = sorted(self._templates.values(), key=lambda t: t["name"])
        return 200, self._page(q, items, "compute#instanceTemplateList",
                               f"{SELF_LINK_BASE}/projects/{self.project}/global/instanceTemplates")

    def _h_template_delete(self, params, q, body):
        replay = self._replayed(q)
        if replay:
            return 200, replay
        t = self._template_or_404(params)
        for g in self._groups.values():
            if g["resource"]["instanceTemplate"] == t["selfLink"]:
                raise ApiError(400, f"The instance_template resource 'projects/{self.project}/global/"
                               f"instanceTemplates/{t['name']}' is already being used by "
                               f"'{self._group_path(g['key'])}'", "resourceInUseByAnotherResource")
        del self._templates[t["name"]]
        return 200, self._operation(q, ("global", None), "compute.instanceTemplates.delete", t["selfLink"], t["id"])

    def _page(self, q, items, kind, self_link, field="items", with_header=True):
        try:
            size = int(q.get("maxResults", 500))
            start = int(q.get("pageToken") or 0)
        except ValueError:
            raise _invalid("Invalid value for field 'pageToken' or 'maxResults'")
        size = max(1, min(size, 500))
        page = items[start:start + size]
        r = {"kind": kind, "id": self_link.split("/compute/v1/", 1)[1], "selfLink": self_link} if with_header else {}
        if page:
            r[field] = page
        if start + size < len(items):
            r["nextPageToken"] = str(start + size)
        return r

    # ------------------------------------------------------------ instance group managers
    def _template_link(self, value, field):
        m = re.match(r"^(?:(?:https://(?:www|compute)\.googleapis\.com/compute/v1/|"
                     + re.escape(self.endpoint) + r"/)?projects/([^/]+)/)?global/instanceTemplates/([^/]+)$",
                     value or "")
        if not m:
            raise _invalid(f"Invalid value for field '{field}': '{value or ''}'. The URL is malformed.")
        project, name = m.groups()
        if project not in (None, self.project, self.project_number) or name not in self._templates:
            raise _not_found(f"projects/{project or self.project}/global/instanceTemplates/{name}")
        return self._templates[name]["selfLink"]

    def _group_or_404(self, params):
        key = (params["kind"], params["loc"], params["name"])
        g = self._groups.get(key)
        if g is None:
            raise _not_found(f"projects/{params['project']}/{key[0]}/{key[1]}/instanceGroupManagers/{key[2]}")
        return g

    def _render_group(self, g):
        r = dict(g["resource"])
        members = self._members(g["key"])
        actions = {a: 0 for a in _ACTIONS}
        for i in members:
            a = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), i["current_action"].lower())
            actions[a] = actions.get(a, 0) + 1
        r["currentActions"] = actions
        stable = len(members) == r["targetSize"] and all(i["current_action"] == "NONE" for i in members)
        r["status"] = {"isStable": stable, "versionTarget": {"isReached": True},
                       "stateful": {"hasStatefulConfig": "statefulPolicy" in r,
                                    "perInstanceConfigs": {"allEffective": True}},
                       "allInstancesConfig": {"effective": True}}
        return r

    def _h_igm_insert(self, params, q, body):
        replay = self._replayed(q)
        if replay:
            return 200, replay
        kind, loc = params["kind"], params["loc"]
        g = self._create_group(kind, loc, self._parse_body(body))
        r = g["resource"]
        return 200, self._operation(q, (kind, loc), f"compute.{self._igm_api(kind)}.insert", r["selfLink"], r["id"])

    def _create_group(self, kind, loc, data):
        self._check_fields(data, _IGM_FIELDS)
        self._check_name(data.get("name"))
        name = data["name"]
        versions = data.get("versions") or []
        if data.get("instanceTemplate"):
            template = self._template_link(data["instanceTemplate"], "resource.instanceTemplate")
        elif versions and isinstance(versions[0], dict) and versions[0].get("instanceTemplate"):
            template = self._template_link(versions[0]["instanceTemplate"], "resource.versions[0].instanceTemplate")
        else:
            raise _invalid("Invalid value for field 'resource.instanceTemplate': ''. "
                           "Instance template or versions must be specified.")
        size = data.get("targetSize", 0)
        if isinstance(size, str) and re.fullmatch(r"-?\d+", size):
            size = int(size)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _invalid(f"Invalid value for field 'resource.targetSize': '{size}'. Must be greater than or "
                           "equal to 0.")
        base = data.get("baseInstanceName") or name[:58]
        if not _BASE_NAME.match(base):
            raise _invalid(f"Invalid value for field 'resource.baseInstanceName': '{base}'. Must be a match of "
                           "regex '[a-z](([-a-z0-9]{0,57})|([-a-z0-9]{0,51}[0-9]{0,7}))'")
        key = (kind, loc, name)
        link = f"{self._scope_url(kind, loc)}/instanceGroupManagers/{name}"
        if key in self._groups:
            raise ApiError(409, f"The resource '{self._group_path(key)}' already exists", "alreadyExists")
        zones = None
        if kind == "regions":
            zones = self._distribution_zones(loc, data.get("distributionPolicy"))
        spread = len(zones or [loc])
        r = {"kind": "compute#instanceGroupManager", "id": self._new_id(),
             "creationTimestamp": _rfc3339(time.time()), "name": name,
             "instanceGroup": f"{self._scope_url(kind, loc)}/instanceGroups/{name}",
             "instanceTemplate": template, "versions": [{"instanceTemplate": template}],
             "baseInstanceName": base, "fingerprint": self._fingerprint(), "targetSize": size,
             "selfLink": link,
             "updatePolicy": data.get("updatePolicy") or {
                 "type": "OPPORTUNISTIC", "instanceRedistributionType": "PROACTIVE" if zones else "NONE",
                 "minimalAction": "REPLACE", "maxSurge": {"fixed": spread, "calculated": spread},
                 "maxUnavailable": {"fixed": spread, "calculated": spread},
                 "replacementMethod": "SUBSTITUTE"},
             "instanceLifecyclePolicy": data.get("instanceLifecyclePolicy") or {
                 "forceUpdateOnRepair": "NO", "defaultActionOnFailure": "REPAIR"},
             "listManagedInstancesResults": data.get("listManagedInstancesResults") or "PAGELESS"}
        if kind == "zones":
            r["zone"] = self._scope_url(kind, loc)
        else:
            r["region"] = self._scope_url(kind, loc)
            r["distributionPolicy"] = {"zones": [{"zone": self._scope_url("zones", z)} for z in zones],
                                       "targetShape": (data.get("distributionPolicy") or {}).get("targetShape", "EVEN")}
        for k in ("description", "statefulPolicy", "namedPorts", "autoHealingPolicies", "targetPools"):
            if data.get(k):
                r[k] = data[k]
        g = {"key": key, "resource": r, "zones": zones}
        self._groups[key] = g
        if self.create_members:
            self._converge(g)
        return g

    @staticmethod
    def _igm_api(kind):
        return "regionInstanceGroupManagers" if kind == "regions" else "instanceGroupManagers"

    def _fingerprint(self):
        return base64.b64encode(self._rand.getrandbits(64).to_bytes(8, "big")).decode()

    def _distribution_zones(self, region, policy):
        region_zones = [z for z in self.zones if _region_of(z) == region]
        if not policy or not policy.get("zones"):
            return region_zones[:3]
        zones = []
        for i, entry in enumerate(policy["zones"]):
            value = entry.get("zone", "") if isinstance(entry, dict) else ""
            z = value.rstrip("/").split("/")[-1]
            if z not in region_zones:
                raise _invalid(f"Invalid value for field 'resource.distributionPolicy.zones[{i}].zone': '{value}'. "
                               f"Zone must be in region {region}.")
            zones.append(z)
        return zones

    def _converge(self, g):
        """create_members=True: a minimal controller bringing the members to targetSize."""
        members = self._members(g["key"])
        target = g["resource"]["targetSize"]
        for inst in members[target:][::-1]:
            inst["status"], inst["group"] = "DELETED", None
        for _ in range(target - len(members)):
            zone = self._pick_zone(g)
            while True:
                name = f"{g['resource']['baseInstanceName']}-" + "".join(
                    self._rand.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(4))
                if not self._live(zone, name):
                    break
            self._new_instance(zone, name, group=g["key"])

    def _h_igm_get(self, params, q, body):
        return 200, self._render_group(self._group_or_404(params))

    def _h_igm_list(self, params, q, body):
        kind, loc = params["kind"], params["loc"]
        items = [self._render_group(g) for k, g in sorted(self._groups.items()) if k[:2] == (kind, loc)]
        return 200, self._page(q, items, "compute#instanceGroupManagerList" if kind == "zones"
                               else "compute#regionInstanceGroupManagerList",
                               f"{self._scope_url(kind, loc)}/instanceGroupManagers")

    def _h_igm_delete(self, params, q, body):
        replay = self._replayed(q)
        if replay:
            return 200, replay
        g = self._group_or_404(params)
        for inst in self._members(g["key"]):
            inst["status"], inst["group"] = "DELETED", None
        del self._groups[g["key"]]
        r = g["resource"]
        return 200, self._operation(q, g["key"][:2], f"compute.{self._igm_api(g['key'][0])}.delete",
                                    r["selfLink"], r["id"])

    def _h_igm_resize(self, params, q, body):
        replay = self._replayed(q)
        if replay:
            return 200, replay
        g = self._group_or_404(params)
        size = q.get("size")
        if size is None:
            raise _invalid("Required parameter 'size' not specified")
        if not re.fullmatch(r"-?\d+", size) or int(size) < 0:
            raise _invalid(f"Invalid value for field 'size': '{size}'. Must be greater than or equal to 0.")
        g["resource"]["targetSize"] = int(size)
        g["resource"]["fingerprint"] = self._fingerprint()
        if self.create_members:
            self._converge(g)
        r = g["resource"]
        return 200, self._operation(q, g["key"][:2], f"compute.{self._igm_api(g['key'][0])}.resize",
                                    r["selfLink"], r["id"])

    def _resolve_members(self, g, data, field):
        """The listed instances as (valid members, non-members); raises 400 for malformed ones."""
        kind, loc, _ = g["key"]
        entries = data.get("instances")
        if not isinstance(entries, list) or not entries:
            raise _invalid(f"Invalid value for field 'resource.{field}': ''. At least one instance must be "
                           "specified.")
        own = re.escape(self.endpoint) + "/"
        url = re.compile(r"^(?:(?:https://(?:www|compute)\.googleapis\.com/compute/v1/|" + own
                         + r")?projects/([^/]+)/)?zones/([^/]+)/instances/([^/]+)$")
        kinds = set()
        members, strangers, seen = [], [], set()
        for i, entry in enumerate(entries):
            where = f"resource.{field}[{i}]"
            if not isinstance(entry, str):
                raise _invalid(f"Invalid value for field '{where}': ''. Must be a string.")
            m = url.match(entry)
            if m:
                project, zone, name = m.groups()
                kinds.add("url")
                if project not in (None, self.project, self.project_number):
                    raise _invalid(f"Invalid value for field '{where}': '{entry}'. The instance must be in project "
                                   f"'{self.project}'.")
            elif kind == "zones" and _NAME.match(entry):
                zone, name = loc, entry
                kinds.add("name")
            else:
                raise _invalid(f"Invalid value for field '{where}': '{entry}'. The URL is malformed.")
            if zone not in self._group_zones(g):
                raise _invalid(f"Invalid value for field '{where}': '{entry}'. The instance must be in "
                               f"{'zone' if kind == 'zones' else 'region'} '{loc}'.")
            inst = self._live(zone, name)
            if inst is not None and inst["group"] == g["key"] and (zone, name) not in seen:
                members.append(inst)
                seen.add((zone, name))
            else:
                strangers.append(entry)
        if len(kinds) > 1:
            raise _invalid(f"Invalid value for field 'resource.{field}': one cannot specify both URLs and names in "
                           "a single request.")
        return members, strangers

    def _igm_remove(self, params, q, body, verb):
        replay = self._replayed(q)
        if replay:
            return 200, replay
        g = self._group_or_404(params)
        data = self._parse_body(body)
        self._check_fields(data, {"instances", "skipInstancesOnValidationError"})
        members, strangers = self._resolve_members(g, data, "instances")
        skip = data.get("skipInstancesOnValidationError") is True
        r = g["resource"]
        op_type = f"compute.{self._igm_api(g['key'][0])}.{verb}"
        if strangers and not skip:
            message = (f"The instance '{strangers[0]}' is not a member of the managed instance group "
                       f"'{self._group_path(g['key'])}', or it is already being deleted or abandoned.")
            if self.non_member_error == "request":
                raise _invalid(message)
            return 200, self._operation(q, g["key"][:2], op_type, r["selfLink"], r["id"],
                                        error=("CONDITION_NOT_MET", 400, message))
        for inst in members:
            if verb == "deleteInstances":
                inst["status"] = "DELETED"
            inst["group"] = None
        r["targetSize"] = max(0, r["targetSize"] - len(members))
        r["fingerprint"] = self._fingerprint()
        return 200, self._operation(q, g["key"][:2], op_type, r["selfLink"], r["id"])

    def _h_igm_delete_instances(self, params, q, body):
        return self._igm_remove(params, q, body, "deleteInstances")

    def _h_igm_abandon_instances(self, params, q, body):
        return self._igm_remove(params, q, body, "abandonInstances")

    def _h_igm_list_managed(self, params, q, body):
        g = self._group_or_404(params)  # no body in this method's HTTP rule: whatever is sent is ignored
        items = [{"instance": self._instance_url(i), "id": i["id"], "name": i["name"],
                  "instanceStatus": i["status"], "currentAction": i["current_action"],
                  "version": {"instanceTemplate": g["resource"]["instanceTemplate"]}}
                 for i in self._members(g["key"])]
        if g["resource"].get("listManagedInstancesResults") != "PAGINATED":
            return 200, ({"managedInstances": items} if items else {})
        return 200, self._page(q, items, None, "", field="managedInstances", with_header=False)


# ------------------------------------------------------------ serve
def _write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the fake until SIGTERM/SIGINT")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--port-file")
    s.add_argument("--project", default="my-project")
    s.add_argument("--project-number", default="123456789")
    s.add_argument("--zone", default="us-central1-a")
    s.add_argument("--instance", default="trainer-1")
    s.add_argument("--token", help="the only bearer token accepted (default: any non-empty one)")
    args = parser.parse_args(argv)
    sigs = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    token_ok = (lambda t: t == args.token) if args.token else (lambda t: bool(t))
    try:
        srv = FakeComputeServer(args.project, args.zone, args.instance, token_ok, args.host, args.port,
                                project_number=args.project_number).start()
    except (OSError, ValueError) as e:
        print(f"fake-compute: {e}", file=sys.stderr, flush=True)
        return 2
    if args.port_file:  # the file first: whoever sees the line finds the file too
        _write_atomic(args.port_file, f"{srv.port}\n")
    print(f"fake-compute listening on {srv.endpoint}", flush=True)
    signal.sigwait(sigs)
    srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

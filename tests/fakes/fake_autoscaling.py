#!/usr/bin/python3
"""Fake Amazon EC2 Auto Scaling API on loopback: the AWS Query protocol (API version 2011-01-01),
signed with SigV4 and verified, for spotvisor's Auto Scaling lifecycle handling.

The protocol as the service speaks it: POST / with an application/x-www-form-urlencoded body
(Action=...&Version=2011-01-01, lists as Name.member.N, structures as Name.Field); GET with the
parameters in the query string is accepted too. Answers are XML in the namespace
http://autoscaling.amazonaws.com/doc/2011-01-01/: <XResponse><XResult>..</XResult>
<ResponseMetadata><RequestId>..</RequestId></ResponseMetadata></XResponse>; errors are
<ErrorResponse><Error><Type>Sender</Type><Code>..</Code><Message>..</Message></Error>
<RequestId>..</RequestId></ErrorResponse>, which botocore reads into
ClientError.response["Error"]["Code"] and aws-cli prints as "An error occurred (CODE) ...".

Strict where the service is:
  - SigV4 verified (Authorization header, service "autoscaling", the fake's region, the body's
    own SHA-256; the signing rules are fake_s3.py's): an unknown key, or a session key without
    its X-Amz-Security-Token, is 403 InvalidClientTokenId; a wrong signature, scope or a request
    signed more than 15 min away from the fake's clock 403 SignatureDoesNotMatch; an expired
    session token 403 ExpiredToken; no Authorization 403 MissingAuthenticationToken;
  - unknown actions (or another Version) are 400 InvalidAction "Could not find operation X for
    version 2011-01-01" (the Query services' wording, as STS and IAM answer); a required parameter missing is ValidationError "1 validation error
    detected: Value null at 'instanceId' failed to satisfy constraint: Member must not be null";
  - deny(action) answers 403 AccessDenied as IAM words it ("User: arn:aws:sts::...:assumed-role/
    ... is not authorized to perform: autoscaling:ACTION on resource: GROUP-ARN because no
    identity-based policy allows the autoscaling:ACTION action"; no "on resource" for Describe*);
  - the ValidationError / AlreadyExists / ResourceInUse / ScalingActivityInProgress messages are
    the service's where they are known (issue threads and clients that match on them):
    "AutoScalingGroup name not found - AutoScalingGroup NAME not found" (DeleteAutoScalingGroup:
    with the name in quotes), "AutoScalingGroup by this name already exists - A group with the
    name NAME already exists", "Currently, desiredSize equals minSize (N). Terminating instance
    without replacement will violate group's min size constraint. Either set
    shouldDecrementDesiredCapacity flag to false or lower group's min size.", "Instance Id not
    found - No managed instance found for instance ID: ID", "New SetDesiredCapacity value N is
    above max value M for the AutoScalingGroup.", "Desired capacity:D must be between the
    specified min size:A and max size:B", "Max bound, B, must be greater than or equal to min
    bound, A", "No active Lifecycle Action found with instance ID ID" (or "with token T"), "You
    cannot delete an AutoScalingGroup while there are instances or pending Spot instance
    request(s) still in the group." (ResourceInUse) / "... while there are scaling activities in
    progress for that group." (ScalingActivityInProgress), "Valid requests must contain either
    LaunchTemplate, LaunchConfigurationName, InstanceId or MixedInstancesPolicy parameter.", "At
    least one Availability Zone or VPC Subnet is required.", and, with link_ec2(), 400
    InvalidQueryParameter "Incompatible launch template: You cannot use a launch template that is
    set to request Spot Instances (InstanceMarketOptions) when you configure an Auto Scaling group
    with a mixed instances policy. Add a different launch template to the group and try again."
    (as the service answered kops in 2019: that code, not ValidationError).
  Chosen here, not verified against the service: the below-min SetDesiredCapacity message (the
  above-max one mirrored), the messages for a bad LifecycleTransition, HeartbeatTimeout,
  DefaultResult or LifecycleActionResult, for an unknown hook on DeleteLifecycleHook ("No
  Lifecycle Hook found with name H for group G"; only the prefix is known), for an Availability
  Zone outside the region, for terminating an instance that is already terminating
  (ScalingActivityInProgress), MissingAction, that ValidationError is also the code for an
  unparsable number or boolean, and, with link_ec2(), the texts for a launch template EC2 does
  not have: the service's "You must use a valid fully-formed launch template. " (seen on many
  launch-template refusals) followed by EC2's own confirmed not-found text, "The specified
  launch template, with template name N, does not exist." / "..., with template ID ID, does not
  exist." / "Could not find the specified version V for the launch template with ID ID.".

Actions: CreateAutoScalingGroup (LaunchTemplate or MixedInstancesPolicy -- LaunchTemplate
specification, Overrides' InstanceType/WeightedCapacity, InstancesDistribution --; MinSize,
MaxSize, DesiredCapacity (default MinSize), VPCZoneIdentifier, AvailabilityZones,
CapacityRebalance, Tags, LifecycleHookSpecificationList, NewInstancesProtectedFromScaleIn,
DefaultCooldown, HealthCheckType, HealthCheckGracePeriod, TerminationPolicies);
DescribeAutoScalingGroups (names, Filters tag:KEY / tag-key / tag-value, MaxRecords, NextToken;
unknown names are left out, as the service does); DescribeAutoScalingInstances (InstanceIds,
MaxRecords, NextToken; HealthStatus "HEALTHY" there, "Healthy" in a group's Instances, as the
service answers); UpdateAutoScalingGroup (sizes -- a new MinSize above DesiredCapacity raises it,
a new MaxSize below lowers it, as the API reference says --, CapacityRebalance, zones and
subnets, launch template, NewInstancesProtectedFromScaleIn); SetDesiredCapacity (HonorCooldown
ignored); TerminateInstanceInAutoScalingGroup (answers the Activity: "Terminating EC2 instance:
ID", Cause "At T instance ID was taken out of service in response to a user request[, shrinking
the capacity from D to D-1].", StatusCode InProgress, Details with subnet and zone);
DeleteAutoScalingGroup (ForceDelete); PutLifecycleHook / DescribeLifecycleHooks /
DeleteLifecycleHook (autoscaling:EC2_INSTANCE_LAUNCHING or _TERMINATING, HeartbeatTimeout 30..7200
default 3600, GlobalTimeout = min(100 x HeartbeatTimeout, 172800), DefaultResult default
ABANDON, NotificationTargetARN/RoleARN/NotificationMetadata stored and echoed, 50 hooks per
group: LimitExceeded); CompleteLifecycleAction (CONTINUE | ABANDON, by InstanceId or
LifecycleActionToken); RecordLifecycleActionHeartbeat (the deadline moves to now +
HeartbeatTimeout, never past the global timeout); DetachInstances (InstanceIds, at most 20, each
InService in the group; ShouldDecrementDesiredCapacity required; answers one Activity per instance,
"Detaching EC2 instance: ID", Cause "At T instance ID was detached in response to a user request[,
shrinking the capacity from D to D-1].", InProgress; the instance leaves the group at once, runs
on, is listed by detached(), and a linked IMDS says Detached; chosen, not verified: the messages for
an instance not in the group, not InService, more than 20, and a decrement below MinSize).
Faults: lose_answer(action, count) carries the next requests out and drops their connections
without an answer.

The lifecycle, as the fake runs it (the fake never launches or terminates EC2 instances itself:
a test plays the group's controller, adds instances with add_instance(), and needed(group) says
how many the group is short of its desired capacity):
  - add_instance(..., state="InService") puts an instance straight into service;
    state="Pending" runs the launching hooks: Pending:Wait until each is completed (or times
    out), then InService; an ABANDON terminates it (Terminating, no terminating hooks run).
  - A termination (TerminateInstanceInAutoScalingGroup, begin_termination()) moves the instance
    to Terminating:Wait when the group has EC2_INSTANCE_TERMINATING hooks -- one lifecycle action
    (its own token) per hook, each until CompleteLifecycleAction or its heartbeat timeout, when
    the hook's DefaultResult applies; CONTINUE and ABANDON both let the instance terminate, ABANDON
    ends the instance's other actions too -- then Terminating:Proceed; without such a hook,
    straight to Terminating.
  - An instance in Terminating or Terminating:Proceed leaves the group's instance list (and
    DescribeAutoScalingInstances) termination_seconds later on the lifecycle clock: 0 by
    default, so it is gone by the time the answer is sent; None keeps it there until
    finish_termination(id).
  - ShouldDecrementDesiredCapacity=true lowers the desired capacity by one (a ValidationError,
    and nothing happens, when desired <= MinSize); false keeps it, so needed(group) goes up by
    one: what makes the real group launch a replacement.
  - A hook put while an instance already waits does not hold that instance; DeleteLifecycleHook
    lets the instances waiting on it go on (as CONTINUE); ForceDelete drops the group, its
    instances and their pending actions at once (the real deletion is asynchronous).
  - link_imds(instance_id, fake_imds_server) keeps that FakeImdsServer's
    autoscaling/target-lifecycle-state in step: InService from the start (launching or in
    service), Terminated once a termination begins.
  - Lifecycle time is clock() + advance(): heartbeat timeouts and termination_seconds follow it,
    and a background thread applies them every 50 ms; signatures and token expiry are judged by
    clock() alone, so advance() never makes a signed request stale.
Zones: VPCZoneIdentifier subnets take their zone from subnets={subnet: zone} (an unknown subnet
is then "The subnet ID 'S' does not exist"); without that map every subnet is in REGION + "a".
Launch templates: without link_ec2() any template name or id is taken as it is (a name alone
gets a made-up id, an id alone no name). link_ec2(fake_ec2_server) checks them in that fake
EC2, after deny and the group's existence (AlreadyExists) are judged: LaunchTemplate,
MixedInstancesPolicy.LaunchTemplate.LaunchTemplateSpecification and each override's
LaunchTemplateSpecification must name a template it has (by name or id) with the Version asked
($Default when none; $Latest; a number) -- else 400 ValidationError --, and a mixed instances
policy's templates must not request Spot (InstanceMarketOptions in that version) -- else 400
InvalidQueryParameter --; the group then answers the template's real id and name both. A plain
LaunchTemplate that requests Spot is accepted, as the service does. The AMI, instance types and
the rest of the template are not checked (the service checks them here).

Not implemented (InvalidAction like any other action): launch configurations
(LaunchConfigurationName is "Launch configuration name not found"), CreateAutoScalingGroup from
an InstanceId, warm pools, Standby/Attach, instance refresh, scaling policies and
scheduled actions, DescribeScalingActivities, notifications (nothing is sent to
NotificationTargetARN), tags actions, instance protection actions, load balancers and target
groups, health checks (every instance is Healthy), AZ rebalancing, capacity rebalancing itself
(CapacityRebalance is stored and echoed), InstanceRequirements in Overrides (ignored), Context,
the launch template's name when only its id is given unless link_ec2() (the real service
looks it up in EC2), the launch templates' contents beyond the Spot check, presigned URLs,
HTTPS, throttling, the exact order in which the service runs its checks (here: signature,
action, required parameters and their values, deny, existence).

  srv = FakeAutoScalingServer(region="us-east-1", credentials={"AKID": "secret"}).start()
  srv.endpoint                               # "http://127.0.0.1:PORT" (--endpoint-url, endpoint_url)
  srv.create_group("g", min_size=1, max_size=3, desired=2, availability_zones=["us-east-1a"])
  srv.add_instance("g", "i-0aaa", "us-east-1a", state="InService"); srv.instances("g"); srv.desired("g")
  srv.begin_termination("i-0aaa") -> token or None; srv.lifecycle_completed("i-0aaa") -> "CONTINUE"|...|None
  srv.calls() -> [(action, params)]; srv.deny("TerminateInstanceInAutoScalingGroup"); srv.wait_for(pred, 5)
  srv.link_ec2(fake_ec2_server)              # launch templates checked in fake_ec2.py's FakeEc2Server
  srv.group("g") -> {name, arn, min, max, desired, availability_zones, subnets, vpc_zone_identifier,
                     capacity_rebalance, launch_template, mixed_instances_policy (as answered: LaunchTemplate
                     {LaunchTemplateSpecification, Overrides}, InstancesDistribution), new_instances_protected,
                     tags {k: v}, tag_list [{Key, Value, PropagateAtLaunch}], hooks [LifecycleHook dicts, as
                     DescribeLifecycleHooks answers them, LifecycleHookSpecificationList's included], instances}
  srv.stop()

As a process:

  fake_autoscaling.py serve [--port 0] [--port-file F] [--region R]
                            [--credentials AKID:SECRET[:SESSION_TOKEN]]...
                            [--group NAME:MIN:MAX[:DESIRED]]... [--instance GROUP:ID[:ZONE]]...
prints "fake-autoscaling listening on http://HOST:PORT" and runs until SIGTERM/SIGINT.
"""
import argparse
import calendar
import collections
import hashlib
import hmac
import http.server
import json
import os
import re
import signal
import socketserver
import sys
import threading
import time
import traceback
import urllib.parse
import uuid

from fake_s3 import _canonical_query, _parse_query, _signing_key  # the same SigV4 rules

API_VERSION = "2011-01-01"
NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
SERVICE = "autoscaling"
ACTIONS = ("CreateAutoScalingGroup", "DescribeAutoScalingGroups", "DescribeAutoScalingInstances",
           "UpdateAutoScalingGroup", "SetDesiredCapacity", "TerminateInstanceInAutoScalingGroup",
           "DeleteAutoScalingGroup", "PutLifecycleHook", "DescribeLifecycleHooks", "DeleteLifecycleHook",
           "CompleteLifecycleAction", "RecordLifecycleActionHeartbeat", "DetachInstances")
# Actions IAM authorises without a resource (the AccessDenied message names none).
UNSCOPED = ("DescribeAutoScalingGroups", "DescribeAutoScalingInstances", "DescribeLifecycleHooks")
LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
RESULTS = ("CONTINUE", "ABANDON")
TERMINATING_STATES = ("Terminating", "Terminating:Wait", "Terminating:Proceed")
SKEW_S = 15 * 60
MAX_BODY = 1 << 20
MAX_HOOKS = 50
LOG_LIMIT = 10_000
TICK_S = 0.05
HOOK_NAME = re.compile(r"[A-Za-z0-9\-_/]+\Z")
SPOT_IN_MIXED = ("Incompatible launch template: You cannot use a launch template that is set to request Spot "
                 "Instances (InstanceMarketOptions) when you configure an Auto Scaling group with a mixed instances "
                 "policy. Add a different launch template to the group and try again.")
FULLY_FORMED = "You must use a valid fully-formed launch template. "
SIG_MISMATCH = ("The request signature we calculated does not match the signature you provided. Check your "
                "AWS Secret Access Key and signing method. Consult the service documentation for details.")


class _Err(Exception):
    def __init__(self, code, message, status=400):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _invalid(message):
    return _Err("ValidationError", message)


def _esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _x(name, value):
    """One XML element the Query protocol way: dict = structure (fields in order), list = members,
    None = left out."""
    if value is None:
        return ""
    if isinstance(value, dict):
        inner = "".join(_x(k, v) for k, v in value.items())
    elif isinstance(value, list):
        inner = "".join(_x("member", v) for v in value)
    elif isinstance(value, bool):
        inner = "true" if value else "false"
    else:
        inner = _esc(str(value))
    return f"<{name}>{inner}</{name}>" if inner else f"<{name}/>"


def _iso(t, ms=True):
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return f"{base}.{int((t % 1) * 1000):03d}Z" if ms else base + "Z"


def _amz(t):
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def _camel(name):
    return name[:1].lower() + name[1:]


# ---------------------------------------------------------------- Query parameters
def _list(p, prefix):
    """Values of prefix.member.N, in N order."""
    pat = re.compile(re.escape(prefix) + r"\.member\.(\d+)\Z")
    found = sorted((int(m.group(1)), v) for k, v in p.items() for m in [pat.match(k)] if m)
    return [v for _, v in found]


def _struct_list(p, prefix):
    """[{field: value}] from prefix.member.N.field (field may be dotted), in N order."""
    pat = re.compile(re.escape(prefix) + r"\.member\.(\d+)\.(.+)\Z")
    out = collections.defaultdict(dict)
    for k, v in p.items():
        m = pat.match(k)
        if m:
            out[int(m.group(1))][m.group(2)] = v
    return [out[n] for n in sorted(out)]


def _sub(p, prefix):
    n = len(prefix) + 1
    return {k[n:]: v for k, v in p.items() if k.startswith(prefix + ".")}


def _required(p, *names):
    missing = [n for n in names if p.get(n) is None]
    if missing:
        parts = [f"Value null at '{_camel(n)}' failed to satisfy constraint: Member must not be null"
                 for n in missing]
        raise _invalid(f"{len(parts)} validation error{'s' if len(parts) > 1 else ''} detected: "
                       + "; ".join(parts))


def _max_len(p, name, limit):
    v = p.get(name)
    if v is not None and len(v) > limit:
        raise _invalid(f"1 validation error detected: Value '{v}' at '{_camel(name)}' failed to satisfy "
                       f"constraint: Member must have length less than or equal to {limit}")


def _int(p, name, lo=None, hi=None):
    v = p.get(name)
    if v is None:
        return None
    try:
        n = int(v)
    except ValueError:
        raise _invalid(f"Value '{v}' for parameter {name} is invalid: not an integer.")
    if lo is not None and n < lo:
        raise _invalid(f"1 validation error detected: Value '{n}' at '{_camel(name)}' failed to satisfy "
                       f"constraint: Member must have value greater than or equal to {lo}")
    if hi is not None and n > hi:
        raise _invalid(f"1 validation error detected: Value '{n}' at '{_camel(name)}' failed to satisfy "
                       f"constraint: Member must have value less than or equal to {hi}")
    return n


def _bool(p, name):
    v = p.get(name)
    if v is None:
        return None
    if v.lower() not in ("true", "false"):
        raise _invalid(f"Value '{v}' for parameter {name} is invalid: not a boolean.")
    return v.lower() == "true"


def _template_spec(d):
    """A LaunchTemplateSpecification as the group answers it: the id, the name when given, the
    version ($Default when none)."""
    tid, tname = d.get("LaunchTemplateId"), d.get("LaunchTemplateName")
    if bool(tid) == bool(tname):
        raise _invalid("Valid requests must contain either launchTemplateId or LaunchTemplateName")
    if not tid:
        tid = "lt-" + hashlib.sha256(tname.encode()).hexdigest()[:17]
    return {"LaunchTemplateId": tid, "LaunchTemplateName": tname, "Version": d.get("Version") or "$Default"}


class _Listener(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def server_bind(self):  # no reverse DNS lookup
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], OSError):  # a client gone
            return
        super().handle_error(request, client_address)


class _Group:
    def __init__(self, name, arn, created):
        self.name, self.arn, self.created = name, arn, created
        self.min = self.max = self.desired = 0
        self.azs, self.subnets, self.vpc_zone_identifier = [], [], None
        self.launch_template = None      # a LaunchTemplateSpecification dict
        self.mixed = None                # a MixedInstancesPolicy dict, as answered
        self.capacity_rebalance = False
        self.new_protected = False
        self.default_cooldown, self.health_check_type, self.grace = 300, "EC2", 0
        self.termination_policies = ["Default"]
        self.tags = []                   # [{Key, Value, PropagateAtLaunch}]
        self.hooks = {}                  # name -> LifecycleHook dict, as answered
        self.instances = {}              # id -> _Instance, in arrival order


class _Instance:
    def __init__(self, iid, group, az, subnet, state, instance_type, protected):
        self.id, self.group, self.az, self.subnet = iid, group, az, subnet
        self.state, self.instance_type, self.protected = state, instance_type, protected
        self.entered = 0.0               # when it entered its current state (lifecycle clock)
        self.cause = None
        self.actions = []                # the lifecycle actions of its current transition


class FakeAutoScalingServer:
    """In-process fake EC2 Auto Scaling API. Thread-safe."""

    def __init__(self, host="127.0.0.1", port=0, region="us-east-1", credentials=None, clock=time.time,
                 account_id="123456789012", principal=None, subnets=None, termination_seconds=0.0):
        """credentials: {akid: secret} or {akid: (secret, session_token[, expires_at])}.
        clock: epoch seconds; judges signature times and token expiry, and (plus advance())
        lifecycle deadlines. principal: the caller named in AccessDenied messages.
        subnets: {subnet_id: zone} for VPCZoneIdentifier (None: any subnet, in REGION + "a").
        termination_seconds: how long a terminating instance stays listed once nothing holds it
        (None: until finish_termination())."""
        self.host, self.port, self.region, self.clock = host, port, region, clock
        self.account_id = account_id
        self.principal = principal or f"arn:aws:sts::{account_id}:assumed-role/spotvisor-node/i-0123456789abcdef0"
        self.subnets = None if subnets is None else dict(subnets)
        self.termination_seconds = termination_seconds
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._offset = 0.0
        self._creds = {}
        self._groups = {}
        self._actions = []               # every lifecycle action, oldest first
        self._rounds = 0                 # numbers transitions, so actions of one go together
        self._gone = {}                  # instance id -> its last group name
        self._detached = {}              # instance id -> the group DetachInstances took it out of
        self._lose = {}                  # action -> how many more answers to lose (lose_answer)
        self._imds = {}                  # instance id -> a FakeImdsServer
        self._ec2 = None                 # a FakeEc2Server, through link_ec2()
        self._denied = set()
        self._log = []
        self._stopping = threading.Event()
        self._listener = self._thread = self._ticker = None
        for akid, v in (credentials or {}).items():
            if isinstance(v, (tuple, list)):
                self.add_credentials(akid, *v)
            else:
                self.add_credentials(akid, v)

    # ------------------------------------------------------------ lifecycle of the server
    def start(self):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def version_string(self):
                return "AmazonEC2AutoScaling"

            def do_POST(self):
                outer._handle(self)

            def do_GET(self):
                outer._handle(self)

        self._stopping.clear()
        listener = _Listener((self.host, self.port), Handler)
        self.port = listener.server_address[1]
        thread = threading.Thread(target=listener.serve_forever, kwargs={"poll_interval": 0.05},
                                  name=f"fake-autoscaling:{self.port}", daemon=True)
        ticker = threading.Thread(target=self._tick_loop, name=f"fake-autoscaling-tick:{self.port}", daemon=True)
        thread.start()
        ticker.start()
        self._listener, self._thread, self._ticker = listener, thread, ticker
        return self

    def stop(self):
        self._stopping.set()
        listener, thread, ticker = self._listener, self._thread, self._ticker
        self._listener = self._thread = self._ticker = None
        if listener is None:
            return
        listener.shutdown()
        listener.server_close()
        thread.join()
        ticker.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def endpoint(self):
        return f"http://{self.host}:{self.port}"

    def _tick_loop(self):
        while not self._stopping.wait(TICK_S):
            with self._lock:
                self._tick_locked()

    # ------------------------------------------------------------ control
    def add_credentials(self, access_key_id, secret, session_token=None, expires_at=None):
        """A key pair the fake accepts. With session_token, requests must carry it in
        X-Amz-Security-Token; at expires_at (epoch s, clock()) and after: ExpiredToken."""
        with self._lock:
            self._creds[access_key_id] = (secret, session_token, expires_at)

    def deny(self, action):
        """Answer 403 AccessDenied (IAM's wording) to every later call of action."""
        with self._lock:
            self._denied.add(action)

    def allow(self, action):
        with self._lock:
            self._denied.discard(action)

    def now(self):
        """The lifecycle clock: clock() + everything advance() added."""
        return self.clock() + self._offset

    def advance(self, seconds):
        """Move the lifecycle clock (heartbeat timeouts, termination_seconds) on; signatures are
        still judged by clock()."""
        with self._lock:
            self._offset += seconds
            self._tick_locked()

    def create_group(self, name, min_size=0, max_size=1, desired=None, availability_zones=None,
                     launch_template_name="spotvisor", capacity_rebalance=False, vpc_zone_identifier=None):
        """A group as CreateAutoScalingGroup would make it (ValueError where the API refuses)."""
        p = {"AutoScalingGroupName": name, "MinSize": str(min_size), "MaxSize": str(max_size),
             "LaunchTemplate.LaunchTemplateName": launch_template_name,
             "CapacityRebalance": "true" if capacity_rebalance else "false"}
        if desired is not None:
            p["DesiredCapacity"] = str(desired)
        if vpc_zone_identifier:
            p["VPCZoneIdentifier"] = vpc_zone_identifier
        elif not availability_zones:
            availability_zones = [self.region + "a"]
        for n, az in enumerate(availability_zones or [], 1):
            p[f"AvailabilityZones.member.{n}"] = az
        try:
            with self._lock:
                self._create(p, authorize=False)
                self._changed.notify_all()
        except _Err as e:
            raise ValueError(f"{e.code}: {e.message}") from None

    def add_instance(self, group, instance_id, az=None, state="InService", instance_type=None, protected=None):
        """An instance the group launched. state: "InService", or "Pending" to run the launching
        hooks (Pending:Wait until completed). az: one of the group's zones (default: the zone
        with the fewest instances)."""
        if state not in ("InService", "Pending"):
            raise ValueError('state must be "InService" or "Pending"')
        with self._lock:
            g = self._group_or_raise(group)
            if self._find(instance_id) is not None:
                raise ValueError(f"instance {instance_id} is already in a group")
            if az is None:
                counts = collections.Counter(i.az for i in g.instances.values())
                az = min(g.azs, key=lambda z: counts[z])
            if az not in g.azs:
                raise ValueError(f"zone {az} is not one of group {group}'s zones {g.azs}")
            subnet = next((s for s in g.subnets if self._subnet_zone(s) == az), None)
            inst = _Instance(instance_id, g.name, az, subnet, "InService",
                             instance_type, g.new_protected if protected is None else bool(protected))
            inst.entered = self.now()
            g.instances[instance_id] = inst
            self._gone.pop(instance_id, None)
            hooks = [h for h in g.hooks.values() if h["LifecycleTransition"] == LAUNCHING]
            if state == "Pending" and hooks:
                inst.state = "Pending:Wait"
                self._rounds += 1
                inst.actions = [self._new_action(inst, h) for h in hooks]
            self._sync_imds(inst)
            self._tick_locked()
            self._changed.notify_all()

    def begin_termination(self, instance_id, cause="scale-in", decrement=False):
        """Start terminating an instance the way the group itself would (a scale-in, a Spot
        interruption, a rebalance...): Terminating:Wait with a token per terminating hook, else
        Terminating. decrement=True lowers the desired capacity too. Returns the token of the
        first terminating hook's action, or None."""
        with self._lock:
            self._tick_locked()
            inst = self._find(instance_id)
            if inst is None:
                raise KeyError(f"no instance {instance_id} in any group")
            if inst.state in TERMINATING_STATES:
                raise ValueError(f"instance {instance_id} is already {inst.state}")
            g = self._groups[inst.group]
            if decrement:
                g.desired = max(0, g.desired - 1)
            actions = self._start_termination(inst, cause)
            self._tick_locked()
            self._changed.notify_all()
            return actions[0]["token"] if actions else None

    def finish_termination(self, instance_id):
        """Take a Terminating / Terminating:Proceed instance out of the group now (for
        termination_seconds=None)."""
        with self._lock:
            self._tick_locked()
            inst = self._find(instance_id)
            if inst is None or inst.state not in ("Terminating", "Terminating:Proceed"):
                raise ValueError(f"instance {instance_id} is not Terminating or Terminating:Proceed")
            self._remove(inst)
            self._changed.notify_all()

    def link_imds(self, instance_id, imds):
        """Keep imds (a FakeImdsServer) answering this instance's
        autoscaling/target-lifecycle-state: InService, then Terminated once it starts to go."""
        with self._lock:
            self._imds[instance_id] = imds
            inst = self._find(instance_id)
            if inst is not None:
                self._sync_imds(inst)
            elif instance_id in self._gone:
                imds.set_target_lifecycle_state("Terminated")

    def link_ec2(self, ec2):
        """Check launch templates against ec2 (a fake_ec2.FakeEc2Server; None unlinks) from now
        on: CreateAutoScalingGroup and UpdateAutoScalingGroup (and create_group()) then refuse a
        LaunchTemplate, a MixedInstancesPolicy's LaunchTemplateSpecification or an override's
        template that ec2 does not have (by name or id) or whose version it lacks, and a
        MixedInstancesPolicy whose template requests Spot (InstanceMarketOptions); the group
        remembers the template's id and name both, whichever the request gave."""
        with self._lock:
            self._ec2 = ec2

    def group(self, name):
        """A snapshot of a group as a dict, or None."""
        with self._lock:
            self._tick_locked()
            g = self._groups.get(name)
            if g is None:
                return None
            return {"name": g.name, "arn": g.arn, "min": g.min, "max": g.max, "desired": g.desired,
                    "availability_zones": list(g.azs), "vpc_zone_identifier": g.vpc_zone_identifier,
                    "capacity_rebalance": g.capacity_rebalance, "launch_template": g.launch_template,
                    "mixed_instances_policy": g.mixed, "new_instances_protected": g.new_protected,
                    "tags": {t["Key"]: t["Value"] for t in g.tags},
                    "tag_list": [dict(t) for t in g.tags], "subnets": list(g.subnets),
                    "hooks": [dict(h) for h in g.hooks.values()], "instances": self._instances_locked(g)}

    def groups(self):
        with self._lock:
            return sorted(self._groups)

    def instances(self, group):
        """[{id, az, lifecycle_state, health, protected, subnet, instance_type}] in arrival order."""
        with self._lock:
            self._tick_locked()
            return self._instances_locked(self._group_or_raise(group))

    def desired(self, group):
        with self._lock:
            return self._group_or_raise(group).desired

    def needed(self, group):
        """How many instances the group is short of (desired capacity minus its Pending* and
        InService instances; negative when over): what a test playing the controller launches."""
        with self._lock:
            self._tick_locked()
            g = self._group_or_raise(group)
            live = sum(1 for i in g.instances.values() if i.state not in TERMINATING_STATES)
            return g.desired - live

    def lifecycle_state(self, instance_id):
        """The instance's LifecycleState, "Terminated" once it has left its group, or None."""
        with self._lock:
            self._tick_locked()
            inst = self._find(instance_id)
            if inst is not None:
                return inst.state
            return "Terminated" if instance_id in self._gone else None

    def lifecycle_actions(self, instance_id=None):
        """Every lifecycle action (of one instance, or all), oldest first: dicts with
        instance_id, group, hook, transition, token, started, deadline, global_deadline,
        heartbeats, round (one number per transition), default_result, result (None while
        pending) and completed_by ("CompleteLifecycleAction",
        "timeout" -- the hook's DefaultResult --, "abandoned" -- another hook's ABANDON --,
        "terminated", "DeleteLifecycleHook" or "ForceDelete")."""
        with self._lock:
            self._tick_locked()
            return [dict(a) for a in self._actions if instance_id in (None, a["instance_id"])]

    def lifecycle_completed(self, instance_id):
        """The LifecycleActionResult CompleteLifecycleAction gave the instance's latest transition
        (its actions for every hook; ABANDON wins), or None: no call completed one of them (none
        yet, or only timeouts: see lifecycle_actions())."""
        with self._lock:
            self._tick_locked()
            mine = [a for a in self._actions if a["instance_id"] == instance_id]
            done = [a["result"] for a in mine if a["round"] == mine[-1]["round"]
                    and a["completed_by"] == "CompleteLifecycleAction"] if mine else []
            if not done:
                return None
            return "ABANDON" if "ABANDON" in done else "CONTINUE"

    def calls(self):
        """[(action, params)] for every authenticated request, oldest first (params without
        Action and Version)."""
        with self._lock:
            return [(e["action"], dict(e["params"])) for e in self._log if e["akid"] is not None]

    def log(self):
        """Every request: dicts with time, action, params, akid (None when the signature
        failed), status, error (code or None)."""
        with self._lock:
            return [dict(e) for e in self._log]

    def reset_log(self):
        with self._lock:
            self._log.clear()

    def hits(self, action=None):
        with self._lock:
            return sum(1 for e in self._log if e["status"] is not None and action in (None, e["action"]))

    def wait_for(self, what, timeout=5.0, count=1):
        """Block until what() is true (a callable, re-checked whenever the fake changes, at least
        every 50 ms), or until hits(what) >= count (an action name). Returns whether it happened
        within timeout seconds."""
        pred = what if callable(what) else (lambda: self.hits(what) >= count)
        with self._lock:
            return self._changed.wait_for(pred, timeout)

    # ------------------------------------------------------------ state helpers (lock held)
    def _group_or_raise(self, name):
        g = self._groups.get(name)
        if g is None:
            raise KeyError(f"no group {name!r}")
        return g

    def _find(self, instance_id):
        for g in self._groups.values():
            inst = g.instances.get(instance_id)
            if inst is not None:
                return inst
        return None

    def _subnet_zone(self, subnet):
        if self.subnets is None:
            return self.region + "a"
        return self.subnets.get(subnet)

    @staticmethod
    def _instances_locked(g):
        return [{"id": i.id, "az": i.az, "lifecycle_state": i.state, "health": "Healthy",
                 "protected": i.protected, "subnet": i.subnet, "instance_type": i.instance_type}
                for i in g.instances.values()]

    def _sync_imds(self, inst, gone=False):
        imds = self._imds.get(inst.id)
        if imds is not None:
            target = "Terminated" if gone or inst.state in TERMINATING_STATES else "InService"
            imds.set_target_lifecycle_state(target)

    def _new_action(self, inst, hook):
        now = self.now()
        hb, gt = hook["HeartbeatTimeout"], hook["GlobalTimeout"]
        action = {"instance_id": inst.id, "group": inst.group, "hook": hook["LifecycleHookName"],
                  "transition": hook["LifecycleTransition"], "round": self._rounds,
                  "token": str(uuid.uuid4()), "started": now,
                  "deadline": now + hb, "global_deadline": now + gt, "heartbeats": 0,
                  "default_result": hook["DefaultResult"], "result": None, "completed_by": None}
        self._actions.append(action)
        return action

    @staticmethod
    def _pending(inst):
        return [a for a in inst.actions if a["completed_by"] is None]

    def _finish_action(self, action, result, how):
        action["result"], action["completed_by"] = result, how
        if result == "ABANDON" and how != "abandoned":
            for other in self._actions:
                if (other["instance_id"] == action["instance_id"] and other["completed_by"] is None
                        and other is not action):
                    other["result"], other["completed_by"] = "ABANDON", "abandoned"

    def _start_termination(self, inst, cause):
        for a in self._pending(inst):  # a launch still waiting on its hooks
            a["completed_by"] = "terminated"
        g = self._groups[inst.group]
        inst.cause, inst.entered = cause, self.now()
        hooks = [h for h in g.hooks.values() if h["LifecycleTransition"] == TERMINATING]
        inst.state = "Terminating:Wait" if hooks else "Terminating"
        self._rounds += 1
        inst.actions = [self._new_action(inst, h) for h in hooks]
        self._sync_imds(inst)
        return inst.actions

    def _remove(self, inst):
        g = self._groups[inst.group]
        del g.instances[inst.id]
        self._gone[inst.id] = g.name
        self._sync_imds(inst, gone=True)

    def _tick_locked(self):
        """Apply what the lifecycle clock says is due; returns whether anything changed."""
        now = self.now()
        changed = False
        for a in self._actions:
            if a["completed_by"] is None and now >= min(a["deadline"], a["global_deadline"]):
                self._finish_action(a, a["default_result"], "timeout")
                changed = True
        for g in list(self._groups.values()):
            for inst in list(g.instances.values()):
                if inst.state in ("Pending:Wait", "Terminating:Wait") and not self._pending(inst):
                    abandoned = any(a["result"] == "ABANDON" for a in inst.actions)
                    if inst.state == "Pending:Wait":
                        inst.state = "Terminating" if abandoned else "InService"
                    else:
                        inst.state = "Terminating:Proceed"
                    inst.entered = now
                    self._sync_imds(inst)
                    changed = True
                if (inst.state in ("Terminating", "Terminating:Proceed") and self.termination_seconds is not None
                        and now - inst.entered >= self.termination_seconds):
                    self._remove(inst)
                    changed = True
        if changed:
            self._changed.notify_all()
        return changed

    # ------------------------------------------------------------ requests
    def _handle(self, h):
        rid = str(uuid.uuid4())
        entry = {"time": time.time(), "action": None, "params": {}, "akid": None, "status": None, "error": None}
        with self._lock:
            self._log.append(entry)
            if len(self._log) > LOG_LIMIT:
                del self._log[:len(self._log) - LOG_LIMIT]
        try:
            try:
                n = int(h.headers.get("Content-Length", "0"))
            except ValueError:
                h.close_connection = True
                raise _Err("MalformedQueryString", "bad Content-Length")
            if n < 0 or n > MAX_BODY:
                h.close_connection = True
                raise _Err("MalformedQueryString", "request too large")
            body = h.rfile.read(n) if n else b""
            path, _, query = h.path.partition("?")
            params = {}
            for raw in (query, body.decode("utf-8", "replace") if h.command == "POST" else ""):
                for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True):
                    params[k] = v
            action, version = params.pop("Action", None), params.pop("Version", None)
            entry["action"], entry["params"] = action, params
            entry["akid"] = self._verify(h, path, query, body)
            if action is None:
                raise _Err("MissingAction", "Missing Action")
            if path != "/" or action not in ACTIONS or version != API_VERSION:
                raise _Err("InvalidAction", f"Could not find operation {action} for version {version}")
            with self._lock:
                self._tick_locked()
                result = getattr(self, "_op_" + action)(params)
                self._tick_locked()
                self._changed.notify_all()
            with self._lock:
                lose = self._lose.get(action, 0) > 0
                if lose:
                    self._lose[action] -= 1
            if lose:  # done, and the answer lost on the way: the connection drops
                entry["status"], entry["error"] = None, "answer lost"
                h.close_connection = True
                return
            wrapped = "" if result is None else _x(action + "Result", result)
            status, code = 200, None
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{NS}">{wrapped}'
                   f"<ResponseMetadata><RequestId>{rid}</RequestId></ResponseMetadata></{action}Response>")
        except Exception as e:  # a bug in the fake: a 500 the test sees, and the traceback
            if not isinstance(e, _Err):
                traceback.print_exc()
                e = _Err("InternalFailure", f"fake_autoscaling failed: {e!r}", 500)
            status, code = e.status, e.code
            kind = "Receiver" if e.status >= 500 else "Sender"
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<ErrorResponse xmlns="{NS}"><Error><Type>{kind}</Type>'
                   f"<Code>{e.code}</Code><Message>{_esc(e.message)}</Message></Error>"
                   f"<RequestId>{rid}</RequestId></ErrorResponse>")
        data = xml.encode()
        h.send_response(status)
        h.send_header("x-amzn-RequestId", rid)
        h.send_header("Content-Type", "text/xml")
        h.send_header("Content-Length", str(len(data)))
        if h.close_connection:
            h.send_header("Connection", "close")
        h.end_headers()
        with self._lock:
            entry["status"], entry["error"] = status, code
            self._changed.notify_all()
        h.wfile.write(data)

    def _verify(self, h, path, query, body):
        """SigV4 as the Query services check it; returns the access key id."""
        auth = h.headers.get("Authorization", "")
        if not auth:
            raise _Err("MissingAuthenticationToken", "Request is missing Authentication Token", 403)
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            raise _Err("IncompleteSignature", "Unsupported authorization type")
        fields = {}
        for part in auth[len("AWS4-HMAC-SHA256 "):].split(","):
            k, _, v = part.strip().partition("=")
            fields[k] = v
        cred = fields.get("Credential", "").split("/")
        if len(cred) != 5 or cred[4] != "aws4_request" or "SignedHeaders" not in fields \
                or "Signature" not in fields:
            raise _Err("IncompleteSignature", "Authorization header requires 'Credential', 'Signature' and "
                                              "'SignedHeaders' parameters.")
        akid, date, region, service = cred[:4]
        with self._lock:
            c = self._creds.get(akid)
        if c is None:
            raise _Err("InvalidClientTokenId", "The security token included in the request is invalid.", 403)
        secret, token, expires_at = c
        if token is not None:
            if h.headers.get("X-Amz-Security-Token") != token:
                raise _Err("InvalidClientTokenId", "The security token included in the request is invalid.", 403)
            if expires_at is not None and self.clock() >= expires_at:
                raise _Err("ExpiredToken", "The security token included in the request is expired", 403)
        if service != SERVICE:
            raise _Err("SignatureDoesNotMatch", f"Credential should be scoped to correct service: '{SERVICE}'. ", 403)
        if region != self.region:
            raise _Err("SignatureDoesNotMatch", "Credential should be scoped to a valid region. ", 403)
        amz_date = h.headers.get("X-Amz-Date", "")
        try:
            sent = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
        except ValueError:
            raise _Err("IncompleteSignature", "Authorization header requires existence of either a 'X-Amz-Date' "
                                              "or a 'Date' header.")
        if not amz_date.startswith(date):
            raise _Err("SignatureDoesNotMatch", f"Date in Credential scope does not match YYYYMMDD from ISO-8601 "
                                                f"version of date from HTTP: '{date}' != '{amz_date[:8]}', from "
                                                f"'{amz_date}'.", 403)
        now = self.clock()
        if sent < now - SKEW_S:
            raise _Err("SignatureDoesNotMatch", f"Signature expired: {amz_date} is now earlier than "
                                                f"{_amz(now - SKEW_S)} ({_amz(now)} - 15 min.)", 403)
        if sent > now + SKEW_S:
            raise _Err("SignatureDoesNotMatch", f"Signature not yet current: {amz_date} is still later than "
                                                f"{_amz(now + SKEW_S)} ({_amz(now)} + 15 min.)", 403)
        signed = fields["SignedHeaders"].split(";")
        if "host" not in signed:
            raise _Err("SignatureDoesNotMatch", "'Host' or ':authority' must be a 'SignedHeader' in the AWS "
                                                "Authorization.", 403)
        canon_headers = ""
        for name in signed:
            values = h.headers.get_all(name) or []
            canon_headers += name + ":" + ",".join(" ".join(v.split()) for v in values) + "\n"
        try:
            canon_query = _canonical_query(_parse_query(query))
        except Exception:
            raise _Err("SignatureDoesNotMatch", SIG_MISMATCH, 403)
        # The payload hash is always the body's own: a declared x-amz-content-sha256 that differs
        # (or UNSIGNED-PAYLOAD) cannot make a signature match.
        payload = hashlib.sha256(body).hexdigest()
        creq = "\n".join([h.command, path, canon_query, canon_headers, ";".join(signed), payload])
        scope = f"{date}/{region}/{SERVICE}/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
        want = hmac.new(_signing_key(secret, date, region, SERVICE), to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want.encode(), fields["Signature"].encode("ascii", "replace")):
            raise _Err("SignatureDoesNotMatch", SIG_MISMATCH, 403)
        return akid

    # ------------------------------------------------------------ shared checks (lock held)
    def _authorize(self, action, group=None, group_name=None):
        if action not in self._denied:
            return
        if action in UNSCOPED:
            raise _Err("AccessDenied", f"User: {self.principal} is not authorized to perform: autoscaling:{action} "
                                       f"because no identity-based policy allows the autoscaling:{action} action",
                       403)
        arn = group.arn if group is not None else self._arn("*", group_name or "*")
        raise _Err("AccessDenied", f"User: {self.principal} is not authorized to perform: autoscaling:{action} on "
                                   f"resource: {arn} because no identity-based policy allows the "
                                   f"autoscaling:{action} action", 403)

    def _arn(self, uid, name):
        return f"arn:aws:autoscaling:{self.region}:{self.account_id}:autoScalingGroup:{uid}:autoScalingGroupName/{name}"

    def _existing(self, name, quoted=False):
        g = self._groups.get(name)
        if g is None:
            shown = f"'{name}'" if quoted else name
            raise _invalid(f"AutoScalingGroup name not found - AutoScalingGroup {shown} not found")
        return g

    def _placement(self, p):
        """(zones, subnets, VPCZoneIdentifier) from AvailabilityZones / VPCZoneIdentifier, or None
        when neither is given."""
        azs = _list(p, "AvailabilityZones")
        vzi = p.get("VPCZoneIdentifier")
        subnets = [s.strip() for s in (vzi or "").split(",") if s.strip()]
        if not azs and not subnets:
            return None
        for az in azs:
            if not re.fullmatch(re.escape(self.region) + r"[a-z]", az):
                raise _invalid(f"Invalid Availability Zone {az}: not a zone of region {self.region}")
        if subnets:
            zones = []
            for s in subnets:
                z = self._subnet_zone(s)
                if z is None:
                    raise _invalid(f"The subnet ID '{s}' does not exist")
                if z not in zones:
                    zones.append(z)
            azs = zones
        return list(dict.fromkeys(azs)), subnets, (vzi if subnets else None)

    def _launch_source(self, p, required):
        """(LaunchTemplate spec, MixedInstancesPolicy) from the request; (None, None) if absent
        and not required."""
        lt, mip = _sub(p, "LaunchTemplate"), _sub(p, "MixedInstancesPolicy")
        if p.get("LaunchConfigurationName") is not None:
            name = p["LaunchConfigurationName"]
            raise _invalid(f"Launch configuration name not found - Launch configuration {name} not found")
        sources = sum(1 for s in (lt, mip, p.get("InstanceId")) if s)
        if sources > 1 or (required and sources == 0):
            raise _invalid("Valid requests must contain either LaunchTemplate, LaunchConfigurationName, InstanceId "
                           "or MixedInstancesPolicy parameter.")
        if p.get("InstanceId") is not None:
            raise _invalid("Creating a group from an instance (InstanceId) is not implemented by this fake.")
        if lt:
            return _template_spec(lt), None
        if mip:
            spec = _sub(mip, "LaunchTemplate.LaunchTemplateSpecification")
            overrides = []
            for o in _struct_list(mip, "LaunchTemplate.Overrides"):
                item = {"InstanceType": o.get("InstanceType"), "WeightedCapacity": o.get("WeightedCapacity")}
                sub_spec = _sub(o, "LaunchTemplateSpecification")
                if sub_spec:
                    item["LaunchTemplateSpecification"] = _template_spec(sub_spec)
                overrides.append(item)
            d = _sub(mip, "InstancesDistribution")
            spot = d.get("SpotAllocationStrategy") or "lowest-price"
            dist = {"OnDemandAllocationStrategy": d.get("OnDemandAllocationStrategy") or "prioritized",
                    "OnDemandBaseCapacity": _int(d, "OnDemandBaseCapacity", 0) or 0,
                    "OnDemandPercentageAboveBaseCapacity": _int(d, "OnDemandPercentageAboveBaseCapacity", 0, 100),
                    "SpotAllocationStrategy": spot,
                    "SpotInstancePools": (_int(d, "SpotInstancePools", 1, 20) or 2) if spot == "lowest-price"
                    else None,
                    "SpotMaxPrice": d.get("SpotMaxPrice")}
            if dist["OnDemandPercentageAboveBaseCapacity"] is None:
                dist["OnDemandPercentageAboveBaseCapacity"] = 100
            return None, {"LaunchTemplate": {"LaunchTemplateSpecification": _template_spec(spec),
                                             "Overrides": overrides},
                          "InstancesDistribution": dist}
        return None, None

    def _linked(self, lt, mip):
        """The launch source with its templates checked against the linked fake EC2 (as is
        without link_ec2())."""
        if self._ec2 is None:
            return lt, mip
        if lt is not None:
            lt = self._linked_spec(lt, mixed=False)
        if mip is not None:
            mip = json.loads(json.dumps(mip))
            mlt = mip["LaunchTemplate"]
            mlt["LaunchTemplateSpecification"] = self._linked_spec(mlt["LaunchTemplateSpecification"], mixed=True)
            for o in mlt["Overrides"]:
                if o.get("LaunchTemplateSpecification"):
                    o["LaunchTemplateSpecification"] = self._linked_spec(o["LaunchTemplateSpecification"], mixed=True)
        return lt, mip

    def _linked_spec(self, spec, mixed):
        name = spec.get("LaunchTemplateName")
        if name:  # _template_spec made the id up
            t, which = self._ec2.launch_template(name), f"with template name {name}"
        else:
            t, which = self._ec2.launch_template(template_id=spec["LaunchTemplateId"]), \
                f"with template ID {spec['LaunchTemplateId']}"
        if t is None:
            raise _invalid(f"{FULLY_FORMED}The specified launch template, {which}, does not exist.")
        version = spec["Version"]
        number = t["latest_version"] if version == "$Latest" else t["default_version"] if version == "$Default" \
            else int(version) if version.isdigit() else None
        found = next((v for v in t["versions"] if v["number"] == number), None)
        if found is None:
            raise _invalid(f"{FULLY_FORMED}Could not find the specified version {version} for the launch template "
                           f"with ID {t['id']}.")
        if mixed and "InstanceMarketOptions" in found["data"]:
            raise _Err("InvalidQueryParameter", SPOT_IN_MIXED)
        return dict(spec, LaunchTemplateId=t["id"], LaunchTemplateName=t["name"])

    @staticmethod
    def _check_sizes(mn, mx, desired):
        if mx < mn:
            raise _invalid(f"Max bound, {mx}, must be greater than or equal to min bound, {mn}")
        if not mn <= desired <= mx:
            raise _invalid(f"Desired capacity:{desired} must be between the specified min size:{mn} and max size:{mx}")

    def _hook_from(self, p, g, existing=None):
        """A LifecycleHook dict (as DescribeLifecycleHooks answers it) from request fields."""
        name = p["LifecycleHookName"]
        if len(name) > 255 or not HOOK_NAME.match(name):
            raise _invalid(f"1 validation error detected: Value '{name}' at 'lifecycleHookName' failed to satisfy "
                           r"constraint: Member must satisfy regular expression pattern: [A-Za-z0-9\-_\/]+")
        hook = dict(existing) if existing else {
            "LifecycleHookName": name, "AutoScalingGroupName": g.name, "LifecycleTransition": None,
            "NotificationTargetARN": None, "RoleARN": None, "NotificationMetadata": None,
            "HeartbeatTimeout": 3600, "GlobalTimeout": None, "DefaultResult": "ABANDON"}
        for k in ("LifecycleTransition", "NotificationTargetARN", "RoleARN", "NotificationMetadata", "DefaultResult"):
            if p.get(k) is not None:
                hook[k] = p[k]
        if hook["LifecycleTransition"] is None:
            _required({}, "LifecycleTransition")
        if hook["LifecycleTransition"] not in (LAUNCHING, TERMINATING):
            raise _invalid(f"Invalid Lifecycle Transition {hook['LifecycleTransition']!r}: must be {LAUNCHING} or "
                           f"{TERMINATING}")
        hb = p.get("HeartbeatTimeout")
        if hb is not None:
            hook["HeartbeatTimeout"] = _int(p, "HeartbeatTimeout")
        if not 30 <= hook["HeartbeatTimeout"] <= 7200:
            raise _invalid(f"Heartbeat timeout {hook['HeartbeatTimeout']} is invalid: it must be between 30 and "
                           f"7200 seconds")
        if hook["DefaultResult"] not in RESULTS:
            raise _invalid(f"Invalid DefaultResult {hook['DefaultResult']!r}: must be CONTINUE or ABANDON")
        hook["GlobalTimeout"] = min(100 * hook["HeartbeatTimeout"], 172800)
        return hook

    # ------------------------------------------------------------ actions (lock held)
    def _create(self, p, authorize=True):
        _required(p, "AutoScalingGroupName", "MinSize", "MaxSize")
        _max_len(p, "AutoScalingGroupName", 255)
        name = p["AutoScalingGroupName"]
        mn, mx = _int(p, "MinSize", 0), _int(p, "MaxSize", 0)
        desired = _int(p, "DesiredCapacity", 0)
        lt, mip = self._launch_source(p, required=True)
        placement = self._placement(p)
        if placement is None:
            raise _invalid("At least one Availability Zone or VPC Subnet is required.")
        desired = mn if desired is None else desired
        self._check_sizes(mn, mx, desired)
        tags = []
        for t in _struct_list(p, "Tags"):
            if not t.get("Key"):
                raise _invalid("1 validation error detected: Value null at 'tags.member.key' failed to satisfy "
                               "constraint: Member must not be null")
            tags.append({"Key": t["Key"], "Value": t.get("Value", ""),
                         "PropagateAtLaunch": (t.get("PropagateAtLaunch", "false").lower() == "true")})
        if authorize:
            self._authorize("CreateAutoScalingGroup", group_name=name)
        if name in self._groups:
            raise _Err("AlreadyExists", f"AutoScalingGroup by this name already exists - A group with the name {name} "
                                        f"already exists")
        lt, mip = self._linked(lt, mip)
        g = _Group(name, self._arn(uuid.uuid4(), name), self.now())
        hooks = {}
        for spec in _struct_list(p, "LifecycleHookSpecificationList"):
            _required(spec, "LifecycleHookName", "LifecycleTransition")
            hooks[spec["LifecycleHookName"]] = self._hook_from(spec, g)
        g.min, g.max, g.desired = mn, mx, desired
        g.azs, g.subnets, g.vpc_zone_identifier = placement
        g.launch_template, g.mixed = lt, mip
        g.capacity_rebalance = bool(_bool(p, "CapacityRebalance"))
        g.new_protected = bool(_bool(p, "NewInstancesProtectedFromScaleIn"))
        g.default_cooldown = _int(p, "DefaultCooldown", 0) if p.get("DefaultCooldown") else 300
        g.health_check_type = p.get("HealthCheckType") or "EC2"
        g.grace = _int(p, "HealthCheckGracePeriod", 0) or 0
        g.termination_policies = _list(p, "TerminationPolicies") or ["Default"]
        g.tags = tags
        g.hooks = hooks
        self._groups[name] = g

    def _op_CreateAutoScalingGroup(self, p):
        self._create(p)
        return None

    def _group_xml(self, g):
        tmpl = g.launch_template or (g.mixed["LaunchTemplate"]["LaunchTemplateSpecification"] if g.mixed else None)
        instances = [{"InstanceId": i.id, "InstanceType": i.instance_type, "AvailabilityZone": i.az,
                      "LifecycleState": i.state, "HealthStatus": "Healthy", "LaunchTemplate": tmpl,
                      "ProtectedFromScaleIn": i.protected} for i in g.instances.values()]
        return {
            "AutoScalingGroupName": g.name, "AutoScalingGroupARN": g.arn,
            "LaunchTemplate": g.launch_template, "MixedInstancesPolicy": g.mixed,
            "MinSize": g.min, "MaxSize": g.max, "DesiredCapacity": g.desired, "DefaultCooldown": g.default_cooldown,
            "AvailabilityZones": list(g.azs), "LoadBalancerNames": [], "TargetGroupARNs": [],
            "HealthCheckType": g.health_check_type, "HealthCheckGracePeriod": g.grace, "Instances": instances,
            "CreatedTime": _iso(g.created), "SuspendedProcesses": [], "VPCZoneIdentifier": g.vpc_zone_identifier,
            "EnabledMetrics": [],
            "Tags": [{"ResourceId": g.name, "ResourceType": "auto-scaling-group", "Key": t["Key"], "Value": t["Value"],
                      "PropagateAtLaunch": t["PropagateAtLaunch"]} for t in g.tags],
            "TerminationPolicies": list(g.termination_policies),
            "NewInstancesProtectedFromScaleIn": g.new_protected,
            "ServiceLinkedRoleARN": f"arn:aws:iam::{self.account_id}:role/aws-service-role/"
                                    f"autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling",
            "CapacityRebalance": g.capacity_rebalance, "TrafficSources": []}

    @staticmethod
    def _page(items, p):
        size = _int(p, "MaxRecords", 1, 100) or 50
        token = p.get("NextToken")
        start = 0
        if token:
            m = re.fullmatch(r"fake-(\d+)", token)
            if not m or int(m.group(1)) > len(items):
                raise _Err("InvalidNextToken", "The token is invalid.")
            start = int(m.group(1))
        end = start + size
        return items[start:end], (f"fake-{end}" if end < len(items) else None)

    def _op_DescribeAutoScalingGroups(self, p):
        names = _list(p, "AutoScalingGroupNames")
        filters = [(f.get("Name", ""), _list(f, "Values")) for f in _struct_list(p, "Filters")]
        self._authorize("DescribeAutoScalingGroups")
        groups = [self._groups[n] for n in sorted(self._groups) if not names or n in names]

        def keep(g):
            tags = {t["Key"]: t["Value"] for t in g.tags}
            for fname, values in filters:
                if fname.startswith("tag:"):
                    if tags.get(fname[4:]) not in values:
                        return False
                elif fname == "tag-key":
                    if not set(values) & set(tags):
                        return False
                elif fname == "tag-value":
                    if not set(values) & set(tags.values()):
                        return False
                else:
                    raise _invalid(f"Filter name {fname} is invalid.")
            return True
        page, token = self._page([g for g in groups if keep(g)], p)
        return {"AutoScalingGroups": [self._group_xml(g) for g in page], "NextToken": token}

    def _op_DescribeAutoScalingInstances(self, p):
        ids = _list(p, "InstanceIds")
        self._authorize("DescribeAutoScalingInstances")
        found = [i for g in self._groups.values() for i in g.instances.values() if not ids or i.id in ids]
        page, token = self._page(found, p)
        out = []
        for i in page:
            g = self._groups[i.group]
            tmpl = g.launch_template or (g.mixed["LaunchTemplate"]["LaunchTemplateSpecification"] if g.mixed else None)
            out.append({"InstanceId": i.id, "InstanceType": i.instance_type, "AutoScalingGroupName": g.name,
                        "AvailabilityZone": i.az, "LifecycleState": i.state, "HealthStatus": "HEALTHY",
                        "LaunchTemplate": tmpl, "ProtectedFromScaleIn": i.protected})
        return {"AutoScalingInstances": out, "NextToken": token}

    def _op_UpdateAutoScalingGroup(self, p):
        _required(p, "AutoScalingGroupName")
        name = p["AutoScalingGroupName"]
        mn, mx, desired = _int(p, "MinSize", 0), _int(p, "MaxSize", 0), _int(p, "DesiredCapacity", 0)
        lt, mip = self._launch_source(p, required=False)
        placement = self._placement(p)
        rebalance, protected = _bool(p, "CapacityRebalance"), _bool(p, "NewInstancesProtectedFromScaleIn")
        g = self._groups.get(name)
        self._authorize("UpdateAutoScalingGroup", group=g, group_name=name)
        g = self._existing(name)
        lt, mip = self._linked(lt, mip)
        new_min = g.min if mn is None else mn
        new_max = g.max if mx is None else mx
        if desired is None:  # as the API reference says: the desired capacity follows new bounds
            desired = min(max(g.desired, new_min), new_max) if new_min <= new_max else g.desired
        self._check_sizes(new_min, new_max, desired)
        g.min, g.max, g.desired = new_min, new_max, desired
        if lt or mip:
            g.launch_template, g.mixed = lt, mip
        if placement is not None:
            g.azs, g.subnets, g.vpc_zone_identifier = placement
        if rebalance is not None:
            g.capacity_rebalance = rebalance
        if protected is not None:
            g.new_protected = protected
        return None

    def _op_SetDesiredCapacity(self, p):
        _required(p, "AutoScalingGroupName", "DesiredCapacity")
        name = p["AutoScalingGroupName"]
        desired = _int(p, "DesiredCapacity", 0)
        _bool(p, "HonorCooldown")
        g = self._groups.get(name)
        self._authorize("SetDesiredCapacity", group=g, group_name=name)
        g = self._existing(name)
        if desired > g.max:
            raise _invalid(f"New SetDesiredCapacity value {desired} is above max value {g.max} for the "
                           f"AutoScalingGroup.")
        if desired < g.min:
            raise _invalid(f"New SetDesiredCapacity value {desired} is below min value {g.min} for the "
                           f"AutoScalingGroup.")
        g.desired = desired
        return None

    def _op_TerminateInstanceInAutoScalingGroup(self, p):
        _required(p, "InstanceId", "ShouldDecrementDesiredCapacity")
        _max_len(p, "InstanceId", 19)
        iid = p["InstanceId"]
        decrement = _bool(p, "ShouldDecrementDesiredCapacity")
        inst = self._find(iid)
        g = self._groups[inst.group] if inst is not None else None
        self._authorize("TerminateInstanceInAutoScalingGroup", group=g)
        if inst is None:
            raise _invalid(f"Instance Id not found - No managed instance found for instance ID: {iid}")
        if inst.state in TERMINATING_STATES:
            raise _Err("ScalingActivityInProgress", f"Instance {iid} is already {inst.state}: a scaling activity is "
                                                    f"in progress for it.")
        now = self.now()
        cause = f"At {_iso(now, ms=False)} instance {iid} was taken out of service in response to a user request"
        if decrement:
            if g.desired <= g.min:
                raise _invalid(f"Currently, desiredSize equals minSize ({g.min}). Terminating instance without "
                               f"replacement will violate group's min size constraint. Either set "
                               f"shouldDecrementDesiredCapacity flag to false or lower group's min size.")
            cause += f", shrinking the capacity from {g.desired} to {g.desired - 1}"
            g.desired -= 1
        cause += "."
        self._start_termination(inst, cause)
        details = {"Subnet ID": inst.subnet, "Availability Zone": inst.az} if inst.subnet else \
            {"Availability Zone": inst.az}
        return {"Activity": {"ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": g.name,
                             "Description": f"Terminating EC2 instance: {iid}", "Cause": cause,
                             "StartTime": _iso(now), "StatusCode": "InProgress", "Progress": 0,
                             "Details": json.dumps(details, separators=(",", ":"))}}

    def _op_DetachInstances(self, p):
        _required(p, "AutoScalingGroupName", "ShouldDecrementDesiredCapacity")
        name = p["AutoScalingGroupName"]
        decrement = _bool(p, "ShouldDecrementDesiredCapacity")
        ids = _list(p, "InstanceIds")
        if len(ids) > 20:
            raise _invalid("The number of instances to detach must be 20 or fewer.")
        g = self._groups.get(name)
        self._authorize("DetachInstances", group=g, group_name=name)
        g = self._existing(name)
        for iid in ids:
            inst = g.instances.get(iid)
            if inst is None:
                raise _invalid(f"The instance {iid} is not part of Auto Scaling group {name}.")
            if inst.state != "InService":
                raise _invalid(f"The instance {iid} is not in InService or Standby.")
        if decrement and g.desired - len(ids) < g.min:
            raise _invalid(f"The number of instances to detach would cause the group to fall below its minimum size "
                           f"({g.min}). Either set ShouldDecrementDesiredCapacity to false or lower the group's min "
                           f"size.")
        now = self.now()
        activities = []
        for iid in ids:
            inst = g.instances[iid]
            cause = f"At {_iso(now, ms=False)} instance {iid} was detached in response to a user request"
            if decrement:
                cause += f", shrinking the capacity from {g.desired} to {g.desired - 1}"
                g.desired -= 1
            del g.instances[iid]
            self._detached[iid] = name
            imds = self._imds.get(iid)
            if imds is not None:
                imds.set_target_lifecycle_state("Detached")
            details = {"Subnet ID": inst.subnet, "Availability Zone": inst.az} if inst.subnet else \
                {"Availability Zone": inst.az}
            activities.append({"ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": name,
                               "Description": f"Detaching EC2 instance: {iid}", "Cause": cause + ".",
                               "StartTime": _iso(now), "StatusCode": "InProgress", "Progress": 50,
                               "Details": json.dumps(details, separators=(",", ":"))})
        self._rounds += 1
        return {"Activities": activities}

    def lose_answer(self, action, count=1):
        """The next `count` requests for `action` are carried out, and then the connection drops
        without an answer: a client sees a transport error for a call that took effect (what a
        retry must cope with)."""
        with self._lock:
            self._lose[action] = self._lose.get(action, 0) + count

    def detached(self):
        """{instance id: group name} of every instance DetachInstances took out of its group (it runs
        on, in no group, with autoscaling/target-lifecycle-state Detached in a linked IMDS)."""
        with self._lock:
            return dict(self._detached)

    def _op_DeleteAutoScalingGroup(self, p):
        _required(p, "AutoScalingGroupName")
        name = p["AutoScalingGroupName"]
        force = bool(_bool(p, "ForceDelete"))
        g = self._groups.get(name)
        self._authorize("DeleteAutoScalingGroup", group=g, group_name=name)
        g = self._existing(name, quoted=True)
        if not force and g.instances:
            if any(i.state not in TERMINATING_STATES for i in g.instances.values()):
                raise _Err("ResourceInUse", "You cannot delete an AutoScalingGroup while there are instances or "
                                            "pending Spot instance request(s) still in the group.")
            raise _Err("ScalingActivityInProgress", "You cannot delete an AutoScalingGroup while there are scaling "
                                                    "activities in progress for that group.")
        for inst in list(g.instances.values()):
            for a in self._pending(inst):
                a["completed_by"] = "ForceDelete"
            self._remove(inst)
        del self._groups[name]
        return None

    def _op_PutLifecycleHook(self, p):
        _required(p, "LifecycleHookName", "AutoScalingGroupName")
        name = p["AutoScalingGroupName"]
        g = self._groups.get(name)
        self._authorize("PutLifecycleHook", group=g, group_name=name)
        g = self._existing(name)
        existing = g.hooks.get(p["LifecycleHookName"])
        hook = self._hook_from(p, g, existing)
        if existing is None and len(g.hooks) >= MAX_HOOKS:
            raise _Err("LimitExceeded", f"Already have {MAX_HOOKS} lifecycle hooks for AutoScalingGroup {name}; the "
                                        f"limit is {MAX_HOOKS}.")
        g.hooks[hook["LifecycleHookName"]] = hook
        return {}

    def _op_DescribeLifecycleHooks(self, p):
        _required(p, "AutoScalingGroupName")
        names = _list(p, "LifecycleHookNames")
        self._authorize("DescribeLifecycleHooks")
        g = self._existing(p["AutoScalingGroupName"])
        return {"LifecycleHooks": [dict(h) for n, h in g.hooks.items() if not names or n in names]}

    def _op_DeleteLifecycleHook(self, p):
        _required(p, "LifecycleHookName", "AutoScalingGroupName")
        name, hook = p["AutoScalingGroupName"], p["LifecycleHookName"]
        g = self._groups.get(name)
        self._authorize("DeleteLifecycleHook", group=g, group_name=name)
        g = self._existing(name)
        if hook not in g.hooks:
            raise _invalid(f"No Lifecycle Hook found with name {hook} for group {name}")
        del g.hooks[hook]
        for a in self._actions:
            if a["group"] == name and a["hook"] == hook and a["completed_by"] is None:
                a["result"], a["completed_by"] = "CONTINUE", "DeleteLifecycleHook"
        return {}

    def _active_action(self, p, action_name):
        _required(p, "LifecycleHookName", "AutoScalingGroupName")
        _max_len(p, "InstanceId", 19)
        name = p["AutoScalingGroupName"]
        g = self._groups.get(name)
        self._authorize(action_name, group=g, group_name=name)
        g = self._existing(name)
        token, iid = p.get("LifecycleActionToken"), p.get("InstanceId")
        if not token and not iid:
            raise _invalid("Either LifecycleActionToken or InstanceId must be specified.")
        for a in reversed(self._actions):
            if (a["group"] == g.name and a["hook"] == p["LifecycleHookName"] and a["completed_by"] is None
                    and (not token or a["token"] == token) and (not iid or a["instance_id"] == iid)):
                return a
        if token:
            raise _invalid(f"No active Lifecycle Action found with token {token}")
        raise _invalid(f"No active Lifecycle Action found with instance ID {iid}")

    def _op_CompleteLifecycleAction(self, p):
        _required(p, "LifecycleHookName", "AutoScalingGroupName", "LifecycleActionResult")
        result = p["LifecycleActionResult"]
        if result not in RESULTS:
            raise _invalid(f"Invalid LifecycleActionResult {result!r}: must be CONTINUE or ABANDON")
        a = self._active_action(p, "CompleteLifecycleAction")
        self._finish_action(a, result, "CompleteLifecycleAction")
        return {}

    def _op_RecordLifecycleActionHeartbeat(self, p):
        a = self._active_action(p, "RecordLifecycleActionHeartbeat")
        hook = self._groups[a["group"]].hooks.get(a["hook"])
        timeout = hook["HeartbeatTimeout"] if hook else a["deadline"] - a["started"]
        a["deadline"] = min(self.now() + timeout, a["global_deadline"])
        a["heartbeats"] += 1
        return {}


# ---------------------------------------------------------------- CLI
def _write_atomic(path, text):
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
            print(f"fake-autoscaling: bad --credentials {spec!r} (want AKID:SECRET[:SESSION_TOKEN])", file=sys.stderr)
            return 2
        creds[parts[0]] = (parts[1], parts[2] if len(parts) == 3 else None)
    try:
        srv = FakeAutoScalingServer(args.host, args.port, region=args.region, credentials=creds)
        for spec in args.group:
            parts = spec.split(":")
            if len(parts) not in (3, 4) or not parts[0]:
                raise ValueError(f"bad --group {spec!r} (want NAME:MIN:MAX[:DESIRED])")
            srv.create_group(parts[0], int(parts[1]), int(parts[2]), int(parts[3]) if len(parts) == 4 else None)
        for spec in args.instance:
            parts = spec.split(":")
            if len(parts) not in (2, 3):
                raise ValueError(f"bad --instance {spec!r} (want GROUP:ID[:ZONE])")
            srv.add_instance(parts[0], parts[1], parts[2] if len(parts) == 3 else None)
        srv.start()
    except (OSError, ValueError, KeyError) as e:
        print(f"fake-autoscaling: {e}", file=sys.stderr, flush=True)
        return 2
    if args.port_file:  # the file first: whoever sees the line finds the file too
        _write_atomic(args.port_file, f"{srv.port}\n")
    print(f"fake-autoscaling listening on {srv.endpoint}", flush=True)
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
    s.add_argument("--group", action="append", default=[], help="NAME:MIN:MAX[:DESIRED], in REGION+'a' (repeatable)")
    s.add_argument("--instance", action="append", default=[], help="GROUP:ID[:ZONE], InService (repeatable)")
    return _serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

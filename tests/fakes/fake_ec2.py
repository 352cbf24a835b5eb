#!/usr/bin/python3
"""Fake Amazon EC2 Query API on loopback, signed with SigV4 and verified: StopInstances and
TerminateInstances (what spotvisor's on-exit = stop | delete calls), CreateTags (the
spotvisor-phase tag), and launch templates: CreateLaunchTemplate, DescribeLaunchTemplates,
DescribeLaunchTemplateVersions, DeleteLaunchTemplate (what a fleet of Spot workers is built from,
and what fake_autoscaling.py checks groups against through link_ec2()).

Strict where EC2 is:
  - POST / with an application/x-www-form-urlencoded body (Action, Version=2016-11-15, lists
    flattened as Name.N, structures as Name.Field: InstanceId.1, LaunchTemplateData.SecurityGroupId.1,
    LaunchTemplateData.TagSpecification.1.Tag.1.Key); GET with the parameters in the query string
    is accepted too, as EC2 does;
  - SigV4 (Authorization header, service "ec2", the fake's region): an unknown key is 401
    AuthFailure, a wrong signature 403 SignatureDoesNotMatch, a session key without its
    X-Amz-Security-Token 401 AuthFailure, an expired token 400 RequestExpired, a request signed
    more than 15 min away from the fake's clock 400 RequestExpired... the codes EC2's error table
    gives (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html);
  - errors as EC2 sends them: <Response><Errors><Error><Code>..</Code><Message>..</Message>
    </Error></Errors><RequestID>..</RequestID></Response>;
  - an unknown instance id is 400 InvalidInstanceID.NotFound; deny(action) answers 403
    UnauthorizedOperation ("You are not authorized to perform this operation.") for any action
    the fake implements, after the request's own parameters were judged and before existence;
  - for the launch-template actions a parameter EC2 does not know is 400 UnknownParameter "The
    parameter X is not recognized" (EC2's wording); DryRun=true answers 412 DryRunOperation
    "Request would have succeeded, but DryRun flag is set." (or UnauthorizedOperation when denied)
    and changes nothing.

Launch templates. CreateLaunchTemplate: LaunchTemplateName (3-128 characters of
[a-zA-Z0-9().\\-/_], else 400 InvalidLaunchTemplateName.MalformedException), LaunchTemplateData
(required: absent or empty is 400 MissingParameter), VersionDescription (<= 255), ClientToken
(<= 128 ASCII; the same token with the same parameters answers the first template again, even
after it was deleted, as EC2's idempotency guide says; with other parameters 400
IdempotentParameterMismatch), TagSpecification.N (ResourceType must be launch-template, else
400 InvalidParameterValue "'T' is not a valid taggable resource type for this operation.").
The name already taken: 400 InvalidLaunchTemplateName.AlreadyExistsException "Launch template
name already in use.". Answers launchTemplate {launchTemplateId lt-<17 hex>, launchTemplateName,
createTime, createdBy (principal, default arn:aws:iam::ACCOUNT:root), defaultVersionNumber 1,
latestVersionNumber 1, tagSet}. LaunchTemplateData is parsed into a nested dict with the API's
member names (what boto3 takes as LaunchTemplateData and DescribeLaunchTemplateVersions gives
back), driven by the field table LTD below: KernelId, EbsOptimized, IamInstanceProfile {Arn, Name},
BlockDeviceMappings [{DeviceName, VirtualName, NoDevice, Ebs {Encrypted, DeleteOnTermination,
Iops, KmsKeyId, SnapshotId, VolumeSize, VolumeType, Throughput}}], NetworkInterfaces [{...,
DeviceIndex, SubnetId, Groups, AssociatePublicIpAddress, ...}], ImageId, InstanceType, KeyName,
Monitoring, Placement, RamDiskId, DisableApiTermination, DisableApiStop,
InstanceInitiatedShutdownBehavior (stop | terminate), UserData, TagSpecifications
[{ResourceType, Tags [{Key, Value}]}], SecurityGroupIds, SecurityGroups, InstanceMarketOptions
{MarketType spot, SpotOptions {MaxPrice, SpotInstanceType, BlockDurationMinutes, ValidUntil,
InstanceInterruptionBehavior}}, CreditSpecification, CpuOptions,
CapacityReservationSpecification, LicenseSpecifications, HibernationOptions, MetadataOptions
{HttpTokens, HttpPutResponseHopLimit, HttpEndpoint, HttpProtocolIpv6, InstanceMetadataTags},
EnclaveOptions, PrivateDnsNameOptions, MaintenanceOptions. Integers and booleans are typed;
enumerations (shutdown behaviour, market and Spot options, metadata options, volume type,
tenancy...) must be one of their values (400 InvalidParameterValue). The AMI, instance type,
key pair, security groups, profile... are NOT checked: "Launch template parameters are not fully
validated when you create the launch template" (EC2 User Guide, launch template restrictions);
Auto Scaling checks them when a group uses the template. UserData must be base64: whitespace is
ignored and missing padding tolerated (EC2 has been seen accepting both), any other character
is 400 InvalidUserData.Malformed "Invalid BASE64 encoding of user data.".
DescribeLaunchTemplates: LaunchTemplateName.N / LaunchTemplateId.N (one unknown name: 400
InvalidLaunchTemplateName.NotFoundException "At least one of the launch templates specified in
the request does not exist."; an unknown id: 400 InvalidLaunchTemplateId.NotFound), Filter.N
(launch-template-name, tag:KEY, tag-key; values may use the * and ? wildcards; another name is
400 InvalidParameterValue "The filter 'X' is invalid"), MaxResults 1..200, NextToken; in creation
order. DescribeLaunchTemplateVersions: by LaunchTemplateName or LaunchTemplateId (unknown: 400
InvalidLaunchTemplateName.NotFoundException "The specified launch template, with template name
N, does not exist." / InvalidLaunchTemplateId.NotFound "The specified launch template, with
template ID ID, does not exist."), LaunchTemplateVersion.N ($Latest, $Default, numbers; a number
the template lacks: 400 InvalidLaunchTemplateId.VersionNotFound "Could not find the specified
version V for the launch template with ID ID."), MinVersion / MaxVersion (inclusive),
MaxResults, NextToken, newest first; without a template only $Latest / $Default are allowed
(one entry per template), and no version at all is 400 MissingParameter with EC2's long
"To describe the launch template data for all your launch templates, ..." text (a number there:
InvalidParameterValue with the same text). DeleteLaunchTemplate: by LaunchTemplateName or
LaunchTemplateId (unknown: the NotFound codes and texts above), answers the deleted template;
the name can be used again. An id that is not lt-<hex> is 400 InvalidLaunchTemplateId.Malformed.
CreateTags also tags launch templates (lt- ids).

Where the texts come from. Confirmed from clients and issue threads quoting the service (and
moto's tests marked aws_verified): "Launch template name already in use.", "At least one of the
launch templates specified in the request does not exist.", "The specified launch template, with
template name N, does not exist.", "The specified launch template, with template ID ID, does not
exist." (DeleteLaunchTemplate, DescribeLaunchTemplateVersions), "Could not find the specified
version V for the launch template with ID ID.", the two long DescribeLaunchTemplateVersions texts,
"Invalid BASE64 encoding of user data.", "'T' is not a valid taggable resource type for this
operation.", "Arguments on this idempotent request are inconsistent with arguments used in
previous request(s)." (RunInstances' wording), "The parameter X is not recognized", MissingParameter
for empty LaunchTemplateData ("No launch template data was provided. Launch template data is
required to create a launch template."), and the codes of the malformed name and id. Chosen
here, not confirmed: the malformed-name text (two variants have been seen: "A launch template
name must be between 3 and 128 characters, and may contain letters, numbers, and the following
characters: - ( ) . / _." is used), the malformed-id text (from the error table's description),
InvalidLaunchTemplateId.NotFound's text for DescribeLaunchTemplates, the texts for a missing
or doubled name/id on Delete/DescribeLaunchTemplateVersions ("The request must contain the
parameter launch template ID or launch template name", and "Either provide launch template ID
or launch template name ..." after ModifyLaunchTemplate's confirmed text), every
InvalidParameterValue text for bad numbers, booleans, enumeration values, tags, MaxResults,
filters and the VersionDescription and ClientToken lengths, InvalidNextToken's, MinVersion /
MaxVersion being inclusive (the API reference says "after which"; moto's tests are inclusive),
versions listed newest first, and the checks' order (signature, action, parameters, deny,
DryRun, existence).

Not implemented: every other action (400 InvalidAction), CreateLaunchTemplateVersion,
ModifyLaunchTemplate and DeleteLaunchTemplateVersions (add_launch_template_version() makes
versions for tests), ValidationWarning in answers, DescribeLaunchTemplateVersions' filters,
the LaunchTemplateData members InstanceRequirements, ElasticGpuSpecifications,
ElasticInferenceAccelerators and the network interfaces' address and prefix lists (400
UnknownParameter saying the fake does not implement them), the 16 KB user-data limit and other
quotas, presigned URLs, DryRun for the instance actions, the instances' state machine beyond
recording the call (a stopped instance stays "stopped" here), HTTPS. Checked against boto3 1.26's
EC2 client and aws-cli 2.9.19 in test_fake_ec2.py.

  srv = FakeEc2Server(region="us-east-1", credentials={"AKID": "secret"}, instances=["i-0123"]).start()
  srv.endpoint                 # "http://127.0.0.1:PORT" (AWS_ENDPOINT_URL_EC2, --endpoint-url)
  srv.calls() -> [(action, [instance or resource ids])] for StopInstances, TerminateInstances, CreateTags
  srv.requests() -> [(action, {param: value})] for every request whose signature verified
  srv.state(id) ; srv.tags(id) ; srv.deny(action) ; srv.allow(action) ; srv.stop()
  srv.add_launch_template(name, data, tags=None, version_description=None) -> "lt-..."
  srv.add_launch_template_version(name_or_id, data, version_description=None, make_default=False) -> number
  srv.launch_templates() -> [names, sorted]
  srv.launch_template(name) or srv.launch_template(template_id="lt-...") -> None or
      {"id", "name", "create_time", "created_by", "default_version", "latest_version",
       "tags": {k: v}, "data": the default version's LaunchTemplateData dict,
       "user_data_text": its UserData decoded (UTF-8, errors replaced) or None,
       "versions": [{"number", "description", "create_time", "default", "data", "user_data_text"}]}
"""
import base64
import binascii
import calendar
import copy
import fnmatch
import hashlib
import hmac
import http.server
import re
import socketserver
import threading
import time
import urllib.parse
import uuid

from fake_s3 import _canonical_query, _parse_query, _signing_key  # the same SigV4 rules

API_VERSION = "2016-11-15"
NS = f"http://ec2.amazonaws.com/doc/{API_VERSION}/"
INSTANCE_ACTIONS = ("StopInstances", "TerminateInstances")
TEMPLATE_ACTIONS = ("CreateLaunchTemplate", "DescribeLaunchTemplates", "DescribeLaunchTemplateVersions",
                    "DeleteLaunchTemplate")
ACTIONS = INSTANCE_ACTIONS + ("CreateTags",) + TEMPLATE_ACTIONS
TEMPLATE_NAME = re.compile(r"[a-zA-Z0-9().\-/_]{3,128}\Z")
TEMPLATE_ID = re.compile(r"lt-[0-9a-f]+\Z")
B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}\Z")
UNAUTHORIZED = "You are not authorized to perform this operation."
MALFORMED_NAME = ("A launch template name must be between 3 and 128 characters, and may contain letters, numbers, "
                  "and the following characters: - ( ) . / _.")
ALL_VERSIONS_HELP = ("To describe the launch template data for all your launch templates, for \u2018--versions\u2019 "
                     "specify \u2018$Latest\u2019, \u2018$Default\u2019, or both, and omit "
                     "\u2018--launch-template-id\u2019, \u2018--launch-template-name\u2019, and version numbers. To "
                     "describe the launch template data for a specific launch template, specify "
                     "\u2018--launch-template-id\u2019 or \u2018--launch-template-name\u2019, and for "
                     "\u2018--versions\u2019 specify one or more of the following values: \u2018$Latest\u2019, "
                     "\u2018$Default\u2019, or one or more version numbers.")
REQUEST_LOG_LIMIT = 10_000
LT_TAG_RESOURCES = ("instance", "volume", "network-interface", "spot-instances-request", "elastic-gpu")


class _Err(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _bad(message, code="InvalidParameterValue"):
    return _Err(400, code, message)


def _xml_escape(s):
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;"))


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


# ---------------------------------------------------------------- LaunchTemplateData, as a field table
class _F:
    """One member of a structure: its API member name, the name it travels under in a request
    (query) and in an answer (xml), and its kind: "s" string, "i" integer, "b" boolean, "b64"
    base64 string, a tuple of allowed values (an enumeration), [_F...] a structure, or ("list",
    kind) a list (N from 1) of that kind. missing: why the fake refuses it, when it does."""

    def __init__(self, member, kind="s", query=None, xml=None, missing=None):
        self.member, self.kind, self.missing = member, kind, missing
        self.query = query or member
        self.xml = xml or member[:1].lower() + member[1:]


def _L(kind):
    return ("list", kind)


NOT_HERE = "fake_ec2.py does not implement it"
TAG = [_F("Key"), _F("Value")]
EBS = [_F("Encrypted", "b"), _F("DeleteOnTermination", "b"), _F("Iops", "i"), _F("KmsKeyId"), _F("SnapshotId"),
       _F("VolumeSize", "i"), _F("VolumeType", ("standard", "io1", "io2", "gp2", "sc1", "st1", "gp3")),
       _F("Throughput", "i")]
NETWORK_INTERFACE = [
    _F("AssociateCarrierIpAddress", "b"), _F("AssociatePublicIpAddress", "b"), _F("DeleteOnTermination", "b"),
    _F("Description"), _F("DeviceIndex", "i"), _F("Groups", _L("s"), query="SecurityGroupId", xml="groupSet"),
    _F("InterfaceType"), _F("Ipv6AddressCount", "i"), _F("NetworkInterfaceId"), _F("PrivateIpAddress"),
    _F("SecondaryPrivateIpAddressCount", "i"), _F("SubnetId"), _F("NetworkCardIndex", "i"),
    _F("Ipv4PrefixCount", "i"), _F("Ipv6PrefixCount", "i"),
    _F("Ipv6Addresses", missing=NOT_HERE), _F("PrivateIpAddresses", missing=NOT_HERE),
    _F("Ipv4Prefixes", query="Ipv4Prefix", missing=NOT_HERE), _F("Ipv6Prefixes", query="Ipv6Prefix", missing=NOT_HERE)]
LTD = [  # RequestLaunchTemplateData (requests) / ResponseLaunchTemplateData (answers)
    _F("KernelId"), _F("EbsOptimized", "b"),
    _F("IamInstanceProfile", [_F("Arn"), _F("Name")]),
    _F("BlockDeviceMappings", _L([_F("DeviceName"), _F("VirtualName"), _F("Ebs", EBS), _F("NoDevice")]),
       query="BlockDeviceMapping", xml="blockDeviceMappingSet"),
    _F("NetworkInterfaces", _L(NETWORK_INTERFACE), query="NetworkInterface", xml="networkInterfaceSet"),
    _F("ImageId"), _F("InstanceType"), _F("KeyName"),
    _F("Monitoring", [_F("Enabled", "b")]),
    _F("Placement", [_F("AvailabilityZone"), _F("Affinity"), _F("GroupName"), _F("HostId"),
                     _F("Tenancy", ("default", "dedicated", "host")), _F("SpreadDomain"), _F("HostResourceGroupArn"),
                     _F("PartitionNumber", "i"), _F("GroupId")]),
    _F("RamDiskId"), _F("DisableApiTermination", "b"),
    _F("InstanceInitiatedShutdownBehavior", ("stop", "terminate")),
    _F("UserData", "b64"),
    _F("TagSpecifications", _L([_F("ResourceType"), _F("Tags", _L(TAG), query="Tag", xml="tagSet")]),
       query="TagSpecification", xml="tagSpecificationSet"),
    _F("ElasticGpuSpecifications", query="ElasticGpuSpecification", missing=NOT_HERE),
    _F("ElasticInferenceAccelerators", query="ElasticInferenceAccelerator", missing=NOT_HERE),
    _F("SecurityGroupIds", _L("s"), query="SecurityGroupId", xml="securityGroupIdSet"),
    _F("SecurityGroups", _L("s"), query="SecurityGroup", xml="securityGroupSet"),
    _F("InstanceMarketOptions", [
        _F("MarketType", ("spot",)),
        _F("SpotOptions", [_F("MaxPrice"), _F("SpotInstanceType", ("one-time", "persistent")),
                           _F("BlockDurationMinutes", "i"), _F("ValidUntil"),
                           _F("InstanceInterruptionBehavior", ("hibernate", "stop", "terminate"))])]),
    _F("CreditSpecification", [_F("CpuCredits")]),
    _F("CpuOptions", [_F("CoreCount", "i"), _F("ThreadsPerCore", "i")]),
    _F("CapacityReservationSpecification", [
        _F("CapacityReservationPreference", ("open", "none")),
        _F("CapacityReservationTarget", [_F("CapacityReservationId"), _F("CapacityReservationResourceGroupArn")])]),
    _F("LicenseSpecifications", _L([_F("LicenseConfigurationArn")]), query="LicenseSpecification", xml="licenseSet"),
    _F("HibernationOptions", [_F("Configured", "b")]),
    _F("MetadataOptions", [_F("HttpTokens", ("optional", "required")), _F("HttpPutResponseHopLimit", "i"),
                           _F("HttpEndpoint", ("disabled", "enabled")), _F("HttpProtocolIpv6", ("disabled", "enabled")),
                           _F("InstanceMetadataTags", ("disabled", "enabled"))]),
    _F("EnclaveOptions", [_F("Enabled", "b")]),
    _F("InstanceRequirements", missing=NOT_HERE),
    _F("PrivateDnsNameOptions", [_F("HostnameType", ("ip-name", "resource-name")),
                                 _F("EnableResourceNameDnsARecord", "b"), _F("EnableResourceNameDnsAAAARecord", "b")]),
    _F("MaintenanceOptions", [_F("AutoRecovery", ("default", "disabled"))]),
    _F("DisableApiStop", "b"),
]


def _scalar(kind, value, where):
    if kind == "i":
        if not re.fullmatch(r"-?\d{1,18}", value):
            raise _bad(f"Invalid value '{value}' for {where}: not an integer.")
        return int(value)
    if kind == "b":
        if value.lower() not in ("true", "false"):
            raise _bad(f"Invalid value '{value}' for {where}: not a boolean.")
        return value.lower() == "true"
    if kind == "b64":
        _decode_user_data(value)
        return value
    if isinstance(kind, tuple) and value not in kind:
        raise _bad(f"Value ({value}) for parameter {where} is invalid. Valid values: {', '.join(kind)}.")
    return value


def _decode_user_data(value):
    """UserData's bytes; InvalidUserData.Malformed unless it is base64 (whitespace ignored,
    padding optional)."""
    s = re.sub(r"\s+", "", value)
    if not B64.match(s) or len(s.rstrip("=")) % 4 == 1:
        raise _Err(400, "InvalidUserData.Malformed", "Invalid BASE64 encoding of user data.")
    s = s.rstrip("=")
    try:
        return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise _Err(400, "InvalidUserData.Malformed", "Invalid BASE64 encoding of user data.")


def _parse(flat, fields, where):
    """The structure fields describe, from flat {"A.B.1.C": value} (keys relative to where)."""
    out, used = {}, set()
    for f in fields:
        q = f.query
        mine = {k: v for k, v in flat.items() if k == q or k.startswith(q + ".")}
        if not mine:
            continue
        name = f"{where}.{q}" if where else q
        if f.missing:
            raise _bad(f"The parameter {name} is not recognized ({f.missing})", "UnknownParameter")
        used.update(mine)
        kind = f.kind
        if isinstance(kind, list):
            sub = {k[len(q) + 1:]: v for k, v in mine.items() if k != q}
            if q in mine:
                raise _bad(f"The parameter {name} is not recognized", "UnknownParameter")
            out[f.member] = _parse(sub, kind, name)
        elif isinstance(kind, tuple) and kind[:1] == ("list",):
            items = {}
            for k, v in mine.items():
                m = re.fullmatch(re.escape(q) + r"\.([1-9]\d{0,3})(?:\.(.+))?", k)
                if not m:
                    raise _bad(f"The parameter {where + '.' if where else ''}{k} is not recognized", "UnknownParameter")
                items.setdefault(int(m.group(1)), {})[m.group(2)] = v
            values = []
            for n in sorted(items):
                item, item_name = items[n], f"{name}.{n}"
                if isinstance(kind[1], list):
                    if None in item:
                        raise _bad(f"The parameter {item_name} is not recognized", "UnknownParameter")
                    values.append(_parse(item, kind[1], item_name))
                else:
                    extra = [k for k in item if k is not None]
                    if extra:
                        raise _bad(f"The parameter {item_name}.{extra[0]} is not recognized", "UnknownParameter")
                    values.append(_scalar(kind[1], item[None], item_name))
            out[f.member] = values
        else:
            extra = [k for k in mine if k != q]
            if extra:
                raise _bad(f"The parameter {where + '.' if where else ''}{extra[0]} is not recognized",
                           "UnknownParameter")
            out[f.member] = _scalar(kind, mine[q], name)
    left = sorted(set(flat) - used)
    if left:
        raise _bad(f"The parameter {where + '.' if where else ''}{left[0]} is not recognized", "UnknownParameter")
    return out


def _flatten(data, fields, prefix):
    """The request parameters a client would send for data (the inverse of _parse)."""
    out = {}
    by_member = {f.member: f for f in fields}
    for member, value in data.items():
        f = by_member.get(member)
        if f is None:
            raise ValueError(f"{prefix}: no member {member!r}")
        name = f"{prefix}.{f.query}" if prefix else f.query
        kind = f.kind
        if isinstance(kind, list):
            out.update(_flatten(value, kind, name))
        elif isinstance(kind, tuple) and kind[:1] == ("list",):
            for n, item in enumerate(value, 1):
                if isinstance(kind[1], list):
                    out.update(_flatten(item, kind[1], f"{name}.{n}"))
                else:
                    out[f"{name}.{n}"] = _text(item)
        else:
            out[name] = _text(value)
    return out


def _text(v):
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _xml_struct(data, fields):
    """data as the XML elements of an answer, in the table's order."""
    out = ""
    for f in fields:
        if f.member not in data:
            continue
        value, kind = data[f.member], f.kind
        if isinstance(kind, list):
            inner = _xml_struct(value, kind)
        elif isinstance(kind, tuple) and kind[:1] == ("list",):
            inner = "".join("<item>" + (_xml_struct(v, kind[1]) if isinstance(kind[1], list) else _xml_escape(_text(v)))
                            + "</item>" for v in value)
        else:
            inner = _xml_escape(_text(value))
        out += f"<{f.xml}>{inner}</{f.xml}>"
    return out


def _tags_xml(tags):
    if not tags:
        return ""
    items = "".join(f"<item><key>{_xml_escape(k)}</key><value>{_xml_escape(v)}</value></item>" for k, v in tags.items())
    return f"<tagSet>{items}</tagSet>"


def _check_tag(key, value, where):
    if not key or len(key) > 128 or len(value) > 256 or key.lower().startswith("aws:"):
        raise _bad(f"Tag {where} is not valid (key 1-128, value 0-256 characters, no aws: prefix)")


def _user_data_text(data):
    ud = data.get("UserData")
    return None if ud is None else _decode_user_data(ud).decode("utf-8", "replace")


def _numbered(p, prefix):
    """Values of prefix.N, in N order."""
    pat = re.compile(re.escape(prefix) + r"\.(\d+)\Z")
    return [v for _, v in sorted((int(m.group(1)), v) for k, v in p.items() for m in [pat.match(k)] if m)]


def _filters(p):
    """[(name, [values])] from Filter.N.Name / Filter.N.Value.M."""
    out = {}
    for k, v in p.items():
        m = re.fullmatch(r"Filter\.(\d+)\.(Name|Value\.(\d+))", k)
        if m:
            f = out.setdefault(int(m.group(1)), {"name": None, "values": {}})
            if m.group(2) == "Name":
                f["name"] = v
            else:
                f["values"][int(m.group(3))] = v
    return [(f["name"], [f["values"][n] for n in sorted(f["values"])]) for _, f in sorted(out.items())]


class FakeEc2Server:
    def __init__(self, host="127.0.0.1", port=0, region="us-east-1", credentials=None, instances=(),
                 clock=time.time, account_id="123456789012", principal=None):
        """principal: the ARN answered as a launch template's createdBy."""
        self.host, self.port, self.region, self.clock = host, port, region, clock
        self.account_id = account_id
        self.principal = principal or f"arn:aws:iam::{account_id}:root"
        self._lock = threading.Lock()
        self._creds = {}
        for akid, v in (credentials or {}).items():
            if isinstance(v, tuple):
                self.add_credentials(akid, *v)
            else:
                self.add_credentials(akid, v)
        self._instances = {i: "running" for i in instances}
        self._calls = []
        self._requests = []
        self._tags = {}
        self._denied = set()
        self._templates = {}             # id -> template dict, in creation order
        self._tokens = {}                # ClientToken -> (request fingerprint, launchTemplate XML)
        self._server = None
        self._thread = None

    # ---- control
    def add_credentials(self, access_key_id, secret, session_token=None, expires_at=None):
        with self._lock:
            self._creds[access_key_id] = (secret, session_token, expires_at)

    def add_instance(self, instance_id, state="running"):
        with self._lock:
            self._instances[instance_id] = state

    def deny(self, action):
        """Answer 403 UnauthorizedOperation to every later call of action."""
        with self._lock:
            self._denied.add(action)

    def allow(self, action):
        with self._lock:
            self._denied.discard(action)

    def calls(self):
        """[(action, [ids])] for StopInstances, TerminateInstances and CreateTags (instance or
        resource ids), denied calls included, oldest first."""
        with self._lock:
            return list(self._calls)

    def requests(self):
        """[(action, {param: value})] for every request whose signature verified (Action and
        Version left out), oldest first, whatever the answer; the last 10,000."""
        with self._lock:
            return [(a, dict(p)) for a, p in self._requests]

    def tags(self, instance_id):
        with self._lock:
            return dict(self._tags.get(instance_id, {}))

    def state(self, instance_id):
        with self._lock:
            return self._instances.get(instance_id)

    def add_launch_template(self, name, data, tags=None, version_description=None):
        """A launch template as CreateLaunchTemplate would make it from data (the API's
        LaunchTemplateData structure, UserData in base64); returns its id. ValueError where the
        API refuses."""
        p = {"LaunchTemplateName": name}
        try:
            p.update(_flatten(data, LTD, "LaunchTemplateData"))
        except ValueError as e:
            raise ValueError(f"UnknownParameter: {e}") from None
        if version_description is not None:
            p["VersionDescription"] = version_description
        for n, (k, v) in enumerate((tags or {}).items(), 1):
            p["TagSpecification.1.ResourceType"] = "launch-template"
            p[f"TagSpecification.1.Tag.{n}.Key"], p[f"TagSpecification.1.Tag.{n}.Value"] = k, v
        try:
            with self._lock:
                return self._create_template(p, authorize=False)["id"]
        except _Err as e:
            raise ValueError(f"{e.code}: {e.message}") from None

    def add_launch_template_version(self, template, data, version_description=None, make_default=False):
        """A new version (what CreateLaunchTemplateVersion makes, without a SourceVersion) of the
        template with that name or id; returns its number."""
        try:
            parsed = _parse(_flatten(data, LTD, ""), LTD, "")
        except (ValueError, _Err) as e:
            raise ValueError(str(e)) from None
        with self._lock:
            t = self._find_template(template)
            if t is None:
                raise KeyError(f"no launch template {template!r}")
            t["latest"] += 1
            t["versions"][t["latest"]] = {"number": t["latest"], "description": version_description,
                                          "create_time": self.clock(), "data": parsed}
            if make_default:
                t["default"] = t["latest"]
            return t["latest"]

    def launch_templates(self):
        with self._lock:
            return sorted(t["name"] for t in self._templates.values())

    def launch_template(self, name=None, template_id=None):
        """A snapshot of the launch template with that name (or template_id), or None."""
        with self._lock:
            t = self._templates.get(template_id) if template_id else self._by_name(name)
            if t is None or (name is not None and t["name"] != name):
                return None
            versions = []
            for n in sorted(t["versions"], reverse=True):
                v = t["versions"][n]
                versions.append({"number": n, "description": v["description"], "create_time": v["create_time"],
                                 "default": n == t["default"], "data": copy.deepcopy(v["data"]),
                                 "user_data_text": _user_data_text(v["data"])})
            default = t["versions"][t["default"]]["data"]
            return {"id": t["id"], "name": t["name"], "create_time": t["create_time"], "created_by": t["created_by"],
                    "default_version": t["default"], "latest_version": t["latest"], "tags": dict(t["tags"]),
                    "data": copy.deepcopy(default), "user_data_text": _user_data_text(default), "versions": versions}

    @property
    def endpoint(self):
        return f"http://{self.host}:{self.port}"

    def start(self):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                outer._handle(self)

            def do_GET(self):
                outer._handle(self)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- requests
    def _handle(self, h):
        rid = str(uuid.uuid4())
        try:
            try:
                n = int(h.headers.get("Content-Length", "0"))
            except ValueError:
                raise _Err(400, "InvalidParameterValue", "bad Content-Length")
            if n < 0 or n > 1 << 20:
                raise _Err(400, "InvalidParameterValue", "request too large")
            body = h.rfile.read(n) if n else b""
            path, _, query = h.path.partition("?")
            if path != "/":
                raise _Err(400, "InvalidAction", f"The action {path} is not valid for this web service.")
            self._verify(h, path, query, body)
            params = {}
            for raw in (query, body.decode("utf-8", "replace") if h.command == "POST" else ""):
                for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True):
                    params[k] = v
            with self._lock:
                self._requests.append((params.get("Action", ""),
                                       {k: v for k, v in params.items() if k not in ("Action", "Version")}))
                del self._requests[:-REQUEST_LOG_LIMIT]
            status, xml = self._act(params, rid)
        except _Err as e:
            status = e.status
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{e.code}</Code>'
                   f"<Message>{_xml_escape(e.message)}</Message></Error></Errors><RequestID>{rid}</RequestID>"
                   "</Response>")
        data = xml.encode()
        h.send_response(status)
        h.send_header("Content-Type", "text/xml;charset=UTF-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _verify(self, h, path, query, body):
        auth = h.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            raise _Err(401, "AuthFailure", "AWS was not able to validate the provided access credentials")
        fields = {}
        for part in auth[len("AWS4-HMAC-SHA256 "):].split(","):
            k, _, v = part.strip().partition("=")
            fields[k] = v
        cred = fields.get("Credential", "").split("/")
        if len(cred) != 5 or cred[3] != "ec2" or cred[4] != "aws4_request":
            raise _Err(400, "IncompleteSignature", "malformed Credential")
        akid, date, region = cred[0], cred[1], cred[2]
        with self._lock:
            c = self._creds.get(akid)
        if c is None:
            raise _Err(401, "AuthFailure", "AWS was not able to validate the provided access credentials")
        secret, token, expires_at = c
        if region != self.region:
            raise _Err(400, "AuthFailure", f"Credential should be scoped to a valid region, not '{region}'.")
        if token is not None:
            if h.headers.get("X-Amz-Security-Token") != token:
                raise _Err(401, "AuthFailure", "AWS was not able to validate the provided access credentials")
            if expires_at is not None and self.clock() >= expires_at:
                raise _Err(400, "RequestExpired", "Request has expired.")
        amz_date = h.headers.get("X-Amz-Date", "")
        if not amz_date.startswith(date):
            raise _Err(400, "AuthFailure", "X-Amz-Date does not match the credential's date")
        try:
            sent = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
        except ValueError:
            raise _Err(400, "AuthFailure", "X-Amz-Date is not a date")
        if abs(self.clock() - sent) > 15 * 60:  # as EC2: a request signed more than 15 min away
            raise _Err(400, "RequestExpired", "Request has expired.")
        signed = fields.get("SignedHeaders", "").split(";")
        if "host" not in signed:
            raise _Err(400, "AuthFailure", "host must be signed")
        canon_headers = ""
        for name in signed:
            values = h.headers.get_all(name) or []
            canon_headers += name + ":" + ",".join(" ".join(v.split()) for v in values) + "\n"
        payload = hashlib.sha256(body).hexdigest()
        declared = h.headers.get("X-Amz-Content-Sha256")
        if declared is not None and declared != payload:
            raise _Err(400, "AuthFailure", "x-amz-content-sha256 does not match the body")
        creq = "\n".join([h.command, path, _canonical_query(_parse_query(query)), canon_headers,
                          ";".join(signed), payload])
        scope = f"{date}/{region}/ec2/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
        want = hmac.new(_signing_key(secret, date, region, "ec2"), to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want.encode(), fields.get("Signature", "").encode("ascii", "replace")):
            raise _Err(403, "SignatureDoesNotMatch", "The request signature we calculated does not match the "
                                                     "signature you provided.")

    def _create_tags(self, params, rid):
        if params.get("Version") != API_VERSION:
            raise _Err(400, "InvalidParameterValue", f"unsupported Version {params.get('Version')!r}")
        ids = [v for k, v in sorted(params.items()) if k.startswith("ResourceId.")]
        tags = {}
        n = 1
        while f"Tag.{n}.Key" in params:
            key, value = params[f"Tag.{n}.Key"], params.get(f"Tag.{n}.Value", "")
            _check_tag(key, value, n)
            tags[key] = value
            n += 1
        if not ids or not tags:
            raise _Err(400, "MissingParameter", "The request must contain the parameters ResourceId and Tag")
        with self._lock:
            self._calls.append(("CreateTags", ids))
            if "CreateTags" in self._denied:
                raise _Err(403, "UnauthorizedOperation", UNAUTHORIZED)
            for i in ids:
                if i not in self._instances and i not in self._templates:
                    raise _Err(400, "InvalidID", f"The ID '{i}' is not valid")
            for i in ids:
                if i in self._templates:
                    self._templates[i]["tags"].update(tags)
                else:
                    self._tags.setdefault(i, {}).update(tags)
        return 200, (f'<?xml version="1.0" encoding="UTF-8"?>\n<CreateTagsResponse xmlns="{NS}">'
                     f"<requestId>{rid}</requestId><return>true</return></CreateTagsResponse>")

    def _act(self, params, rid):
        action = params.get("Action", "")
        if action == "CreateTags":
            return self._create_tags(params, rid)
        if action in TEMPLATE_ACTIONS:
            if params.get("Version") != API_VERSION:
                raise _Err(400, "InvalidParameterValue", f"unsupported Version {params.get('Version')!r}")
            p = {k: v for k, v in params.items() if k not in ("Action", "Version")}
            with self._lock:
                result = getattr(self, "_op_" + action)(p)
            return 200, (f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{NS}">'
                         f"<requestId>{rid}</requestId>{result}</{action}Response>")
        if action not in INSTANCE_ACTIONS:
            raise _Err(400, "InvalidAction", f"The action {action} is not valid for this web service.")
        if params.get("Version") != API_VERSION:
            raise _Err(400, "InvalidParameterValue", f"unsupported Version {params.get('Version')!r}")
        ids = [v for k, v in sorted(params.items()) if k.startswith("InstanceId.")]
        if not ids:
            raise _Err(400, "MissingParameter", "The request must contain the parameter InstanceId")
        with self._lock:
            self._calls.append((action, ids))
            if action in self._denied:
                raise _Err(403, "UnauthorizedOperation", UNAUTHORIZED)
            for i in ids:
                if i not in self._instances:
                    raise _Err(400, "InvalidInstanceID.NotFound", f"The instance ID '{i}' does not exist")
            items = ""
            tag = "StopInstancesResponse" if action == "StopInstances" else "TerminateInstancesResponse"
            new = ("stopping", 64) if action == "StopInstances" else ("shutting-down", 32)
            for i in ids:
                prev = self._instances[i]
                self._instances[i] = "stopped" if action == "StopInstances" else "terminated"
                items += (f"<item><instanceId>{i}</instanceId><currentState><code>{new[1]}</code><name>{new[0]}"
                          f"</name></currentState><previousState><code>16</code><name>{prev}</name></previousState>"
                          "</item>")
        return 200, (f'<?xml version="1.0" encoding="UTF-8"?>\n<{tag} xmlns="{NS}">'
                     f"<requestId>{rid}</requestId><instancesSet>{items}</instancesSet></{tag}>")

    # ---- launch templates (lock held)
    @staticmethod
    def _known(p, allowed, patterns=()):
        for k in sorted(p):
            if k not in allowed and not any(re.fullmatch(pat, k) for pat in patterns):
                raise _bad(f"The parameter {k} is not recognized", "UnknownParameter")

    def _authorize(self, action, p):
        """deny() first, then DryRun: a denied dry run is UnauthorizedOperation, an allowed one
        DryRunOperation (412), as EC2 answers them."""
        dry = _scalar("b", p["DryRun"], "DryRun") if "DryRun" in p else False
        if action in self._denied:
            raise _Err(403, "UnauthorizedOperation", UNAUTHORIZED)
        if dry:
            raise _Err(412, "DryRunOperation", "Request would have succeeded, but DryRun flag is set.")

    def _by_name(self, name):
        return next((t for t in self._templates.values() if t["name"] == name), None)

    def _find_template(self, name_or_id):
        t = self._templates.get(name_or_id)
        return t if t is not None else self._by_name(name_or_id)

    @staticmethod
    def _check_name(name):
        if not TEMPLATE_NAME.match(name):
            raise _Err(400, "InvalidLaunchTemplateName.MalformedException", MALFORMED_NAME)

    @staticmethod
    def _check_id(tid):
        if not TEMPLATE_ID.match(tid):
            raise _Err(400, "InvalidLaunchTemplateId.Malformed",
                       f"The launch template ID '{tid}' is malformed. Ensure that you specify the launch template ID "
                       f"in the form lt-xxxxxxxxxxxxxxxxx.")

    def _one_template(self, p, verb):
        """The template a request names by LaunchTemplateName xor LaunchTemplateId (None when
        neither is given); NotFound errors as EC2 words them."""
        name, tid = p.get("LaunchTemplateName"), p.get("LaunchTemplateId")
        if name is not None and tid is not None:
            raise _bad(f"Either provide launch template ID or launch template name to {verb}.",
                       "InvalidParameterCombination")
        if tid is not None:
            self._check_id(tid)
        elif name is not None:
            self._check_name(name)
        return name, tid

    def _resolve(self, name, tid):
        if tid is not None:
            t = self._templates.get(tid)
            if t is None:
                raise _Err(400, "InvalidLaunchTemplateId.NotFound",
                           f"The specified launch template, with template ID {tid}, does not exist.")
            return t
        t = self._by_name(name)
        if t is None:
            raise _Err(400, "InvalidLaunchTemplateName.NotFoundException",
                       f"The specified launch template, with template name {name}, does not exist.")
        return t

    def _template_xml(self, t):
        return (f"<launchTemplateId>{t['id']}</launchTemplateId>"
                f"<launchTemplateName>{_xml_escape(t['name'])}</launchTemplateName>"
                f"<createTime>{_iso(t['create_time'])}</createTime>"
                f"<createdBy>{_xml_escape(t['created_by'])}</createdBy>"
                f"<defaultVersionNumber>{t['default']}</defaultVersionNumber>"
                f"<latestVersionNumber>{t['latest']}</latestVersionNumber>{_tags_xml(t['tags'])}")

    def _create_template(self, p, authorize=True):
        self._known(p, ("LaunchTemplateName", "VersionDescription", "ClientToken", "DryRun"),
                    (r"LaunchTemplateData\..+", r"TagSpecification\.\d+\.(ResourceType|Tag\.\d+\.(Key|Value))"))
        name = p.get("LaunchTemplateName")
        if name is None:
            raise _bad("The request must contain the parameter LaunchTemplateName", "MissingParameter")
        self._check_name(name)
        data = _parse({k[len("LaunchTemplateData."):]: v for k, v in p.items() if k.startswith("LaunchTemplateData.")},
                      LTD, "LaunchTemplateData")
        if not data:
            raise _bad("No launch template data was provided. Launch template data is required to create a launch "
                       "template.", "MissingParameter")
        description = p.get("VersionDescription")
        if description is not None and len(description) > 255:
            raise _bad("The version description must be at most 255 characters long.")
        token = p.get("ClientToken")
        if token is not None and (len(token) > 128 or not token.isascii()):
            raise _bad("The client token must be at most 128 ASCII characters.")
        tags = {}
        specs = {}
        for k, v in p.items():
            m = re.fullmatch(r"TagSpecification\.(\d+)\.(ResourceType|Tag\.(\d+)\.(Key|Value))", k)
            if m:
                spec = specs.setdefault(int(m.group(1)), {"type": None, "tags": {}})
                if m.group(2) == "ResourceType":
                    spec["type"] = v
                else:
                    spec["tags"].setdefault(int(m.group(3)), {})[m.group(4)] = v
        for n in sorted(specs):
            spec = specs[n]
            if spec["type"] != "launch-template":
                raise _bad(f"'{spec['type']}' is not a valid taggable resource type for this operation.")
            for m in sorted(spec["tags"]):
                key, value = spec["tags"][m].get("Key", ""), spec["tags"][m].get("Value", "")
                _check_tag(key, value, f"TagSpecification.{n}.Tag.{m}")
                tags[key] = value
        for spec in data.get("TagSpecifications", []):
            if spec.get("ResourceType") not in LT_TAG_RESOURCES:
                raise _bad(f"'{spec.get('ResourceType')}' is not a valid taggable resource type for this operation.")
            for tag in spec.get("Tags", []):
                _check_tag(tag.get("Key", ""), tag.get("Value", ""), "in LaunchTemplateData.TagSpecification")
        if authorize:
            self._authorize("CreateLaunchTemplate", p)
        fingerprint = {k: v for k, v in p.items() if k not in ("ClientToken", "DryRun")}
        if token is not None and token in self._tokens:
            first, answer = self._tokens[token]
            if first != fingerprint:
                raise _bad("Arguments on this idempotent request are inconsistent with arguments used in previous "
                           "request(s).", "IdempotentParameterMismatch")
            return {"xml": answer, "id": None}
        if self._by_name(name) is not None:
            raise _bad("Launch template name already in use.", "InvalidLaunchTemplateName.AlreadyExistsException")
        tid = "lt-" + uuid.uuid4().hex[:17]
        now = self.clock()
        t = {"id": tid, "name": name, "create_time": now, "created_by": self.principal, "default": 1, "latest": 1,
             "tags": tags, "versions": {1: {"number": 1, "description": description, "create_time": now, "data": data}}}
        self._templates[tid] = t
        answer = self._template_xml(t)
        if token is not None:
            self._tokens[token] = (fingerprint, answer)
        return {"xml": answer, "id": tid}

    def _op_CreateLaunchTemplate(self, p):
        return f"<launchTemplate>{self._create_template(p)['xml']}</launchTemplate>"

    def _op_DeleteLaunchTemplate(self, p):
        self._known(p, ("LaunchTemplateName", "LaunchTemplateId", "DryRun"))
        name, tid = self._one_template(p, "delete the template")
        if name is None and tid is None:
            raise _bad("The request must contain the parameter launch template ID or launch template name",
                       "MissingParameter")
        self._authorize("DeleteLaunchTemplate", p)
        t = self._resolve(name, tid)
        del self._templates[t["id"]]
        return f"<launchTemplate>{self._template_xml(t)}</launchTemplate>"

    @staticmethod
    def _paged(items, p):
        size = p.get("MaxResults")
        if size is not None:
            if not re.fullmatch(r"\d{1,4}", size) or not 1 <= int(size) <= 200:
                raise _bad(f"Value ( {size} ) for parameter maxResults is invalid. Expecting a value between 1 and "
                           f"200.")
            size = int(size)
        start = 0
        token = p.get("NextToken")
        if token is not None:
            m = re.fullmatch(r"fake-(\d+)", token)
            if not m or int(m.group(1)) > len(items):
                raise _bad("The specified NextToken is not valid.", "InvalidNextToken")
            start = int(m.group(1))
        end = len(items) if size is None else start + size
        return items[start:end], (f"<nextToken>fake-{end}</nextToken>" if end < len(items) else "")

    def _op_DescribeLaunchTemplates(self, p):
        self._known(p, ("DryRun", "MaxResults", "NextToken"),
                    (r"LaunchTemplateName\.\d+", r"LaunchTemplateId\.\d+", r"Filter\.\d+\.(Name|Value\.\d+)"))
        names, ids = _numbered(p, "LaunchTemplateName"), _numbered(p, "LaunchTemplateId")
        for n in names:
            self._check_name(n)
        for i in ids:
            self._check_id(i)
        filters = _filters(p)
        for fname, _ in filters:
            if fname not in ("launch-template-name", "tag-key") and not (fname or "").startswith("tag:"):
                raise _bad(f"The filter '{fname}' is invalid")
        self._authorize("DescribeLaunchTemplates", p)
        for n in names:
            if self._by_name(n) is None:
                raise _Err(400, "InvalidLaunchTemplateName.NotFoundException",
                           "At least one of the launch templates specified in the request does not exist.")
        for i in ids:
            if i not in self._templates:
                raise _Err(400, "InvalidLaunchTemplateId.NotFound",
                           f"The specified launch template, with template ID {i}, does not exist.")

        def match(values, got):
            return any(fnmatch.fnmatchcase(g, v) for v in values for g in got)

        def keep(t):
            if (names or ids) and t["name"] not in names and t["id"] not in ids:
                return False
            for fname, values in filters:
                if fname == "launch-template-name" and not match(values, [t["name"]]):
                    return False
                if fname == "tag-key" and not match(values, list(t["tags"])):
                    return False
                key = fname[4:] if fname.startswith("tag:") else None
                if key is not None and (key not in t["tags"] or not match(values, [t["tags"][key]])):
                    return False
            return True
        page, token = self._paged([t for t in self._templates.values() if keep(t)], p)
        items = "".join(f"<item>{self._template_xml(t)}</item>" for t in page)
        return f"<launchTemplates>{items}</launchTemplates>{token}"

    def _op_DescribeLaunchTemplateVersions(self, p):
        self._known(p, ("LaunchTemplateName", "LaunchTemplateId", "DryRun", "MinVersion", "MaxVersion", "MaxResults",
                        "NextToken"), (r"LaunchTemplateVersion\.\d+",))
        if any(k.startswith("Filter.") for k in p):
            raise _bad("DescribeLaunchTemplateVersions filters are not implemented by fake_ec2.py", "UnknownParameter")
        name, tid = self._one_template(p, "describe the template versions")
        versions = _numbered(p, "LaunchTemplateVersion")
        bounds = []
        for key in ("MinVersion", "MaxVersion"):
            v = p.get(key)
            if v is not None and not re.fullmatch(r"\d{1,18}", v):
                raise _bad(f"Invalid value '{v}' for {key}: not a version number.")
            bounds.append(None if v is None else int(v))
        for v in versions:
            if v not in ("$Latest", "$Default") and not re.fullmatch(r"\d{1,18}", v):
                raise _bad(f"Invalid value '{v}' for LaunchTemplateVersion: expecting $Latest, $Default or a version "
                           f"number.")
        if name is None and tid is None:
            if not versions:
                raise _bad(ALL_VERSIONS_HELP, "MissingParameter")
            if any(v not in ("$Latest", "$Default") for v in versions):
                raise _bad(ALL_VERSIONS_HELP)
        self._authorize("DescribeLaunchTemplateVersions", p)
        chosen = []                      # (template, number)
        for t in ([self._resolve(name, tid)] if name is not None or tid is not None else self._templates.values()):
            if versions:
                numbers = []
                for v in versions:
                    n = t["latest"] if v == "$Latest" else t["default"] if v == "$Default" else int(v)
                    if n not in t["versions"]:
                        raise _Err(400, "InvalidLaunchTemplateId.VersionNotFound",
                                   f"Could not find the specified version {v} for the launch template with ID "
                                   f"{t['id']}.")
                    if n not in numbers:
                        numbers.append(n)
            else:
                numbers = list(t["versions"])
            lo, hi = bounds
            numbers = [n for n in numbers if (lo is None or n >= lo) and (hi is None or n <= hi)]
            chosen += [(t, n) for n in sorted(numbers, reverse=True)]
        page, token = self._paged(chosen, p)
        items = ""
        for t, n in page:
            v = t["versions"][n]
            desc = "" if v["description"] is None else f"<versionDescription>{_xml_escape(v['description'])}" \
                                                        f"</versionDescription>"
            items += (f"<item><launchTemplateId>{t['id']}</launchTemplateId>"
                      f"<launchTemplateName>{_xml_escape(t['name'])}</launchTemplateName>"
                      f"<versionNumber>{n}</versionNumber>{desc}<createTime>{_iso(v['create_time'])}</createTime>"
                      f"<createdBy>{_xml_escape(t['created_by'])}</createdBy>"
                      f"<defaultVersion>{'true' if n == t['default'] else 'false'}</defaultVersion>"
                      f"<launchTemplateData>{_xml_struct(v['data'], LTD)}</launchTemplateData></item>")
        return f"<launchTemplateVersionSet>{items}</launchTemplateVersionSet>{token}"

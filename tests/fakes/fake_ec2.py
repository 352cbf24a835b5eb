#!/usr/bin/python3
"""Fake Amazon EC2 Query API on loopback: StopInstances and TerminateInstances, what spotvisor's
on-exit = stop | delete calls, and CreateTags (the spotvisor-phase tag), signed with SigV4 and
verified.

Strict where EC2 is, for these two actions:
  - POST / with an application/x-www-form-urlencoded body (Action, Version, InstanceId.N); GET
    with the parameters in the query string is accepted too, as EC2 does;
  - SigV4 (Authorization header, service "ec2", the fake's region): an unknown key is 401
    AuthFailure, a wrong signature 403 SignatureDoesNotMatch, a session key without its
    X-Amz-Security-Token 401 AuthFailure, an expired token 400 RequestExpired... the codes EC2's
    error table gives (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html);
  - errors as EC2 sends them: <Response><Errors><Error><Code>..</Code><Message>..</Message>
    </Error></Errors><RequestID>..</RequestID></Response>;
  - an unknown instance id is 400 InvalidInstanceID.NotFound; deny(action) answers 403
    UnauthorizedOperation ("You are not authorized to perform this operation.") for it.
Not implemented: every other action (400 InvalidAction), presigned URLs, DryRun, the
instances' state machine beyond recording the call (a stopped instance stays "stopped" here).
Checked against boto3's EC2 client in test_fake_ec2.py.

  srv = FakeEc2Server(region="us-east-1", credentials={"AKID": "secret"}, instances=["i-0123"]).start()
  srv.endpoint                 # "http://127.0.0.1:PORT" (AWS_ENDPOINT_URL_EC2)
  srv.calls() -> [(action, [instance ids])] ; srv.state(id) ; srv.tags(id) ; srv.deny(action) ; srv.stop()
"""
import calendar
import hashlib
import hmac
import http.server
import socketserver
import threading
import time
import urllib.parse
import uuid

from fake_s3 import _canonical_query, _parse_query, _signing_key  # the same SigV4 rules

API_VERSION = "2016-11-15"


class _Err(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _xml_escape(s):
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;"))


class FakeEc2Server:
    def __init__(self, host="127.0.0.1", port=0, region="us-east-1", credentials=None, instances=(),
                 clock=time.time):
        self.host, self.port, self.region, self.clock = host, port, region, clock
        self._lock = threading.Lock()
        self._creds = {}
        for akid, v in (credentials or {}).items():
            if isinstance(v, tuple):
                self.add_credentials(akid, *v)
            else:
                self.add_credentials(akid, v)
        self._instances = {i: "running" for i in instances}
        self._calls = []
        self._tags = {}
        self._denied = set()
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
        with self._lock:
            self._denied.add(action)

    def calls(self):
        with self._lock:
            return list(self._calls)

    def tags(self, instance_id):
        with self._lock:
            return dict(self._tags.get(instance_id, {}))

    def state(self, instance_id):
        with self._lock:
            return self._instances.get(instance_id)

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
            if not key or len(key) > 128 or len(value) > 256 or key.lower().startswith("aws:"):
                raise _Err(400, "InvalidParameterValue", f"Tag {n} is not valid (key 1-128, value 0-256 characters, "
                                                         "no aws: prefix)")
            tags[key] = value
            n += 1
        if not ids or not tags:
            raise _Err(400, "MissingParameter", "The request must contain the parameters ResourceId and Tag")
        with self._lock:
            self._calls.append(("CreateTags", ids))
            if "CreateTags" in self._denied:
                raise _Err(403, "UnauthorizedOperation", "You are not authorized to perform this operation.")
            for i in ids:
                if i not in self._instances:
                    raise _Err(400, "InvalidID", f"The ID '{i}' is not valid")
            for i in ids:
                self._tags.setdefault(i, {}).update(tags)
        return 200, (f'<?xml version="1.0" encoding="UTF-8"?>\n<CreateTagsResponse xmlns="http://ec2.amazonaws.com/doc/'
                     f'{API_VERSION}/"><requestId>{rid}</requestId><return>true</return></CreateTagsResponse>')

    def _act(self, params, rid):
        action = params.get("Action", "")
        if action == "CreateTags":
            return self._create_tags(params, rid)
        if action not in ("StopInstances", "TerminateInstances"):
            raise _Err(400, "InvalidAction", f"The action {action} is not valid for this web service.")
        if params.get("Version") != API_VERSION:
            raise _Err(400, "InvalidParameterValue", f"unsupported Version {params.get('Version')!r}")
        ids = [v for k, v in sorted(params.items()) if k.startswith("InstanceId.")]
        if not ids:
            raise _Err(400, "MissingParameter", "The request must contain the parameter InstanceId")
        with self._lock:
            self._calls.append((action, ids))
            if action in self._denied:
                raise _Err(403, "UnauthorizedOperation", "You are not authorized to perform this operation.")
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
        return 200, (f'<?xml version="1.0" encoding="UTF-8"?>\n<{tag} xmlns="http://ec2.amazonaws.com/doc/'
                     f'{API_VERSION}/"><requestId>{rid}</requestId><instancesSet>{items}</instancesSet></{tag}>')

"""A fake OAuth 2.0 token endpoint, as Google's https://oauth2.googleapis.com/token
answers it, for the laptop commands' Application Default Credentials.

What it implements: POST with an application/x-www-form-urlencoded body, and two
grants:
- grant_type=refresh_token (RFC 6749 section 6; `authorized_user` files) with
  client_id, client_secret and refresh_token that match what the test
  configured -> 200 {"access_token", "expires_in", "token_type": "Bearer",
  "scope"}; a wrong refresh token -> 400 {"error": "invalid_grant"}; a wrong
  client -> 401 {"error": "invalid_client"}.
- grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer (RFC 7523; a
  `service_account` key file) with an `assertion`: a JWT whose header says
  alg RS256, whose signature is **verified** (RSASSA-PKCS1-v1_5 with SHA-256,
  in plain Python against the public half of a key `service_account()` made
  with the `openssl` command) for the account named by `iss` (and the key
  named by `kid`, when there is one), whose `aud` is
  https://oauth2.googleapis.com/token, whose `scope` is not empty, and whose
  iat/exp are at most an hour apart and in a reasonable timeframe (5 min skew)
  -> 200 as above. A bad signature, an unknown or deleted key, or bad times
  -> 400 invalid_grant with Google's texts ("Invalid JWT Signature.", "Invalid
  JWT: Token must be a short-lived token (60 minutes) and in a reasonable
  timeframe. ..."); no scope -> 400 invalid_scope.
Anything else -> 400 unsupported_grant_type or 405.

What it does not: other grants (authorization_code, token exchange),
id_tokens (target_audience), domain-wide delegation (`sub`), scope checking
beyond "present", rate limits, HTTPS. Chosen by the fake, not confirmed
against Google: the texts for an unknown account, a wrong audience and a
missing scope.

Checked against a client nobody here wrote: Google's google-auth-library for
Node (tests/fakes/node/, test_fake_oauth.py) gets tokens from it with both
kinds of credentials.
"""
import base64
import hashlib
import json
import re
import subprocess
import time
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
# DER prefix of DigestInfo(sha256) in EMSA-PKCS1-v1_5 (RFC 8017 section 9.2, note 1).
SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")
BAD_TIME = ("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
            "Check your iat and exp values in the JWT claim.")


def b64url_decode(text):
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_rsa_key():
    """A fresh 2048-bit RSA key with the openssl command: (PKCS#8 PEM, n, e)."""
    pem = subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                         check=True, capture_output=True, text=True).stdout
    text = subprocess.run(["openssl", "pkey", "-noout", "-text_pub"], input=pem, check=True,
                          capture_output=True, text=True).stdout
    modulus = re.search(r"Modulus:\s*((?:[0-9a-f]{2}:?\s*)+)", text).group(1)
    n = int(re.sub(r"[^0-9a-f]", "", modulus), 16)
    e = int(re.search(r"Exponent:\s*(\d+)", text).group(1))
    return pem, n, e


def rs256_verify(n, e, signing_input, signature):
    k = (n.bit_length() + 7) // 8
    if len(signature) != k:
        return False
    s = int.from_bytes(signature, "big")
    if s >= n:
        return False
    em = pow(s, e, n).to_bytes(k, "big")
    t = SHA256_DIGEST_INFO + hashlib.sha256(signing_input).digest()
    return em == b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t


class FakeOAuthServer:
    def __init__(self, client_id="fake-client.apps.googleusercontent.com", client_secret="fake-secret",
                 refresh_token="1//fake-refresh-token", access_token="ya29.fake-user-token", expires_in=3599):
        self.client_id, self.client_secret = client_id, client_secret
        self.refresh_token, self.access_token, self.expires_in = refresh_token, access_token, expires_in
        self.requests = []
        self.accounts = {}  # email -> {key_id: (n, e)}
        self.assertions = []  # decoded (header, claims) of every jwt-bearer request
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _reply(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._reply(405, {"error": "method_not_allowed"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0") or 0)
                raw = self.rfile.read(n).decode("utf-8", "replace")
                form = {k: v[0] for k, v in urllib.parse.parse_qs(raw, keep_blank_values=True).items()}
                with fake._lock:
                    fake.requests.append({"path": self.path, "form": form,
                                          "content_type": self.headers.get("Content-Type", "")})
                if not self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
                    return self._reply(400, {"error": "invalid_request", "error_description": "form body expected"})
                if form.get("grant_type") == JWT_BEARER:
                    code, obj = fake._jwt_grant(form.get("assertion", ""))
                    return self._reply(code, obj)
                if form.get("grant_type") != "refresh_token":
                    return self._reply(400, {"error": "unsupported_grant_type"})
                if form.get("client_id") != fake.client_id or form.get("client_secret") != fake.client_secret:
                    return self._reply(401, {"error": "invalid_client", "error_description": "The OAuth client was not found."})
                if form.get("refresh_token") != fake.refresh_token:
                    return self._reply(400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."})
                self._reply(200, {"access_token": fake.access_token, "expires_in": fake.expires_in,
                                  "token_type": "Bearer",
                                  "scope": "https://www.googleapis.com/auth/cloud-platform"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.token_uri = f"http://127.0.0.1:{self.port}/token"
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._server.shutdown()
        self._server.server_close()

    def service_account(self, email="spotvisor-laptop@fake-project.iam.gserviceaccount.com", key_id=None, **overrides):
        """Registers a new key for `email` and returns the key file `gcloud iam
        service-accounts keys create` would write, with token_uri pointed here."""
        pem, n, e = make_rsa_key()
        key_id = key_id or hashlib.sha1(str(n).encode()).hexdigest()
        with self._lock:
            self.accounts.setdefault(email, {})[key_id] = (n, e)
        d = {"type": "service_account", "project_id": "fake-project", "private_key_id": key_id,
             "private_key": pem, "client_email": email, "client_id": "123456789012345678901",
             "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": self.token_uri,
             "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
             "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/" + email,
             "universe_domain": "googleapis.com"}
        d.update(overrides)
        return d

    def delete_key(self, email, key_id):
        with self._lock:
            self.accounts.get(email, {}).pop(key_id, None)

    def _jwt_grant(self, assertion):
        bad_sig = (400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        try:
            h64, c64, s64 = assertion.split(".")
            header, claims = json.loads(b64url_decode(h64)), json.loads(b64url_decode(c64))
            signature = b64url_decode(s64)
            if not isinstance(header, dict) or not isinstance(claims, dict):
                raise ValueError("not objects")
        except (ValueError, UnicodeDecodeError):
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT: not a JWS compact serialization."}
        with self._lock:
            self.assertions.append((header, claims))
            known = claims.get("iss") in self.accounts
            keys = dict(self.accounts.get(claims.get("iss"), {}))
        if header.get("alg") != "RS256":
            return bad_sig
        if not known:
            return 400, {"error": "invalid_grant", "error_description": "Invalid grant: account not found"}
        if "kid" in header:
            keys = {k: v for k, v in keys.items() if k == header["kid"]}
        signing_input = (h64 + "." + c64).encode()
        if not any(rs256_verify(n, e, signing_input, signature) for n, e in keys.values()):
            return bad_sig
        if claims.get("aud") != GOOGLE_TOKEN_URI:
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT: wrong audience."}
        iat, exp, now = claims.get("iat"), claims.get("exp"), time.time()
        if (not isinstance(iat, int) or not isinstance(exp, int) or exp <= iat or exp - iat > 3600
                or iat > now + 300 or exp < now - 300):
            return 400, {"error": "invalid_grant", "error_description": BAD_TIME}
        if not isinstance(claims.get("scope"), str) or not claims["scope"].strip():
            return 400, {"error": "invalid_scope", "error_description": "Invalid OAuth scope or ID token audience provided."}
        return 200, {"access_token": self.access_token, "expires_in": self.expires_in, "token_type": "Bearer"}

    def adc(self, **overrides):
        """The authorized_user file `gcloud auth application-default login` writes, pointed here."""
        d = {"type": "authorized_user", "client_id": self.client_id, "client_secret": self.client_secret,
             "refresh_token": self.refresh_token, "token_uri": self.token_uri}
        d.update(overrides)
        return d

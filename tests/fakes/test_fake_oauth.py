"""Self-test of fake_oauth.py: its checks of a service-account assertion, and
the proof that it answers as Google's token endpoint does for a client nobody
here wrote: Google's google-auth-library for Node (tests/fakes/node/,
installed by scripts/install-deps.sh with `npm ci`)."""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_oauth import FakeOAuthServer, JWT_BEARER, GOOGLE_TOKEN_URI  # noqa: E402

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
NODE_CLIENT = os.path.join(NODE_DIR, "oauth_client.js")


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class FakeOAuthTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fake-oauth-")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.fake = FakeOAuthServer(access_token="ya29.fake-sa-token").start()
        self.addCleanup(self.fake.stop)
        self.key = self.fake.service_account()
        self.key_pem = os.path.join(self.tmp, "key.pem")
        with open(self.key_pem, "w") as f:
            f.write(self.key["private_key"])

    def post(self, form):
        req = urllib.request.Request(self.fake.token_uri, data=urllib.parse.urlencode(form).encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def assertion(self, header=None, pem=None, **claims):
        now = int(time.time())
        c = {"iss": self.key["client_email"], "scope": "https://www.googleapis.com/auth/devstorage.read_write",
             "aud": GOOGLE_TOKEN_URI, "iat": now, "exp": now + 3600}
        c.update(claims)
        c = {k: v for k, v in c.items() if v is not None}
        h = header or {"alg": "RS256", "typ": "JWT", "kid": self.key["private_key_id"]}
        signing_input = b64url(json.dumps(h).encode()) + "." + b64url(json.dumps(c).encode())
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", pem or self.key_pem],
                             input=signing_input.encode(), check=True, capture_output=True).stdout
        return signing_input + "." + b64url(sig)

    def grant(self, assertion):
        return self.post({"grant_type": JWT_BEARER, "assertion": assertion})

    def test_a_good_assertion_gets_a_token(self):
        self.assertEqual(self.grant(self.assertion()),
                         (200, {"access_token": "ya29.fake-sa-token", "expires_in": 3599, "token_type": "Bearer"}))
        # Without kid, every key of the account is tried.
        self.assertEqual(self.grant(self.assertion(header={"alg": "RS256"}))[0], 200)

    def test_a_signature_from_another_key_or_a_changed_claim_is_refused(self):
        other = FakeOAuthServer().service_account()  # a key this fake does not know
        other_pem = os.path.join(self.tmp, "other.pem")
        with open(other_pem, "w") as f:
            f.write(other["private_key"])
        bad = (400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        self.assertEqual(self.grant(self.assertion(pem=other_pem)), bad)
        h, c, s = self.assertion().split(".")
        claims = json.loads(base64.urlsafe_b64decode(c + "=" * (-len(c) % 4)))
        claims["exp"] += 1  # same account, another expiry: the signature no longer matches
        self.assertEqual(self.grant(".".join([h, b64url(json.dumps(claims).encode()), s])), bad)
        unsigned = b64url(b'{"alg":"none"}') + "." + c + "."
        self.assertEqual(self.grant(unsigned), bad)
        self.fake.delete_key(self.key["client_email"], self.key["private_key_id"])
        self.assertEqual(self.grant(self.assertion()), bad)

    def test_times_audience_scope_and_account_are_checked(self):
        now = int(time.time())
        for claims in ({"exp": now + 7200}, {"iat": now - 7200, "exp": now - 3600}, {"iat": now + 3600},
                       {"exp": "soon"}):
            code, body = self.grant(self.assertion(**claims))
            self.assertEqual((code, body["error"]), (400, "invalid_grant"), claims)
            self.assertIn("short-lived token (60 minutes)", body["error_description"])
        self.assertEqual(self.grant(self.assertion(aud=self.fake.token_uri))[1]["error"], "invalid_grant")
        self.assertEqual(self.grant(self.assertion(scope=None))[1]["error"], "invalid_scope")
        self.assertEqual(self.grant(self.assertion(iss="nobody@x"))[1]["error_description"],
                         "Invalid grant: account not found")
        self.assertEqual(self.grant("not.a-jwt")[0], 400)
        self.assertEqual(self.post({"grant_type": "client_credentials"}), (400, {"error": "unsupported_grant_type"}))


@unittest.skipUnless(shutil.which("node") and os.path.isdir(os.path.join(NODE_DIR, "node_modules", "google-auth-library")),
                     "google-auth-library is not installed: run scripts/install-deps.sh (npm ci in tests/fakes/node)")
class GoogleAuthLibraryInteropTest(unittest.TestCase):
    """Google's Node client against the fake: the proof that the fake is Google's dialect, not ours."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fake-oauth-node-")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.fake = FakeOAuthServer(access_token="ya29.node-token").start()
        self.addCleanup(self.fake.stop)

    def node(self, key):
        path = os.path.join(self.tmp, "key.json")
        with open(path, "w") as f:
            json.dump(key, f)
        r = subprocess.run(["node", NODE_CLIENT, path], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_a_service_account_key_file(self):
        key = self.fake.service_account()
        self.assertEqual(self.node(key), {"token": "ya29.node-token"})
        # The library's own signature (Node's crypto through jws) was verified by the fake.
        header, claims = self.fake.assertions[-1]
        self.assertEqual(header["alg"], "RS256")
        self.assertEqual((claims["iss"], claims["aud"]), (key["client_email"], GOOGLE_TOKEN_URI))
        self.assertEqual(claims["exp"] - claims["iat"], 3600)
        self.assertEqual(self.fake.requests[-1]["form"]["grant_type"], JWT_BEARER)

    def test_a_deleted_key_is_the_error_google_gives(self):
        key = self.fake.service_account()
        self.fake.delete_key(key["client_email"], key["private_key_id"])
        self.assertIn("invalid_grant: Invalid JWT Signature.", self.node(key)["error"])

    def test_an_authorized_user_file(self):
        self.assertEqual(self.node(self.fake.adc()), {"token": "ya29.node-token"})
        form = self.fake.requests[-1]["form"]
        self.assertEqual(form["grant_type"], "refresh_token")
        self.assertEqual(form["refresh_token"], self.fake.refresh_token)
        self.assertIn("invalid_grant", self.node(self.fake.adc(refresh_token="1//revoked"))["error"])


if __name__ == "__main__":
    unittest.main()

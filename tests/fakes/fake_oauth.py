"""A fake OAuth 2.0 token endpoint (RFC 6749 section 6, refresh_token grant),
as Google's https://oauth2.googleapis.com/token answers it, for the laptop
commands' Application Default Credentials (authorized_user).

What it implements: POST with an application/x-www-form-urlencoded body;
grant_type=refresh_token with client_id, client_secret and refresh_token that
match what the test configured -> 200 {"access_token", "expires_in",
"token_type": "Bearer", "scope"}; a wrong refresh token -> 400
{"error": "invalid_grant", ...}; a wrong client -> 401 {"error":
"invalid_client"}; anything else -> 400 {"error": "unsupported_grant_type"} or
405. What it does not: other grants (jwt-bearer for service-account keys,
authorization_code), id_tokens, scopes, rate limits, HTTPS.
"""
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOAuthServer:
    def __init__(self, client_id="fake-client.apps.googleusercontent.com", client_secret="fake-secret",
                 refresh_token="1//fake-refresh-token", access_token="ya29.fake-user-token", expires_in=3599):
        self.client_id, self.client_secret = client_id, client_secret
        self.refresh_token, self.access_token, self.expires_in = refresh_token, access_token, expires_in
        self.requests = []
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

    def adc(self, **overrides):
        """The authorized_user file `gcloud auth application-default login` writes, pointed here."""
        d = {"type": "authorized_user", "client_id": self.client_id, "client_secret": self.client_secret,
             "refresh_token": self.refresh_token, "token_uri": self.token_uri}
        d.update(overrides)
        return d

#!/usr/bin/env python3
"""Self-test of fake_metadata.py.

Run from the repo root:
    python3 -m unittest tests/fakes/test_fake_metadata.py
    python3 tests/fakes/test_fake_metadata.py

No sleeps as synchronisation: tests wait on the fake's own counters
(waiters/hung/hits), which are updated under the lock the data changes take.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fake_metadata import FakeMetadataServer, V1  # noqa: E402

SCRIPT = os.path.join(HERE, "fake_metadata.py")
FLAVOR = {"Metadata-Flavor": "Google"}
HEX = set("0123456789abcdef")


def wait_until(predicate, timeout=5.0, interval=0.01):
    """Bounded poll for conditions the fake cannot signal (files, pids)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self):
        return self.body.decode()


class FakeTestCase(unittest.TestCase):
    def setUp(self):
        self.srv = FakeMetadataServer(attrs={"my-key": "v1",
                                             "ssh-keys": "k"},
                                      project_attrs={"proj_key": "p"})
        self.srv.start()
        self.addCleanup(self.srv.stop)

    def request(self, path, headers=FLAVOR, method="GET", body=None,
                timeout=5.0, port=None):
        """One request on a fresh connection; returns a Response."""
        conn = http.client.HTTPConnection("127.0.0.1", port or self.srv.port,
                                          timeout=timeout)
        try:
            conn.request(method, path if path.startswith("/") else V1 + path,
                         body=body, headers=headers)
            r = conn.getresponse()
            return Response(r.status, {k.lower(): v for k, v in
                                       r.getheaders()}, r.read())
        finally:
            conn.close()

    def in_thread(self, fn, *args, **kwargs):
        """Run fn in a thread; returns a getter that joins and re-raises."""
        box = {}

        def run():
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # re-raised in the test thread
                box["error"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()

        def result(timeout=5.0):
            t.join(timeout)
            self.assertFalse(t.is_alive(), "request thread did not finish")
            if "error" in box:
                raise box["error"]
            return box["value"]
        return result


class ProtocolTests(FakeTestCase):
    def test_flavor_header_required(self):
        r = self.request("instance/name", headers={})
        self.assertEqual(r.status, 403)
        self.assertTrue(r.text.endswith(
            "Missing Metadata-Flavor:Google header."))
        self.assertEqual(r.headers["metadata-flavor"], "Google")
        r = self.request("instance/name",
                         headers={"Metadata-Flavor": "NotGoogle"})
        self.assertEqual(r.status, 403)

    def test_x_forwarded_for_rejected(self):
        r = self.request("instance/name",
                         headers={**FLAVOR, "X-Forwarded-For": "10.0.0.1"})
        self.assertEqual(r.status, 403)
        self.assertEqual(r.headers["metadata-flavor"], "Google")

    def test_leaf_get_with_etag(self):
        r = self.request("instance/preempted")
        self.assertEqual((r.status, r.text), (200, "FALSE"))
        self.assertEqual(r.headers["metadata-flavor"], "Google")
        self.assertTrue(r.headers["content-type"].startswith("text/plain"))
        etag = r.headers["etag"]
        self.assertTrue(etag and set(etag) <= HEX, etag)
        self.assertEqual(self.request("instance/name").text, "spotvisor-test")
        self.assertEqual(self.request("instance/zone").text,
                         "projects/123456789/zones/us-central1-a")
        self.assertEqual(self.request("project/project-id").text,
                         "spotvisor-test-project")
        self.assertEqual(self.request("instance/attributes/my-key").text,
                         "v1")

    def test_etag_changes_on_set(self):
        before = self.request("instance/preempted").headers["etag"]
        dir_before = self.request("instance/").headers["etag"]
        self.srv.set("instance/preempted", "TRUE")
        r = self.request("instance/preempted")
        self.assertEqual(r.text, "TRUE")
        self.assertNotEqual(r.headers["etag"], before)
        self.assertNotEqual(self.request("instance/").headers["etag"],
                            dir_before)
        # Documented choice: ETags are content hashes, so setting the same
        # value again keeps the ETag (and wakes no long-poll).
        self.srv.set("instance/preempted", "TRUE")
        self.assertEqual(self.request("instance/preempted").headers["etag"],
                         r.headers["etag"])
        self.assertEqual(self.srv.state("instance/preempted")["etag"],
                         r.headers["etag"])

    def test_directory_listing(self):
        r = self.request("instance/scheduling/")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.text.splitlines(), ["automatic-restart",
                                               "on-host-maintenance",
                                               "preemptible",
                                               "provisioning-model"])
        lines = self.request("instance/").text.splitlines()
        for name in ("attributes/", "preempted", "maintenance-event",
                     "scheduling/", "service-accounts/", "zone"):
            self.assertIn(name, lines)
        self.assertEqual(self.request("").text.splitlines(),
                         ["instance/", "project/"])

    def test_recursive_json(self):
        r = self.request("instance/?recursive=true")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers["content-type"], "application/json")
        doc = json.loads(r.body)
        self.assertEqual(doc["scheduling"]["onHostMaintenance"], "TERMINATE")
        self.assertEqual(doc["maintenanceEvent"], "NONE")
        self.assertEqual(doc["attributes"], {"my-key": "v1", "ssh-keys": "k"})
        self.assertEqual(doc["networkInterfaces"][0]["ip"], "10.128.0.2")
        self.assertIn("default", doc["serviceAccounts"])
        self.assertNotIn("token", doc["serviceAccounts"]["default"])
        proj = json.loads(self.request("project/?recursive=true").body)
        self.assertEqual(proj["projectId"], "spotvisor-test-project")
        self.assertEqual(proj["attributes"], {"proj_key": "p"})
        attrs = json.loads(
            self.request("instance/attributes/?recursive=true").body)
        self.assertEqual(attrs, {"my-key": "v1", "ssh-keys": "k"})

    def test_directory_without_slash_redirects(self):
        r = self.request("instance/scheduling?recursive=true")
        self.assertEqual(r.status, 301)
        self.assertTrue(r.headers["location"].endswith(
            V1 + "instance/scheduling/?recursive=true"), r.headers)

    def test_unknown_path_404(self):
        self.assertEqual(self.request("instance/nope").status, 404)
        self.assertEqual(self.request("instance/attributes/nope").status, 404)
        r = self.request("instance/preempted/")
        self.assertEqual(r.status, 404)
        self.assertEqual(r.headers["metadata-flavor"], "Google")

    def test_token(self):
        r = self.request("instance/service-accounts/default/token")
        self.assertEqual(r.status, 200)
        tok = json.loads(r.body)
        self.assertEqual(tok["token_type"], "Bearer")
        self.assertEqual(tok["expires_in"], 3599)
        self.assertTrue(tok["access_token"].startswith("fake-token-"))
        tok2 = json.loads(
            self.request("instance/service-accounts/default/token").body)
        self.assertNotEqual(tok["access_token"], tok2["access_token"])
        r = self.request("instance/service-accounts/default/token"
                         "?wait_for_change=true")
        self.assertEqual(r.status, 400)

    def test_scopes_are_lines(self):
        r = self.request("instance/service-accounts/default/scopes")
        scopes = r.text.splitlines()
        self.assertIn("https://www.googleapis.com/auth/devstorage.read_write",
                      scopes)

    def test_guest_attributes_round_trip(self):
        path = "instance/guest-attributes/spotvisor/state"
        r = self.request(path, method="PUT", body=b"draining")
        self.assertEqual(r.status, 200)
        self.assertEqual(self.request(path).text, "draining")
        self.assertEqual(
            self.request("instance/guest-attributes/spotvisor/").text,
            "state\n")
        self.assertEqual(json.loads(self.request(
            "instance/guest-attributes/spotvisor/?recursive=true").body),
            {"state": "draining"})
        self.assertEqual(self.request(path, method="PUT", body=b"x",
                                      headers={}).status, 403)
        self.assertEqual(self.request("instance/name", method="PUT",
                                      body=b"x").status, 405)


class LongPollTests(FakeTestCase):
    def test_wait_for_change_returns_on_change(self):
        get = self.in_thread(self.request,
                             "instance/preempted?wait_for_change=true")
        self.assertTrue(self.srv.wait_for_waiters("instance/preempted", 1))
        self.assertEqual(self.srv.waiters("instance/preempted"), 1)
        self.srv.set("instance/preempted", "TRUE")
        r = get()
        self.assertEqual((r.status, r.text), (200, "TRUE"))
        self.assertEqual(r.headers["etag"],
                         self.srv.state("instance/preempted")["etag"])
        self.assertEqual(self.srv.waiters("instance/preempted"), 0)

    def test_last_etag_mismatch_answers_at_once(self):
        r = self.request("instance/preempted?wait_for_change=true"
                         "&last_etag=0", timeout=2)
        self.assertEqual((r.status, r.text), (200, "FALSE"))
        etag = r.headers["etag"]
        # Matching last_etag parks until the value moves on.
        get = self.in_thread(self.request, "instance/preempted?"
                             f"wait_for_change=true&last_etag={etag}")
        self.assertTrue(self.srv.wait_for_waiters("instance/preempted", 1))
        self.srv.set("instance/preempted", "TRUE")
        self.assertEqual(get().text, "TRUE")

    def test_timeout_sec(self):
        etag = self.request("instance/maintenance-event").headers["etag"]
        start = time.monotonic()
        r = self.request("instance/maintenance-event?wait_for_change=true"
                         f"&last_etag={etag}&timeout_sec=1", timeout=5)
        elapsed = time.monotonic() - start
        self.assertEqual((r.status, r.text, r.headers["etag"]),
                         (200, "NONE", etag))
        self.assertGreaterEqual(elapsed, 0.9)
        self.assertLess(elapsed, 3.0)
        self.assertEqual(self.request("instance/preempted?wait_for_change="
                                      "true&timeout_sec=0").status, 400)

    def test_directory_long_poll(self):
        self.assertEqual(self.request("instance/attributes/?"
                                      "wait_for_change=true").status, 400)
        get = self.in_thread(self.request, "instance/attributes/?"
                             "recursive=true&wait_for_change=true")
        self.assertTrue(self.srv.wait_for_waiters("instance/attributes", 1))
        self.srv.set("instance/preempted", "TRUE")   # outside the subtree
        self.srv.set("instance/attributes/new-key", "x")
        r = get()
        self.assertEqual(json.loads(r.body)["new-key"], "x")

    def test_delete_answers_waiters_with_404(self):
        self.srv.set("instance/attributes/doomed", "1")
        get = self.in_thread(self.request, "instance/attributes/doomed?"
                             "wait_for_change=true")
        self.assertTrue(self.srv.wait_for_waiters(
            "instance/attributes/doomed", 1))
        self.srv.delete("instance/attributes/doomed")
        self.assertEqual(get().status, 404)
        self.assertEqual(self.request("instance/attributes/doomed").status,
                         404)

    def test_many_concurrent_waiters(self):
        n = 40
        gets = [self.in_thread(self.request, "instance/preempted?"
                               "wait_for_change=true&timeout_sec=30")
                for _ in range(n)]
        self.assertTrue(self.srv.wait_for_waiters("instance/preempted", n))
        self.srv.set("instance/preempted", "TRUE")
        self.assertEqual({g().text for g in gets}, {"TRUE"})


class UpcomingMaintenanceTests(FakeTestCase):
    """The three ways a server says nothing is scheduled, then a window."""

    PATH = "instance/upcoming-maintenance"

    def test_nothing_scheduled_in_each_form_then_a_window(self):
        r = self.request(self.PATH + "?alt=json")
        self.assertEqual(r.status, 404)
        self.srv.set_no_maintenance_answer("503")
        r = self.request(self.PATH + "?alt=json&wait_for_change=true&last_etag=0")
        self.assertEqual(r.status, 503)
        self.assertEqual(r.headers["metadata-flavor"], "Google")
        self.assertIn("no notifications have been received yet", r.text)
        self.srv.set(self.PATH, "NONE")
        self.assertEqual(self.request(self.PATH).text, "NONE")
        window = json.dumps({"type": "SCHEDULED", "maintenanceStatus": "PENDING",
                             "windowStartTime": "2026-11-25T10:00:00Z"})
        get = self.in_thread(self.request, self.PATH + "?alt=json&wait_for_change=true")
        self.assertTrue(self.srv.wait_for_waiters(self.PATH, 1))
        self.srv.set(self.PATH, window)
        got = get()
        self.assertEqual(got.status, 200)
        # A leaf asked for with alt=json comes back as a JSON string.
        self.assertEqual(json.loads(json.loads(got.text)), json.loads(window))
        with self.assertRaises(Exception):
            self.srv.set_no_maintenance_answer("500")


class FaultTests(FakeTestCase):
    def test_status_with_count_and_prefix(self):
        self.srv.fault("status", code=503, count=2, path_prefix="instance/")
        self.assertEqual(self.request("project/project-id").status, 200)
        r = self.request("instance/name")
        self.assertEqual(r.status, 503)
        self.assertEqual(r.headers["metadata-flavor"], "Google")
        self.assertEqual(self.srv.state("instance/name")["value"],
                         "spotvisor-test")  # control is never faulted
        self.assertEqual(self.request("instance/name").status, 503)
        self.assertEqual(self.request("instance/name").status, 200)
        self.assertEqual(self.srv.current_fault(), {"mode": "none"})

    def test_hang_then_clear_closes_without_response(self):
        self.srv.fault("hang")
        get = self.in_thread(self.request, "instance/name", timeout=5)
        self.assertTrue(self.srv.wait_for_hung("instance/name", 1))
        self.srv.fault("none")
        with self.assertRaises(http.client.RemoteDisconnected):
            get()
        self.assertEqual(self.request("instance/name").status, 200)

    def test_hang_holds_due_long_poll(self):
        get = self.in_thread(self.request,
                             "instance/preempted?wait_for_change=true")
        self.assertTrue(self.srv.wait_for_waiters("instance/preempted", 1))
        self.srv.fault("hang")
        self.srv.set("instance/preempted", "TRUE")
        self.assertTrue(self.srv.wait_for_hung("instance/preempted", 1))
        self.assertEqual(self.srv.waiters("instance/preempted"), 0)
        self.srv.fault("none")
        with self.assertRaises(http.client.RemoteDisconnected):
            get()

    def test_reset(self):
        self.srv.fault("reset")
        with self.assertRaises(ConnectionResetError):
            self.request("instance/name")
        self.srv.fault("none")
        self.assertEqual(self.request("instance/name").status, 200)

    def test_refuse_then_clear_same_port(self):
        port = self.srv.port
        get = self.in_thread(self.request,
                             "instance/preempted?wait_for_change=true")
        self.assertTrue(self.srv.wait_for_waiters("instance/preempted", 1))
        self.srv.fault("refuse")
        with self.assertRaises(ConnectionError):
            get()   # the parked long-poll was closed
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        self.srv.fault("none")
        self.assertEqual(self.srv.port, port)
        self.assertEqual(self.request("instance/name").status, 200)

    def test_refuse_for_sec_clears_itself(self):
        self.srv.fault("refuse", for_sec=0.2)
        self.assertTrue(wait_until(
            lambda: self.srv.current_fault()["mode"] == "none"))
        self.assertEqual(self.request("instance/name").status, 200)

    def test_no_flavor(self):
        self.srv.fault("no-flavor")
        r = self.request("instance/name")
        self.assertEqual(r.status, 200)
        self.assertNotIn("metadata-flavor", r.headers)
        self.srv.fault("none")
        self.assertIn("metadata-flavor", self.request("instance/name").headers)

    def test_flap(self):
        self.srv.fault("flap", code=503, ratio=0.5, seed=1)
        codes = [self.request("instance/name").status for _ in range(20)]
        self.assertEqual(set(codes), {200, 503})

    def test_bad_fault_rejected(self):
        with self.assertRaises(Exception):
            self.srv.fault("explode")


class ObservationTests(FakeTestCase):
    def test_log_and_hits(self):
        self.request("instance/preempted?timeout_sec=5")
        self.request("instance/preempted", headers={})
        self.request("instance/name")
        self.assertEqual(self.srv.hits("instance/preempted"), 2)
        self.assertEqual(self.srv.hits("/computeMetadata/v1/instance/name"),
                         1)
        log = self.srv.log()
        self.assertEqual([e["status"] for e in log], [200, 403, 200])
        first = log[0]
        self.assertEqual(first["method"], "GET")
        self.assertEqual(first["path"], "instance/preempted")
        self.assertEqual(first["query"], {"timeout_sec": "5"})
        self.assertEqual(first["headers"]["Metadata-Flavor"], "Google")
        self.assertIsInstance(first["time"], float)
        self.srv.reset_log()
        self.assertEqual((self.srv.log(), self.srv.hits("instance/preempted")),
                         ([], 0))

    def test_http_control_api(self):
        def control(method, name, payload=None):
            body = None if payload is None else json.dumps(payload)
            r = self.request("/_fake/" + name, headers={}, method=method,
                             body=body)
            return r.status, json.loads(r.body)

        self.assertEqual(control("POST", "set", {"path": "instance/preempted",
                                                 "value": "TRUE"})[0], 200)
        status, st = control("GET", "state?path=instance/preempted")
        self.assertEqual((status, st["value"]), (200, "TRUE"))
        self.assertEqual(control("GET", "hits?path=instance/preempted"),
                         (200, {"count": 0}))
        self.assertEqual(control("POST", "fault", {"mode": "bogus"})[0], 400)
        self.assertEqual(control("POST", "delete", {"path": "nope/x"})[0],
                         404)
        self.assertEqual(control("GET", "wait?what=hits&path=instance/name"
                                 "&count=1&timeout=0.1")[0], 408)


class ScriptTests(unittest.TestCase):
    def test_serve_and_ctl(self):
        with tempfile.TemporaryDirectory() as tmp:
            port_file = os.path.join(tmp, "port")
            proc = subprocess.Popen(
                [sys.executable, SCRIPT, "serve", "--port-file", port_file,
                 "--attr", "a-b=c=d", "--project-attr", "pk=pv",
                 "--instance-name", "vm-7"],
                stdout=subprocess.PIPE, text=True)
            self.addCleanup(proc.stdout.close)
            self.addCleanup(proc.wait, 5)
            self.addCleanup(proc.kill)
            self.assertTrue(wait_until(lambda: os.path.exists(port_file)),
                            "port file never appeared")
            with open(port_file) as f:
                port = int(f.read())
            self.assertEqual(proc.stdout.readline().strip(),
                             f"fake-metadata listening on 127.0.0.1:{port}")

            def ctl(*args):
                out = subprocess.run(
                    [sys.executable, SCRIPT, "ctl", "--port", str(port),
                     *args], capture_output=True, text=True, timeout=10)
                return out.returncode, json.loads(out.stdout)

            def get(path):
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", V1 + path, headers=FLAVOR)
                r = c.getresponse()
                body = r.read().decode()
                c.close()
                return r.status, body

            self.assertEqual(get("instance/attributes/a-b"), (200, "c=d"))
            self.assertEqual(get("project/attributes/pk"), (200, "pv"))
            self.assertEqual(get("instance/name"), (200, "vm-7"))
            rc, out = ctl("set", "instance/preempted", "TRUE")
            self.assertEqual((rc, out["value"]), (0, "TRUE"))
            self.assertEqual(get("instance/preempted"), (200, "TRUE"))
            self.assertEqual(ctl("hits", "instance/preempted"),
                             (0, {"count": 1}))
            self.assertEqual(ctl("waiters", "instance/preempted"),
                             (0, {"count": 0, "hung": 0}))
            self.assertEqual(ctl("state", "instance/name")[1]["value"],
                             "vm-7")
            rc, out = ctl("fault", '{"mode":"status","code":503,"count":1}')
            self.assertEqual((rc, out["mode"]), (0, "status"))
            self.assertEqual(get("instance/name")[0], 503)
            self.assertEqual(get("instance/name")[0], 200)
            rc, log = ctl("log")
            self.assertEqual([e["status"] for e in log], [200, 200, 200,
                                                          200, 503, 200])
            self.assertEqual(ctl("reset-log"), (0, {"ok": True}))
            self.assertEqual(ctl("delete", "instance/attributes/a-b")[0], 0)
            self.assertEqual(get("instance/attributes/a-b")[0], 404)
            self.assertEqual(ctl("delete", "instance/attributes/a-b")[0], 1)

            # SIGUSR1 clears a refuse fault (the control port is gone then).
            ctl("fault", '{"mode":"refuse"}')
            with self.assertRaises(ConnectionRefusedError):
                get("instance/name")
            proc.send_signal(signal.SIGUSR1)
            self.assertTrue(wait_until(
                lambda: _connects("127.0.0.1", port)))
            self.assertEqual(get("instance/name"), (200, "vm-7"))

            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(5), 0)


def _connects(host, port):
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()

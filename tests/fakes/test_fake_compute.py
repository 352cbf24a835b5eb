#!/usr/bin/python3
"""Self-test of fake_compute.py: its strictness (auth, 404, 403, 409, 400), instance templates,
zonal and regional managed instance groups, operations, the control API tests use to play the
group's controller, `serve`, and the proof that it speaks the Compute Engine API as Google's own
Node client @google-cloud/compute (tests/fakes/node/, `npm ci`) understands it."""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_compute import FakeComputeServer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.join(HERE, "node")
NODE_CLIENT = os.path.join(NODE_DIR, "compute_client.js")
TOKEN = "ya29.compute-token"
P, Z, R = "my-project", "us-central1-a", "us-central1"
WWW = "https://www.googleapis.com/compute/v1"


class FakeTestCase(unittest.TestCase):
    fake_kwargs = {}

    def setUp(self):
        self.srv = FakeComputeServer(P, Z, "trainer-7", token_ok=lambda t: t == TOKEN, **self.fake_kwargs).start()
        self.addCleanup(self.srv.stop)

    def api(self, method, path, body=None, token=TOKEN, raw=None):
        """(status, JSON) for METHOD /compute/v1/PATH (path relative to projects/P/ unless it starts with /)."""
        if not path.startswith("/"):
            path = f"/compute/v1/projects/{P}/{path}"
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=10)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    def ok(self, method, path, body=None):
        status, answer = self.api(method, path, body)
        self.assertEqual(status, 200, answer)
        return answer

    def error(self, method, path, body=None, token=TOKEN):
        status, answer = self.api(method, path, body, token=token)
        self.assertNotEqual(status, 200, answer)
        err = answer["error"]
        self.assertEqual(err["code"], status)
        self.assertEqual(err["errors"][0]["message"], err["message"])
        self.assertEqual(err["errors"][0]["domain"], "global")
        return status, err["errors"][0]["reason"], err["message"]

    def finish(self, op):
        """Polls an operation the way clients do: get until DONE."""
        scope = op["selfLink"].split("/compute/v1/projects/", 1)[1].split("/", 1)[1]
        for _ in range(10):
            if op["status"] == "DONE":
                return op
            op = self.ok("GET", scope)
        self.fail(f"operation never DONE: {op}")

    def template(self, name="tpl"):
        return self.finish(self.ok("POST", "global/instanceTemplates",
                                   {"name": name, "properties": {"machineType": "e2-small"}}))

    def zonal(self, name="mig", size=0, **extra):
        self.template(f"{name}-tpl")
        body = {"name": name, "instanceTemplate": f"global/instanceTemplates/{name}-tpl", "targetSize": size, **extra}
        return self.finish(self.ok("POST", f"zones/{Z}/instanceGroupManagers", body))

    def regional(self, name="rmig", size=0, **extra):
        self.template(f"{name}-tpl")
        body = {"name": name, "instanceTemplate": f"{WWW}/projects/{P}/global/instanceTemplates/{name}-tpl",
                "targetSize": size, **extra}
        return self.finish(self.ok("POST", f"regions/{R}/instanceGroupManagers", body))

    def delete_instances(self, group, instances, skip=None, kind="zones", loc=Z):
        body = {"instances": instances}
        if skip is not None:
            body["skipInstancesOnValidationError"] = skip
        return self.api("POST", f"{kind}/{loc}/instanceGroupManagers/{group}/deleteInstances", body)


class ExistingBehaviourTest(FakeTestCase):
    """What tests/integration/test_policies.py relies on."""

    def test_stop_delete_get_and_deny(self):
        self.assertEqual(self.srv.endpoint, f"http://127.0.0.1:{self.srv.port}/compute/v1")
        self.assertEqual(self.ok("GET", f"zones/{Z}/instances/trainer-7")["status"], "RUNNING")
        op = self.ok("POST", f"zones/{Z}/instances/trainer-7/stop")
        self.assertEqual((op["kind"], op["operationType"], op["status"]), ("compute#operation", "stop", "RUNNING"))
        self.assertEqual(op["targetLink"], f"{WWW}/projects/{P}/zones/{Z}/instances/trainer-7")
        self.assertEqual(self.srv.status, "STOPPING")
        self.assertEqual(self.finish(op)["status"], "DONE")  # now gettable
        self.ok("DELETE", f"zones/{Z}/instances/trainer-7")
        self.assertEqual(self.srv.status, "DELETED")
        self.assertEqual(self.error("GET", f"zones/{Z}/instances/trainer-7")[:2], (404, "notFound"))
        calls = [(e["method"], e["path"]) for e in self.srv.log()]
        self.assertEqual(calls[1], ("POST", f"/compute/v1/projects/{P}/zones/{Z}/instances/trainer-7/stop"))
        self.assertTrue(all(e["token"] == TOKEN for e in self.srv.log()))

    def test_deny_stop(self):
        self.srv.deny("compute.instances.stop")
        self.assertEqual(self.error("POST", f"zones/{Z}/instances/trainer-7/stop"), (
            403, "forbidden",
            f"Required 'compute.instances.stop' permission for 'projects/{P}/zones/{Z}/instances/trainer-7'"))
        self.assertEqual(self.srv.status, "RUNNING")
        self.ok("DELETE", f"zones/{Z}/instances/trainer-7")  # only that permission

    def test_positional_constructor(self):
        srv = FakeComputeServer("p", "europe-west4-b", "vm", lambda t: True, "127.0.0.1", 0).start()
        self.addCleanup(srv.stop)
        self.assertEqual((srv.project, srv.zone, srv.instance, srv.status), ("p", "europe-west4-b", "vm", "RUNNING"))
        self.assertEqual(srv.log(), [])


class StrictnessTest(FakeTestCase):
    def test_bearer_token_on_every_call(self):
        for method, path in (("GET", f"zones/{Z}/instances/trainer-7"), ("GET", "global/instanceTemplates"),
                             ("POST", f"zones/{Z}/instanceGroupManagers"), ("GET", "global/operations/x"),
                             ("GET", "/nowhere")):
            code, reason, message = self.error(method, path, token=None)
            self.assertEqual((code, reason), (401, "required"), path)
            self.assertIn("missing required authentication credential", message)
            self.assertEqual(self.error(method, path, token="ya29.wrong")[:2], (401, "authError"))
        self.assertEqual(self.srv.calls(), [])  # nothing reached a method

    def test_unknown_things_are_404(self):
        for method, path, resource in (
                ("GET", "/compute/v1/nowhere", None),
                ("GET", f"zones/{Z}/instanceGroupManagers/mig/resize", None),  # wrong method
                ("PATCH", f"zones/{Z}/instances/trainer-7", None),
                ("GET", "/compute/v1/projects/other/zones/us-central1-a/instances/trainer-7",
                 f"projects/other/zones/{Z}/instances/trainer-7"),
                ("GET", "zones/mars-north1-a/instances/trainer-7",
                 f"projects/{P}/zones/mars-north1-a/instances/trainer-7"),
                ("GET", f"zones/{Z}/instances/nope", f"projects/{P}/zones/{Z}/instances/nope"),
                ("GET", "regions/mars-north1/instanceGroupManagers", f"projects/{P}/regions/mars-north1"),
                ("POST", "zones/mars-north1-a/instanceGroupManagers", f"projects/{P}/zones/mars-north1-a"),
                ("GET", "/compute/v1/projects/other/global/instanceTemplates", "projects/other"),
                ("GET", f"zones/{Z}/instanceGroupManagers/nope", f"projects/{P}/zones/{Z}/instanceGroupManagers/nope"),
                ("GET", f"regions/{R}/instanceGroupManagers/nope",
                 f"projects/{P}/regions/{R}/instanceGroupManagers/nope"),
                ("GET", "global/instanceTemplates/nope", f"projects/{P}/global/instanceTemplates/nope"),
                ("DELETE", "global/instanceTemplates/nope", f"projects/{P}/global/instanceTemplates/nope"),
                ("GET", f"zones/{Z}/operations/operation-1", f"projects/{P}/zones/{Z}/operations/operation-1"),
                ("POST", "global/operations/operation-1/wait", f"projects/{P}/global/operations/operation-1")):
            code, reason, message = self.error(method, path)
            self.assertEqual((code, reason), (404, "notFound"), path)
            if resource:
                self.assertEqual(message, f"The resource '{resource}' was not found")

    def test_project_id_or_number(self):
        by_number = f"/compute/v1/projects/123456789/zones/{Z}/instances/trainer-7"
        self.assertEqual(self.ok("GET", by_number)["selfLink"], f"{WWW}/projects/{P}/zones/{Z}/instances/trainer-7")
        self.template()
        tpl = self.ok("GET", "/compute/v1/projects/123456789/global/instanceTemplates/tpl")
        self.assertEqual(tpl["selfLink"], f"{WWW}/projects/{P}/global/instanceTemplates/tpl")

    def test_deny_each_permission(self):
        self.zonal("mig", 1)
        self.srv.add_member("mig", "mig-0001")
        members = {"instances": [f"zones/{Z}/instances/mig-0001"]}
        g = f"zones/{Z}/instanceGroupManagers/mig"
        vm, tpl = f"zones/{Z}/instances/trainer-7", "global/instanceTemplates/mig-tpl"
        cases = [
            ("compute.instances.get", "GET", vm, None, f"projects/{P}/{vm}"),
            ("compute.instances.delete", "DELETE", vm, None, f"projects/{P}/{vm}"),
            ("compute.instanceTemplates.create", "POST", "global/instanceTemplates",
             {"name": "t2", "properties": {"machineType": "e2-small"}}, f"projects/{P}/global/instanceTemplates/t2"),
            ("compute.instanceTemplates.get", "GET", tpl, None, f"projects/{P}/{tpl}"),
            ("compute.instanceTemplates.list", "GET", "global/instanceTemplates", None, f"projects/{P}"),
            ("compute.instanceTemplates.delete", "DELETE", tpl, None, f"projects/{P}/{tpl}"),
            ("compute.instanceGroupManagers.create", "POST", f"zones/{Z}/instanceGroupManagers",
             {"name": "m2", "instanceTemplate": "global/instanceTemplates/mig-tpl"}, f"projects/{P}/{g[:-3]}m2"),
            ("compute.instanceGroupManagers.get", "GET", g, None, f"projects/{P}/{g}"),
            ("compute.instanceGroupManagers.get", "POST", g + "/listManagedInstances", None, f"projects/{P}/{g}"),
            ("compute.instanceGroupManagers.list", "GET", f"zones/{Z}/instanceGroupManagers", None, f"projects/{P}"),
            ("compute.instanceGroupManagers.update", "POST", g + "/resize?size=5", None, f"projects/{P}/{g}"),
            ("compute.instanceGroupManagers.update", "POST", g + "/deleteInstances", members, f"projects/{P}/{g}"),
            ("compute.instanceGroupManagers.update", "POST", g + "/abandonInstances", members, f"projects/{P}/{g}"),
            ("compute.instanceGroupManagers.delete", "DELETE", g, None, f"projects/{P}/{g}"),
        ]
        for permission, method, path, body, resource in cases:
            self.srv.deny(permission)
            self.assertEqual(self.error(method, path, body),
                             (403, "forbidden", f"Required '{permission}' permission for '{resource}'"), path)
            self.srv.allow(permission)
        # Nothing was applied.
        self.assertEqual(self.srv.target_size("mig"), 1)
        self.assertEqual([m["name"] for m in self.srv.members("mig")], ["mig-0001"])
        self.assertEqual(self.srv.status, "RUNNING")
        self.assertIsNone(self.srv.template("t2"))
        # IAM is checked before existence.
        self.srv.deny("compute.instanceGroupManagers.get")
        self.assertEqual(self.error("GET", f"zones/{Z}/instanceGroupManagers/nope")[0], 403)

    def test_duplicate_inserts_are_409(self):
        self.zonal("mig")
        self.assertEqual(
            self.error("POST", "global/instanceTemplates", {"name": "mig-tpl", "properties": {"machineType": "x"}}),
            (409, "alreadyExists", f"The resource 'projects/{P}/global/instanceTemplates/mig-tpl' already exists"))
        body = {"name": "mig", "instanceTemplate": "global/instanceTemplates/mig-tpl"}
        self.assertEqual(self.error("POST", f"zones/{Z}/instanceGroupManagers", body),
                         (409, "alreadyExists",
                          f"The resource 'projects/{P}/zones/{Z}/instanceGroupManagers/mig' already exists"))
        # The same name as a regional group is another resource.
        self.ok("POST", f"regions/{R}/instanceGroupManagers", body)

    def test_bad_requests_are_400(self):
        self.template("tpl")
        igms = f"zones/{Z}/instanceGroupManagers"
        for path, body in (
                ("global/instanceTemplates", {"name": "Bad_Name", "properties": {"machineType": "e2-small"}}),
                ("global/instanceTemplates", {"name": "t"}),
                ("global/instanceTemplates", {"name": "t", "properties": {"machineType": "x"}, "colour": "red"}),
                (igms, {"name": "m"}),
                (igms, {"name": "m", "instanceTemplate": "tpl"}),
                (igms, {"name": "m", "instanceTemplate": "global/instanceTemplates/tpl", "targetSize": -1}),
                (igms, {"name": "m", "instanceTemplate": "global/instanceTemplates/tpl", "baseInstanceName": "9x"}),
                (igms, {"name": "m", "instanceTemplate": "global/instanceTemplates/tpl", "targetSizes": 1}),
                (f"regions/{R}/instanceGroupManagers",
                 {"name": "m", "instanceTemplate": "global/instanceTemplates/tpl",
                  "distributionPolicy": {"zones": [{"zone": "zones/europe-west4-a"}]}})):
            code, reason, _ = self.error("POST", path, body)
            self.assertEqual((code, reason), (400, "invalid"), body)
        status, answer = self.api("POST", igms, raw=b"{not json")
        self.assertEqual((status, answer["error"]["errors"][0]["reason"]), (400, "parseError"))
        missing = {"name": "m", "instanceTemplate": "global/instanceTemplates/nope"}
        self.assertEqual(self.error("POST", igms, missing)[:2], (404, "notFound"))
        self.zonal("mig")
        for q in ("", "?size=-2", "?size=two"):
            self.assertEqual(self.error("POST", f"{igms}/mig/resize{q}")[:2], (400, "invalid"))
        self.assertEqual(self.srv.group("m"), None)

    def test_template_in_use_cannot_be_deleted(self):
        self.zonal("mig")
        self.assertEqual(self.error("DELETE", "global/instanceTemplates/mig-tpl"), (
            400, "resourceInUseByAnotherResource",
            f"The instance_template resource 'projects/{P}/global/instanceTemplates/mig-tpl' is already being used by "
            f"'projects/{P}/zones/{Z}/instanceGroupManagers/mig'"))
        self.finish(self.ok("DELETE", f"zones/{Z}/instanceGroupManagers/mig"))
        self.finish(self.ok("DELETE", "global/instanceTemplates/mig-tpl"))
        self.assertIsNone(self.srv.template("mig-tpl"))

    def test_fail_next(self):
        self.zonal("mig", 1)
        self.srv.add_member("mig", "mig-a")
        self.srv.fail_next("instanceGroupManagers.deleteInstances", code=503)
        status, answer = self.delete_instances("mig", ["mig-a"], skip=True)
        self.assertEqual((status, answer["error"]["errors"][0]["reason"]), (503, "backendError"))
        self.assertEqual(self.srv.target_size("mig"), 1)
        status, _ = self.delete_instances("mig", ["mig-a"], skip=True)
        self.assertEqual((status, self.srv.target_size("mig")), (200, 0))


class TemplatesAndGroupsTest(FakeTestCase):
    def test_template_resource(self):
        props = {"machineType": "g2-standard-8", "scheduling": {"provisioningModel": "SPOT"}, "anything": [1, 2]}
        op = self.ok("POST", "global/instanceTemplates", {"name": "t", "description": "d", "properties": props})
        self.assertEqual((op["operationType"], op["targetLink"]),
                         ("compute.instanceTemplates.insert", f"{WWW}/projects/{P}/global/instanceTemplates/t"))
        self.assertNotIn("zone", op)
        self.assertEqual(op["selfLink"], f"{WWW}/projects/{P}/global/operations/{op['name']}")
        t = self.ok("GET", "global/instanceTemplates/t")
        self.assertEqual((t["kind"], t["name"], t["description"], t["properties"]),
                         ("compute#instanceTemplate", "t", "d", props))
        self.assertEqual(op["targetId"], t["id"])
        self.assertRegex(t["id"], r"^\d+$")
        self.assertRegex(t["creationTimestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[-+]\d\d:\d\d$")
        self.assertEqual(self.srv.template("t")["properties"], props)
        self.template("a")
        listed = self.ok("GET", "global/instanceTemplates")
        self.assertEqual((listed["kind"], [i["name"] for i in listed["items"]]),
                         ("compute#instanceTemplateList", ["a", "t"]))
        page = self.ok("GET", "global/instanceTemplates?maxResults=1")
        self.assertEqual(([i["name"] for i in page["items"]], page["nextPageToken"]), (["a"], "1"))
        page = self.ok("GET", f"global/instanceTemplates?maxResults=1&pageToken={page['nextPageToken']}")
        self.assertEqual(([i["name"] for i in page["items"]], page.get("nextPageToken")), (["t"], None))

    def test_zonal_group_resource(self):
        op = self.zonal("mig", 2, baseInstanceName="trainer",
                        statefulPolicy={"preservedState": {"disks": {"data": {"autoDelete": "NEVER"}}}},
                        instanceLifecyclePolicy={"defaultActionOnFailure": "DO_NOTHING"})
        link = f"{WWW}/projects/{P}/zones/{Z}/instanceGroupManagers/mig"
        self.assertEqual((op["operationType"], op["targetLink"], op["zone"]),
                         ("compute.instanceGroupManagers.insert", link, f"{WWW}/projects/{P}/zones/{Z}"))
        g = self.ok("GET", f"zones/{Z}/instanceGroupManagers/mig")
        self.assertEqual((g["kind"], g["name"], g["selfLink"], g["zone"], g["targetSize"], g["baseInstanceName"]),
                         ("compute#instanceGroupManager", "mig", link, f"{WWW}/projects/{P}/zones/{Z}", 2, "trainer"))
        self.assertNotIn("region", g)
        self.assertEqual(g["instanceTemplate"], f"{WWW}/projects/{P}/global/instanceTemplates/mig-tpl")
        self.assertEqual(g["versions"], [{"instanceTemplate": g["instanceTemplate"]}])
        self.assertEqual(g["instanceGroup"], f"{WWW}/projects/{P}/zones/{Z}/instanceGroups/mig")
        self.assertEqual(g["statefulPolicy"]["preservedState"]["disks"]["data"]["autoDelete"], "NEVER")
        self.assertEqual(g["instanceLifecyclePolicy"], {"defaultActionOnFailure": "DO_NOTHING"})
        self.assertEqual(g["currentActions"]["none"], 0)
        self.assertFalse(g["status"]["isStable"])  # 0 of 2: the test has not played the controller yet
        self.assertEqual(g["id"], op["targetId"])
        self.assertEqual(self.srv.group("mig"), g)
        self.assertEqual([i["name"] for i in self.ok("GET", f"zones/{Z}/instanceGroupManagers")["items"]], ["mig"])
        # Defaults, and versions[0] instead of instanceTemplate.
        self.template("t2")
        self.ok("POST", f"zones/{Z}/instanceGroupManagers",
                {"name": "plain", "versions": [{"instanceTemplate": "projects/123456789/global/instanceTemplates/t2"}]})
        plain = self.srv.group("plain")
        self.assertEqual((plain["targetSize"], plain["baseInstanceName"]), (0, "plain"))
        self.assertEqual(plain["instanceLifecyclePolicy"]["defaultActionOnFailure"], "REPAIR")

    def test_resize_sets_the_target_only(self):
        self.zonal("mig", 2)
        before = self.srv.group("mig")["fingerprint"]
        op = self.finish(self.ok("POST", f"zones/{Z}/instanceGroupManagers/mig/resize?size=5"))
        self.assertEqual(op["operationType"], "compute.instanceGroupManagers.resize")
        self.assertEqual(self.srv.target_size("mig"), 5)
        self.assertNotEqual(self.srv.group("mig")["fingerprint"], before)
        self.assertEqual(self.srv.members("mig"), [])  # the test is the controller
        self.ok("POST", f"zones/{Z}/instanceGroupManagers/mig/resize?size=0")
        self.assertEqual(self.srv.target_size("mig"), 0)

    def test_delete_instances_forms_and_skip(self):
        self.zonal("mig", 6)
        for i in range(6):
            self.srv.add_member("mig", f"m{i}")
        forms = [f"{WWW}/projects/{P}/zones/{Z}/instances/m0",
                 f"https://compute.googleapis.com/compute/v1/projects/{P}/zones/{Z}/instances/m1",
                 f"projects/123456789/zones/{Z}/instances/m2",
                 f"zones/{Z}/instances/m3",
                 f"{self.srv.endpoint}/projects/{P}/zones/{Z}/instances/m4"]
        status, op = self.delete_instances("mig", forms + [f"zones/{Z}/instances/stranger", f"zones/{Z}/instances/m0"],
                                           skip=True)
        self.assertEqual(status, 200, op)
        op = self.finish(op)
        self.assertNotIn("error", op)
        self.assertEqual(op["operationType"], "compute.instanceGroupManagers.deleteInstances")
        self.assertEqual(self.srv.target_size("mig"), 1)  # lowered by the 5 actually deleted
        self.assertEqual([m["name"] for m in self.srv.members("mig")], ["m5"])
        self.assertEqual(self.error("GET", f"zones/{Z}/instances/m0")[0], 404)
        # A bare name works for a zonal group.
        self.assertEqual(self.delete_instances("mig", ["m5"])[0], 200)
        self.assertEqual((self.srv.target_size("mig"), self.srv.members("mig")), (0, []))
        self.assertEqual(self.srv.deleted_outside_group(), [])

    def test_delete_instances_without_skip_fails_on_a_non_member(self):
        self.zonal("mig", 2)
        self.srv.add_member("mig", "a")
        self.srv.add_member("mig", "b")
        self.srv.add_instance("loner")  # exists, but not in the group
        for stranger in ("zones/us-central1-a/instances/nope", "zones/us-central1-a/instances/loner"):
            for skip in (None, False):
                status, op = self.delete_instances("mig", [f"zones/{Z}/instances/a", stranger], skip=skip)
                self.assertEqual((status, op["status"]), (200, "RUNNING"))
                op = self.finish(op)
                self.assertEqual(op["error"]["errors"][0]["code"], "CONDITION_NOT_MET")
                self.assertIn(stranger, op["error"]["errors"][0]["message"])
                self.assertEqual(op["httpErrorStatusCode"], 400)
        self.assertEqual(self.srv.target_size("mig"), 2)
        self.assertEqual([m["name"] for m in self.srv.members("mig")], ["a", "b"])

    def test_delete_instances_malformed_or_elsewhere_is_400_even_with_skip(self):
        self.zonal("mig", 1)
        self.srv.add_member("mig", "a")
        for entries in ([], ["zones/us-central1-a/disks/a"], ["https://example.com/zones/us-central1-a/instances/a"],
                        ["zones/us-central1-b/instances/a"], ["projects/other/zones/us-central1-a/instances/a"],
                        ["a", "zones/us-central1-a/instances/a"], [7]):
            status, answer = self.delete_instances("mig", entries, skip=True)
            self.assertEqual((status, answer["error"]["errors"][0]["reason"]), (400, "invalid"), entries)
        status, answer = self.api("POST", f"zones/{Z}/instanceGroupManagers/mig/deleteInstances",
                                  {"instances": ["a"], "skip": True})
        self.assertIn('Unknown name "skip"', answer["error"]["message"])
        self.assertEqual(self.srv.target_size("mig"), 1)

    def test_abandon_instances(self):
        self.zonal("mig", 2)
        self.srv.add_member("mig", "a")
        self.srv.add_member("mig", "b")
        op = self.finish(self.ok("POST", f"zones/{Z}/instanceGroupManagers/mig/abandonInstances",
                                 {"instances": [f"zones/{Z}/instances/a"]}))
        self.assertEqual(op["operationType"], "compute.instanceGroupManagers.abandonInstances")
        self.assertEqual((self.srv.target_size("mig"), [m["name"] for m in self.srv.members("mig")]), (1, ["b"]))
        vm = self.ok("GET", f"zones/{Z}/instances/a")  # still there, without created-by
        self.assertNotIn("metadata", vm)

    def test_list_managed_instances(self):
        self.zonal("mig", 3)
        self.assertEqual(self.ok("POST", f"zones/{Z}/instanceGroupManagers/mig/listManagedInstances"), {})
        self.srv.add_member("mig", "a")
        self.srv.add_member("mig", "b", status="STAGING", current_action="CREATING")
        self.srv.add_member("mig", "c")
        self.srv.set_member_status("c", "STOPPING", current_action="RECREATING")
        listed = self.ok("POST", f"zones/{Z}/instanceGroupManagers/mig/listManagedInstances?maxResults=1")
        self.assertEqual([(m["name"], m["instanceStatus"], m["currentAction"]) for m in listed["managedInstances"]],
                         [("a", "RUNNING", "NONE"), ("b", "STAGING", "CREATING"), ("c", "STOPPING", "RECREATING")])
        self.assertNotIn("nextPageToken", listed)  # PAGELESS: maxResults ignored, as the API does
        m = listed["managedInstances"][0]
        self.assertEqual(m["instance"], f"{WWW}/projects/{P}/zones/{Z}/instances/a")
        self.assertEqual(m["id"], self.ok("GET", f"zones/{Z}/instances/a")["id"])
        self.assertEqual(m["version"]["instanceTemplate"], f"{WWW}/projects/{P}/global/instanceTemplates/mig-tpl")
        g = self.srv.group("mig")
        actions = g["currentActions"]
        self.assertEqual((actions["none"], actions["creating"], actions["recreating"]), (1, 1, 1))
        self.assertFalse(g["status"]["isStable"])
        self.zonal("paged", 0, listManagedInstancesResults="PAGINATED")
        for n in ("p1", "p2", "p3"):
            self.srv.add_member("paged", n)
        page = self.ok("POST", f"zones/{Z}/instanceGroupManagers/paged/listManagedInstances?maxResults=2")
        self.assertEqual(([m["name"] for m in page["managedInstances"]], page["nextPageToken"]), (["p1", "p2"], "2"))

    def test_request_id_makes_a_call_idempotent(self):
        self.zonal("mig", 2)
        self.srv.add_member("mig", "a")
        self.srv.add_member("mig", "b")
        rid = "123e4567-e89b-12d3-a456-426614174000"
        path = f"zones/{Z}/instanceGroupManagers/mig/deleteInstances?requestId={rid}"
        first = self.ok("POST", path, {"instances": ["a"]})
        again = self.ok("POST", path, {"instances": ["a"]})  # a retry after a lost answer
        self.assertEqual(again["name"], first["name"])
        self.assertEqual(self.srv.target_size("mig"), 1)
        self.assertEqual(self.error("POST", f"zones/{Z}/instanceGroupManagers/mig/resize?size=1&requestId=nope")[:2],
                         (400, "invalid"))

    def test_delete_group_deletes_its_members(self):
        self.zonal("mig", 1)
        self.srv.add_member("mig", "a")
        op = self.finish(self.ok("DELETE", f"zones/{Z}/instanceGroupManagers/mig"))
        self.assertEqual(op["operationType"], "compute.instanceGroupManagers.delete")
        self.assertIsNone(self.srv.group("mig"))
        self.assertEqual(self.error("GET", f"zones/{Z}/instances/a")[0], 404)
        self.assertNotIn("items", self.ok("GET", f"zones/{Z}/instanceGroupManagers"))


class RegionalGroupTest(FakeTestCase):
    def test_regional_group(self):
        op = self.regional("rmig", 3)
        link = f"{WWW}/projects/{P}/regions/{R}/instanceGroupManagers/rmig"
        self.assertEqual((op["operationType"], op["targetLink"], op["region"]),
                         ("compute.regionInstanceGroupManagers.insert", link, f"{WWW}/projects/{P}/regions/{R}"))
        self.assertEqual(op["selfLink"], f"{WWW}/projects/{P}/regions/{R}/operations/{op['name']}")
        self.assertNotIn("zone", op)
        g = self.ok("GET", f"regions/{R}/instanceGroupManagers/rmig")
        self.assertEqual((g["selfLink"], g["region"], g["targetSize"]), (link, f"{WWW}/projects/{P}/regions/{R}", 3))
        self.assertNotIn("zone", g)
        self.assertEqual(g["instanceGroup"], f"{WWW}/projects/{P}/regions/{R}/instanceGroups/rmig")
        self.assertEqual([z["zone"].split("/")[-1] for z in g["distributionPolicy"]["zones"]],
                         ["us-central1-a", "us-central1-b", "us-central1-c"])
        listed = self.ok("GET", f"regions/{R}/instanceGroupManagers")
        self.assertEqual((listed["kind"], [i["name"] for i in listed["items"]]),
                         ("compute#regionInstanceGroupManagerList", ["rmig"]))
        self.assertNotIn("items", self.ok("GET", f"zones/{Z}/instanceGroupManagers"))
        # Members spread over the group's zones; created-by names the region, by project number.
        for n in ("r0", "r1", "r2"):
            self.srv.add_member("rmig", n)
        self.assertEqual([m["zone"] for m in self.srv.members("rmig")], [f"{R}-a", f"{R}-b", f"{R}-c"])
        vm = self.ok("GET", "zones/us-central1-b/instances/r1")
        meta = {i["key"]: i["value"] for i in vm["metadata"]["items"]}
        self.assertEqual(meta["created-by"], f"projects/123456789/regions/{R}/instanceGroupManagers/rmig")
        self.assertEqual(meta["instance-template"], "projects/123456789/global/instanceTemplates/rmig-tpl")
        managed = self.ok("POST", f"regions/{R}/instanceGroupManagers/rmig/listManagedInstances")["managedInstances"]
        self.assertEqual(managed[1]["instance"], f"{WWW}/projects/{P}/zones/us-central1-b/instances/r1")

    def test_regional_delete_instances(self):
        self.regional("rmig", 3, distributionPolicy={"zones": [{"zone": f"{WWW}/projects/{P}/zones/us-central1-b"},
                                                               {"zone": "zones/us-central1-f"}]})
        self.assertEqual(self.srv.group("rmig")["distributionPolicy"]["zones"][1]["zone"],
                         f"{WWW}/projects/{P}/zones/us-central1-f")
        self.srv.add_member("rmig", "r0")
        self.srv.add_member("rmig", "r1")
        self.srv.add_member("rmig", "r2", zone="us-central1-b")
        self.assertEqual([m["zone"] for m in self.srv.members("rmig")], [f"{R}-b", f"{R}-f", f"{R}-b"])
        with self.assertRaises(ValueError):
            self.srv.add_member("rmig", "r3", zone="us-central1-a")  # not one of the group's zones
        with self.assertRaises(ValueError):
            self.srv.add_member("rmig", "trainer-7")  # the VM is in us-central1-a: not adopted elsewhere
        for entries in (["r0"], ["zones/us-central1-a/instances/r0"], ["zones/europe-west4-a/instances/r0"]):
            status, answer = self.delete_instances("rmig", entries, skip=True, kind="regions", loc=R)
            self.assertEqual((status, answer["error"]["errors"][0]["reason"]), (400, "invalid"), entries)
        status, op = self.delete_instances("rmig", ["zones/us-central1-f/instances/nope"], kind="regions", loc=R)
        self.assertEqual(self.finish(op)["error"]["errors"][0]["code"], "CONDITION_NOT_MET")
        entries = ["zones/us-central1-f/instances/r1", "zones/us-central1-f/instances/nope",
                   f"{WWW}/projects/{P}/zones/us-central1-b/instances/r2"]
        status, op = self.delete_instances("rmig", entries, skip=True, kind="regions", loc=R)
        op = self.finish(op)
        self.assertEqual((op["operationType"], op.get("error")),
                         ("compute.regionInstanceGroupManagers.deleteInstances", None))
        self.assertEqual((self.srv.target_size("rmig"), [m["name"] for m in self.srv.members("rmig")]), (1, ["r0"]))
        self.assertEqual(self.srv.calls()[-2][0], "regionInstanceGroupManagers.deleteInstances")

    def test_non_member_error_as_a_request_error(self):
        srv = FakeComputeServer(P, Z, "vm", non_member_error="request").start()
        self.addCleanup(srv.stop)
        srv.add_group("rmig", region=R, members=["a"])
        self.srv = srv
        status, answer = self.delete_instances("rmig", ["zones/us-central1-a/instances/nope"], kind="regions", loc=R,
                                               skip=False)
        self.assertEqual((status, answer["error"]["errors"][0]["reason"]), (400, "invalid"))
        self.assertIn("is not a member of the managed instance group", answer["error"]["message"])
        self.assertEqual(srv.target_size("rmig"), 1)


class OperationsTest(FakeTestCase):
    def test_default_done_by_the_first_get_or_wait(self):
        self.template("t")
        op = self.ok("POST", f"zones/{Z}/instances/trainer-7/stop")
        self.assertEqual((op["status"], op["progress"]), ("RUNNING", 0))
        self.assertNotIn("endTime", op)
        done = self.ok("GET", f"zones/{Z}/operations/{op['name']}")
        self.assertEqual((done["status"], done["progress"], done["name"], done["id"]),
                         ("DONE", 100, op["name"], op["id"]))
        self.assertIn("endTime", done)
        self.assertEqual(done["selfLink"], f"{WWW}/projects/{P}/zones/{Z}/operations/{op['name']}")
        self.assertEqual(done["user"], "123456789-compute@developer.gserviceaccount.com")
        op = self.ok("DELETE", "global/instanceTemplates/t")
        self.assertEqual(self.ok("POST", f"global/operations/{op['name']}/wait")["status"], "DONE")
        # Another scope's path does not find it.
        self.assertEqual(self.error("GET", f"zones/us-central1-b/operations/{op['name']}")[0], 404)
        self.assertEqual(self.error("GET", f"regions/{R}/operations/{op['name']}")[0], 404)
        self.assertEqual([c for c, _ in self.srv.calls()][-3:],
                         ["globalOperations.wait", "zoneOperations.get", "regionOperations.get"])
        self.assertEqual(len(self.srv.operations()), 3)


class SlowOperationsTest(FakeTestCase):
    fake_kwargs = {"operation_polls": 2}

    def test_polls_then_done(self):
        op = self.ok("POST", f"zones/{Z}/instances/trainer-7/stop")
        path = f"zones/{Z}/operations/{op['name']}"
        seen = [self.ok("GET", path)["status"], self.ok("POST", path + "/wait")["status"],
                self.ok("GET", path)["status"]]
        self.assertEqual(seen, ["RUNNING", "RUNNING", "DONE"])

    def test_timed_operation_and_the_wait_cap(self):
        srv = FakeComputeServer(P, Z, "vm", operation_seconds=0.4, wait_cap_s=0.1).start()
        self.addCleanup(srv.stop)
        self.srv = srv
        op = self.ok("POST", f"zones/{Z}/instances/vm/stop")
        path = f"zones/{Z}/operations/{op['name']}"
        t0 = time.monotonic()
        self.assertEqual(self.ok("POST", path + "/wait")["status"], "RUNNING")  # the cap came first
        self.assertGreaterEqual(time.monotonic() - t0, 0.09)
        self.assertEqual(self.ok("GET", path)["status"], "RUNNING")
        srv.wait_cap_s = 5
        self.assertEqual(self.ok("POST", path + "/wait")["status"], "DONE")  # blocked until it was
        self.assertLess(time.monotonic() - t0, 2)


class ControlApiTest(FakeTestCase):
    def test_the_vm_in_its_group(self):
        g = self.srv.add_group("trainers", members=["trainer-7", "trainers-x1"], template="spot",
                               stateful_policy={"preservedState": {"disks": {"d": {"autoDelete": "NEVER"}}}})
        self.assertEqual((g["targetSize"], g["selfLink"]),
                         (2, f"{WWW}/projects/{P}/zones/{Z}/instanceGroupManagers/trainers"))
        self.assertEqual(self.srv.template("spot")["properties"], {"machineType": "e2-small"})
        vm = self.ok("GET", f"zones/{Z}/instances/trainer-7")
        meta = {i["key"]: i["value"] for i in vm["metadata"]["items"]}
        self.assertEqual(meta["created-by"], f"projects/123456789/zones/{Z}/instanceGroupManagers/trainers")
        self.assertEqual([(m["name"], m["zone"], m["status"], m["current_action"])
                          for m in self.srv.members("trainers")],
                         [("trainer-7", Z, "RUNNING", "NONE"), ("trainers-x1", Z, "RUNNING", "NONE")])
        self.assertTrue(self.srv.group("trainers")["status"]["isStable"])
        self.srv.set_member_status("trainer-7", "STOPPING")
        self.assertEqual(self.srv.status, "STOPPING")
        self.srv.remove_member("trainers-x1")
        self.assertEqual((self.srv.target_size("trainers"), len(self.srv.members("trainers"))), (2, 1))
        self.assertIsNone(self.srv.group("nope"))
        with self.assertRaises(KeyError):
            self.srv.members("nope")
        with self.assertRaises(ValueError):
            self.srv.set_member_status("trainer-7", "SLEEPING")

    def test_deleted_outside_the_group_is_recorded_and_recreated_by_the_test(self):
        self.srv.add_group("trainers", members=["trainer-7"])
        self.finish(self.ok("DELETE", f"zones/{Z}/instances/trainer-7"))
        self.assertEqual(self.srv.target_size("trainers"), 1)  # what makes a real MIG bring it back
        self.assertEqual(self.srv.members("trainers"), [])
        self.assertEqual(self.srv.deleted_outside_group(),
                         [{"group": "trainers", "instance": "trainer-7", "zone": Z, "call": "instances.delete"}])
        self.assertEqual(self.srv.calls()[-2], ("instances.delete", f"projects/{P}/zones/{Z}/instances/trainer-7"))
        self.srv.add_member("trainers", "trainer-7")  # the controller recreates it, same name
        self.assertEqual((self.srv.status, [m["name"] for m in self.srv.members("trainers")]),
                         ("RUNNING", ["trainer-7"]))

    def test_leaving_through_the_group(self):
        self.srv.add_group("trainers", region=R, members=["a", "trainer-7", "b"])  # the VM adopted in its zone
        me = [m for m in self.srv.members("trainers") if m["name"] == "trainer-7"][0]
        self.assertEqual(me["zone"], Z)
        # As the VM does it: the project number from created-by, a partial URL, skip, then the operation.
        group = f"/compute/v1/projects/123456789/regions/{R}/instanceGroupManagers/trainers"
        body = {"instances": [f"zones/{me['zone']}/instances/trainer-7"], "skipInstancesOnValidationError": True}
        op = self.ok("POST", group + "/deleteInstances", body)
        self.assertEqual((self.srv.status, self.srv.target_size("trainers")), ("DELETED", 2))
        done = self.ok("GET", f"/compute/v1/projects/123456789/regions/{R}/operations/{op['name']}")
        self.assertEqual((done["status"], done.get("error")), ("DONE", None))
        self.ok("POST", group + "/deleteInstances", body)  # again, after a lost answer: nothing changes
        self.assertEqual(self.srv.target_size("trainers"), 2)
        self.assertEqual(self.delete_instances("trainers", [me["url"]], skip=True, kind="regions", loc=R)[0], 200)
        self.assertEqual(self.srv.deleted_outside_group(), [])
        self.assertEqual(self.srv.calls()[:2],
                         [("regionInstanceGroupManagers.deleteInstances",
                           f"projects/123456789/regions/{R}/instanceGroupManagers/trainers"),
                          ("regionOperations.get", f"projects/123456789/regions/{R}/operations/{op['name']}")])

    def test_wait_for_sees_another_thread(self):
        self.srv.add_group("g", members=["a"])
        threading.Timer(0.1, lambda: self.delete_instances("g", ["a"], skip=True)).start()
        self.assertTrue(self.srv.wait_for(lambda: self.srv.target_size("g") == 0, timeout=5))
        self.assertFalse(self.srv.wait_for(lambda: self.srv.target_size("g") == 7, timeout=0.05))

    def test_create_members(self):
        srv = FakeComputeServer(P, Z, "vm", create_members=True).start()
        self.addCleanup(srv.stop)
        srv.add_group("auto", region=R, target_size=4, base_instance_name="w")
        names = [m["name"] for m in srv.members("auto")]
        self.assertEqual(len(names), 4)
        self.assertTrue(all(n.startswith("w-") and len(n) == 6 for n in names))
        self.assertEqual(sorted({m["zone"] for m in srv.members("auto")}), [f"{R}-a", f"{R}-b", f"{R}-c"])


class ServeTest(unittest.TestCase):
    def test_serve(self):
        tmp = tempfile.mkdtemp(prefix="fake-compute-")
        self.addCleanup(shutil.rmtree, tmp)
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_compute.py"), "serve",
                                 "--port-file", port_file, "--project", "p", "--zone", Z, "--instance", "vm",
                                 "--token", "tok"],
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(proc.kill)
        line = proc.stdout.readline()
        with open(port_file) as f:
            port = int(f.read())
        self.assertEqual(line.strip(), f"fake-compute listening on http://127.0.0.1:{port}/compute/v1")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", f"/compute/v1/projects/p/zones/{Z}/instances/vm", headers={"Authorization": "Bearer tok"})
        self.assertEqual(json.loads(conn.getresponse().read())["status"], "RUNNING")
        conn.close()
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=10), 0)
        proc.stdout.close()


@unittest.skipUnless(shutil.which("node") and os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@google-cloud",
                                                                          "compute")),
                     "@google-cloud/compute is not installed: run scripts/install-deps.sh (npm ci in tests/fakes/node)")
class GoogleComputeClientInteropTest(unittest.TestCase):
    """Google's Node client against the fake: the proof that the fake is Compute Engine's dialect, not ours."""

    def test_templates_groups_operations_and_errors(self):
        srv = FakeComputeServer(P, Z, "trainer-7", token_ok=lambda t: t == TOKEN, create_members=True,
                                operation_polls=1).start()
        self.addCleanup(srv.stop)
        srv.deny("compute.instances.stop")
        r = subprocess.run(["node", NODE_CLIENT, f"http://127.0.0.1:{srv.port}", TOKEN, P, Z, R],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertNotIn("error", out, json.dumps(out, indent=1))

        # The operations: RUNNING from the insert, RUNNING from the first wait, then DONE.
        for key in ("templateInsert", "zonalInsert", "regionalInsert", "resize", "zonalDelete", "regionalDelete",
                    "zonalDeleteGroup", "regionalDeleteGroup", "templateDelete"):
            self.assertEqual((out[key]["seen"], out[key]["error"]), (["RUNNING", "RUNNING", "DONE"], None), key)
        self.assertEqual(out["regionalInsert"]["operationType"], "compute.regionInstanceGroupManagers.insert")
        waits = [c for c, _ in srv.calls() if c.endswith("Operations.wait")]
        self.assertEqual(set(waits), {"globalOperations.wait", "zoneOperations.wait", "regionOperations.wait"})

        tpl = out["template"]
        self.assertEqual((tpl["kind"], tpl["machineType"], tpl["provisioningModel"]),
                         ("compute#instanceTemplate", "g2-standard-8", "SPOT"))
        self.assertEqual(tpl["selfLink"], f"{WWW}/projects/{P}/global/instanceTemplates/trainer-template")
        zonal, regional = out["zonal"], out["regional"]
        self.assertEqual(
            (zonal["kind"], zonal["targetSize"], zonal["baseInstanceName"], zonal["zone"], zonal["region"]),
            ("compute#instanceGroupManager", 2, "trainer", f"{WWW}/projects/{P}/zones/{Z}", None))
        self.assertEqual(zonal["selfLink"], f"{WWW}/projects/{P}/zones/{Z}/instanceGroupManagers/zonal-mig")
        self.assertEqual((zonal["preservedDiskAutoDelete"], zonal["defaultActionOnFailure"]), ("NEVER", "REPAIR"))
        self.assertEqual(zonal["instanceTemplate"], tpl["selfLink"])
        self.assertEqual((regional["targetSize"], regional["zone"], regional["region"]),
                         (3, None, f"{WWW}/projects/{P}/regions/{R}"))
        self.assertEqual(regional["selfLink"], f"{WWW}/projects/{P}/regions/{R}/instanceGroupManagers/regional-mig")
        self.assertEqual(regional["distributionZones"], [f"{R}-a", f"{R}-b", f"{R}-c"])
        self.assertEqual((out["zonalList"], out["regionalList"]), (["zonal-mig"], ["regional-mig"]))

        self.assertEqual(out["zonalAfterResize"], 3)
        self.assertEqual(len(out["zonalManaged"]), 3)
        self.assertEqual({(m["instanceStatus"], m["currentAction"]) for m in out["zonalManaged"]},
                         {("RUNNING", "NONE")})
        first = out["zonalManaged"][0]
        self.assertEqual(first["instance"], f"{WWW}/projects/{P}/zones/{Z}/instances/{first['name']}")
        self.assertEqual(sorted(m["instance"].split("/")[-3] for m in out["regionalManaged"]),
                         [f"{R}-a", f"{R}-b", f"{R}-c"])

        # skipInstancesOnValidationError: one member deleted, the stranger skipped, the size down by one.
        self.assertEqual(out["zonalAfterDelete"], 2)
        bad = out["zonalDeleteNonMember"]
        self.assertEqual((bad["seen"][-1], bad["httpErrorStatusCode"], bad["error"][0]["code"]),
                         ("DONE", 400, "CONDITION_NOT_MET"))
        self.assertEqual(out["regionalAfterDelete"], 2)
        self.assertEqual(len(out["regionalManagedAfter"]), 2)
        self.assertNotIn(out["regionalManaged"][1]["name"], [m["name"] for m in out["regionalManagedAfter"]])

        # Errors as the library reports them. @google-cloud/compute 5.x (google-gax 5.0) keeps the HTTP
        # status as the code and the API's error body as the message; 7.x maps the status to a gRPC
        # code and keeps the API's message. Either way the library read our error body.
        def reported(err, http, grpc, text):
            if err.get("httpStatusCode") == http:
                self.assertEqual((err["code"], err["message"]), (grpc, text))
            else:
                self.assertEqual(err["code"], http)
                body = json.loads(err["message"])
                self.assertEqual((body["error"]["code"], body["error"]["message"]), (http, text))
        reported(out["notFound"], 404, 5,
                 f"The resource 'projects/{P}/zones/{Z}/instanceGroupManagers/no-such-mig' was not found")
        member = out["zonalManaged"][1]["name"]
        reported(out["forbidden"], 403, 7,
                 f"Required 'compute.instances.stop' permission for 'projects/{P}/zones/{Z}/instances/{member}'")
        self.assertIn(out["templateInUse"]["code"], (3, 400))
        self.assertIn("is already being used by", out["templateInUse"]["message"])
        self.assertEqual(out["memberMetadata"]["created-by"],
                         f"projects/123456789/zones/{Z}/instanceGroupManagers/zonal-mig")

        self.assertEqual(out["templatesLeft"], [])
        self.assertIsNone(srv.group("zonal-mig"))
        self.assertIsNone(srv.group("regional-mig"))
        self.assertEqual(srv.deleted_outside_group(), [])
        # Every request carried the library's bearer token; none was refused for it.
        self.assertTrue(all(e["token"] == TOKEN for e in srv.log()))
        self.assertEqual(sorted({e["status"] for e in srv.log()}), [200, 400, 403, 404])


if __name__ == "__main__":
    unittest.main()

"""Runs that finish by themselves (issue #30): a VM in a managed instance group
or an Auto Scaling group leaves it when the run is over, a failed boot within
max-failed-boots is handed back to the group for another try, and a run that
fails at every boot is marked failed in the bucket and ends at once after.

The cloud side is the project's fakes (tests/fakes/fake_compute.py,
fake_autoscaling.py, fake_metadata.py, fake_imds.py); spotvisor finds them
through its documented overrides (GCE_METADATA_HOST, compute-endpoint,
AWS_ENDPOINT_URL_AUTO_SCALING)."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))
from harness import SpotvisorTestCase  # noqa: E402


class BudgetTest(SpotvisorTestCase):
    """max-failed-boots, counted from the run's boot records in the bucket."""

    def boot(self, trainer, **sets):
        base = {"bucket": "file://" + self.path("bucket"), "run-id": "run1", "on-exit": "poweroff",
                "shutdown-command": f"echo off >> {self.path('off')}", "on-exit-timeout": "6s"}
        base.update(sets)
        p = self.run_trainer(trainer, sets=base)
        return p, p.wait_exit()

    def failed_marker(self):
        path = self.path("bucket/run1/FAILED")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def test_a_run_that_fails_at_every_boot_is_marked_failed_and_later_boots_end_at_once(self):
        for n in (1, 2):
            p, code = self.boot(["--run-for", "10", "--exit-code", "3"])
            self.assertEqual(code, 3)
            w = p.wait_event("run.failed_boot")
            self.assertEqual((w["failed_in_a_row"], w["max_failed_boots"]), (n, 3))
            self.assertIsNone(self.failed_marker())
        p, code = self.boot(["--run-for", "10", "--exit-code", "3"])
        self.assertEqual(code, 3)
        marked = p.wait_event("run.marked_failed")
        self.assertEqual(marked["failed_in_a_row"], 3)
        marker = self.failed_marker()
        self.assertIsNotNone(marker, "RUN_ID/FAILED written beside DONE")
        self.assertEqual(len(marker["failed_boots"]), 3)
        self.assertEqual(marker["reason"], "failed")
        # Every later boot: no trainer, run-failed, exit 76, on-exit (failure).
        p, code = self.boot(["--run-for", "10", "--marker-file", self.path("marker")])
        self.assertEqual(code, 76)
        self.assertEqual(p.wait_event("run.end")["reason"], "run-failed")
        self.assertIn("FAILED", p.wait_event("run.marked_failed")["message"])
        self.assertEqual(self.marker_lines(), [], "the trainer never ran")
        self.assertEqual(self.read("off").count("off"), 4, "each boot powered off (no group here)")
        self.assertEqual(self.failed_marker(), marker, "the marker is written once")
        # Deleting FAILED gives the run a whole new budget, not one more try.
        os.remove(self.path("bucket/run1/FAILED"))
        for n in (1, 2):
            p, code = self.boot(["--run-for", "10", "--exit-code", "3"])
            if n == 1:
                p.wait_event("run.budget_reset")
            self.assertEqual(p.wait_event("run.failed_boot")["failed_in_a_row"], n)
        self.assertIsNone(self.failed_marker())

    def test_a_good_ending_resets_the_count_and_a_preemption_does_not(self):
        self.boot(["--run-for", "10", "--exit-code", "3"])
        # Ends as max-runtime: a good ending, the count starts again.
        self.boot(["--run-for", "60000"], **{"max-runtime": "1s"})
        self.boot(["--run-for", "10", "--exit-code", "3"])
        # A preempted boot neither counts nor resets.
        p = self.run_trainer(["--run-for", "60000", "--marker-file", self.path("marker")],
                             sets={"bucket": "file://" + self.path("bucket"), "run-id": "run1"})
        p.wait_trainer_ready()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_exit()
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
        self.metadata.set("instance/preempted", "FALSE")
        p, _ = self.boot(["--run-for", "10", "--exit-code", "3"])
        self.assertEqual(p.wait_event("run.failed_boot")["failed_in_a_row"], 2)
        self.assertIsNone(self.failed_marker())
        p, _ = self.boot(["--run-for", "10", "--exit-code", "3"])
        p.wait_event("run.marked_failed")
        self.assertEqual(len(self.failed_marker()["failed_boots"]), 3)

    def test_a_stop_marker_of_any_shape_stops_the_run_and_is_read_safely(self):
        # RUN_ID/STOP is outside data: a `by` that is not a string, or no JSON at all, is a stop all the same.
        os.makedirs(self.path("bucket/run1"), exist_ok=True)
        with open(self.path("bucket/run1/STOP"), "w") as f:
            f.write('{"by": 5}')
        p, code = self.boot(["--run-for", "10", "--marker-file", self.path("marker")])
        self.assertEqual(code, 0)
        self.assertEqual(p.wait_event("run.end")["reason"], "stop-requested")
        self.assertEqual(self.marker_lines(), [])
        with open(self.path("bucket/run1/STOP"), "wb") as f:
            f.write(b"\xff not json")
        p = self.run_trainer(["--run-for", "60000"], sets={
            "bucket": "file://" + self.path("bucket"), "run-id": "run1", "stop-check-interval": "1s"})
        self.assertEqual(p.wait_exit(), 0)
        self.assertEqual(p.wait_event("run.end")["reason"], "stop-requested")
        os.remove(self.path("bucket/run1/STOP"))
        p = self.run_trainer(["--run-for", "60000", "--marker-file", self.path("marker")], sets={
            "bucket": "file://" + self.path("bucket"), "run-id": "run1", "stop-check-interval": "1s"})
        p.wait_trainer_ready()
        with open(self.path("bucket/run1/STOP"), "w") as f:
            f.write('{"by": ["a", 1]}')
        self.assertEqual(p.wait_exit(), 130)
        self.assertEqual(p.wait_event("run.stop_requested")["by"], "")
        self.assertEqual(p.wait_event("run.end")["reason"], "stop-requested")

    def test_max_failed_boots_0_never_marks_the_run(self):
        for _ in range(2):
            p, _ = self.boot(["--run-for", "10", "--exit-code", "3"], **{"max-failed-boots": "1"} if _ else {"max-failed-boots": "0"})
        # The second boot, with a limit of 1, uses it up at once.
        p.wait_event("run.marked_failed")
        os.remove(self.path("bucket/run1/FAILED"))
        p, code = self.boot(["--run-for", "10", "--exit-code", "3"], **{"max-failed-boots": "0"})
        self.assertEqual(code, 3)
        self.assertEqual(p.wait_event("run.failed_boot")["max_failed_boots"], 0)
        self.assertIsNone(self.failed_marker())


ZONE = "us-central1-a"
MIG = f"projects/123456789/zones/{ZONE}/instanceGroupManagers/trainers"


class ManagedInstanceGroupTest(SpotvisorTestCase):
    """A VM of a MIG (created-by set, as a MIG sets it) against the fake Compute API."""

    def setUp(self):
        super().setUp()
        from fake_compute import FakeComputeServer
        self.metadata.set("project/project-id", "my-project")
        self.metadata.set("instance/zone", f"projects/123456789/zones/{ZONE}")
        self.metadata.set("instance/name", "trainers-x1")
        self.metadata.set("instance/attributes/created-by", MIG)
        self.compute = FakeComputeServer("my-project", ZONE, "trainers-x1",
                                         token_ok=lambda t: t.startswith("fake-token-")).start()
        self.addCleanup(self.compute.stop)
        self.compute.add_group("trainers", zone=ZONE, members=["trainers-x1", "trainers-x2"])

    def boot(self, trainer, **sets):
        base = {"compute-endpoint": self.compute.endpoint, "shutdown-command": f"echo off >> {self.path('off')}",
                "on-exit": "poweroff", "on-exit-timeout": "6s",
                "bucket": "file://" + self.path("bucket"), "run-id": "run1"}
        base.update(sets)
        p = self.run_trainer(trainer, sets=base)
        return p, p.wait_exit()

    def off_count(self):
        return self.read("off").count("off") if os.path.exists(self.path("off")) else 0

    def members(self):
        return sorted(m["name"] for m in self.compute.members("trainers"))

    def test_a_completed_run_leaves_its_group_and_a_later_boot_of_a_done_run_leaves_too(self):
        p, code = self.boot(["--run-for", "10"])
        self.assertEqual(code, 0)
        g = p.wait_event("cloud.group")
        self.assertEqual((g["group"], g["group_kind"], g["source"]), (MIG, "zonal-mig", "created-by"))
        p.wait_event("shutdown.api_done")
        calls = [c for c, _ in self.compute.calls()]
        self.assertIn("instanceGroupManagers.deleteInstances", calls)
        self.assertNotIn("instances.delete", calls, "never a self-delete the group would undo")
        self.assertEqual(self.members(), ["trainers-x2"])
        self.assertEqual(self.compute.target_size("trainers"), 1, "the group's size went down: nothing comes back")
        self.assertEqual(self.off_count(), 0)
        with open(self.path("state/status.json")) as f:
            self.assertEqual(json.load(f)["group"], MIG)
        boots = [json.load(open(os.path.join(self.path("bucket/run1/boots"), n)))
                 for n in sorted(os.listdir(self.path("bucket/run1/boots")))]
        self.assertEqual(boots[0]["group"], MIG)
        # The group, had it recreated the VM (the bug of issue #30: DONE, then a
        # self-delete at every boot, recreated forever), would now see it leave.
        self.compute.add_member("trainers", "trainers-x1")
        self.compute.set_target_size("trainers", 2)
        p, code = self.boot(["--run-for", "10", "--marker-file", self.path("marker")])
        self.assertEqual(code, 0)
        self.assertEqual(p.wait_event("run.end")["reason"], "already-done")
        p.wait_event("shutdown.api_done")
        self.assertEqual(self.members(), ["trainers-x2"])
        self.assertEqual(self.compute.target_size("trainers"), 1)
        self.assertEqual(self.compute.deleted_outside_group(), [])
        self.assertEqual(self.marker_lines(), [], "not trained again")

    def test_group_delete_when_empty_the_last_vm_leaves_nothing_but_the_bucket(self):
        # Another member still there: a plain leave.
        p, code = self.boot(["--run-for", "10"], **{"group-delete-when-empty": "true"})
        self.assertEqual(code, 0)
        p.wait_event("shutdown.api_done")
        self.assertEqual(p.find("group.deleted"), [])
        self.assertEqual(self.compute.target_size("trainers"), 1)
        self.assertIsNotNone(self.compute.template("trainers-template"))
        # The last one: out of the group, the group and its template deleted, then itself.
        self.compute.add_member("trainers", "trainers-x1")
        self.compute.remove_member("trainers-x2")
        self.compute.set_target_size("trainers", 1)
        p, code = self.boot(["--run-for", "10"], **{"group-delete-when-empty": "true", "run-id": "run2"})
        self.assertEqual(code, 0)
        deleted = p.wait_event("group.deleted")["deleted"]
        p.wait_event("shutdown.api_done")
        self.assertEqual(deleted[0], MIG)
        self.assertTrue(deleted[1].endswith("/global/instanceTemplates/trainers-template"), deleted)
        self.assertTrue(deleted[2].endswith("/instances/trainers-x1"), deleted)
        self.assertIsNone(self.compute.group("trainers"))
        self.assertIsNone(self.compute.template("trainers-template"))
        calls = [c for c, _ in self.compute.calls()]
        order = [c for c in calls if c in ("instanceGroupManagers.abandonInstances", "instanceGroupManagers.delete",
                                           "instanceTemplates.delete", "instances.delete")]
        self.assertEqual(order, ["instanceGroupManagers.abandonInstances", "instanceGroupManagers.delete",
                                 "instanceTemplates.delete", "instances.delete"])
        self.assertEqual(self.off_count(), 0)

    def test_a_preemption_is_left_to_the_group(self):
        p = self.run_trainer(["--run-for", "60000", "--marker-file", self.path("marker")], sets={
            "compute-endpoint": self.compute.endpoint, "shutdown-command": f"echo off >> {self.path('off')}",
            "on-exit": "poweroff", "bucket": "file://" + self.path("bucket"), "run-id": "run1"})
        p.wait_trainer_ready()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_exit()
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
        self.assertEqual(self.compute.calls(), [], "no call: the group brings the VM back")
        self.assertEqual(self.compute.target_size("trainers"), 2)
        self.assertEqual(self.off_count(), 0)

    def test_spotvisor_stop_from_a_laptop_ends_the_run_gracefully_and_the_group_goes_down(self):
        import subprocess
        from harness import SPOTVISOR
        p = self.run_trainer(["--checkpoint-every", "50", "--marker-file", self.path("marker")], sets={
            "compute-endpoint": self.compute.endpoint, "shutdown-command": f"echo off >> {self.path('off')}",
            "on-exit": "poweroff", "bucket": "file://" + self.path("bucket"), "run-id": "run1",
            "stop-check-interval": "1s", "sync-interval": "0", "sync-settle": "0s"})
        p.wait_trainer_ready()
        missing = subprocess.run([SPOTVISOR, "stop", "file://" + self.path("bucket/no-such-run")],
                                 capture_output=True, text=True)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("holds no run", missing.stderr)
        out = subprocess.run([SPOTVISOR, "stop", "--wait", "60s", "file://" + self.path("bucket/run1")],
                             capture_output=True, text=True, timeout=90)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("stop requested", out.stdout)
        self.assertIn("run1 ended: stop-requested", out.stdout)
        self.assertEqual(p.wait_exit(), 130)
        self.assertIn("spotvisor stop by", p.wait_event("run.stop_requested")["by"])
        p.wait_event("sync.complete", kind="final")
        self.assertTrue(any(l.startswith("sigint ") for l in self.marker_lines()), "stopped gracefully")
        self.assertEqual(p.wait_event("run.end")["reason"], "stop-requested")
        self.assertEqual(p.wait_event("shutdown.start")["action"], "leave")
        self.assertEqual(self.compute.target_size("trainers"), 1)
        # A boot after that (the group had recreated it meanwhile) does not train, and leaves.
        self.compute.add_member("trainers", "trainers-x1")
        self.compute.set_target_size("trainers", 2)
        os.remove(self.path("marker"))
        p, code = self.boot(["--run-for", "10", "--marker-file", self.path("marker")])
        self.assertEqual(code, 0)
        self.assertEqual(p.wait_event("run.end")["reason"], "stop-requested")
        self.assertEqual(self.marker_lines(), [])
        self.assertEqual(self.compute.target_size("trainers"), 1)
        again = subprocess.run([SPOTVISOR, "stop", "file://" + self.path("bucket/run1")], capture_output=True, text=True)
        self.assertEqual(again.returncode, 0)
        self.assertIn("requested already", again.stdout)

    def test_a_host_maintenance_is_left_to_the_group_too(self):
        p = self.run_trainer(["--run-for", "60000"], sets={
            "compute-endpoint": self.compute.endpoint, "shutdown-command": f"echo off >> {self.path('off')}",
            "on-exit": "poweroff", "bucket": "file://" + self.path("bucket"), "run-id": "run1"})
        p.wait_trainer_ready()
        self.metadata.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        p.wait_exit()
        self.assertEqual(p.wait_event("run.end")["reason"], "maintenance")
        self.assertIn("left to", p.wait_event("shutdown.skipped")["message"])
        self.assertEqual(self.compute.calls(), [], "leaving would end the run for good")
        self.assertEqual(self.compute.target_size("trainers"), 2)
        self.assertEqual(self.off_count(), 0)

    def test_a_failed_boot_is_handed_back_for_another_try_until_the_budget_is_used_up(self):
        for n in (1, 2):
            p, code = self.boot(["--run-for", "10", "--exit-code", "3"])
            self.assertEqual(code, 3)
            start = p.wait_event("shutdown.start")
            self.assertEqual(start["action"], "retry")
            self.assertIn(f"failed boot {n} of 3", start["message"])
            p.wait_event("shutdown.api_done")
            self.assertEqual([d["instance"] for d in self.compute.deleted_outside_group()], ["trainers-x1"] * n)
            self.assertEqual(self.compute.target_size("trainers"), 2, "the group recreates it")
            self.compute.add_member("trainers", "trainers-x1")  # as the group does
        p, code = self.boot(["--run-for", "10", "--exit-code", "3"])
        p.wait_event("run.marked_failed")
        self.assertEqual(p.wait_event("shutdown.start")["action"], "leave")
        p.wait_event("shutdown.api_done")
        self.assertEqual(self.compute.target_size("trainers"), 1)
        self.assertEqual(self.members(), ["trainers-x2"])
        # Recreated once more anyway (a repair racing the leave): it leaves at once.
        self.compute.add_member("trainers", "trainers-x1")
        self.compute.set_target_size("trainers", 2)
        p, code = self.boot(["--run-for", "10", "--marker-file", self.path("marker")])
        self.assertEqual(code, 76)
        self.assertEqual(p.wait_event("shutdown.start")["action"], "leave")
        self.assertEqual(self.compute.target_size("trainers"), 1)
        self.assertEqual(self.marker_lines(), [])
        self.assertEqual(self.off_count(), 0)
        # From the laptop: the run is failed, its boots and its group are in the history.
        import subprocess
        from harness import SPOTVISOR
        runs = [SPOTVISOR, "runs", "--compute-endpoint", self.compute.endpoint, "file://" + self.path("bucket")]
        laptop = dict(os.environ, HOME="/nonexistent", GOOGLE_APPLICATION_CREDENTIALS="", GCE_METADATA_HOST="127.0.0.1:9")
        out = subprocess.run(runs[:2] + ["--access-token-command", "echo fake-token-laptop"] + runs[2:],
                             capture_output=True, text=True, env=laptop)
        self.assertEqual(out.returncode, 0, out.stderr)
        # GROUP_NOW: the group asked how it is now: one member (x2), target size 1.
        self.assertRegex(out.stdout.splitlines()[1],
                         r"^run1\s+run-failed\s.*\s4\s+0\s+0\.\d\d\s+-\s+trainers \(us-central1-a\)\s+1 of 1$")
        self.assertIn("GROUP_NOW", out.stdout.splitlines()[0])
        out = subprocess.run(runs[:2] + ["--json", "--access-token-command", "echo fake-token-laptop"] + runs[2:],
                             capture_output=True, text=True, env=laptop)
        self.assertEqual(json.loads(out.stdout)[0]["boot_summary"]["group_state"], {"target_size": 1, "instances": 1})
        # Refused credentials: a "?" and the reason, once; the listing itself is whole.
        out = subprocess.run(runs[:2] + ["--access-token-command", "echo wrong-token"] + runs[2:],
                             capture_output=True, text=True, env=laptop)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout.splitlines()[1], r"trainers \(us-central1-a\)\s+\?$")
        self.assertEqual(out.stderr.count("GROUP_NOW ?"), 1, out.stderr)
        self.assertIn("compute.instanceGroupManagers.get", out.stderr)
        # --no-group-state asks nothing; a deleted group is "gone".
        calls = len(self.compute.calls())
        out = subprocess.run(runs[:2] + ["--no-group-state"] + runs[2:], capture_output=True, text=True, env=laptop)
        self.assertRegex(out.stdout.splitlines()[1], r"trainers \(us-central1-a\)\s+-$")
        self.assertEqual(len(self.compute.calls()), calls)
        import urllib.request  # deleted through the API, as `gcloud ... delete` does
        urllib.request.urlopen(urllib.request.Request(
            f"{self.compute.endpoint}/projects/my-project/zones/{ZONE}/instanceGroupManagers/trainers", method="DELETE",
            headers={"Authorization": "Bearer fake-token-laptop"}), timeout=10).read()
        self.assertTrue(self.compute.wait_for(lambda: self.compute.group("trainers") is None, 10))
        out = subprocess.run(runs[:2] + ["--access-token-command", "echo fake-token-laptop"] + runs[2:],
                             capture_output=True, text=True, env=laptop)
        self.assertRegex(out.stdout.splitlines()[1], r"trainers \(us-central1-a\)\s+gone$")

    def test_a_refused_leave_names_the_permission_and_powers_off(self):
        self.compute.deny("compute.instanceGroupManagers.update")
        p, code = self.boot(["--run-for", "10"])
        self.assertEqual(code, 0)
        failed = p.wait_event("shutdown.api_failed")
        self.assertIn("compute.instanceGroupManagers.update", failed["message"])
        self.assertIn(MIG, failed["message"])
        self.assertEqual(self.off_count(), 1, "powered off instead, once")
        self.assertEqual(self.compute.deleted_outside_group(), [], "never a self-delete the group would undo")

    def test_a_broken_configuration_leaves_the_group_so_it_does_not_come_back_broken(self):
        p, code = self.boot(["--run-for", "10"], **{"sync-interval": "soon"})
        self.assertEqual(code, 78)
        p.wait_event("config.error")
        self.assertEqual(p.wait_event("shutdown.start")["action"], "leave")
        p.wait_event("shutdown.api_done")
        self.assertEqual(self.compute.target_size("trainers"), 1)
        self.assertEqual(self.off_count(), 0)

    def test_a_group_that_no_longer_exists_is_said_and_the_vm_powers_off(self):
        self.metadata.set("instance/attributes/created-by", MIG.replace("/trainers", "/deleted-since"))
        p, code = self.boot(["--run-for", "10"])
        failed = p.wait_event("shutdown.api_failed")
        self.assertTrue(failed["group_gone"], failed)
        self.assertIn("zonal managed instance group deleted-since (us-central1-a) does not hold this VM any more",
                      failed["message"])
        self.assertIn("nothing brings this VM back", failed["message"])
        self.assertEqual(self.off_count(), 1, "powered off instead, once")
        self.assertEqual(self.compute.target_size("trainers"), 2, "the other group is left alone")

    def test_a_created_by_that_is_not_a_group_is_a_clear_configuration_error(self):
        self.metadata.set("instance/attributes/created-by", "projects/1/zones/us-central1-a/instances/x")
        p, code = self.boot(["--run-for", "10"])
        self.assertEqual(code, 78)
        e = p.wait_event("config.error")
        self.assertIn("created-by", e["message"])
        self.assertIn("instanceGroupManagers/NAME", e["message"])
        self.assertIn("spotvisor-group", e["message"])
        self.assertEqual(self.compute.calls(), [])
        self.assertEqual(self.off_count(), 1, "powered off: a group it cannot name cannot be left")

    def test_in_a_regional_group_a_missing_dataset_disk_says_why_it_may_not_be_in_this_zone(self):
        # Issue #30 point 7: a regional MIG creates its VM in any zone; a zonal disk is in one.
        self.compute.add_group("regional", region="us-central1")
        regional = "projects/123456789/regions/us-central1/instanceGroupManagers/regional"
        self.metadata.set("instance/attributes/created-by", regional)
        p, code = self.boot(["--run-for", "10"], **{"dataset-disk": "no-such-dataset", "dataset-dir": self.path("ds"),
                                                    "mount-timeout": "1s"})
        self.assertEqual(code, 72)
        failed = p.wait_event("mount.failed")
        self.assertIn("did not appear", failed["message"])
        self.assertIn("regional managed instance group regional (us-central1)", failed["message"])
        self.assertIn("this one: us-central1-a", failed["message"])
        self.assertIn("bucket-mount", failed["message"])

    def test_group_none_and_an_explicit_regional_group(self):
        p, code = self.boot(["--run-for", "10"], group="none", **{"on-exit": "delete"})
        self.assertEqual(code, 0)
        self.assertEqual(p.find("cloud.group"), [])
        self.assertEqual([c for c, _ in self.compute.calls()], ["instances.delete"])
        self.compute.add_instance("trainers-x1") if hasattr(self.compute, "add_instance") else None
        self.compute.add_group("regional", region="us-central1", members=[("trainers-x1")])
        regional = "projects/my-project/regions/us-central1/instanceGroupManagers/regional"
        p, code = self.boot(["--run-for", "10"], group=regional, **{"run-id": "run2"})
        self.assertEqual(code, 0)
        self.assertEqual(p.wait_event("cloud.group")["group_kind"], "regional-mig")
        p.wait_event("shutdown.api_done")
        self.assertIn("regionInstanceGroupManagers.deleteInstances", [c for c, _ in self.compute.calls()])
        self.assertEqual(self.compute.target_size("regional", location="us-central1"), 0)


class AutoScalingGroupTest(SpotvisorTestCase):
    """An EC2 instance of an Auto Scaling group (the tag aws:autoscaling:groupName, as the group sets it)
    against the fake IMDS, the fake EC2 API and the fake Auto Scaling API (SigV4 checked)."""

    INSTANCE = "i-0abc123def4567890"

    def setUp(self):
        super().setUp()
        import datetime
        from fake_autoscaling import FakeAutoScalingServer
        from fake_ec2 import FakeEc2Server
        from fake_imds import FakeImdsServer
        creds = ("ASIAEC2ROLE", "ec2-role-secret", "ec2-role-token")
        self.imds = FakeImdsServer(instance_id=self.INSTANCE, zone="eu-west-1b", region="eu-west-1",
                                   tags={"aws:autoscaling:groupName": "trainers", "Name": "trainer-1"}, role=None).start()
        self.addCleanup(self.imds.stop)
        self.imds.set_role("trainer", *creds, datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=6))
        self.asg = FakeAutoScalingServer(region="eu-west-1").start()
        self.addCleanup(self.asg.stop)
        self.asg.add_credentials(creds[0], creds[1], session_token=creds[2])
        self.asg.create_group("trainers", min_size=0, max_size=2, desired=2, availability_zones=["eu-west-1b"])
        self.asg.add_instance("trainers", self.INSTANCE, "eu-west-1b")
        self.asg.add_instance("trainers", "i-0other", "eu-west-1b")
        self.ec2 = FakeEc2Server(region="eu-west-1", instances=[self.INSTANCE]).start()
        self.addCleanup(self.ec2.stop)
        self.ec2.add_credentials(creds[0], creds[1], session_token=creds[2])
        self.env_ec2 = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": self.imds.endpoint, "AWS_REGION": "eu-west-1",
                        "AWS_ENDPOINT_URL_AUTO_SCALING": self.asg.endpoint, "AWS_ENDPOINT_URL_EC2": self.ec2.endpoint,
                        "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}

    def boot(self, trainer, **sets):
        base = {"shutdown-command": f"echo off >> {self.path('off')}", "on-exit": "poweroff", "on-exit-timeout": "6s",
                "bucket": "file://" + self.path("bucket"), "run-id": "run1"}
        base.update(sets)
        p = self.run_trainer(trainer, sets=base, metadata=False, env=self.env_ec2)
        return p, p.wait_exit()

    def test_the_end_of_the_run_leaves_the_group_with_its_desired_capacity_lowered(self):
        p, code = self.boot(["--run-for", "10"])
        self.assertEqual(code, 0, "".join(p.raw[-20:]))
        g = p.wait_event("cloud.group")
        self.assertEqual((g["group"], g["group_kind"], g["source"]), ("trainers", "asg", "aws:autoscaling:groupName"))
        p.wait_event("shutdown.api_done")
        leave = [c for c in self.asg.calls() if c[0] == "TerminateInstanceInAutoScalingGroup"]
        self.assertEqual(len(leave), 1)
        self.assertEqual(leave[0][1]["InstanceId"], self.INSTANCE)
        self.assertEqual(leave[0][1]["ShouldDecrementDesiredCapacity"], "true")
        self.assertEqual(self.asg.desired("trainers"), 1)
        self.assertEqual([i["id"] for i in self.asg.instances("trainers")], ["i-0other"])
        self.assertEqual([c for c in self.ec2.calls() if c[0] != "CreateTags"], [], "no TerminateInstances: it would be replaced")
        self.assertFalse(os.path.exists(self.path("off")))
        # From a laptop with its own keys: the group now, one instance of a desired capacity of 1.
        import subprocess
        from harness import SPOTVISOR
        self.asg.add_credentials("AKIALAPTOP", "laptop-secret")
        laptop = dict(os.environ, AWS_ACCESS_KEY_ID="AKIALAPTOP", AWS_SECRET_ACCESS_KEY="laptop-secret",
                      AWS_ENDPOINT_URL_AUTO_SCALING=self.asg.endpoint, AWS_EC2_METADATA_DISABLED="true")
        laptop.pop("AWS_SESSION_TOKEN", None)
        out = subprocess.run([SPOTVISOR, "runs", "--json", "file://" + self.path("bucket")], capture_output=True,
                             text=True, env=laptop, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        summary = json.loads(out.stdout)[0]["boot_summary"]
        self.assertEqual((summary["group"], summary["group_state"]), ("trainers", {"target_size": 1, "instances": 1}))
        self.asg.deny("DescribeAutoScalingGroups")
        out = subprocess.run([SPOTVISOR, "runs", "file://" + self.path("bucket")], capture_output=True, text=True,
                             env=laptop, timeout=60)
        self.assertRegex(out.stdout.splitlines()[1], r"trainers\s+\?$")
        self.assertIn("autoscaling:DescribeAutoScalingGroups", out.stderr)

    def test_a_failed_boot_is_terminated_for_a_replacement_and_a_refused_leave_powers_off(self):
        p, code = self.boot(["--run-for", "10", "--exit-code", "3"])
        self.assertEqual(p.wait_event("shutdown.start")["action"], "retry")
        p.wait_event("shutdown.api_done")
        self.assertIn(("TerminateInstances", [self.INSTANCE]), self.ec2.calls())
        self.assertEqual(self.asg.calls(), [])
        self.asg.deny("TerminateInstanceInAutoScalingGroup")
        p, code = self.boot(["--run-for", "10"], **{"run-id": "run2"})
        failed = p.wait_event("shutdown.api_failed")
        self.assertIn("autoscaling:TerminateInstanceInAutoScalingGroup", failed["message"])
        self.assertEqual(self.read("off").count("off"), 1)

    def test_a_terminating_hook_holds_the_instance_until_the_final_sync_is_over(self):
        # Scale-in or capacity rebalancing: the group terminates the instance, an
        # autoscaling:EC2_INSTANCE_TERMINATING hook holds it in Terminating:Wait, IMDS says
        # target-lifecycle-state Terminated; spotvisor stops the trainer, syncs, completes the action.
        import boto3
        client = boto3.client("autoscaling", endpoint_url=self.asg.endpoint, region_name="eu-west-1",
                              aws_access_key_id="ASIAEC2ROLE", aws_secret_access_key="ec2-role-secret",
                              aws_session_token="ec2-role-token")
        client.put_lifecycle_hook(LifecycleHookName="drain", AutoScalingGroupName="trainers",
                                  LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING", HeartbeatTimeout=600)
        client.put_lifecycle_hook(LifecycleHookName="on-launch", AutoScalingGroupName="trainers",
                                  LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING", HeartbeatTimeout=600)
        self.asg.link_imds(self.INSTANCE, self.imds)
        p = self.run_trainer(["--checkpoint-every", "50", "--marker-file", self.path("marker")], sets={
            "shutdown-command": f"echo off >> {self.path('off')}", "on-exit": "poweroff",
            "bucket": "file://" + self.path("bucket"), "run-id": "run1", "sync-interval": "0", "sync-settle": "0s"},
            metadata=False, env=self.env_ec2)
        p.wait_trainer_ready()
        self.asg.begin_termination(self.INSTANCE, cause="scale-in")
        self.assertEqual(p.wait_exit(), 130)
        self.assertIn("is terminating this instance", p.wait_event("preemption.detected")["message"])
        final = p.wait_event("sync.complete", kind="final")
        done = p.wait_event("group.lifecycle_completed")
        self.assertEqual(done["hooks"], ["drain"])
        self.assertEqual(self.asg.lifecycle_completed(self.INSTANCE), "CONTINUE")
        order = [e["event"] for e in p.events if e["event"] in ("sync.complete", "group.lifecycle_completed")]
        self.assertEqual(order[-2:], ["sync.complete", "group.lifecycle_completed"], "completed after the final sync")
        self.assertTrue(final)
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
        self.assertFalse(p.find("shutdown.start"), "the group terminates it: no on-exit on top")
        self.assertFalse(os.path.exists(self.path("off")))
        # The run's end leaves the group, and the hook that catches the leaving instance is released too.
        self.asg.add_instance("trainers", self.INSTANCE, "eu-west-1b")  # as a replacement would be
        self.imds.set_target_lifecycle_state("InService")
        p, code = self.boot(["--run-for", "10"], **{"run-id": "run2"})
        self.assertEqual(code, 0)
        p.wait_event("shutdown.api_done")
        completed = [a for a in self.asg.lifecycle_actions(self.INSTANCE)
                     if a["completed_by"] == "CompleteLifecycleAction" and a["result"] == "CONTINUE"]
        self.assertEqual(len(completed), 2, "the leaving instance's hook was released too")

    def solo_group(self, name, launched_by_spotvisor):
        """This instance alone in a group of one from a launch template named after it, made
        through the API as `spotvisor launch` makes it (with its spotvisor-launch tag) or not."""
        import boto3
        if self.INSTANCE in [i["id"] for i in self.asg.instances("trainers")]:
            self.asg.begin_termination(self.INSTANCE)  # out of "trainers" first (gone at once: no hook)
        self.ec2.add_launch_template(name, {"ImageId": "ami-0123456789abcdef0"})
        self.asg.link_ec2(self.ec2)
        self.asg.add_credentials("AKIATEST", "test-secret")
        tags = [{"Key": "spotvisor-launch", "Value": "token-1", "PropagateAtLaunch": False,
                 "ResourceId": name, "ResourceType": "auto-scaling-group"}] if launched_by_spotvisor else []
        boto3.client("autoscaling", region_name="eu-west-1", endpoint_url=self.asg.endpoint,
                     aws_access_key_id="AKIATEST", aws_secret_access_key="test-secret").create_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=0, MaxSize=1, DesiredCapacity=1, AvailabilityZones=["eu-west-1b"],
            LaunchTemplate={"LaunchTemplateName": name, "Version": "$Latest"}, Tags=tags)
        self.asg.add_instance(name, self.INSTANCE, "eu-west-1b")
        self.imds.set_tags({"aws:autoscaling:groupName": name, "Name": "trainer-1"})
        self.asg.reset_log()

    def test_group_delete_when_empty_the_last_instance_leaves_nothing_but_the_bucket(self):
        self.solo_group("solo", launched_by_spotvisor=True)
        p, code = self.boot(["--run-for", "10"], **{"group-delete-when-empty": "true"})
        self.assertEqual(code, 0, "".join(p.raw[-20:]))
        gone = p.wait_event("group.deleted")["deleted"]
        self.assertEqual(gone, ["Auto Scaling group solo (eu-west-1)", "launch template solo", f"instance {self.INSTANCE}"])
        p.wait_event("shutdown.api_done")
        self.assertEqual([a for a, _ in self.asg.calls()],
                         ["DescribeAutoScalingGroups", "DetachInstances", "DeleteAutoScalingGroup"])
        self.assertIsNone(self.asg.group("solo"))
        self.assertEqual(self.asg.detached(), {self.INSTANCE: "solo"})
        self.assertIsNone(self.ec2.launch_template("solo"))
        self.assertIn(("TerminateInstances", [self.INSTANCE]), self.ec2.calls())
        self.assertFalse(os.path.exists(self.path("off")))

    def test_group_delete_when_empty_copes_with_a_lost_answer_and_a_peer_still_terminating(self):
        self.solo_group("solo", launched_by_spotvisor=True)
        # A gang's peer that left first, still listed as terminating (as AWS keeps it a while).
        self.asg.termination_seconds = None
        self.asg.add_instance("solo", "i-0peer", "eu-west-1b")
        self.asg.begin_termination("i-0peer")  # its leave already lowered the capacity to this one
        self.asg.lose_answer("DetachInstances")
        self.asg.reset_log()
        import threading  # the peer is gone a while after this instance detached (ResourceInUse until then)
        threading.Thread(target=lambda: self.asg.wait_for(lambda: self.INSTANCE in self.asg.detached(), 30) and
                         self.asg.finish_termination("i-0peer"), daemon=True).start()
        p, code = self.boot(["--run-for", "10"], **{"group-delete-when-empty": "true", "on-exit-timeout": "40s"})
        self.assertEqual(code, 0, "".join(p.raw[-20:]))
        gone = p.wait_event("group.deleted")["deleted"]
        self.assertEqual(gone[0], "Auto Scaling group solo (eu-west-1)")
        actions = [a for a, _ in self.asg.calls()]
        self.assertEqual(actions[:4], ["DescribeAutoScalingGroups", "DetachInstances", "DetachInstances",
                                       "DescribeAutoScalingGroups"], actions)
        self.assertIn("DeleteAutoScalingGroup", actions)
        self.assertNotIn("TerminateInstanceInAutoScalingGroup", actions)
        self.assertEqual(p.find("group.cleanup_skipped"), [])

    def test_group_delete_when_empty_that_cannot_read_the_group_says_so_and_leaves(self):
        self.solo_group("solo", launched_by_spotvisor=True)
        self.asg.deny("DescribeAutoScalingGroups")
        p, code = self.boot(["--run-for", "10"], **{"group-delete-when-empty": "true"})
        skipped = p.wait_event("group.cleanup_skipped")
        self.assertIn("autoscaling:DescribeAutoScalingGroups", skipped["error"])
        p.wait_event("shutdown.api_done")
        self.assertEqual(self.asg.desired("solo"), 0, "left the plain way")
        self.assertIsNotNone(self.asg.group("solo"))

    def test_group_delete_when_empty_leaves_a_group_with_others_and_keeps_a_template_it_did_not_make(self):
        # "trainers" holds another instance too: a plain leave.
        p, code = self.boot(["--run-for", "10"], **{"group-delete-when-empty": "true"})
        p.wait_event("shutdown.api_done")
        self.assertIn("TerminateInstanceInAutoScalingGroup", [a for a, _ in self.asg.calls()])
        self.assertNotIn("DetachInstances", [a for a, _ in self.asg.calls()])
        self.assertEqual(self.asg.desired("trainers"), 1)
        self.assertEqual(p.find("group.deleted"), [])
        # Alone in a group made by hand: the group goes, its template stays.
        self.solo_group("byhand", launched_by_spotvisor=False)
        p, code = self.boot(["--run-for", "10"], **{"group-delete-when-empty": "true", "run-id": "run2"})
        gone = p.wait_event("group.deleted")["deleted"]
        self.assertEqual(gone, ["Auto Scaling group byhand (eu-west-1)", f"instance {self.INSTANCE}"])
        self.assertIsNotNone(self.ec2.launch_template("byhand"), "a template spotvisor did not make stays")
        self.assertIsNone(self.asg.group("byhand"))

    def test_a_group_that_no_longer_has_this_instance_is_said_and_it_powers_off(self):
        self.asg.begin_termination(self.INSTANCE)  # taken out of "trainers" behind spotvisor's back
        p, code = self.boot(["--run-for", "10"])
        failed = p.wait_event("shutdown.api_failed")
        self.assertTrue(failed["group_gone"], failed)
        self.assertIn("Auto Scaling group trainers (eu-west-1) does not hold this VM any more", failed["message"])
        self.assertEqual(self.read("off").count("off"), 1)

    def test_hidden_tags_are_said_and_an_explicit_group_key_names_the_group(self):
        self.imds.set_tags_enabled(False)
        p, code = self.boot(["--run-for", "10"], **{"on-exit": "none"})
        self.assertIn("spotvisor-group", p.wait_event("cloud.group_unknown")["message"])
        p, code = self.boot(["--run-for", "10"], group="trainers", **{"run-id": "run2"})
        self.assertEqual(p.wait_event("cloud.group")["source"], "the group key")
        p.wait_event("shutdown.api_done")
        self.assertEqual(self.asg.desired("trainers"), 1)


if __name__ == "__main__":
    unittest.main()

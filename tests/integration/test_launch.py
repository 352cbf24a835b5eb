"""`spotvisor launch` (issue #30) against the fake Compute API (tests/fakes/fake_compute.py, checked
against Google's own Node client): the instance template and the managed instance group an
unattended run needs, the dry run, and the errors, with nothing left behind when the group cannot
be made."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))
from harness import SPOTVISOR  # noqa: E402
from fake_compute import FakeComputeServer  # noqa: E402

ZONE = "us-central1-a"


class LaunchTest(unittest.TestCase):
    def setUp(self):
        self.compute = FakeComputeServer("my-project", ZONE, "unused-vm", token_ok=lambda t: t == "launch-token").start()
        self.addCleanup(self.compute.stop)

    def launch(self, *extra, run_id="mnist-1", where=("--zone", ZONE), command=("python3", "train.py", "--epochs", "10")):
        args = [SPOTVISOR, "launch", "--project", "my-project", *where, "--run-id", run_id,
                "--bucket", "gs://my-bucket/runs", "--image-family", "spotvisor", "--accelerator", "type=nvidia-tesla-t4,count=1",
                "--compute-endpoint", self.compute.endpoint, "--access-token-command", "echo launch-token", *extra]
        if command:
            args += ["--", *command]
        env = dict(os.environ, HOME="/nonexistent", GOOGLE_APPLICATION_CREDENTIALS="")
        return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)

    def test_a_run_gets_a_spot_template_and_a_group_of_one_and_is_told_how_to_watch_and_stop_it(self):
        out = self.launch("--set", "sync-interval=5m", "--set", "max-failed-boots=2")
        self.assertEqual(out.returncode, 0, out.stderr)
        tpl = self.compute.template("mnist-1")
        self.assertIsNotNone(tpl)
        props = tpl["properties"]
        self.assertEqual(props["scheduling"]["provisioningModel"], "SPOT")
        self.assertEqual(props["scheduling"]["instanceTerminationAction"], "DELETE")
        self.assertEqual(props["guestAccelerators"], [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}])
        self.assertEqual(props["disks"][0]["initializeParams"]["sourceImage"], "projects/my-project/global/images/family/spotvisor")
        self.assertEqual(props["serviceAccounts"][0]["scopes"], ["https://www.googleapis.com/auth/cloud-platform"])
        meta = {i["key"]: i["value"] for i in props["metadata"]["items"]}
        self.assertEqual(meta["spotvisor-run-id"], "mnist-1")
        self.assertEqual(meta["spotvisor-bucket"], "gs://my-bucket/runs")
        self.assertEqual(json.loads(meta["spotvisor-command"]), ["python3", "train.py", "--epochs", "10"])
        self.assertEqual((meta["spotvisor-sync-interval"], meta["spotvisor-max-failed-boots"]), ("5m", "2"))
        self.assertEqual(meta["enable-guest-attributes"], "TRUE")
        group = self.compute.group("mnist-1")
        self.assertEqual(group["targetSize"], 1)
        self.assertTrue(group["instanceTemplate"].endswith("/global/instanceTemplates/mnist-1"), group["instanceTemplate"])
        self.assertIn("launched run mnist-1", out.stdout)
        self.assertIn("spotvisor runs gs://my-bucket/runs", out.stdout)
        self.assertIn("spotvisor stop gs://my-bucket/runs/mnist-1", out.stdout)
        self.assertNotIn("launch-token", out.stdout + out.stderr, "the token is never printed")
        # Launched again: the names are taken, said as such.
        again = self.launch()
        self.assertEqual(again.returncode, 1)
        self.assertIn("already exists", again.stderr)

    def test_a_regional_group_of_three_for_a_gang(self):
        out = self.launch("--size", "3", where=("--region", "us-central1"), run_id="gang-1")
        self.assertEqual(out.returncode, 0, out.stderr)
        group = self.compute.group("gang-1", location="us-central1")
        self.assertEqual(group["targetSize"], 3)
        self.assertIn("regionInstanceGroupManagers.insert", [c for c, _ in self.compute.calls()])

    def test_a_dataset_disk_is_attached_read_only_and_refused_for_a_regional_group(self):
        out = self.launch("--dataset-disk", "imagenet")
        self.assertEqual(out.returncode, 0, out.stderr)
        props = self.compute.template("mnist-1")["properties"]
        disk = [d for d in props["disks"] if not d.get("boot")]
        self.assertEqual(disk, [{"boot": False, "autoDelete": False, "type": "PERSISTENT", "mode": "READ_ONLY",
                                 "deviceName": "imagenet", "source": "imagenet"}])
        meta = {i["key"]: i["value"] for i in props["metadata"]["items"]}
        self.assertEqual(meta["spotvisor-dataset-disk"], "imagenet")
        # Issue #30 point 7: a zonal disk cannot follow a regional group's VMs into other zones.
        refused = self.launch("--dataset-disk", "imagenet", where=("--region", "us-central1"), run_id="mnist-2")
        self.assertEqual(refused.returncode, 64)
        self.assertIn("a zonal disk exists in one zone only", refused.stderr)
        self.assertIn("bucket-mount", refused.stderr)
        self.assertIsNone(self.compute.template("mnist-2"))

    def test_the_dry_run_prints_the_requests_and_creates_nothing(self):
        out = self.launch("--dry-run")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"POST {self.compute.endpoint}/projects/my-project/global/instanceTemplates", out.stdout)
        self.assertIn(f"POST {self.compute.endpoint}/projects/my-project/zones/{ZONE}/instanceGroupManagers", out.stdout)
        self.assertIn('"provisioningModel": "SPOT"', out.stdout)
        self.assertIn("dry run: nothing was created", out.stdout)
        self.assertEqual(self.compute.calls(), [])

    def test_a_group_that_cannot_be_made_leaves_nothing_behind(self):
        self.compute.deny("compute.instanceGroupManagers.create")
        out = self.launch()
        self.assertEqual(out.returncode, 1)
        self.assertIn("compute.instanceGroupManagers.create", out.stderr)
        self.assertIn("deleted instance template mnist-1 again", out.stderr)
        self.assertIsNone(self.compute.template("mnist-1"))
        self.assertIsNone(self.compute.group("mnist-1"))

    def test_bad_input_is_a_clear_usage_error_and_nothing_is_called(self):
        cases = [
            (self.launch(run_id="Bad_Name"), "--run-id"),
            (self.launch(where=()), "--zone"),
            (self.launch("--set", "no-such-key=1"), "not a spotvisor key"),
            (self.launch(command=()), "no command"),
            (self.launch("--scopes", "everything"), "--scopes"),
            (self.launch("--accelerator", "nvidia"), "--accelerator"),
        ]
        for out, text in cases:
            self.assertEqual(out.returncode, 64, out.stderr)
            self.assertIn(text, out.stderr)
        self.assertEqual(self.compute.calls(), [])


if __name__ == "__main__":
    unittest.main()

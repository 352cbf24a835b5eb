"""`spotvisor launch` (issue #30) against the fake Compute API (tests/fakes/fake_compute.py, checked
against Google's own Node client): the instance template and the managed instance group an
unattended run needs, the dry run, and the errors, with nothing left behind when the group cannot
be made. On EC2 the same against the fake EC2 and Auto Scaling APIs (checked against boto3 and the
AWS CLI), linked so that the group's launch template must exist: a launch template and an Auto
Scaling group of Spot instances."""
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

    def test_a_dataset_snapshot_gives_each_vm_of_a_regional_group_a_disk_in_its_zone(self):
        out = self.launch("--dataset-snapshot", "imagenet-v2", where=("--region", "us-central1"), run_id="gang-2")
        self.assertEqual(out.returncode, 0, out.stderr)
        props = self.compute.template("gang-2")["properties"]
        disk = [d for d in props["disks"] if not d.get("boot")]
        self.assertEqual(disk, [{"boot": False, "autoDelete": True, "type": "PERSISTENT", "mode": "READ_WRITE",
                                 "deviceName": "dataset",
                                 "initializeParams": {"sourceSnapshot": "projects/my-project/global/snapshots/imagenet-v2"}}])
        meta = {i["key"]: i["value"] for i in props["metadata"]["items"]}
        self.assertEqual(meta["spotvisor-dataset-disk"], "dataset")
        image = self.launch("--dataset-image", "projects/data-proj/global/images/coco", run_id="mnist-3")
        self.assertEqual(image.returncode, 0, image.stderr)
        disk = [d for d in self.compute.template("mnist-3")["properties"]["disks"] if not d.get("boot")]
        self.assertEqual(disk[0]["initializeParams"], {"sourceImage": "projects/data-proj/global/images/coco"})
        # One source only, and a path that is not one is said before any call.
        calls = len(self.compute.calls())
        for extra, text in [(("--dataset-snapshot", "a", "--dataset-image", "b"), "give one of"),
                            (("--dataset-snapshot", "gs://x/y"), "--dataset-snapshot"),
                            (("--dataset-snapshot", "a", "--set", "dataset-disk=x"), "given twice")]:
            bad = self.launch(*extra, run_id="mnist-4")
            self.assertEqual(bad.returncode, 64, bad.stderr)
            self.assertIn(text, bad.stderr)
        self.assertEqual(len(self.compute.calls()), calls)

    def test_a_regional_disk_is_attached_by_its_url_and_the_group_kept_to_its_two_zones(self):
        out = self.launch("--dataset-disk", "regions/us-central1/disks/imagenet", "--zones", "us-central1-a,us-central1-f",
                          "--size", "2", where=("--region", "us-central1"), run_id="gang-3")
        self.assertEqual(out.returncode, 0, out.stderr)
        props = self.compute.template("gang-3")["properties"]
        disk = [d for d in props["disks"] if not d.get("boot")]
        # An instance template names a zonal disk by name and a regional one by URL (compute.proto, AttachedDisk.source).
        self.assertEqual(disk, [{"boot": False, "autoDelete": False, "type": "PERSISTENT", "mode": "READ_ONLY",
                                 "deviceName": "imagenet", "source": "projects/my-project/regions/us-central1/disks/imagenet"}])
        self.assertEqual({i["key"]: i["value"] for i in props["metadata"]["items"]}["spotvisor-dataset-disk"], "imagenet")
        zones = [z["zone"].rsplit("/", 1)[-1] for z in self.compute.group("gang-3", location="us-central1")["distributionPolicy"]["zones"]]
        self.assertEqual(zones, ["us-central1-a", "us-central1-f"])
        calls = len(self.compute.calls())
        for extra, where, text in [
                (("--dataset-disk", "regions/us-central1/disks/imagenet"), ("--region", "us-central1"), "--zones"),
                (("--dataset-disk", "regions/europe-west4/disks/imagenet", "--zones", "us-central1-a"),
                 ("--region", "us-central1"), "the regional disk is in europe-west4"),
                (("--zones", "europe-west4-a"), ("--region", "us-central1"), "not a zone of us-central1"),
                (("--zones", "us-central1-a"), ("--zone", ZONE), "--zones is for a regional group"),
                (("--dataset-disk", "zones/x/disks/y"), ("--zone", ZONE), "is not a disk name")]:
            bad = self.launch(*extra, where=where, run_id="mnist-5")
            self.assertEqual(bad.returncode, 64, bad.stderr)
            self.assertIn(text, bad.stderr)
        self.assertEqual(len(self.compute.calls()), calls)

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
            (self.launch("--subnets", "subnet-0123abcd"), "--subnets is for EC2"),
        ]
        for out, text in cases:
            self.assertEqual(out.returncode, 64, out.stderr)
            self.assertIn(text, out.stderr)
        self.assertEqual(self.compute.calls(), [])


def config_section(text):
    """The [spotvisor] section of user data as {key: value}, values unquoted as spotvisor reads them."""
    out, inside = {}, False
    for line in text.splitlines():
        if line.startswith("["):
            inside = line == "[spotvisor]"
        elif inside and " = " in line:
            key, value = line.split(" = ", 1)
            if value.startswith('"'):
                value = json.loads(value)  # the escapes QuoteConfigValue writes (\", \\, \n, \t) are JSON's
            out[key] = value
    return out


class Ec2LaunchTest(unittest.TestCase):
    REGION = "eu-west-1"
    SUBNETS = "subnet-0aaa1111,subnet-0bbb2222"

    def setUp(self):
        from fake_autoscaling import FakeAutoScalingServer
        from fake_ec2 import FakeEc2Server
        creds = {"AKIALAPTOP": "laptop-secret"}
        self.ec2 = FakeEc2Server(region=self.REGION, credentials=creds).start()
        self.addCleanup(self.ec2.stop)
        self.asg = FakeAutoScalingServer(region=self.REGION, credentials=creds,
                                         subnets={"subnet-0aaa1111": "eu-west-1a", "subnet-0bbb2222": "eu-west-1b"}).start()
        self.addCleanup(self.asg.stop)
        self.asg.link_ec2(self.ec2)  # the group's launch template must exist, and must not request Spot

    def launch(self, *extra, run_id="resnet-2", command=("python3", "train.py", "--name", 'a "b"'), env=None):
        args = [SPOTVISOR, "launch", "--region", self.REGION, "--run-id", run_id, "--bucket", "s3://my-bucket/runs",
                "--image", "ami-0123456789abcdef0", "--instance-types", "g4dn.xlarge,g5.xlarge",
                "--subnets", self.SUBNETS, *extra]
        if command:
            args += ["--", *command]
        e = dict(os.environ, HOME="/nonexistent", AWS_ACCESS_KEY_ID="AKIALAPTOP", AWS_SECRET_ACCESS_KEY="laptop-secret",
                 AWS_ENDPOINT_URL_EC2=self.ec2.endpoint, AWS_ENDPOINT_URL_AUTO_SCALING=self.asg.endpoint,
                 AWS_EC2_METADATA_DISABLED="true")
        e.pop("AWS_SESSION_TOKEN", None)
        e.update(env or {})
        return subprocess.run(args, capture_output=True, text=True, timeout=120, env=e)

    def test_a_run_gets_a_launch_template_and_a_spot_group_across_subnets_and_is_told_how_to_watch_it(self):
        out = self.launch("--instance-profile", "spotvisor-trainer", "--security-groups", "sg-0123abcd",
                          "--set", "sync-interval=5m")
        self.assertEqual(out.returncode, 0, out.stderr)
        lt = self.ec2.launch_template("resnet-2")
        data = lt["data"]
        self.assertEqual(data["ImageId"], "ami-0123456789abcdef0")
        self.assertEqual(data["IamInstanceProfile"], {"Name": "spotvisor-trainer"})
        self.assertEqual(data["SecurityGroupIds"], ["sg-0123abcd"])
        self.assertEqual(data["InstanceInitiatedShutdownBehavior"], "terminate")
        self.assertEqual(data["MetadataOptions"]["InstanceMetadataTags"], "enabled")
        self.assertEqual(data["MetadataOptions"]["HttpTokens"], "required")
        self.assertNotIn("InstanceMarketOptions", data, "Spot comes from the group's policy")
        self.assertEqual({t["Key"]: t["Value"] for t in data["TagSpecifications"][0]["Tags"]},
                         {"Name": "resnet-2", "spotvisor-run-id": "resnet-2"})
        self.assertEqual(lt["tags"], {"spotvisor-run-id": "resnet-2"})
        keys = config_section(lt["user_data_text"])
        self.assertEqual((keys["run-id"], keys["bucket"], keys["group"], keys["sync-interval"]),
                         ("resnet-2", "s3://my-bucket/runs", "resnet-2", "5m"))
        self.assertEqual(json.loads(keys["command"]), ["python3", "train.py", "--name", 'a "b"'])
        g = self.asg.group("resnet-2")
        self.assertEqual((g["min"], g["max"], g["desired"]), (0, 1, 1))
        self.assertEqual(g["subnets"], self.SUBNETS.split(","))
        self.assertFalse(g["capacity_rebalance"])
        mip = g["mixed_instances_policy"]
        self.assertEqual(mip["LaunchTemplate"]["LaunchTemplateSpecification"]["LaunchTemplateName"], "resnet-2")
        self.assertEqual([o["InstanceType"] for o in mip["LaunchTemplate"]["Overrides"]], ["g4dn.xlarge", "g5.xlarge"])
        dist = mip["InstancesDistribution"]
        self.assertEqual((int(dist["OnDemandBaseCapacity"]), int(dist["OnDemandPercentageAboveBaseCapacity"]),
                          dist["SpotAllocationStrategy"]), (0, 0, "capacity-optimized"))
        self.assertEqual(g["tags"]["spotvisor-run-id"], "resnet-2")
        self.assertEqual([t["Key"] for t in g["tag_list"] if t["PropagateAtLaunch"]], [],
                         "the instances' tags come from the template, all of them spotvisor keys or Name")
        hooks = g["hooks"]
        self.assertEqual(len(hooks), 1)
        self.assertEqual((hooks[0]["LifecycleTransition"], int(hooks[0]["HeartbeatTimeout"]), hooks[0]["DefaultResult"]),
                         ("autoscaling:EC2_INSTANCE_TERMINATING", 300, "CONTINUE"))
        # What an instance of the group reads from that user data: spotvisor's own resolution.
        from fake_imds import FakeImdsServer
        imds = FakeImdsServer(instance_id="i-0abc123def4567890", zone="eu-west-1a", region=self.REGION,
                              tags=dict({"aws:autoscaling:groupName": "resnet-2"}, **{
                                  t["Key"]: t["Value"] for t in data["TagSpecifications"][0]["Tags"]})).start()
        self.addCleanup(imds.stop)
        imds.set_user_data(lt["user_data_text"])
        vm = dict(os.environ, AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, AWS_REGION=self.REGION,
                  AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="")
        vm.pop("GCE_METADATA_HOST", None)
        cfg = subprocess.run([SPOTVISOR, "config", "--json"], capture_output=True, text=True, env=vm, timeout=60)
        self.assertEqual(cfg.returncode, 0, cfg.stderr)
        resolved = json.loads(cfg.stdout)
        seen = {k: (v["value"], v["origin"]) for k, v in resolved["keys"].items()
                if k in ("run-id", "bucket", "group", "sync-interval")}
        self.assertEqual(resolved["warnings"], [], "every tag and key is one spotvisor takes")
        self.assertEqual(seen, {"run-id": ("resnet-2", "instance tag spotvisor-run-id"),
                                "bucket": ("s3://my-bucket/runs", "user data spotvisor-bucket"),
                                "group": ("resnet-2", "user data spotvisor-group"),
                                "sync-interval": ("5m", "user data spotvisor-sync-interval")})
        self.assertEqual(json.loads(resolved["keys"]["command"]["value"]), ["python3", "train.py", "--name", 'a "b"'])
        self.assertIn("launched run resnet-2", out.stdout)
        self.assertIn("spotvisor stop s3://my-bucket/runs/resnet-2", out.stdout)
        self.assertIn("aws ec2 delete-launch-template --region eu-west-1 --launch-template-name resnet-2", out.stdout)
        self.assertNotIn("laptop-secret", out.stdout + out.stderr)
        # Launched again: the template's name is taken, said as such, and the group is left alone.
        again = self.launch()
        self.assertEqual(again.returncode, 1)
        self.assertIn("InvalidLaunchTemplateName.AlreadyExistsException", again.stderr)
        self.assertIn("the name is taken", again.stderr)
        self.assertEqual(self.asg.group("resnet-2")["desired"], 1)

    def test_a_group_created_by_a_try_whose_answer_was_lost_is_this_launchs(self):
        self.asg.lose_answer("CreateAutoScalingGroup")  # made, and the answer never arrives
        out = self.launch()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([a for a, _ in self.asg.calls()],
                         ["CreateAutoScalingGroup", "CreateAutoScalingGroup", "DescribeAutoScalingGroups"])
        self.assertIsNotNone(self.ec2.launch_template("resnet-2"), "the group's template stays")
        self.assertEqual(self.asg.group("resnet-2")["desired"], 1)
        self.assertIn("launched run resnet-2", out.stdout)

    def test_a_gang_of_three_price_capacity_optimized_without_a_hook(self):
        out = self.launch("--size", "3", "--allocation-strategy", "price-capacity-optimized",
                          "--terminating-hook-timeout", "0", run_id="gang-1")
        self.assertEqual(out.returncode, 0, out.stderr)
        g = self.asg.group("gang-1")
        self.assertEqual((g["min"], g["max"], g["desired"]), (0, 3, 3))
        self.assertEqual(g["mixed_instances_policy"]["InstancesDistribution"]["SpotAllocationStrategy"],
                         "price-capacity-optimized")
        self.assertEqual(g["hooks"], [])

    def test_a_group_that_cannot_be_made_leaves_nothing_behind(self):
        self.asg.deny("CreateAutoScalingGroup")
        out = self.launch()
        self.assertEqual(out.returncode, 1)
        self.assertIn("autoscaling:CreateAutoScalingGroup", out.stderr)
        self.assertIn("deleted launch template resnet-2 again", out.stderr)
        self.assertIsNone(self.ec2.launch_template("resnet-2"))
        # A group of that name that another launch made: refused, and the template made for it goes.
        self.asg.allow("CreateAutoScalingGroup")
        self.ec2.add_launch_template("older", {"ImageId": "ami-0123456789abcdef0"})
        self.asg.create_group("resnet-2", min_size=0, max_size=1, desired=1, availability_zones=["eu-west-1a"],
                              launch_template_name="older")
        out = self.launch()
        self.assertEqual(out.returncode, 1)
        self.assertIn("the name is taken", out.stderr)
        self.assertIn("aws autoscaling delete-auto-scaling-group", out.stderr)
        self.assertIsNone(self.ec2.launch_template("resnet-2"))
        self.assertEqual(self.ec2.launch_templates(), ["older"])

    def test_the_dry_run_prints_the_requests_with_the_user_data_and_needs_no_credentials(self):
        out = self.launch("--dry-run", env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"POST {self.ec2.endpoint}/ (EC2 CreateLaunchTemplate)", out.stdout)
        self.assertIn(f"POST {self.asg.endpoint}/ (Auto Scaling CreateAutoScalingGroup)", out.stdout)
        self.assertIn("  MinSize=0", out.stdout)
        self.assertIn("    run-id = resnet-2", out.stdout)
        self.assertIn("dry run: nothing was created", out.stdout)
        self.assertEqual((self.ec2.requests(), self.asg.calls()), ([], []))

    def test_bad_input_is_a_clear_usage_error_and_nothing_is_called(self):
        cases = [
            (self.launch("--zone", "eu-west-1a"), "--zone is for GCE"),
            (self.launch("--region", "europe-west1"), "not an AWS region"),
            (self.launch("--project", "p"), "--project is for GCE"),
            (self.launch("--image", "my-image"), "AMI id"),
            (self.launch("--instance-types", "g5"), "not an instance type"),
            (self.launch("--subnets", "vpc-0123abcd"), "not a subnet id"),
            (self.launch("--terminating-hook-timeout", "5s"), "--terminating-hook-timeout"),
            (self.launch("--allocation-strategy", "cheapest"), "--allocation-strategy"),
            (self.launch(run_id="r"), "--run-id"),
            (self.launch(command=()), "no command"),
            (self.launch("--set", "bucket=s3://x"), "give it as --bucket"),
        ]
        for out, text in cases:
            self.assertEqual(out.returncode, 64, out.stderr)
            self.assertIn(text, out.stderr)
        self.assertEqual((self.ec2.requests(), self.asg.calls()), ([], []))


if __name__ == "__main__":
    unittest.main()

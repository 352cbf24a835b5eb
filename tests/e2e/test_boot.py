"""End-to-end: the spotvisor package in a real Debian 12 guest under QEMU.

Run through tests/e2e/run.sh (it picks the package and exports SPOTVISOR_E2E_*),
or directly:

    SPOTVISOR_E2E_DEB=path/to/spotvisor.deb /usr/bin/python3 tests/e2e/test_boot.py -v
    SPOTVISOR_E2E_BINARY=build/daemon/spotvisor SPOTVISOR_E2E_UNIT=systemd/spotvisor.service \
        /usr/bin/python3 tests/e2e/test_boot.py -v

Each scenario boots the same baked image (copy-on-write) with its own fakes and
metadata, and asserts on what the fakes recorded and on the serial console.
Scenarios 1-4 are a GCE Spot VM (fake metadata server, GCS, Cloud Logging);
scenario 5 is an EC2 Spot instance (fake IMDSv2 at the same default address,
S3 and the EC2 API through the AWS endpoint overrides the image's drop-in for
spotvisor.service sets: guest.AWS_ENDPOINTS).
"""
import datetime
import hashlib
import re
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from guest import (AWS_ENDPOINTS, BUCKET, DATASET_DISK, EC2_INSTANCE_ID, EC2_REGION, ROLE,  # noqa: E402
                   ROLE_SECRET, ROLE_TOKEN, ROOT, Ec2Fakes, Fakes, Vm, log, make_dataset_disk,
                   wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("SPOTVISOR_CACHE_DIR", "/var/cache/spotvisor")
TRAINER = "/usr/local/bin/fake_trainer"
PREFIX = "runs"
# Bounds for conditions that normally take seconds; only a broken run hits them
# (the emulated guest shares 2 cores with whatever else runs here).
BOOT_TIMEOUT = 120
EXIT_TIMEOUT = 120
PREEMPTION_BUDGET = 30       # GCE's hard power-off comes ~30 s after the button

ENV = {}       # set by setUpModule: base, image, dataset, workdir
TIMINGS = []   # (scenario, phase, seconds), printed at the end


def setUpModule():
    if shutil.which("qemu-system-x86_64") is None:
        raise unittest.SkipTest("qemu-system-x86_64 is not installed")
    missing = [t for t in ("socat", "mke2fs", "debootstrap", "g++") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"missing host tools: {missing} (see tests/e2e/README.md)")
    deb = os.environ.get("SPOTVISOR_E2E_DEB")
    binary = os.environ.get("SPOTVISOR_E2E_BINARY")
    unit = os.environ.get("SPOTVISOR_E2E_UNIT")
    if not deb and not (binary and unit):
        raise RuntimeError("set SPOTVISOR_E2E_DEB, or SPOTVISOR_E2E_BINARY and SPOTVISOR_E2E_UNIT "
                           "(tests/e2e/run.sh does)")
    workdir = os.environ.get("SPOTVISOR_E2E_WORKDIR") or tempfile.mkdtemp(prefix="spotvisor-e2e-")
    os.makedirs(workdir, exist_ok=True)
    log(f"work dir (serial logs): {workdir}")

    t = time.monotonic()
    base = subprocess.run(["bash", os.path.join(HERE, "build-image.sh")], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    TIMINGS.append(("setup", "base image (cached unless its inputs changed)", time.monotonic() - t))

    t = time.monotonic()
    trainer = static_trainer()
    image = os.path.join(workdir, "root.img")
    cmd = ["bash", os.path.join(HERE, "install-spotvisor.sh"), "--base", base, "--out", image,
           "--file", f"{trainer}:{TRAINER}:755"]
    cmd += ["--deb", deb] if deb else ["--binary", binary, "--unit", unit]
    for key, value in AWS_ENDPOINTS.items():   # the EC2 scenario's fixed endpoints, unused on GCE
        cmd += ["--unit-env", f"{key}={value}"]
    subprocess.run(cmd, check=True)
    dataset = os.path.join(workdir, "dataset.img")
    make_dataset_disk(dataset)
    TIMINGS.append(("setup", "bake spotvisor into the image", time.monotonic() - t))
    ENV.update(base=base, image=image, dataset=dataset, workdir=workdir)


def tearDownModule():
    if ENV.get("image") and not os.environ.get("SPOTVISOR_E2E_KEEP_IMAGE"):
        for name in ("image", "dataset"):
            try:
                os.unlink(ENV[name])
            except FileNotFoundError:
                pass
    print("\ne2e timings (wall clock, this machine):", file=sys.stderr)
    for scenario, phase, seconds in TIMINGS:
        print(f"  {scenario:<19} {phase:<50} {seconds:6.1f} s", file=sys.stderr)
    if ENV.get("workdir"):
        print(f"serial logs: {ENV['workdir']}/*.serial.log", file=sys.stderr)


def static_trainer():
    """fake_trainer, linked statically so it runs on any guest; cached by source hash."""
    src = os.path.join(ROOT, "tests", "fakes", "fake_trainer.cc")
    with open(src, "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:16]
    out = os.path.join(CACHE, f"e2e-fake_trainer-{key}")
    if not os.path.exists(out):
        tmp = out + f".tmp{os.getpid()}"
        subprocess.run(["g++", "-std=c++20", "-O1", "-static", "-o", tmp, src], check=True)
        os.replace(tmp, out)
    return out


def exec_form(*argv):
    return json.dumps(list(argv))


class BootTest(unittest.TestCase):
    maxDiff = None

    def boot(self, scenario, attrs=None, fakes=None, mig=None):
        """Fakes (GCE's with these attributes, unless given; `mig`: in that managed
        instance group) + a fresh guest for one scenario; both torn down after the test."""
        self.scenario = scenario
        self.fakes = fakes or Fakes(instance_name=scenario, attrs=attrs, mig=mig)
        self.addCleanup(self.fakes.stop)
        self.vm = Vm(ENV["base"], ENV["image"], ENV["dataset"], self.fakes, ENV["workdir"], scenario)
        self.addCleanup(self.vm.kill)  # runs first: QEMU never outlives the test
        self.vm.start()
        return self.vm

    def run(self, result=None):
        # On failure, show the end of the guest's console next to the assertion.
        before = len(result.failures) + len(result.errors) if result else 0
        out = super().run(result)
        if result and len(result.failures) + len(result.errors) > before and getattr(self, "vm", None):
            sys.stderr.write(f"\n--- {self.vm.serial_path} (last lines) ---\n{self.vm.serial_tail(80)}\n---\n")
        return out

    def tearDown(self):
        # Before the cleanups kill QEMU: what state a guest that failed the test was in.
        outcome = getattr(self, "_outcome", None)
        failed = outcome is not None and not outcome.success
        if failed and getattr(self, "vm", None):
            log(f"{self.scenario}: {self.vm.diagnose()}")

    def timing(self, phase, seconds):
        TIMINGS.append((self.scenario, phase, seconds))
        log(f"{self.scenario}: {phase}: {seconds:.1f} s")

    def event(self, name, timeout=5):
        """An event spotvisor sent to (fake) Cloud Logging."""
        return wait_until(lambda: self.fakes.events(name), timeout, f"{name} in fake Cloud Logging")[0]

    def serial_event(self, name, timeout=5, **match):
        """An event spotvisor logged to the journal (forwarded to the console), with these
        fields: the only place spotvisor's events go on EC2 (no Cloud Logging there)."""
        def found():
            return [e for e in self.vm.serial_events(name) if all(e.get(k) == v for k, v in match.items())]
        return wait_until(found, timeout, f"{name} {match or ''} on the serial console")[0]

    def wait_trainer_started(self):
        self.vm.wait_serial(r"fake_trainer started pid=", BOOT_TIMEOUT, "the trainer to start")
        t = time.monotonic()
        self.timing("boot -> trainer running", t - self.vm.started)
        return t

    def assert_serial(self, pattern, msg):
        """A pattern on the console (the failure names it, not the whole log)."""
        m = re.search(pattern, self.vm.serial(), re.M)
        self.assertTrue(m, f"{msg}: /{pattern}/ not on the serial console")
        return m

    def wait_run_end(self, since, phase, timeout=EXIT_TIMEOUT):
        """Waits for spotvisor's run.end on the console; records `phase` as since -> then."""
        self.vm.wait_serial(r'"event":"run\.end"', timeout, "spotvisor's run.end")
        t = time.monotonic()
        self.timing(phase, t - since)
        return t

    def wait_poweroff(self, since, timeout=EXIT_TIMEOUT):
        rc = self.vm.wait_exit(timeout)
        self.timing("run.end -> QEMU exited (shutdown)", self.vm.exited - since)
        return rc

    def assert_powered_off(self, rc):
        self.assertEqual(rc, 0, "QEMU's exit status")
        self.assert_serial(r"reboot: Power down", "the guest did not reach a clean power-off (panic? reboot?)")

    def assert_stopped_in_order(self, by_systemd=True):
        """systemd stopped the service (or, by_systemd=False, saw it exit by itself) without a
        timeout or having to kill anything. (A non-zero exit status is not disorder: spotvisor
        exits with the run's code.)"""
        text = self.vm.serial()
        if by_systemd:
            self.assert_serial(r"systemd\[1\]: Stopped spotvisor\.service", "systemd never stopped the unit")
        bad = re.findall(r"spotvisor\.service: (?:State '[a-z-]+' timed out.*|Killing process.*|"
                         r"Failed with result '(?:timeout|signal|core-dump|watchdog)'.*)", text)
        self.assertFalse(bad, f"spotvisor.service was not stopped in order: {bad}")

    def manifest(self, run_id):
        name = f"{PREFIX}/{run_id}/manifest.json"
        objects = self.fakes.objects(f"{PREFIX}/{run_id}/")
        self.assertIn(name, objects, f"no manifest in the bucket; objects: {sorted(objects)}")
        return json.loads(self.fakes.object_bytes(name))

    def manifest_file(self, manifest, path):
        """The bytes of one checkpoint file as committed by the manifest."""
        run_dir = f"{PREFIX}/{manifest.get('run_id')}/"
        for f in manifest_files(manifest):
            if f.get("path") == path:
                name = f["object"]
                return self.fakes.object_bytes(name if name.startswith(run_dir) else run_dir + name)
        self.fail(f"{path} is not in the manifest: {manifest}")

    # ------------------------------------------------------------------ (1)
    def test_1_trainer_completes_and_the_vm_powers_off(self):
        link = f"/dev/disk/by-id/scsi-0Google_PersistentDisk_{DATASET_DISK}"
        # spotvisor mounts the dataset disk (found by its device name through
        # the kernel's own by-id link: no Google guest packages in this image,
        # and waiting for udev if it is late); the trainer reads from it and
        # checks it is read-only, then becomes the fake trainer.
        command = (f"ls -l {link}; cat \"$SPOTVISOR_DATASET_DIR/DATASET-MARKER\"; "
                   f"touch \"$SPOTVISOR_DATASET_DIR/x\" 2>/dev/null && echo DATASET-WRITABLE || echo DATASET-READONLY; "
                   f"exec {TRAINER} --run-for 4000 --checkpoint-every 1000 "
                   f"--marker-file \"$SPOTVISOR_CHECKPOINT_DIR/marker\"")
        run_id = "e2e-complete"
        vm = self.boot(run_id, {"spotvisor-command": command,
                                "spotvisor-bucket": f"gs://{BUCKET}/{PREFIX}",
                                "spotvisor-dataset-disk": DATASET_DISK})
        started = self.wait_trainer_started()
        ended = self.wait_run_end(started, "trainer running -> run.end (run)")
        rc = self.wait_poweroff(ended)
        end = self.event("run.end")
        self.assert_powered_off(rc)

        self.assertEqual((end["reason"], end["exit_code"]), ("completed", 0))
        # The unit became active: with Type=notify, spotvisor's READY=1 reached systemd.
        self.assert_serial(r"systemd\[1\]: Started spotvisor\.service", "the unit never became active")
        if os.environ.get("SPOTVISOR_E2E_DEB"):
            # The package's conffile says user = spotvisor; its postinst created the user.
            self.assertEqual(self.event("trainer.start").get("user"), "spotvisor")
        shutdown = self.event("shutdown.start")
        self.assertIn("poweroff", shutdown.get("message", ""), shutdown)
        # The dataset disk looks like a GCE PD to the guest.
        self.assertTrue(any(link in line for line in self.fakes.trainer_lines()),
                        f"{link} not listed by the trainer: {self.fakes.trainer_lines()[:10]}")
        # Mounted read-only on /mnt/dataset before the trainer, unmounted after it.
        lines = self.fakes.trainer_lines()
        self.assertIn("the e2e dataset disk", lines, lines[:10])
        self.assertIn("DATASET-READONLY", lines, lines[:10])
        mounted = self.event("mount.done")
        self.assertEqual((mounted.get("what"), mounted.get("dir")), ("dataset", "/mnt/dataset"), mounted)
        self.assertTrue(self.event("mount.unmounted"))

        # State for `gcloud compute instances get-guest-attributes`, written to the metadata server.
        attrs = self.fakes.guest_attributes()
        log(f"{run_id}: guest attributes phase={attrs.get('phase')} reason={attrs.get('reason')}")
        self.assertEqual(attrs.get("reason"), "completed", attrs)

        objects = self.fakes.objects(f"{PREFIX}/{run_id}/")
        self.assertIn(f"{PREFIX}/{run_id}/DONE", objects, sorted(objects))
        done = json.loads(self.fakes.object_bytes(f"{PREFIX}/{run_id}/DONE"))
        self.assertEqual(done.get("exit_code"), 0, done)
        manifest = self.manifest(run_id)
        paths = {f.get("path") for f in manifest_files(manifest)}
        self.assertTrue({"ckpt-000001", "ckpt-000002", "ckpt-000003"} <= paths, paths)
        self.assertIn("exit code=0", self.manifest_file(manifest, "marker").decode())
        self.assert_stopped_in_order()

    # ------------------------------------------------------------------ (2)
    def test_2_preemption_sigint_final_checkpoint_and_poweroff_within_30s(self):
        run_id = "e2e-preempted"
        vm = self.boot(run_id, {
            # A trainer that takes 3 s to save after SIGINT: long enough that systemd's
            # stop (caused by the power button) always arrives while it saves.
            "spotvisor-command": exec_form(TRAINER, "--checkpoint-every", "1000", "--sigint-exit-delay", "3000",
                                           "--marker-file", "${SPOTVISOR_CHECKPOINT_DIR}/marker"),
            "spotvisor-bucket": f"gs://{BUCKET}/{PREFIX}",
            "spotvisor-dataset-disk": DATASET_DISK})
        self.wait_trainer_started()
        # GCE presses the button on a VM that is up: wait until the trainer has
        # a checkpoint, spotvisor's watcher is parked on instance/preempted and
        # logind watches the power button.
        vm.wait_serial(r"checkpoint step=1\b", 30, "the trainer's first checkpoint")
        self.assertTrue(self.fakes.metadata.wait_for_waiters("instance/preempted", 1, 30),
                        "spotvisor never long-polled instance/preempted")
        vm.wait_serial(r"Watching system buttons on \S+ \(Power Button\)", 30, "logind watching the power button")

        pressed = time.monotonic()
        self.fakes.metadata.set("instance/preempted", "TRUE")
        vm.power_button()
        log(f"{run_id}: preempted=TRUE and ACPI power button pressed")
        ended = self.wait_run_end(pressed, "power button -> run.end (stop + final sync)", PREEMPTION_BUDGET * 3)
        rc = self.wait_poweroff(ended, PREEMPTION_BUDGET * 3)
        shutdown_s = vm.exited - pressed
        self.timing("power button -> QEMU exited (GCE allows ~30 s)", shutdown_s)
        self.assert_powered_off(rc)

        self.assert_serial(r"fake_trainer received SIGINT", "the trainer did not get SIGINT")
        final = self.assert_serial(r"checkpoint step=(\d+) final", "the trainer wrote no final checkpoint")
        manifest = self.manifest(run_id)
        marker = self.manifest_file(manifest, "marker").decode()
        self.assertIn("sigint realtime_ns=", marker, "the trainer's SIGINT is not in the synced marker")
        self.assertIn("exit code=130", marker)
        steps = sorted(f["path"] for f in manifest_files(manifest) if f.get("path", "").startswith("ckpt-"))
        self.assertTrue(steps, manifest)
        log(f"{run_id}: newest checkpoint in the bucket {steps[-1]}; the trainer's final one: step {final.group(1)}")
        self.assertEqual(int(steps[-1][5:]), int(final.group(1)),
                         f"the newest checkpoint in the bucket ({steps[-1]}) is not the trainer's final one")
        self.assertNotIn(f"{PREFIX}/{run_id}/DONE", self.fakes.objects(f"{PREFIX}/{run_id}/"))

        end = self.event("run.end")
        log(f"{run_id}: run.end reason={end.get('reason')} exit_code={end.get('exit_code')}")
        self.assertEqual(end["reason"], "preempted", end)
        sync = [e for e in self.fakes.events("sync.complete") if e.get("kind") == "final"]
        self.assertTrue(sync, "no final sync.complete reached Cloud Logging")
        self.assert_stopped_in_order()
        self.assertLess(shutdown_s, PREEMPTION_BUDGET,
                        f"power button to power-off took {shutdown_s:.1f}s; GCE cuts power after ~30s")
        # The trainer gets stop-timeout (20 s) to save after SIGINT. systemd's
        # SIGTERM to spotvisor, which the power button causes a moment after
        # preempted=TRUE, must not cut that short.
        sigterm = [l for l in marker.splitlines() if l.startswith("sigterm")]
        self.assertFalse(sigterm, "the trainer got SIGTERM while saving after SIGINT "
                                  f"({ns_gap(marker)} after it): marker:\n{marker}")
        # spotvisor's own mounts come off by its hand, after the final sync,
        # not by systemd's shutdown racing it (mnt-dataset.mount is stopped
        # only after spotvisor.service).
        unmounted = self.event("mount.unmounted")
        self.assertEqual((unmounted.get("dir"), unmounted.get("lazy")), ("/mnt/dataset", False), unmounted)
        self.assertNotRegex(self.vm.serial(), r"Unmounting mnt-dataset\.mount",
                            "systemd unmounted the dataset disk itself during the shutdown")

    # ------------------------------------------------------------------ (3)
    def test_3_invalid_config_is_reported_and_the_vm_powers_off(self):
        run_id = "e2e-bad-config"
        vm = self.boot(run_id, {"spotvisor-command": exec_form(TRAINER, "--run-for", "1000"),
                                "spotvisor-stop-timeout": "banana"})
        vm.wait_serial(r"systemd\[1\]: Start(ing|ed) spotvisor\.service", BOOT_TIMEOUT, "spotvisor.service to start")
        self.timing("boot -> spotvisor started", time.monotonic() - vm.started)
        ended = self.wait_run_end(vm.started, "boot -> run.end (config-error)")
        rc = self.wait_poweroff(ended)
        self.timing("boot -> QEMU exited", vm.exited - vm.started)
        self.assert_powered_off(rc)

        serial_errors = [e for e in vm.serial_events("config.error") if "banana" in e.get("message", "")]
        self.assertTrue(serial_errors, "no config.error naming the bad value on the serial console")
        log(f"{run_id}: {serial_errors[0]['message']}")
        self.assertIn("stop-timeout", serial_errors[0]["message"])
        error = self.event("config.error")
        self.assertIn("banana", error.get("message", ""), error)
        end = self.event("run.end")
        self.assertEqual((end["reason"], end["exit_code"]), ("config-error", 78))
        self.assertFalse(re.search(r"fake_trainer started", vm.serial()), "the trainer started despite the error")
        self.assertIn("poweroff", self.event("shutdown.start").get("message", ""))

    # ------------------------------------------------------------------ (4)
    def test_4_a_shutdown_command_that_fails_still_powers_the_vm_off(self):
        # "A VM never keeps billing by accident": the shutdown command fails
        # every time, so spotvisor retries it and then powers off by force
        # (sync(2) + reboot(2)), inside on-exit-timeout.
        run_id = "e2e-forced-poweroff"
        vm = self.boot(run_id, {"spotvisor-command": exec_form(TRAINER, "--run-for", "500"),
                                "spotvisor-shutdown-command": "echo refusing to power off; exit 1",
                                "spotvisor-on-exit-timeout": "8s"})
        started = self.wait_trainer_started()
        ended = self.wait_run_end(started, "trainer running -> run.end (run)")
        rc = self.wait_poweroff(ended, timeout=EXIT_TIMEOUT)
        self.assertLess(vm.exited - ended, 8 + 5, "powered off inside on-exit-timeout (+ the kernel's own power-off)")
        self.assert_powered_off(rc)
        self.assertEqual(len(vm.serial_events("shutdown.poweroff")), 3, "the command was retried three times")
        self.assertTrue(vm.serial_events("shutdown.forced"), "no shutdown.forced on the serial console")

    # ------------------------------------------------------------------ (5)
    def test_5_ec2_spot_notice_sigint_final_sync_to_s3_and_poweroff(self):
        # An EC2 Spot instance: the IMDS fake at the real default address (169.254.169.254,
        # which the image's /etc/hosts also calls metadata.google.internal), no metadata
        # endpoint in the environment, so spotvisor's cloud = auto must tell EC2 from GCE by
        # itself. Configuration from instance tags (both spellings) over the user data's
        # [spotvisor] section; checkpoints in the fake S3 with the instance role's keys.
        run_id = EC2_INSTANCE_ID    # run-id's default on EC2
        ckpt_dir = "/var/lib/spotvisor/ec2-ckpt"
        # The trainer's environment is spotvisor's: it shows which endpoints the unit has.
        command = ('d=$SPOTVISOR_CHECKPOINT_DIR; echo "env ${GCE_METADATA_HOST-unset} '
                   '${AWS_EC2_METADATA_SERVICE_ENDPOINT-unset} $AWS_ENDPOINT_URL_S3 $d end"; '
                   f'exec {TRAINER} --checkpoint-every 1000 --sigint-exit-delay 1000 --marker-file "$d/marker"')
        self.assertLessEqual(len(command), 256, "an EC2 tag value is at most 256 characters")
        tags = {"Name": "e2e-trainer",
                "spotvisor-command": command,
                "spotvisor-bucket": f"s3://{BUCKET}/{PREFIX}",
                "spotvisor:checkpoint-dir": ckpt_dir}
        user_data = ("#!/bin/bash\n# a cloud-init script; spotvisor reads only its own section\n"
                     "[spotvisor]\n"
                     # EBS's NVMe names are not modelled: the QEMU disk by its path.
                     f"dataset-disk = /dev/disk/by-id/scsi-0Google_PersistentDisk_{DATASET_DISK}\n"
                     "checkpoint-dir = /var/lib/spotvisor/the-tag-wins\n")
        fakes = Ec2Fakes(tags, user_data)
        imds = fakes.imds
        vm = self.boot("e2e-ec2-spot", fakes=fakes)
        self.wait_trainer_started()

        # Which cloud: EC2, found at the default address; the GCE probe met the IMDS fake
        # there too and was not taken for GCE's metadata server.
        detected = self.serial_event("cloud.detected")
        log(f"{self.scenario}: cloud.detected: {detected.get('message')}")
        self.assertEqual((detected.get("cloud"), detected.get("instance")), ("aws", EC2_INSTANCE_ID), detected)
        gce_probe = sorted({(e[1], e[2]) for e in imds.log() if e[1].startswith("/computeMetadata/")})
        log(f"{self.scenario}: the GCE probe at the IMDS fake (path, status): {gce_probe}")
        self.assertTrue(gce_probe, "spotvisor's GCE probe never reached 169.254.169.254 (so this proves nothing about "
                                   f"telling the clouds apart); IMDS saw: {sorted({e[1] for e in imds.log()})}")
        # GCE_METADATA_HOST, AWS_EC2_METADATA_SERVICE_ENDPOINT, AWS_ENDPOINT_URL_S3, the checkpoint dir
        # (not the command line itself, in trainer.start: no "$" in what the shell printed)
        env = vm.wait_serial(r"env ([^\s$]+) ([^\s$]+) ([^\s$]+) ([^\s$]+) end\b", 10,
                             "the trainer's environment line")
        self.assertEqual(env.groups(), ("unset", "unset", AWS_ENDPOINTS["AWS_ENDPOINT_URL_S3"], ckpt_dir),
                         "metadata endpoints must be the defaults; S3 from the drop-in; the tag over the user data")
        self.assertEqual(self.serial_event("run.start").get("run_id"), run_id)
        mounted = self.serial_event("mount.done")
        self.assertEqual((mounted.get("what"), mounted.get("dir")), ("dataset", "/mnt/dataset"), mounted)

        # Interrupt a trainer that is up: it has a checkpoint and spotvisor polls the notice.
        vm.wait_serial(r"checkpoint step=1\b", 30, "the trainer's first checkpoint")
        spot = "/latest/meta-data/spot/instance-action"
        polls = imds.hits(spot)
        self.assertTrue(imds.wait_for(lambda: imds.hits(spot) > polls, 30),
                        f"spotvisor is not polling {spot} ({imds.hits(spot)} requests)")
        vm.wait_serial(r"Watching system buttons on \S+ \(Power Button\)", 30, "logind watching the power button")

        notice_time = int(time.time()) + 120    # IMDS gives whole seconds; EC2's two minutes
        imds.set_instance_action("terminate", notice_time)
        noticed = time.monotonic()
        log(f"{self.scenario}: spot/instance-action terminate at {notice_time} (now + 120 s)")
        vm.wait_serial(r"fake_trainer received SIGINT", 30, "the trainer's SIGINT")
        sigint_s = time.monotonic() - noticed
        self.timing("notice -> trainer got SIGINT", sigint_s)
        self.wait_run_end(noticed, "notice -> run.end (stop + final sync)", 90)
        self.assertLess(time.time(), notice_time, "run.end came after the notice's time")
        self.assertLess(sigint_s, 10, "SIGINT at once: the notice is polled every second")

        notice = self.serial_event("preemption.detected")
        self.assertIn("EC2 Spot interruption notice", notice.get("message", ""), notice)
        self.assertGreater(notice.get("ends_in_s", 0), 60, notice)
        end = self.serial_event("run.end")
        log(f"{self.scenario}: run.end reason={end.get('reason')} exit_code={end.get('exit_code')}")
        self.assertEqual(end.get("reason"), "preempted", end)
        self.assertTrue(self.serial_event("sync.complete", kind="final"), "no final sync.complete")
        self.assertFalse(vm.serial_events("shutdown.start"), "on-exit ran after an interruption notice (EC2 does it)")

        # The final sync, in S3, committed before the notice's time.
        manifest = self.manifest(run_id)
        committed = datetime.datetime.fromisoformat(manifest["committed_at"][:26].rstrip("Z") + "+00:00")
        log(f"{self.scenario}: manifest committed {committed.isoformat()}, "
            f"{notice_time - committed.timestamp():.0f} s before the notice's time")
        self.assertLess(committed.timestamp(), notice_time, "the final commit came after the notice's time")
        final = self.assert_serial(r"checkpoint step=(\d+) final", "the trainer wrote no final checkpoint")
        steps = sorted(f["path"] for f in manifest_files(manifest) if f.get("path", "").startswith("ckpt-"))
        self.assertTrue(steps, manifest)
        self.assertEqual(int(steps[-1][5:]), int(final.group(1)),
                         f"the newest checkpoint in the bucket ({steps[-1]}) is not the trainer's final one")
        marker = self.manifest_file(manifest, "marker").decode()
        self.assertIn("sigint realtime_ns=", marker)
        self.assertIn("exit code=130", marker)
        self.assertNotIn(f"{PREFIX}/{run_id}/DONE", self.fakes.objects(f"{PREFIX}/{run_id}/"))
        wrong_region = requests_of(fakes.s3, "AuthorizationHeaderMalformed")
        if wrong_region:
            log(f"{self.scenario}: {len(wrong_region)} S3 request(s) signed for another region than the bucket's "
                f"({EC2_REGION}), then followed")

        # After the final sync spotvisor is done and exits by itself (no on-exit: EC2 takes the
        # instance at the notice's time); the phase tag says how the run ended.
        exited = vm.wait_serial(r"spotvisor\.service: Main process exited, code=exited, status=(\d+)", 30,
                                "spotvisor to exit by itself after the run")
        self.assertEqual(exited.group(1), "130", "spotvisor's exit code is the trainer's")
        phase = lambda: fakes.ec2.tags(EC2_INSTANCE_ID).get("spotvisor-phase")  # noqa: E731
        try:
            wait_until(lambda: phase() == "done (preempted)", 10, "the spotvisor-phase tag 'done (preempted)'")
        except AssertionError as e:
            self.fail(f"{e} (fake EC2 API; the tag is {phase()!r})")
        self.assertIn(("CreateTags", [EC2_INSTANCE_ID]), fakes.ec2.calls())

        # The instance role: keys from IMDS (IMDSv2), and S3 accepted only those, with their
        # session token (fake_s3 answers InvalidAccessKeyId to the key without it).
        creds = [e for e in imds.log(detail=True)
                 if e["path"].rstrip("/") == f"/latest/meta-data/iam/security-credentials/{ROLE}"]
        self.assertTrue(any(e["status"] == 200 and e["had_token"] for e in creds), creds)
        v1 = [e[:2] for e in imds.log() if e[1].startswith("/latest/meta-data") and not e[3]]
        self.assertFalse(v1, "IMDSv1 requests (no session token)")
        requests = fakes.s3.requests()
        kinds = sorted({(r["kind"], r["status"], r["error"]) for r in requests}, key=str)
        log(f"{self.scenario}: S3 requests (kind, status, error): {kinds}")
        denied = [r for r in requests if r["error"] in ("InvalidAccessKeyId", "InvalidToken", "ExpiredToken",
                                                        "SignatureDoesNotMatch", "AccessDenied")]
        self.assertFalse(denied, "S3 refused spotvisor's credentials")
        self.assertTrue([r for r in requests if r["kind"] == "put" and r["status"] == 200], kinds)
        # Signed for the instance's region from the first request (no AWS_REGION in the unit): no redirect.
        self.assertFalse([r for r in requests if r["error"] == "AuthorizationHeaderMalformed"], kinds)
        for secret in (ROLE_SECRET, ROLE_TOKEN):
            self.assertNotIn(secret[:16], vm.serial(), "the role's secret key or token is on the console")
        # The logs in CloudWatch Logs (log-to = auto on EC2), signed with the same role, before power-off:
        # the lines that say why the run ended.
        wait_until(lambda: fakes.cloudwatch_events("run.end"), 15, "run.end in CloudWatch Logs")
        self.assertEqual(fakes.cloudwatch_events("run.end")[0].get("reason"), "preempted")
        self.assertTrue(fakes.cloudwatch_events("preemption.detected"), "preemption.detected in CloudWatch Logs")
        trainer = [e["message"] for e in fakes.cloudwatch_logs.events("spotvisor", f"{EC2_INSTANCE_ID}/spotvisor-trainer")]
        self.assertIn("fake_trainer received SIGINT", "\n".join(trainer))

        # EC2 powers the instance off at the notice's time (the ACPI power button, as on GCE).
        pressed = time.monotonic()
        vm.power_button()
        rc = vm.wait_exit(PREEMPTION_BUDGET * 3)
        shutdown_s = vm.exited - pressed
        self.timing("power button -> QEMU exited", shutdown_s)
        self.assert_powered_off(rc)
        self.assertLess(shutdown_s, PREEMPTION_BUDGET, f"power button to power-off took {shutdown_s:.1f}s")
        self.assert_stopped_in_order(by_systemd=False)
        text = vm.serial()
        button = text.find("Power key pressed")
        self.assertGreaterEqual(button, 0, "logind never saw the power button")
        self.assertLess(text.find("spotvisor.service: Main process exited"), button,
                        "spotvisor was still running at the power button")
        unmounted = self.serial_event("mount.unmounted")
        self.assertEqual((unmounted.get("dir"), unmounted.get("lazy")), ("/mnt/dataset", False), unmounted)

    # ------------------------------------------------------------------ (6)
    def test_6_a_mig_member_leaves_its_group_when_the_run_completes(self):
        # Issue #30: a VM that a managed instance group created (created-by) must not stop,
        # delete or power itself off at the end (the group would bring it back, forever):
        # it leaves through the group, which lowers its size and then deletes the VM; the test
        # plays that part by pressing the power button, as GCE's deletion does.
        run_id = "e2e-mig"
        vm = self.boot(run_id, {"spotvisor-command": exec_form(TRAINER, "--run-for", "3000", "--checkpoint-every", "1000"),
                                "spotvisor-bucket": f"gs://{BUCKET}/{PREFIX}"}, mig="trainers")
        started = self.wait_trainer_started()
        ended = self.wait_run_end(started, "trainer running -> run.end (run)")
        group = self.event("cloud.group", timeout=30)
        self.assertEqual((group.get("group_kind"), group.get("source")), ("zonal-mig", "created-by"), group)
        done = self.event("shutdown.api_done", timeout=60)
        self.assertIn("leaving it", done.get("message", ""), done)
        calls = [c for c, _ in self.fakes.compute.calls()]
        self.assertIn("instanceGroupManagers.deleteInstances", calls)
        self.assertNotIn("instances.delete", calls)
        self.assertEqual(self.fakes.compute.target_size("trainers"), 0)
        self.assertEqual(self.fakes.compute.members("trainers"), [])
        self.assertIn(f"{PREFIX}/{run_id}/DONE", self.fakes.objects(f"{PREFIX}/{run_id}/"))
        self.assertEqual(self.fakes.guest_attributes().get("group"), group["group"])
        # No poweroff of its own: the group deletes the VM (ACPI, as GCE does).
        vm.wait_serial(r"spotvisor\.service: (Deactivated successfully|Main process exited)", 60, "spotvisor to exit")
        self.assertNotRegex(vm.serial(), r"on-exit poweroff", "powered itself off: the group would have repaired it")
        vm.wait_serial(r"Watching system buttons on \S+ \(Power Button\)", 30, "logind watching the power button")
        vm.power_button()
        rc = self.wait_poweroff(ended)
        self.assert_powered_off(rc)


def ns_gap(marker):
    """'0.35 s': from the trainer's SIGINT to its SIGTERM, as its marker file records them."""
    t = {}
    for line in marker.splitlines():
        name, _, value = line.partition(" realtime_ns=")
        if value and name not in t:
            t[name] = int(value)
    if "sigint" in t and "sigterm" in t:
        return f"{(t['sigterm'] - t['sigint']) / 1e9:.2f} s"
    return "?"


def requests_of(s3, error):
    """fake S3's requests that got this S3 error code."""
    return [r for r in s3.requests() if r.get("error") == error]


def manifest_files(manifest):
    files = manifest.get("files", manifest)
    return files if isinstance(files, list) else []


if __name__ == "__main__":
    unittest.main()

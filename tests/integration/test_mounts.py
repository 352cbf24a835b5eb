"""Issue #4 through the real binary, with real mounts (needs root): ext4
images on loop devices behind by-id style links in /dev/disk/by-id, and a
real FUSE mount of the fake GCS server by rclone.

Every test uses its own device names (sv-<random>) and its own directories,
and tearDown detaches whatever a failing test left behind."""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import unittest
import uuid

from harness import SpotvisorTestCase, SPOTVISOR, wait_until, pid_alive, WAIT

BY_ID = "/dev/disk/by-id"
RCLONE = shutil.which("rclone")
CAN_MOUNT = os.geteuid() == 0 and os.path.exists("/dev/loop-control")
CAN_FUSE = CAN_MOUNT and os.path.exists("/dev/fuse") and shutil.which("fusermount3") and RCLONE


def run(*argv, **kw):
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kw).stdout.strip()


def mounted_at(path):
    """Mount entries at exactly path, from this (the host's) mount table."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mp = fields[4].encode().decode("unicode_escape")
            if mp == path:
                dash = fields.index("-")
                out.append({"fstype": fields[dash + 1], "source": fields[dash + 2], "options": fields[5]})
    return out


@unittest.skipUnless(CAN_MOUNT, "needs root and loop devices")
class MountTestCase(SpotvisorTestCase):
    def setUp(self):
        super().setUp()
        self.loops = []
        self.links = []
        self.created_by_id = False
        if not os.path.isdir(BY_ID):
            os.makedirs(BY_ID)  # no udev here: what GCE's udev rules would create
            self.created_by_id = True
        self.addCleanup(self._cleanup)

    def _cleanup(self):
        for p in self.procs:
            p.kill()
        # Anything a failed test left mounted under our temp dir.
        for _ in range(3):
            with open("/proc/self/mountinfo") as f:
                mps = [l.split()[4] for l in f if l.split()[4].startswith(self.tmp)]
            for mp in reversed(mps):
                subprocess.run(["umount", "-l", mp], capture_output=True)
        for l in self.links:
            if os.path.islink(l):
                os.unlink(l)
        for dev in self.loops:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
        if self.created_by_id:
            try:
                os.rmdir(BY_ID)
                os.rmdir(os.path.dirname(BY_ID))
            except OSError:
                pass

    def image(self, name, size_mb=16, files=None, fstype="ext4", label=None):
        """An image file; with files, an ext4 filesystem holding them (mke2fs -d, no mount)."""
        img = self.path(name + ".img")
        if fstype is None:
            with open(img, "wb") as f:
                f.truncate(size_mb * 1024 * 1024)
            return img
        src = self.path(name + ".src")
        os.makedirs(src, exist_ok=True)
        for rel, data in (files or {}).items():
            p = os.path.join(src, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
        args = ["mke2fs", "-q", "-F", "-t", fstype, "-d", src]
        if label:
            args += ["-L", label]
        run(*args, img, f"{size_mb}M")
        return img

    def attach(self, img, read_only=False):
        args = ["losetup", "--find", "--show"] + (["--read-only"] if read_only else []) + [img]
        dev = run(*args)
        self.loops.append(dev)
        return dev

    def link(self, dev, name):
        path = os.path.join(BY_ID, name)
        os.symlink(dev, path)
        self.links.append(path)
        return path

    def disk_name(self):
        return "sv-" + uuid.uuid4().hex[:10]

    def job(self, script, sets, env=None):
        """spotvisor run with a shell-script trainer; sets are --set KEY=VALUE."""
        args = ["run"] + self.base_sets(**sets) + ["--", "/bin/sh", "-c", script]
        return self.start(args, env=env)


class DatasetDiskTest(MountTestCase):
    def dataset(self, read_only=False, link_style="google-{}"):
        img = self.image("dataset", files={"train/a.txt": b"hello dataset\n"})
        dev = self.attach(img, read_only)
        name = self.disk_name()
        self.link(dev, link_style.format(name))
        return name, dev

    def test_mounted_read_only_by_device_name_and_unmounted_at_the_end(self):
        name, dev = self.dataset()
        mnt = self.path("dataset")
        p = self.job('cat "$SPOTVISOR_DATASET_DIR/train/a.txt"; '
                     'touch "$SPOTVISOR_DATASET_DIR/x" 2>/dev/null && echo WRITABLE || echo READONLY',
                     {"dataset-disk": name, "dataset-dir": mnt})
        self.assertEqual(p.wait_exit(), 0, p.raw[-20:])
        out = [e["message"] for e in p.find("trainer.output")]
        self.assertIn("hello dataset", out)
        self.assertIn("READONLY", out)
        done = p.wait_event("mount.done", what="dataset")
        self.assertEqual(done["fstype"], "ext4")
        self.assertTrue(done["options"].startswith("ro"), done)
        self.assertTrue(done["device"].endswith("google-" + name), done)
        # Before the trainer, undone after it.
        kinds = [e["event"] for e in p.events]
        self.assertLess(kinds.index("mount.done"), kinds.index("trainer.start"))
        self.assertLess(kinds.index("trainer.exit"), kinds.index("mount.unmounted"))
        self.assertEqual(mounted_at(mnt), [], "nothing spotvisor mounted is left mounted")

    def test_a_read_only_disk_whose_journal_needs_recovery_still_mounts(self):
        img = self.image("dataset", files={"a.txt": b"x"})
        run("debugfs", "-w", "-R", "feature needs_recovery", img)
        dev = self.attach(img, read_only=True)  # attached mode=ro, as the seed does
        name = self.disk_name()
        self.link(dev, "google-" + name)
        # Evidence that the image really needs recovery: a plain ro mount fails.
        probe = self.path("probe")
        os.makedirs(probe)
        plain = subprocess.run(["mount", "-t", "ext4", "-o", "ro", dev, probe], capture_output=True, text=True)
        if plain.returncode == 0:
            subprocess.run(["umount", probe])
        self.assertNotEqual(plain.returncode, 0, "the image should need journal recovery")
        p = self.job('ls "$SPOTVISOR_DATASET_DIR"', {"dataset-disk": name, "dataset-dir": self.path("dataset")})
        self.assertEqual(p.wait_exit(), 0, p.raw[-20:])
        self.assertIn("noload", p.wait_event("mount.done")["options"])
        self.assertIn("a.txt", [e["message"] for e in p.find("trainer.output")])

    def test_a_busy_mount_is_retried_then_detached_lazily(self):
        name, _ = self.dataset()
        mnt = self.path("dataset")
        p = self.job("sleep 60", {"dataset-disk": name, "dataset-dir": mnt, "stop-timeout": "2s"})
        p.wait_event("trainer.start")
        # Someone outside the run (a user's shell over SSH) holds a file open on it.
        held = open(os.path.join(mnt, "train", "a.txt"))
        self.addCleanup(held.close)
        p.signal(signal.SIGTERM)
        p.wait_exit(30)
        failed = p.wait_event("mount.unmount_failed")
        self.assertIn("busy", failed["error"])
        self.assertTrue(p.wait_event("mount.unmounted", what="dataset")["lazy"])
        self.assertEqual(mounted_at(mnt), [], "detached from the tree at once")
        self.assertEqual(held.read(), "hello dataset\n", "the open file still works until it is closed")

    def test_the_kernels_own_name_works_without_googles_udev_rules(self):
        name, _ = self.dataset(link_style="scsi-0Google_PersistentDisk_{}")
        p = self.job("true", {"dataset-disk": name, "dataset-dir": self.path("dataset")})
        self.assertEqual(p.wait_exit(), 0, p.raw[-20:])
        self.assertIn("scsi-0Google_PersistentDisk_" + name, p.wait_event("mount.done")["device"])

    def test_a_device_that_appears_late_is_waited_for(self):
        img = self.image("dataset", files={"a.txt": b"x"})
        dev = self.attach(img)
        name = self.disk_name()
        p = self.job('ls "$SPOTVISOR_DATASET_DIR"', {"dataset-disk": name, "dataset-dir": self.path("dataset"),
                                                     "mount-timeout": "30s"})
        waiting = p.wait_event("mount.waiting")
        self.assertIn(os.path.join(BY_ID, "google-" + name), waiting["looked_for"])
        self.link(dev, "google-" + name)  # udev, late
        self.assertEqual(p.wait_exit(), 0, p.raw[-20:])

    def test_a_missing_device_fails_after_the_timeout_naming_what_was_looked_for(self):
        name = self.disk_name()
        p = self.job("echo SHOULD-NOT-RUN", {"dataset-disk": name, "dataset-dir": self.path("dataset"),
                                             "mount-timeout": "1s"})
        self.assertEqual(p.wait_exit(), 72)
        failed = p.wait_event("mount.failed")
        self.assertIn(f"google-{name}", failed["message"])
        self.assertIn(f"scsi-0Google_PersistentDisk_{name}", failed["message"])
        self.assertIn(f"device-name={name}", failed["message"])
        self.assertEqual(p.wait_event("run.end")["reason"], "mount-failed")
        self.assertFalse(p.find("trainer.start"))

    def test_a_disk_without_a_filesystem_is_refused_not_formatted(self):
        img = self.image("blank", fstype=None)
        dev = self.attach(img)
        name = self.disk_name()
        self.link(dev, "google-" + name)
        p = self.job("echo SHOULD-NOT-RUN", {"dataset-disk": name, "dataset-dir": self.path("dataset")})
        self.assertEqual(p.wait_exit(), 72)
        self.assertIn("has no filesystem", p.wait_event("mount.failed")["message"])
        with open(img, "rb") as f:
            self.assertEqual(f.read(1 << 20).count(0), 1 << 20, "the disk was not written to")

    def test_a_disk_with_the_wrong_kind_of_signature_is_refused_clearly(self):
        img = self.image("swap", fstype=None)
        run("mkswap", img)
        dev = self.attach(img)
        name = self.disk_name()
        self.link(dev, "google-" + name)
        p = self.job("echo SHOULD-NOT-RUN", {"dataset-disk": name, "dataset-dir": self.path("dataset")})
        self.assertEqual(p.wait_exit(), 72)
        msg = p.wait_event("mount.failed")["message"]
        self.assertIn("swap", msg)
        self.assertIn("not a filesystem", msg)
        self.assertFalse(p.find("trainer.start"))

    def test_already_mounted_there_is_reused_and_left_alone(self):
        name, dev = self.dataset()
        mnt = self.path("dataset")
        os.makedirs(mnt)
        run("mount", "-o", "ro", dev, mnt)
        p = self.job('cat "$SPOTVISOR_DATASET_DIR/train/a.txt"', {"dataset-disk": name, "dataset-dir": mnt})
        self.assertEqual(p.wait_exit(), 0, p.raw[-20:])
        p.wait_event("mount.reused")
        p.wait_event("mount.left")
        self.assertEqual(len(mounted_at(mnt)), 1, "a mount spotvisor did not make is left mounted")

    def test_something_else_mounted_there_is_refused(self):
        name, _ = self.dataset()
        mnt = self.path("dataset")
        os.makedirs(mnt)
        run("mount", "-t", "tmpfs", "-o", "size=1m", "other", mnt)
        p = self.job("echo SHOULD-NOT-RUN", {"dataset-disk": name, "dataset-dir": mnt})
        self.assertEqual(p.wait_exit(), 72)
        self.assertIn("refusing to mount over it", p.wait_event("mount.failed")["message"])
        self.assertEqual([m["fstype"] for m in mounted_at(mnt)], ["tmpfs"], "the other mount is untouched")

    def test_a_state_dir_on_a_mounted_disk_is_a_config_error(self):
        p = self.job("true", {"scratch-disk": "scratch", "scratch-dir": self.path("scratch"),
                              "state-dir": self.path("scratch/state")})
        self.assertEqual(p.wait_exit(), 78)
        self.assertIn("mounted only after", p.wait_event("config.error")["message"])

    def test_rw_in_dataset_mount_options_is_a_config_error(self):
        p = self.job("true", {"dataset-disk": "data", "dataset-mount-options": "rw,noatime"})
        self.assertEqual(p.wait_exit(), 78)
        self.assertIn("read-only", p.wait_event("config.error")["message"])


class ScratchDiskTest(MountTestCase):
    def test_a_blank_disk_is_formatted_mounted_and_given_to_the_trainer(self):
        dev = self.attach(self.image("scratch", size_mb=32, fstype=None))
        name = self.disk_name()
        self.link(dev, "google-" + name)
        mnt = self.path("scratch")
        ckpt = os.path.join(mnt, "ckpt")
        p = self.job('echo data > "$SPOTVISOR_CHECKPOINT_DIR/c1" && echo "scratch=$SPOTVISOR_SCRATCH_DIR" && '
                     'stat -c %U "$SPOTVISOR_SCRATCH_DIR"',
                     {"scratch-disk": name, "scratch-dir": mnt, "checkpoint-dir": ckpt})
        self.assertEqual(p.wait_exit(), 0, p.raw[-20:])
        self.assertTrue(p.wait_event("mount.done", what="scratch")["formatted"])
        p.wait_event("mount.formatting")
        self.assertIn(f"scratch={mnt}", [e["message"] for e in p.find("trainer.output")])
        self.assertEqual(mounted_at(mnt), [])
        # The checkpoint landed on the scratch filesystem, not under the mount point.
        self.assertFalse(os.path.exists(ckpt), "checkpoint-dir was created after the mount, on the disk")
        self.assertEqual(run("blkid", "-o", "value", "-s", "LABEL", dev), "sv-scratch")
        self.assertIn("c1", run("debugfs", "-R", "ls -l /ckpt", dev))

        # A second boot with the same disk: our own filesystem is mounted as it is.
        p2 = self.job('cat "$SPOTVISOR_CHECKPOINT_DIR/c1"', {"scratch-disk": name, "scratch-dir": mnt, "checkpoint-dir": ckpt})
        self.assertEqual(p2.wait_exit(), 0, p2.raw[-20:])
        self.assertFalse(p2.wait_event("mount.done", what="scratch")["formatted"])
        self.assertIn("data", [e["message"] for e in p2.find("trainer.output")])

    def test_a_disk_with_someone_elses_filesystem_is_never_formatted(self):
        img = self.image("scratch", files={"precious.txt": b"keep me"}, label="users-data")
        dev = self.attach(img)
        name = self.disk_name()
        self.link(dev, "google-" + name)
        before = run("blkid", "-p", "-o", "value", "-s", "UUID", dev)
        p = self.job("echo SHOULD-NOT-RUN", {"scratch-disk": name, "scratch-dir": self.path("scratch")})
        self.assertEqual(p.wait_exit(), 72)
        msg = p.wait_event("mount.failed")["message"]
        self.assertIn("not formatting it", msg)
        self.assertIn("users-data", msg)
        self.assertFalse(p.find("mount.formatting"))
        self.assertEqual(run("blkid", "-p", "-o", "value", "-s", "UUID", dev), before)
        self.assertIn("precious.txt", run("debugfs", "-R", "ls /", dev))


@unittest.skipUnless(CAN_FUSE, "needs root, /dev/fuse, fusermount3 (fuse3) and rclone")
class BucketMountTest(MountTestCase):
    BUCKET = "results"

    def setUp(self):
        super().setUp()
        from fake_gcs import FakeGcsServer
        self.gcs = FakeGcsServer(buckets=[self.BUCKET]).start()
        self.addCleanup(self.gcs.stop)
        self.gcs_env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.gcs.port}"}

    def names(self, prefix=""):
        return sorted(o["name"] for o in self.gcs.objects(self.BUCKET, prefix))

    def test_a_file_the_trainer_writes_is_an_object_after_the_unmount(self):
        mnt = self.path("result")
        p = self.job('mkdir -p "$SPOTVISOR_OUTPUT_DIR/out" && echo "final model" > "$SPOTVISOR_OUTPUT_DIR/out/model.txt"',
                     {"bucket": f"gs://{self.BUCKET}/exp", "bucket-mount": mnt, "mount-driver": "rclone",
                      "sync-interval": "0"}, env=self.gcs_env)
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-30:]))
        start = p.wait_event("mount.fuse_start")
        self.assertEqual(start["argv"][:2], ["rclone", "mount"])
        unmounted = p.wait_event("mount.unmounted", what="bucket")
        self.assertEqual(mounted_at(mnt), [])
        self.assertFalse(pid_alive(start["pid"]), "the FUSE process is gone")
        self.assertIn("out/model.txt", self.names("out/"))
        self.assertEqual(self.gcs.get_object_bytes(self.BUCKET, "out/model.txt"), b"final model\n")
        # The order: mount before the trainer, unmount after the final sync.
        kinds = [e["event"] for e in p.events]
        self.assertLess(kinds.index("mount.done"), kinds.index("trainer.start"))
        self.assertLess(kinds.index("sync.complete"), kinds.index("mount.unmounted"))
        self.assertFalse(unmounted["lazy"], "a clean unmount, not a lazy detach")

    def test_the_fuse_process_dying_mid_run_is_an_error_event(self):
        mnt = self.path("result")
        p = self.job("sleep 60", {"bucket": f"gs://{self.BUCKET}", "bucket-mount": mnt, "mount-driver": "rclone",
                                  "sync-interval": "0", "stop-timeout": "2s"}, env=self.gcs_env)
        pid = p.wait_event("mount.done", what="bucket")["pid"]
        p.wait_event("trainer.start")
        os.kill(pid, signal.SIGKILL)
        died = p.wait_event("mount.fuse_died")
        self.assertEqual(died["severity"], "ERROR")
        self.assertEqual(died["pid"], pid)
        p.signal(signal.SIGTERM)
        p.wait_exit()
        self.assertEqual(mounted_at(mnt), [], "the dead mount was still taken off")

    def test_a_dead_mount_left_by_a_crashed_spotvisor_is_replaced(self):
        mnt = self.path("result")
        sets = {"bucket": f"gs://{self.BUCKET}", "bucket-mount": mnt, "mount-driver": "rclone", "sync-interval": "0"}
        p = self.job("sleep 60", sets, env=self.gcs_env)
        fuse = p.wait_event("mount.done", what="bucket")["pid"]
        trainer = p.wait_event("trainer.start")["pid"]
        p.kill()  # spotvisor crashes (SIGKILL): nothing is undone
        os.kill(trainer, signal.SIGKILL)
        os.kill(fuse, signal.SIGKILL)  # systemd kills what is left in the unit's cgroup
        wait_until(lambda: not pid_alive(fuse), what="rclone gone")
        with self.assertRaises(OSError) as stale:
            os.stat(mnt)
        self.assertIn(stale.exception.errno, (107, 103), "ENOTCONN or ECONNABORTED: a dead FUSE mount")
        p2 = self.job('echo again > "$SPOTVISOR_OUTPUT_DIR/again.txt"', sets, env=self.gcs_env)
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-30:]))
        p2.wait_event("mount.stale")
        self.assertEqual(self.gcs.get_object_bytes(self.BUCKET, "again.txt"), b"again\n")
        self.assertEqual(mounted_at(mnt), [])

    def test_a_read_only_storage_scope_is_warned_about(self):
        # Seed 002's trap: the default scope lets the VM read the bucket, not write it.
        self.metadata.set("instance/service-accounts/default/scopes",
                          "https://www.googleapis.com/auth/devstorage.read_only\n"
                          "https://www.googleapis.com/auth/logging.write\n")
        p = self.job("true", {"bucket": f"gs://{self.BUCKET}", "bucket-mount": self.path("result"),
                              "mount-driver": "rclone", "sync-interval": "0"}, env=self.gcs_env)
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-30:]))
        warning = p.wait_event("mount.scopes")
        self.assertEqual(warning["severity"], "WARNING")
        self.assertIn("--scopes=storage-full", warning["message"])

    def test_a_writable_scope_is_not_warned_about(self):
        p = self.job("true", {"bucket": f"gs://{self.BUCKET}", "bucket-mount": self.path("result"),
                              "mount-driver": "rclone", "sync-interval": "0"}, env=self.gcs_env)
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-30:]))
        self.assertFalse(p.find("mount.scopes"))

    def test_a_missing_driver_binary_is_named(self):
        p = self.job("echo SHOULD-NOT-RUN", {"bucket": f"gs://{self.BUCKET}", "bucket-mount": self.path("result"),
                                             "mount-driver": "gcsfuse"},
                     env=dict(self.gcs_env, PATH="/usr/bin:/bin"))
        self.assertEqual(p.wait_exit(), 72)
        self.assertIn("gcsfuse is not installed", p.wait_event("mount.failed")["message"])

    def test_a_missing_bucket_fails_the_mount_before_the_driver_starts(self):
        p = self.job("echo SHOULD-NOT-RUN", {"bucket": "gs://no-such-bucket", "bucket-mount": self.path("result"),
                                             "mount-driver": "rclone", "mount-timeout": "20s"}, env=self.gcs_env)
        code = p.wait_exit(60)
        self.assertEqual(code, 72, "".join(p.raw[-30:]))
        failed = p.wait_event("mount.failed")["message"]
        self.assertIn("cannot mount the bucket: bucket gs://no-such-bucket does not exist", failed)
        self.assertFalse(p.find("mount.fuse_start"), "rclone would have mounted it regardless")
        self.assertFalse(p.find("trainer.start"))
        self.assertEqual(mounted_at(self.path("result")), [])

    def test_sync_via_mount_commits_through_the_fuse_mount_and_restores(self):
        mnt = self.path("result")
        sets = {"bucket": f"gs://{self.BUCKET}/exp", "bucket-mount": mnt, "mount-driver": "rclone", "sync-via": "mount",
                "run-id": "run1", "sync-interval": "0", "sync-settle": "0s", "checkpoint-dir": self.path("ckpt")}
        p = self.job('echo weights-1 > "$SPOTVISOR_CHECKPOINT_DIR/model.pt"; exit 3', sets, env=self.gcs_env)
        self.assertEqual(p.wait_exit(), 3, "".join(p.raw[-30:]))
        self.assertEqual(p.wait_event("sync.complete", kind="final")["files_uploaded"], 1)
        self.assertEqual(mounted_at(mnt), [])
        names = self.names("exp/run1/")
        self.assertIn("exp/run1/manifest.json", names)
        manifest = json.loads(self.gcs.get_object_bytes(self.BUCKET, "exp/run1/manifest.json"))
        obj = manifest["files"][0]["object"]
        self.assertEqual(self.gcs.get_object_bytes(self.BUCKET, "exp/run1/" + obj), b"weights-1\n")
        self.assertFalse([n for n in names if ".tmp" in n], f"no temporary objects left: {names}")
        # A person's view of what rclone wrote: `runs` and `pull` read it like any run.
        env = dict(os.environ, **self.gcs_env)
        listed = subprocess.run([SPOTVISOR, "runs", "--json", f"gs://{self.BUCKET}/exp"], capture_output=True, text=True,
                                env=env, timeout=60)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        [run1] = json.loads(listed.stdout)
        self.assertEqual((run1["run_id"], run1["state"], run1["exit_code"], run1["sequence"]),
                         ("run1", "failed", 3, manifest["sequence"]))
        pulled = subprocess.run([SPOTVISOR, "pull", f"gs://{self.BUCKET}/exp/run1", self.path("pulled")],
                                capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(pulled.returncode, 0, pulled.stderr)
        with open(self.path("pulled/model.pt"), "rb") as f:
            self.assertEqual(f.read(), b"weights-1\n")
        # A new VM restores through the mount, then through the API: the same layout.
        # (The first fails on purpose, so that it writes no DONE.)
        for via, code in (("mount", 4), ("api", 0)):
            sets2 = dict(sets, **{"checkpoint-dir": self.path("ckpt-" + via), "sync-via": via})
            p2 = self.job(f'cat "$SPOTVISOR_CHECKPOINT_DIR/model.pt"; echo "resumed=$SPOTVISOR_RESUMED"; exit {code}', sets2,
                          env=self.gcs_env)
            self.assertEqual(p2.wait_exit(), code, "".join(p2.raw[-30:]))
            out = [e["message"] for e in p2.find("trainer.output")]
            self.assertIn("weights-1", out, f"{via}: {p2.raw[-30:]}")
            self.assertIn("resumed=1", out, via)
        self.assertIn("exp/run1/DONE", self.names("exp/run1/"))

    def test_sync_via_mount_fails_loudly_when_the_mount_is_gone(self):
        mnt = self.path("result")
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/model.pt"), "w") as f:
            f.write("weights")
        sets = {"bucket": f"gs://{self.BUCKET}/exp", "bucket-mount": mnt, "mount-driver": "rclone", "sync-via": "mount",
                "run-id": "run1", "sync-interval": "0", "sync-settle": "0s", "checkpoint-dir": self.path("ckpt"),
                "stop-timeout": "2s"}
        p = self.job("sleep 60", sets, env=self.gcs_env)
        p.wait_event("trainer.start")
        # The run's status.json goes up through the mount at the start: let it land first.
        wait_until(lambda: "exp/run1/status.json" in self.names("exp/"), what="status.json through the mount")
        # Someone takes the mount away; rclone exits. umount may say "busy" while
        # the write of status.json is still closing: try again, within the bound.
        wait_until(lambda: subprocess.run(["umount", mnt], capture_output=True).returncode == 0,
                   what="umount of the bucket mount")
        p.wait_event("mount.fuse_died")
        p.signal(signal.SIGUSR1)  # spotvisor sync
        failed = p.wait_event("sync.failed", kind="on-demand")
        self.assertIn("not mounted any more", failed["error"])
        self.assertEqual(os.listdir(mnt), [], "nothing was written into the bare mount point")
        # Only the run's status.json, this VM's claim on the run and its boot record (and the
        # file store's lock beside them) went up, at the start; the claim expires by itself.
        self.assertEqual([n for n in self.names("exp/")
                          if not n.endswith(("/status.json", "/.lock")) and "/claims/" not in n and "/boots/" not in n], [],
                         "and no checkpoint reached the bucket either")
        p.signal(signal.SIGTERM)
        p.wait_exit()

    def test_gcsfuse_stand_in_command_line_and_lifecycle(self):
        """gcsfuse cannot be installed here: a stand-in named gcsfuse records
        the command line spotvisor gives it and serves the mount with rclone,
        so readiness, the trainer's writes, unmount and exit are real."""
        bindir = self.path("bin")
        os.makedirs(bindir)
        record = self.path("gcsfuse.argv")
        stand_in = os.path.join(bindir, "gcsfuse")
        with open(stand_in, "w") as f:
            f.write(GCSFUSE_STAND_IN.format(python=sys.executable, record=record))
        os.chmod(stand_in, 0o755)
        mnt = self.path("result")
        env = dict(self.gcs_env, PATH=f"{bindir}:/usr/bin:/bin", FAKE_GCS_PORT=str(self.gcs.port))
        p = self.job('echo out > "$SPOTVISOR_OUTPUT_DIR/gcsfuse.txt"',
                     {"bucket": f"gs://{self.BUCKET}/exp", "bucket-mount": mnt, "sync-interval": "0"}, env=env)
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-30:]))
        with open(record) as f:
            argv = json.load(f)
        self.assertEqual(argv[0], "--foreground", "gcsfuse must not daemonize under a supervisor")
        self.assertIn("--implicit-dirs", argv)
        self.assertEqual(argv[-2:], [self.BUCKET, mnt])
        self.assertIn("--anonymous-access", argv, "STORAGE_EMULATOR_HOST turns authentication off")
        self.assertEqual(argv[argv.index("--uid") + 1], str(os.getuid()))
        self.assertIn("allow_other", argv)
        self.assertEqual(self.gcs.get_object_bytes(self.BUCKET, "gcsfuse.txt"), b"out\n")
        self.assertEqual(mounted_at(mnt), [])


# Records argv, then mounts with rclone (same bucket, same directory) in the foreground.
GCSFUSE_STAND_IN = '''#!{python}
import json, os, sys
args = sys.argv[1:]
with open("{record}", "w") as f:
    json.dump(args, f)
bucket, mnt = args[-2], args[-1]
env = dict(os.environ,
           RCLONE_CONFIG_STANDIN_TYPE="google cloud storage",
           RCLONE_CONFIG_STANDIN_ANONYMOUS="true",
           RCLONE_CONFIG_STANDIN_BUCKET_POLICY_ONLY="true",
           RCLONE_CONFIG_STANDIN_ENDPOINT="http://127.0.0.1:" + os.environ["FAKE_GCS_PORT"] + "/storage/v1/")
os.execvpe("rclone", ["rclone", "mount", "standin:" + bucket, mnt, "--allow-other", "--vfs-cache-mode", "off"], env)
'''


if __name__ == "__main__":
    unittest.main()

"""Checkpoints that survive real trainers (issue #11), through the real binary
against the fake Cloud Storage server: lost answers, two VMs on one run-id,
two files saved one after the other, Hugging Face rotation, saves faster than
sync-settle, restores for the trainer's user, restarts with newer local
files, names the store cannot hold, and a final sync inside the Spot window.
CheckpointThroughMountTest runs the checks that fit again with
`sync-via = mount`: through a real rclone FUSE mount of the same fake server.

The trainer is tests/integration/ckpt_trainer.py: every file it writes
starts with "step=N path=REL", so a commit can be checked to be one save.
"""
import json
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
import unittest

from harness import SpotvisorTestCase, wait_until, WAIT

PYTHON = "/usr/bin/python3"  # Debian's, whatever is first on PATH
CAN_FUSE = (os.geteuid() == 0 and os.path.exists("/dev/fuse") and shutil.which("fusermount3")
            and shutil.which("rclone"))
TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_trainer.py")


def step_of(data):
    if data.startswith(b"{"):
        try:
            return json.loads(data)["global_step"]
        except (ValueError, KeyError):
            return None
    line = data.split(b"\n", 1)[0].decode("utf-8", "replace")
    return int(line.split()[0][5:]) if line.startswith("step=") else None


class CheckpointTest(SpotvisorTestCase):
    BUCKET = "ckpt-bucket"
    PREFIX = "exp/run1/"
    VIA_MOUNT = False  # sync-via = mount, each VM with its own rclone mount

    def setUp(self):
        super().setUp()
        from fake_gcs import FakeGcsServer
        self.gcs = FakeGcsServer(buckets=[self.BUCKET]).start()
        self.addCleanup(self.gcs.stop)
        self.store_env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.gcs.port}"}

    # ---------------------------------------------------------------- helpers
    def vm(self, trainer_args, ckpt="ckpt", state="state", env=None, **sets):
        base = {"bucket": f"gs://{self.BUCKET}/exp", "run-id": "run1", "checkpoint-dir": self.path(ckpt),
                "state-dir": self.path(state), "sync-interval": "0", "sync-settle": "2s"}
        if self.VIA_MOUNT:
            base.update({"bucket-mount": self.path(f"mnt-{ckpt}"), "mount-driver": "rclone", "sync-via": "mount"})
        base.update(sets)
        e = dict(self.store_env)
        e.update(env or {})
        args = ["run"] + self.base_sets(**base) + ["--", PYTHON, TRAINER, "--log", self.path(f"{ckpt}.log")] + trainer_args
        return self.start(args, env=e)

    def trainer_log(self, ckpt="ckpt"):
        try:
            with open(self.path(f"{ckpt}.log")) as f:
                return [l.strip() for l in f if l.strip()]
        except FileNotFoundError:
            return []

    def manifest(self):
        return json.loads(self.gcs.get_object_bytes(self.BUCKET, self.PREFIX + "manifest.json"))

    def committed(self):
        """The committed checkpoint, read as a new VM would: path -> bytes,
        every object checked against the manifest's size."""
        m = self.manifest()
        out = {}
        for f in m["files"]:
            data = self.gcs.get_object_bytes(self.BUCKET, self.PREFIX + f["object"])
            self.assertEqual(len(data), f["size"], f["path"])
            out[f["path"]] = data
        return m["sequence"], out

    def assert_one_save(self, files):
        """All files of a commit come from one save (per checkpoint-N/ for hf)."""
        groups = {}
        for path, data in files.items():
            group = path.split("/")[0] if path.startswith("checkpoint-") else ""
            groups.setdefault(group, set()).add(step_of(data))
        for group, steps in groups.items():
            self.assertEqual(len(steps), 1, f"a mixed checkpoint {group or '(top)'}: steps {sorted(map(str, steps))}")
            if group:
                self.assertEqual(steps, {int(group.split("-")[1])}, group)
                names = sorted(p.split("/", 1)[1] for p in files if p.startswith(group + "/"))
                self.assertEqual(names, ["model.safetensors", "optimizer.pt", "trainer_state.json"], group)

    def watch_commits(self, stop):
        """Every manifest generation seen while the run goes on."""
        seen = {}
        while not stop.is_set():
            try:
                res = self.gcs.object_resource(self.BUCKET, self.PREFIX + "manifest.json")
                gen = res["generation"]
                if gen not in seen:
                    seen[gen] = self.committed()
            except Exception:  # not there yet, or replaced between the two reads
                pass
            stop.wait(0.05)
        return seen

    def kill_trainer_group(self, ckpt="ckpt"):
        # spotvisor killed with -9 cannot stop its trainer: the test does.
        out = subprocess.run(["pgrep", "-f", "--", f"--log {self.path(ckpt + '.log')}"], capture_output=True, text=True)
        for pid in out.stdout.split():
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # ------------------------------------------------------------------ tests
    def test_a_lost_answer_to_the_commit_is_reconciled_and_the_run_goes_on(self):
        p = self.vm(["--layout", "single", "--every", "0.2", "--marker"])
        wait_until(lambda: "saved 2" in self.trainer_log(), what="two saves")
        # The manifest write is applied, but its answer is lost: the retry's
        # precondition fails against our own commit.
        self.gcs.fault("reset_after", count=1, upload_type="multipart", object_prefix=self.PREFIX + "manifest.json")
        p.signal(signal.SIGUSR1)
        first = p.wait_event("sync.complete", kind="on-demand")
        self.assertTrue(any(e.get("outcome") == "reset_after" for e in self.gcs.log()), "the fault fired")
        wait_until(lambda: f"saved {first['sequence'] + 3}" in self.trainer_log() or len(self.trainer_log()) > 6,
                   what="more saves")
        p.signal(signal.SIGUSR1)
        second = wait_until(lambda: [e for e in p.find("sync.complete", kind="on-demand") if e["sequence"] > first["sequence"]],
                            what="a second commit")
        self.assertFalse(p.find("sync.failed"))
        self.assertFalse(p.find("sync.fenced"))
        p.signal(signal.SIGTERM)
        p.wait_exit()
        seq, files = self.committed()
        self.assertGreater(seq, second[0]["sequence"] - 1)
        self.assert_one_save(files)
        # A new VM restores it byte for byte.
        self.gcs.delete_object(self.BUCKET, self.PREFIX + "DONE") if "DONE" in self.names() else None
        p2 = self.vm(["--layout", "single", "--steps", "1"], ckpt="ckpt2", state="state2")
        self.assertEqual(p2.wait_exit(), 0)
        self.assertEqual(self.trainer_log("ckpt2")[0], f"resumed {step_of(files['latest.ckpt'])}")

    def names(self):
        return [o["name"][len(self.PREFIX):] for o in self.gcs.objects(self.BUCKET, self.PREFIX)]

    def test_two_vms_on_one_run_id_the_loser_says_so_once_and_never_touches_the_winner(self):
        a = self.vm(["--layout", "two", "--every", "0.3", "--marker", "--size", "20000"], ckpt="a", state="sa")
        b = self.vm(["--layout", "two", "--every", "0.3", "--marker", "--size", "20000"], ckpt="b", state="sb")
        for name in ("a", "b"):
            wait_until(lambda n=name: "saved 2" in self.trainer_log(n), what=f"{name} saved")
        a.signal(signal.SIGUSR1)
        a.wait_event("sync.complete", kind="on-demand")
        _, won = self.committed()
        b.signal(signal.SIGUSR1)
        fenced = b.wait_event("sync.fenced")
        self.assertIn("another VM is using run-id", fenced["message"])
        self.assertIn("Stop one of the two VMs", fenced["message"])
        self.assertEqual(self.committed()[1], won, "the loser's failed commit left the winner's checkpoint alone")
        def checkpoint_objects():
            return sorted(o["name"] for o in self.gcs.objects(self.BUCKET, self.PREFIX + "checkpoints/"))
        objects_before = checkpoint_objects()
        b.signal(signal.SIGUSR1)
        b.wait_event("sync.skipped", kind="on-demand")
        b.signal(signal.SIGTERM)
        b.wait_exit()
        self.assertEqual(len(b.find("sync.fenced")), 1, "said once")
        # Its own boot record still says how its boot ended (the run's history); no checkpoint object.
        self.assertEqual(checkpoint_objects(), objects_before, "a fenced VM uploads nothing more")
        self.assertEqual(self.committed()[1], won)
        a.signal(signal.SIGTERM)
        a.wait_exit()
        self.assert_one_save(self.committed()[1])

    def test_two_files_saved_one_after_the_other_are_never_committed_half_saved(self):
        # Saves every 0.5 s with 0.15 s between the two files; periodic syncs
        # every second with sync-settle 2 s: the tree never settles, and a
        # quiet moment between the two files is no end of a save (issue
        # #29), so nothing is committed until the trainer stops; it is told
        # once what to do. Every commit ever seen is one save.
        stop = threading.Event()
        box = {}
        watcher = threading.Thread(target=lambda: box.update(seen=self.watch_commits(stop)))
        watcher.start()
        try:
            p = self.vm(["--layout", "two", "--every", "0.5", "--gap", "0.15", "--size", "300000"], **{"sync-interval": "1s"})
            warning = p.wait_event("sync.settle_defeated", timeout=40)
            self.assertIn("os.replace", warning["message"])
            p.signal(signal.SIGTERM)
            p.wait_exit()
        finally:
            stop.set()
            watcher.join()
        seen = box["seen"]
        self.assertGreaterEqual(len(seen), 1)
        last = -1
        for gen in sorted(seen):
            seq, files = seen[gen]
            self.assert_one_save(files)
            self.assertGreaterEqual(seq, last, "never rolled back")
            last = seq
        self.assertFalse(p.find("sync.complete", kind="periodic", judged_by="settle"))
        self.assertEqual([e["judged_by"] for e in p.find("sync.complete", kind="final")], ["exited"])

    def test_hugging_face_rotation_never_fails_a_sync_and_commits_whole_checkpoint_dirs(self):
        stop = threading.Event()
        box = {}
        watcher = threading.Thread(target=lambda: box.update(seen=self.watch_commits(stop)))
        watcher.start()
        try:
            p = self.vm(["--layout", "hf", "--every", "0.4", "--gap", "0.05", "--size", "200000", "--marker"],
                        **{"sync-interval": "1s"})
            wait_until(lambda: len(p.find("sync.complete", kind="periodic")) >= 4, timeout=40, what="four periodic commits")
            p.signal(signal.SIGTERM)
            p.wait_exit()
        finally:
            stop.set()
            watcher.join()
        self.assertFalse(p.find("sync.failed"), "a deleted checkpoint-N/ must not fail a sync")
        for gen, (seq, files) in box["seen"].items():
            self.assert_one_save(files)
        seq, files = self.committed()
        self.assert_one_save(files)
        steps = sorted(int(p.split("/")[0].split("-")[1]) for p in files)
        self.assertLessEqual(len(set(steps)), 2, "save_total_limit=2 is reflected")

    @unittest.skipUnless(os.geteuid() == 0, "needs root to mount a small tmpfs")
    def test_a_sync_never_takes_the_room_of_the_trainers_next_save(self):
        # A 100 MiB disk; the trainer saves a 40 MiB model.pt by rename (model.pt.tmp, then
        # os.replace: 80 MiB while it saves) every 2 s; the store holds each 16 MiB chunk 1 s, so
        # every upload (3 s) sees a new save and the sync would stage a copy. A copy beside model.pt
        # leaves the next save 20 MiB: "No space left on device" and a dead trainer. Neither the
        # copy nor an upload holding a replaced save may take that room.
        if self.VIA_MOUNT:
            self.skipTest("sync-via = mount stages nothing")
        small = self.path("small")
        os.makedirs(small)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100m", "small", small], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", small])
        self.gcs.fault("slow", delay_ms=1000, upload_type="chunk")
        p = self.vm(["--layout", "atomic", "--size", str(56 << 20), "--every", "2", "--steps", "8", "--marker"],
                    ckpt="small", **{"sync-interval": "1s", "sync-settle": "0s", "sync-alert-after": "5m"})
        self.assertEqual(p.wait_exit(120), 0, "\n".join(self.trainer_log("small")))
        self.assertIn("saved 8", self.trainer_log("small"))
        said = p.find("sync.not_staged")
        self.assertEqual(len(said), 1, "said once a run")
        self.assertRegex(said[0]["message"], r"that would leave [\d.]+ MB free .* largest save so far \([\d.]+ MB\)")
        self.assertFalse([e for e in p.find("sync.complete") if e.get("staged")], "no staged copy was made")
        self.assertEqual(self.committed()[1]["model.pt"][:7], b"step=8 ", "the final sync has the last save")

    def test_a_trainer_saving_faster_than_settle_without_a_marker_is_synced_or_warned(self):
        # The marker is the documented fix; without it a trainer whose
        # checkpoint is one file is synced between its saves (nobody holds
        # the file open then), once it has shown it replaces that file:
        # saves every 1.5 s never settle for 3 s.
        p = self.vm(["--layout", "single", "--every", "1.5", "--size", "100000"], **{"sync-interval": "1s", "sync-settle": "3s"})
        wait_until(lambda: p.find("sync.complete", kind="periodic"), timeout=30, what="a periodic commit")
        p.signal(signal.SIGTERM)
        p.wait_exit()
        self.assertEqual({e["judged_by"] for e in p.find("sync.complete", kind="periodic")}, {"one-file"})
        self.assertFalse(p.find("sync.settle_defeated"))
        self.assert_one_save(self.committed()[1])

    def test_a_trainer_that_defeats_sync_settle_gets_one_warning(self):
        # Saves every 0.2 s, each save taking ~0.15 s with no marker: the tree
        # is never quiet. The third deferral in a row says what to change.
        p = self.vm(["--layout", "two", "--every", "0.05", "--gap", "0.1"], **{"sync-interval": "1s", "sync-settle": "5s"})
        warning = p.wait_event("sync.settle_defeated", timeout=40)
        self.assertIn("spotvisor checkpoint --done", warning["message"])
        self.assertIn("SPOTVISOR_CHECKPOINT_MARKER", warning["message"])
        deferred = len(p.find("sync.deferred", kind="periodic"))
        wait_until(lambda: len(p.find("sync.deferred", kind="periodic")) > deferred + 1, timeout=20, what="more deferrals")
        self.assertEqual(len(p.find("sync.settle_defeated")), 1, "one warning")
        p.signal(signal.SIGTERM)
        p.wait_exit()
        self.assert_one_save(self.committed()[1])  # the final sync, trainer stopped

    def test_a_restart_on_the_same_disk_keeps_newer_local_files(self):
        p = self.vm(["--layout", "single", "--every", "0.2", "--marker"])
        wait_until(lambda: "saved 3" in self.trainer_log(), what="saves")
        p.signal(signal.SIGUSR1)
        committed = p.wait_event("sync.complete", kind="on-demand")
        wait_until(lambda: any(l.startswith("saved ") and int(l.split()[1]) >= committed["sequence"] + 4
                               for l in self.trainer_log()) or len(self.trainer_log()) > 10, what="newer saves")
        p.proc.kill()  # spotvisor dies (systemd restarts it), the trainer's newer saves stay on disk
        p.wait_exit()
        self.kill_trainer_group()
        local = open(self.path("ckpt/latest.ckpt"), "rb").read()
        bucket = self.committed()[1]["latest.ckpt"]
        self.assertGreater(step_of(local), step_of(bucket), "the disk is ahead of the bucket")
        p2 = self.vm(["--layout", "single", "--steps", "1", "--marker"])
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-25:]))
        kept = p2.wait_event("restore.kept_local")
        self.assertEqual(kept["local_changes"], 1)
        self.assertIn(f"resumed {step_of(local)}", self.trainer_log(), "resumed from the newer local file, not rolled back")
        self.assertEqual(step_of(self.committed()[1]["latest.ckpt"]), step_of(local) + 1, "and synced")

    def test_a_restart_after_spotvisor_died_mid_run_without_a_marker_restores_the_bucket(self):
        # No marker: nothing tells a save the trainer finished from one cut off
        # when spotvisor (and then its trainer) died. Keeping a torn in-place
        # file would roll the run back; the bucket's commit is the newest
        # state known whole, and the local file is set aside, not deleted.
        p = self.vm(["--layout", "single", "--every", "0.5"], **{"sync-interval": "1s", "sync-settle": "0.2s"})
        self.assertTrue(self.gcs.wait_for_object(self.BUCKET, self.PREFIX + "manifest.json", timeout=WAIT), "a commit")
        p.proc.kill()
        p.wait_exit()
        self.kill_trainer_group()
        bucket_step = step_of(self.committed()[1]["latest.ckpt"])
        torn = open(self.path("ckpt/latest.ckpt"), "rb").read()[:10]  # a save cut off after 10 bytes
        with open(self.path("ckpt/latest.ckpt"), "wb") as f:
            f.write(torn)
        p2 = self.vm(["--layout", "single", "--steps", "1"])
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-25:]))
        self.assertFalse(p2.find("restore.kept_local"), "a file nobody vouches for is not kept")
        won = p2.wait_event("restore.bucket_newer")
        self.assertEqual(won["set_aside"], 1)
        self.assertIn("spotvisor checkpoint --done", won["message"])
        self.assertIn(f"resumed {bucket_step}", self.trainer_log(), "resumed from the bucket's commit")
        self.assertEqual(step_of(self.committed()[1]["latest.ckpt"]), bucket_step + 1, "never rolled back")
        with open(os.path.join(won["set_aside_dir"], "latest.ckpt"), "rb") as f:
            self.assertEqual(f.read(), torn, "the local file is kept aside")
        self.assertEqual(sorted(self.committed()[1]), ["latest.ckpt"], "what is set aside is never synced")

    def test_two_quick_restarts_never_destroy_a_save_set_aside(self):
        # Issue #28: boot 2 set the newest local save aside and was killed
        # mid-restore; boot 3 took boot 2's restored bytes for changed files
        # and set them aside over the step-7 save, which was gone.
        p = self.vm(["--layout", "two", "--every", "0.5"], **{"sync-interval": "1s", "sync-settle": "0.2s"})
        wait_until(lambda: self.gcs.wait_for_object(self.BUCKET, self.PREFIX + "manifest.json", timeout=0.1)
                   and len(self.manifest()["files"]) == 2, timeout=WAIT, what="a commit of both files")
        p.proc.kill()
        p.wait_exit()
        self.kill_trainer_group()
        # The trainer's newest save, never committed, and nothing vouches for it.
        saved = {name: f"step=7777 path={name} the newest save\n".encode() * 50 for name in ("model.pt", "optimizer.pt")}
        for name, data in saved.items():
            with open(self.path(f"ckpt/{name}"), "wb") as f:
                f.write(data)
        # Boot 2: model.pt comes back at once, optimizer.pt is held by a slow store; killed there.
        self.gcs.fault("slow", delay_ms=60000, kind="download", object_prefix=self.PREFIX + "checkpoints/optimizer.pt")
        p2 = self.vm(["--layout", "two", "--steps", "1"])
        aside_root = self.path("ckpt/.spotvisor-unverified")
        wait_until(lambda: os.path.isdir(aside_root) and os.path.exists(self.path("ckpt/model.pt")), timeout=WAIT,
                   what="boot 2 set the save aside and put model.pt back")
        p2.proc.kill()
        p2.wait_exit()
        self.gcs.fault("none")
        # Boot 3: model.pt is the commit's own file with a new time, not newer work.
        p3 = self.vm(["--layout", "two", "--steps", "1"])
        self.assertEqual(p3.wait_exit(), 0, "".join(p3.raw[-25:]))
        found = {}
        for gen in os.listdir(aside_root):
            for name in saved:
                path = os.path.join(aside_root, gen, name)
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        found.setdefault(name, []).append(f.read())
        for name, data in saved.items():
            self.assertIn(data, found.get(name, []), f"the step-7 {name} set aside by boot 2 is still there")

    def test_a_trainer_that_exited_before_a_failed_final_sync_keeps_its_newer_files(self):
        # A Spot VM preempted with the store failing: the trainer finished its
        # save and exited, the final sync did not make it, the VM stops and is
        # started again with its boot disk. The trainer's last save is whole
        # (it exited), so it is kept and synced, with or without a marker.
        p = self.vm(["--layout", "single", "--every", "0.5"],
                    **{"sync-interval": "1s", "sync-settle": "0.2s", "preemption-window": "6s"})
        self.assertTrue(self.gcs.wait_for_object(self.BUCKET, self.PREFIX + "manifest.json", timeout=WAIT), "a commit")
        self.gcs.fault("status", code=503, upload_type="multipart")
        self.gcs.fault("status", code=503, upload_type="resumable", add=True)
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_exit(timeout=WAIT)
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
        self.assertTrue(p.find("sync.failed", kind="final"), "the final sync did not make it")
        self.gcs.fault("none")
        self.metadata.set("instance/preempted", "FALSE")  # started again
        local = open(self.path("ckpt/latest.ckpt"), "rb").read()
        self.assertGreater(step_of(local), step_of(self.committed()[1]["latest.ckpt"]), "the disk is ahead of the bucket")
        p2 = self.vm(["--layout", "single", "--steps", "1"])
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-25:]))
        self.assertEqual(p2.wait_event("restore.kept_local")["local_changes"], 1)
        self.assertIn(f"resumed {step_of(local)}", self.trainer_log())
        self.assertEqual(step_of(self.committed()[1]["latest.ckpt"]), step_of(local) + 1)

    def test_names_the_store_cannot_hold_are_skipped_with_one_warning(self):
        os.makedirs(self.path("ckpt"))
        bad = [os.path.join(self.path("ckpt").encode(), b"latin1-\xe9t\xe9.pt"), self.path("ckpt/two\nlines.pt").encode()]
        for b in bad:
            with open(b, "wb") as f:
                f.write(b"x")
        p = self.vm(["--layout", "single", "--steps", "1"])
        self.assertEqual(p.wait_exit(), 0)
        warnings = p.find("sync.unstorable_name")
        self.assertEqual(len(warnings), 2)
        self.assertTrue(any("\\xe9" in w["message"] for w in warnings), warnings)
        self.assertEqual(sorted(self.committed()[1]), ["latest.ckpt"])
        self.assertTrue(p.find("done.written"))

    def test_a_final_sync_against_a_failing_store_ends_inside_the_spot_window(self):
        # Every upload answers 503; a periodic sync is asleep in backoff when
        # the VM is preempted. The final sync must give up inside the window
        # and say what did not make it.
        p = self.vm(["--layout", "single", "--every", "0.3", "--marker"],
                    **{"sync-interval": "1s", "preemption-window": "8s"})
        wait_until(lambda: "saved 1" in self.trainer_log(), what="a save")
        self.gcs.fault("status", code=503, upload_type="multipart")
        self.gcs.fault("status", code=503, upload_type="resumable", add=True)
        wait_until(lambda: self.gcs.hits("multipart") >= 2, what="a periodic sync retrying")
        self.wait_parked()
        t0 = time.monotonic()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_exit(timeout=WAIT)
        elapsed = time.monotonic() - t0
        self.assertLess(elapsed, 8.0, "spotvisor ended inside the window")
        failed = p.wait_event("sync.failed", kind="final")
        self.assertIn("not uploaded", failed["message"])
        self.assertIn("latest.ckpt", failed["message"])
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")


    @unittest.skipUnless(os.geteuid() == 0, "needs root to run the trainer as another user")
    def test_restored_files_belong_to_the_trainers_user(self):
        nobody = pwd.getpwnam("nobody")
        p = self.vm(["--layout", "hf", "--steps", "2"])
        self.assertEqual(p.wait_exit(), 0)
        self.gcs.delete_object(self.BUCKET, self.PREFIX + "DONE")
        # A new VM with the package's habit: the trainer runs as another user.
        os.chmod(self.tmp, 0o755)
        with open(self.path("ckpt2.log"), "w"):
            pass
        os.chown(self.path("ckpt2.log"), nobody.pw_uid, nobody.pw_gid)
        p2 = self.vm(["--layout", "hf", "--steps", "2"], ckpt="ckpt2", state="state2", user="nobody")
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-20:]))
        self.assertEqual(self.trainer_log("ckpt2")[0], "resumed 2")
        # It could overwrite and rotate what was restored: checkpoint-1 and -2 are gone.
        self.assertEqual(sorted(n for n in os.listdir(self.path("ckpt2")) if not n.startswith(".")),
                         ["checkpoint-3", "checkpoint-4"])
        for d, dirs, files in os.walk(self.path("ckpt2")):
            for n in dirs + files:
                st = os.lstat(os.path.join(d, n))
                self.assertEqual((st.st_uid, st.st_gid), (nobody.pw_uid, nobody.pw_gid), n)



@unittest.skipUnless(CAN_FUSE, "needs root, /dev/fuse, fusermount3 (fuse3) and rclone")
class CheckpointThroughMountTest(CheckpointTest):
    """The same checks with `sync-via = mount`: spotvisor writes the
    checkpoint into a real rclone FUSE mount of the fake GCS server (where
    gcsfuse would be on GCE), and commits through it."""
    VIA_MOUNT = True

    def setUp(self):
        super().setUp()
        self.addCleanup(self._unmount_leftovers)

    def _unmount_leftovers(self):
        with open("/proc/self/mountinfo") as f:
            mps = [l.split()[4] for l in f if l.split()[4].startswith(self.tmp)]
        for mp in reversed(mps):
            subprocess.run(["umount", "-l", mp], capture_output=True)

    @unittest.skip("injects faults into spotvisor's own JSON API requests; through the mount rclone makes them")
    def test_a_lost_answer_to_the_commit_is_reconciled_and_the_run_goes_on(self):
        pass

    @unittest.skip("holds spotvisor's own JSON API downloads with a fault; through the mount rclone makes them")
    def test_two_quick_restarts_never_destroy_a_save_set_aside(self):
        pass

    @unittest.skip("not guaranteed through a mount (docs/mounts.md): each VM's FUSE driver caches the bucket's "
                   "listing, so the second VM does not see the first one's manifest and its commit replaces it")
    def test_two_vms_on_one_run_id_the_loser_says_so_once_and_never_touches_the_winner(self):
        pass

    @unittest.skip("a write blocked in a FUSE mount cannot be cut short by the Spot window; docs/mounts.md says so")
    def test_a_final_sync_against_a_failing_store_ends_inside_the_spot_window(self):
        pass

    @unittest.skip("its final sync must fail fast, and a write blocked in a FUSE mount against a failing store "
                   "retries past the window (the test above); the rule it checks is the same on both paths")
    def test_a_trainer_that_exited_before_a_failed_final_sync_keeps_its_newer_files(self):
        pass


if __name__ == "__main__":
    unittest.main()

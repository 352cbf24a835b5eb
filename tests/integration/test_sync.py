"""Checkpoint sync through the real binary: restore at boot, periodic, on-demand and final syncs, DONE."""
import json
import os
import signal
import subprocess
import time
import unittest

from harness import SpotvisorTestCase, FAKE_TRAINER, wait_until


class FileSyncTest(SpotvisorTestCase):
    """Runs against a file:// bucket; GcsSyncTest reruns every test against the fake GCS server."""

    def setUp(self):
        super().setUp()
        self.bucket_dir = self.path("bucket")
        self.extra_env = {}

    def bucket(self):
        return f"file://{self.bucket_dir}"

    def objects(self):
        """Object names under RUN_ID/, relative."""
        root = os.path.join(self.bucket_dir, "run1")
        out = []
        for d, _, files in os.walk(root):
            for f in files:
                if f != ".lock":
                    out.append(os.path.relpath(os.path.join(d, f), root))
        return sorted(out)

    def object_bytes(self, name):
        with open(os.path.join(self.bucket_dir, "run1", name), "rb") as f:
            return f.read()

    def put_object(self, name, data):
        p = os.path.join(self.bucket_dir, "run1", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    def manifest(self):
        return json.loads(self.object_bytes("manifest.json"))

    def vm(self, trainer_args, ckpt="ckpt", **sets):
        """One 'boot' of a VM with its own (initially empty) checkpoint disk."""
        base = {"bucket": self.bucket(), "run-id": "run1", "checkpoint-dir": self.path(ckpt),
                "sync-interval": "0", "sync-settle": "0s"}
        base.update(sets)
        return self.run_trainer(trainer_args, sets=base, env=self.extra_env)

    def test_preempted_then_resumed_on_a_new_vm(self):
        p = self.vm(["--checkpoint-every", "50", "--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        wait_until(lambda: len(os.listdir(self.path("ckpt"))) >= 3, what="three checkpoints")
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        self.assertEqual(p.wait_exit(), 130)
        final = p.wait_event("sync.complete", kind="final")
        self.assertGreaterEqual(final["files_uploaded"], 3)
        self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
        names = [e["event"] for e in p.events]
        self.assertLess(names.index("sync.complete"), names.index("run.end"), "final sync before the run ends")
        local = sorted(os.listdir(self.path("ckpt")))
        self.assertEqual(sorted(f["path"] for f in self.manifest()["files"]), local,
                         "the trainer's last checkpoint (written on SIGINT) is in the manifest")
        self.assertNotIn("DONE", self.objects(), "no DONE after a preemption")

        # A new VM, same run-id, empty disk: restore, then the trainer starts resumed.
        self.metadata.set("instance/preempted", "FALSE")
        p2 = self.vm(["--print-env", "--run-for", "10"], ckpt="ckpt2")
        self.assertEqual(p2.wait_exit(), 0)
        restore = p2.wait_event("restore.complete")
        self.assertEqual(restore["files"], len(local))
        env = {e["message"].split("=", 1)[0]: e["message"].split("=", 1)[1]
               for e in p2.find("trainer.output", stream="stdout") if "=" in e["message"]}
        self.assertEqual(env.get("SPOTVISOR_RESUMED"), "1")
        for name in local:
            with open(self.path(f"ckpt/{name}"), "rb") as a, open(self.path(f"ckpt2/{name}"), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)
        self.assertIn("DONE", self.objects())
        done = json.loads(self.object_bytes("DONE"))
        self.assertEqual(done["exit_code"], 0)
        self.assertEqual(p2.wait_event("run.end")["reason"], "completed")

    def test_only_the_delta_is_uploaded_by_the_final_sync(self):
        os.makedirs(self.path("ckpt"))
        for i in range(5):
            with open(self.path(f"ckpt/old-{i}"), "w") as f:
                f.write("x" * 1000)
        p = self.vm(["--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        p.signal(signal.SIGUSR1)  # spotvisor sync
        first = p.wait_event("sync.complete", kind="on-demand")
        self.assertEqual(first["files_uploaded"], 5)
        with open(self.path("ckpt/new"), "w") as f:
            f.write("y" * 10)
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_exit()
        final = p.wait_event("sync.complete", kind="final")
        # The delta: our new file and the checkpoint the trainer wrote on SIGINT.
        trainer_ckpts = [f for f in os.listdir(self.path("ckpt")) if f.startswith("ckpt-")]
        self.assertEqual(len(trainer_ckpts), 1)
        ckpt_size = os.path.getsize(self.path("ckpt/" + trainer_ckpts[0]))
        self.assertEqual((final["files_uploaded"], final["bytes"], final["files"]), (2, 10 + ckpt_size, 7))

    def test_a_finished_run_is_not_trained_again(self):
        p = self.vm(["--checkpoint-every", "20", "--run-for", "100"], **{"on-exit": "poweroff",
                    "shutdown-command": f"echo off >> {self.path('off')}"})
        self.assertEqual(p.wait_exit(), 0)
        p.wait_event("done.written")
        p2 = self.vm(["--marker-file", self.path("marker2")], ckpt="ckpt2", **{"on-exit": "poweroff",
                     "shutdown-command": f"echo off >> {self.path('off')}"})
        self.assertEqual(p2.wait_exit(), 0)
        self.assertEqual(p2.wait_event("run.end")["reason"], "already-done")
        p2.wait_event("run.already_done")
        self.assertFalse(p2.find("trainer.start"))
        self.assertEqual(self.read("off"), "off\noff\n", "on-exit ran once per boot")

    def test_a_failed_restore_does_not_start_a_fresh_trainer(self):
        self.put_object("manifest.json", b'{"version":1,"sequence":3,"files":[{"path":"m","object":"checkpoints/m~3",'
                                         b'"size":4,"crc32c":"AAAAAA==","generation":1}]}')
        p = self.vm(["--marker-file", self.path("marker")])
        self.assertEqual(p.wait_exit(), 74)
        self.assertFalse(p.find("trainer.start"))
        self.assertEqual(self.marker_lines(), [])
        self.assertEqual(p.wait_event("run.end")["reason"], "restore-failed")
        self.assertIn("m", p.wait_event("restore.failed")["error"])

    @unittest.skipUnless(os.geteuid() == 0, "needs root to mount a small tmpfs")
    def test_a_disk_too_small_for_the_checkpoint_fails_the_restore_loudly(self):
        # A checkpoint of 3 MiB in the bucket, restored onto a 1 MiB disk.
        os.makedirs(self.path("ckpt1"))
        with open(self.path("ckpt1/weights.bin"), "wb") as f:
            f.write(os.urandom(3 * 1024 * 1024))
        # A failed run: its checkpoint is synced, but no DONE.
        p = self.vm(["--run-for", "10", "--exit-code", "1"], ckpt="ckpt1")
        self.assertEqual(p.wait_exit(), 1)
        small = self.path("small")
        os.makedirs(small)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "small", small], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", small])
        p2 = self.vm(["--marker-file", self.path("marker")], ckpt="small")
        self.assertEqual(p2.wait_exit(), 74)
        failed = p2.wait_event("restore.failed")
        self.assertIn("No space left on device", failed["error"])
        self.assertIn("weights.bin", failed["error"])
        self.assertFalse(p2.find("trainer.start"), "never a fresh start after a failed restore")
        self.assertEqual(self.marker_lines(), [])
        # Nothing half-written is left where the trainer would find it.
        self.assertNotIn("weights.bin", os.listdir(small))
        # The bucket still holds the complete checkpoint.
        self.assertEqual([f["path"] for f in self.manifest()["files"]], ["weights.bin"])

    def small_disk_with_a_commit_of(self, size):
        """A commit of weights.bin (`size` bytes) in the bucket, and a 1.5 MiB
        tmpfs for the next VM's checkpoint dir."""
        os.makedirs(self.path("ckpt1"))
        with open(self.path("ckpt1/weights.bin"), "wb") as f:
            f.write(os.urandom(size))
        p = self.vm(["--run-for", "10", "--exit-code", "1"], ckpt="ckpt1")
        self.assertEqual(p.wait_exit(), 1)
        small = self.path("small")
        os.makedirs(small)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "small", small], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", small])
        return small

    def test_a_restore_killed_mid_way_never_blocks_the_disk_for_good(self):
        # Issue #28: its preallocated FILE.spotvisor-restore.PID stayed, and
        # every later boot on that disk ended ENOSPC though the checkpoint fits.
        small = self.small_disk_with_a_commit_of(1024 * 1024)
        with open(os.path.join(small, "weights.bin.spotvisor-restore.4242"), "wb") as f:
            f.write(b"\0" * (1024 * 1024))
        p = self.vm(["--run-for", "10"], ckpt="small")
        self.assertEqual(p.wait_exit(), 0)
        done = p.wait_event("restore.complete")
        self.assertEqual(done["stale_temps_removed"], 1)
        self.assertIn("temporary file(s)", done["message"])
        self.assertEqual(sorted(os.listdir(small)), [".spotvisor-complete", "weights.bin"] if
                         os.path.exists(os.path.join(small, ".spotvisor-complete")) else ["weights.bin"])

    def test_a_stale_copy_of_a_file_makes_room_for_the_commit_that_replaces_it(self):
        # Issue #28: a stale weights.bin (a save cut off by the power-off) and
        # the download beside it did not fit; both boots ended ENOSPC.
        small = self.small_disk_with_a_commit_of(1024 * 1024)
        with open(os.path.join(small, "weights.bin"), "wb") as f:
            f.write(b"stale" * 200000)
        p = self.vm(["--run-for", "10"], ckpt="small")
        self.assertEqual(p.wait_exit(), 0)
        done = p.wait_event("restore.complete")
        self.assertEqual(done["stale_dropped"], 1)
        self.assertIn("no room for both", done["message"])
        with open(os.path.join(small, "weights.bin"), "rb") as a, open(self.path("ckpt1/weights.bin"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_a_full_disk_says_exactly_what_is_in_the_way(self):
        # What an earlier restore set aside is never deleted by spotvisor: a
        # restore with no room names it, with the numbers.
        small = self.small_disk_with_a_commit_of(1024 * 1024)
        aside = os.path.join(small, ".spotvisor-unverified", "20261101T000000Z-1")
        os.makedirs(aside)
        with open(os.path.join(aside, "weights.bin"), "wb") as f:
            f.write(b"step 7" * 170000)
        p = self.vm(["--run-for", "10"], ckpt="small")
        self.assertEqual(p.wait_exit(), 74)
        error = p.wait_event("restore.failed")["error"]
        self.assertIn("No space left on device", error)
        self.assertIn("set aside by earlier restores", error)
        self.assertIn(".spotvisor-unverified", error)
        self.assertIn("still to restore", error)
        self.assertTrue(os.path.exists(os.path.join(aside, "weights.bin")), "never deleted")

    def test_the_sync_command_asks_the_daemon_and_reports(self):
        import subprocess
        from harness import SPOTVISOR
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/weights"), "w") as f:
            f.write("w" * 123)
        p = self.vm([])
        p.wait_trainer_ready()
        out = subprocess.run([SPOTVISOR, "sync", "--state-dir", self.path("state"), "--timeout", "20s"],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"on-demand sync #1 done: 1 file\(s\), 123 bytes uploaded")
        self.assertIn("weights", [f["path"] for f in self.manifest()["files"]])
        p.signal(signal.SIGTERM)
        p.wait_exit()
        out = subprocess.run([SPOTVISOR, "sync", "--state-dir", self.path("state")], capture_output=True, text=True)
        self.assertEqual(out.returncode, 3)

    def test_periodic_syncs_while_training(self):
        p = self.vm(["--checkpoint-every", "30"], **{"sync-interval": "500ms"})
        p.wait_trainer_ready()
        p.wait_event("sync.complete", kind="periodic")
        e = wait_until(lambda: [x for x in p.find("sync.complete", kind="periodic") if x["sequence"] >= 2], what="2 periodic syncs")
        self.assertGreaterEqual(e[0]["files"], 1)
        p.signal(signal.SIGTERM)
        p.wait_exit()
        p.wait_event("sync.complete", kind="final")


class GcsSyncTest(FileSyncTest):
    """The same tests through the Cloud Storage JSON API, against the fake GCS server."""

    BUCKET = "ckpt-bucket"
    PREFIX = "exp/run1/"

    def setUp(self):
        super().setUp()
        from fake_gcs import FakeGcsServer
        self.gcs = FakeGcsServer(buckets=[self.BUCKET]).start()
        self.addCleanup(self.gcs.stop)
        # The documented override: Google's libraries read it the same way.
        self.extra_env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.gcs.port}"}

    def bucket(self):
        return f"gs://{self.BUCKET}/exp"

    def objects(self):
        return sorted(o["name"][len(self.PREFIX):] for o in self.gcs.objects(self.BUCKET, self.PREFIX))

    def object_bytes(self, name):
        return self.gcs.get_object_bytes(self.BUCKET, self.PREFIX + name)

    def put_object(self, name, data):
        self.gcs.put_object(self.BUCKET, self.PREFIX + name, data)

    def test_objects_say_what_they_are_to_someone_listing_the_bucket(self):
        os.makedirs(self.path("ckpt/checkpoint-5"))
        with open(self.path("ckpt/checkpoint-5/model.bin"), "wb") as f:
            f.write(b"m" * 1000)
        with open(self.path("ckpt/big.bin"), "wb") as f:
            f.write(os.urandom(9 * 1024 * 1024))  # past the multipart limit: a resumable upload
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        objects = {o["name"][len(self.PREFIX):]: o for o in self.gcs.objects(self.BUCKET, self.PREFIX)}
        self.assertEqual(objects["manifest.json"]["contentType"], "application/json")
        self.assertEqual(objects["DONE"]["contentType"], "application/json")
        by_path = {o.get("metadata", {}).get("spotvisor-path"): o for n, o in objects.items() if n.startswith("checkpoints/")}
        self.assertEqual(set(by_path), {"checkpoint-5/model.bin", "big.bin"})
        for o in by_path.values():
            self.assertEqual(o["contentType"], "application/octet-stream")
            self.assertEqual(o["metadata"]["spotvisor-sequence"], str(self.manifest()["sequence"]))

    def test_a_file_replaced_mid_upload_is_let_go_at_the_next_chunk(self):
        # A trainer that saves by rename (model.pt.tmp -> model.pt) while a slow upload of the
        # old model.pt runs: the upload must close the replaced file at its next chunk, so its
        # blocks are freed now (on a small disk, the next save needs them), not when the whole
        # upload would have ended. Chunks are held 3 s each; the old file has three.
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/model.pt"), "wb") as f:
            f.write(os.urandom(40 << 20))
        p = self.vm([])
        p.wait_trainer_ready()
        self.gcs.fault("slow", delay_ms=3000, upload_type="chunk")
        p.signal(signal.SIGUSR1)
        model = self.path("ckpt/model.pt")

        def holds(deleted):
            found = []
            for fd in os.listdir(f"/proc/{p.proc.pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{p.proc.pid}/fd/{fd}")
                except OSError:
                    continue
                if target == (model + " (deleted)" if deleted else model):
                    found.append(fd)
            return found

        wait_until(lambda: holds(False), what="the upload to open model.pt")
        new = os.urandom(40 << 20)
        with open(model + ".tmp", "wb") as f:
            f.write(new)
        os.rename(model + ".tmp", model)
        replaced = time.monotonic()
        # The chunk in flight ends within 3 s; the next read sees the rename. Before, the file
        # stayed open for the rest of the upload (two more chunks: 6 s and more).
        wait_until(lambda: not holds(True), timeout=4.5, what="the replaced model.pt to be closed")
        let_go = time.monotonic() - replaced
        self.gcs.fault("none")
        done = p.wait_event("sync.complete", timeout=60, kind="on-demand")
        self.assertGreaterEqual(done["attempts"], 2, "a new snapshot of the new save")
        self.assertEqual(self.object_bytes(self.manifest()["files"][0]["object"]), new)
        print(f"\nthe replaced file was let go {let_go:.2f} s after the rename")
        p.signal(signal.SIGTERM)
        p.wait_exit()

    def test_large_files_go_up_in_resumable_chunks_and_come_back_identical(self):
        os.makedirs(self.path("ckpt"))
        big = os.urandom(40 * 1024 * 1024 + 12345)  # 3 chunks of 16 MiB, the last one short
        with open(self.path("ckpt/big.bin"), "wb") as f:
            f.write(big)
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        self.assertEqual(p.wait_event("sync.complete", kind="final")["bytes"], len(big))
        kinds = [e["kind"] for e in self.gcs.log()]
        self.assertIn("resumable", kinds)
        self.assertGreaterEqual(kinds.count("chunk"), 3)
        # DONE exists now; remove it to let a second VM restore the big file.
        self.gcs.delete_object(self.BUCKET, self.PREFIX + "DONE")
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2")
        self.assertEqual(p2.wait_exit(), 0)
        with open(self.path("ckpt2/big.bin"), "rb") as f:
            self.assertEqual(f.read(), big)

    def test_a_large_file_goes_up_as_parallel_parts_composed_into_one_object(self):
        os.makedirs(self.path("ckpt"))
        big = os.urandom(40 * 1024 * 1024 + 12345)
        with open(self.path("ckpt/big.bin"), "wb") as f:
            f.write(big)
        p = self.vm(["--run-for", "10"], **{"sync-parallel-min-size": "20M", "sync-parallelism": "2"})
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        self.assertEqual(p.wait_event("sync.complete", kind="final")["bytes"], len(big))
        log = self.gcs.log()
        composes = [e for e in log if e["kind"] == "compose"]
        self.assertEqual(len(composes), 1)
        parts = sorted({e["object"] for e in log if e["kind"] == "resumable" and ".part-" in (e["object"] or "")})
        self.assertEqual([n.rsplit(".part-", 1)[1] for n in parts], ["00", "01", "02"])
        # The parts are gone; one object holds the file, described like any other.
        names = self.objects()
        self.assertFalse([n for n in names if ".part-" in n], names)
        obj = [o for o in self.gcs.objects(self.BUCKET, self.PREFIX + "checkpoints/")]
        self.assertEqual(len(obj), 1)
        self.assertEqual(obj[0].get("componentCount"), 3)
        self.assertNotIn("md5Hash", obj[0])
        self.assertEqual(obj[0]["metadata"]["spotvisor-path"], "big.bin")
        self.assertEqual(self.object_bytes(obj[0]["name"][len(self.PREFIX):]), big)
        # And a new VM gets it back byte for byte.
        self.gcs.delete_object(self.BUCKET, self.PREFIX + "DONE")
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2", **{"sync-parallel-min-size": "20M"})
        self.assertEqual(p2.wait_exit(), 0)
        with open(self.path("ckpt2/big.bin"), "rb") as f:
            self.assertEqual(f.read(), big)

    def test_faults_on_parts_and_on_compose_are_retried_and_leave_no_parts(self):
        os.makedirs(self.path("ckpt"))
        big = os.urandom(36 * 1024 * 1024)
        with open(self.path("ckpt/big.bin"), "wb") as f:
            f.write(big)
        self.gcs.fault("status", code=503, count=1, upload_type="resumable")
        self.gcs.fault("reset_mid_body", count=1, upload_type="chunk", add=True)
        # The compose happens, its answer is lost: the replay composes again.
        self.gcs.fault("reset_after", count=1, kind="compose", add=True)
        p = self.vm(["--run-for", "10"], **{"sync-parallel-min-size": "20M"})
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        self.assertEqual(len([e for e in self.gcs.log() if e["kind"] == "compose"]), 2)
        names = self.objects()
        self.assertFalse([n for n in names if ".part-" in n], names)
        self.assertEqual(self.object_bytes(self.manifest()["files"][0]["object"]), big)

    def test_kill_9_mid_parallel_upload_restores_the_previous_commit_and_its_parts_are_collected(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(b"epoch-1" * 1000)
        sets = {"sync-parallel-min-size": "20M"}
        p = self.vm(["--marker-file", self.path("marker")], **sets)
        p.wait_trainer_ready()
        p.signal(signal.SIGUSR1)
        p.wait_event("sync.complete", kind="on-demand")
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(os.urandom(40 * 1024 * 1024))
        # The two 16 MiB parts (resumable) hang; the 8 MiB last part (one
        # multipart request) lands: the power goes then.
        self.gcs.fault("slow", delay_ms=30000, upload_type="chunk", object_prefix=self.PREFIX + "checkpoints/model~2")
        p.signal(signal.SIGUSR1)
        self.assertTrue(self.gcs.wait_for_inflight(1, 20), "the upload never started")
        p.proc.kill()
        p.wait_exit()
        start = [l for l in self.marker_lines() if l.startswith("start pid=")]
        if start:
            try:
                os.killpg(int(start[0].split("pid=")[1].split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.gcs.fault("none")
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2", **sets)
        self.assertEqual(p2.wait_exit(), 0)
        self.assertEqual(p2.wait_event("restore.complete")["sequence"], 1)
        with open(self.path("ckpt2/model"), "rb") as f:
            self.assertEqual(f.read(), b"epoch-1" * 1000)
        # The run is done: nothing but what its last manifest names is left.
        live = {f["object"] for f in self.manifest()["files"]}
        self.assertEqual({n for n in self.objects() if n.startswith("checkpoints/")}, live)

    def test_a_large_object_comes_back_as_parallel_ranges_checked_as_a_whole(self):
        os.makedirs(self.path("ckpt"))
        big = os.urandom(40 * 1024 * 1024 + 12345)
        with open(self.path("ckpt/big.bin"), "wb") as f:
            f.write(big)
        p = self.vm(["--run-for", "10"], **{"sync-parallel-min-size": "0"})
        self.assertEqual(p.wait_exit(), 0)
        self.gcs.delete_object(self.BUCKET, self.PREFIX + "DONE")
        self.gcs.reset_log()
        # One range is cut mid-body: it alone is fetched again.
        self.gcs.fault("reset_mid_body", count=1, kind="download", object_prefix=self.PREFIX + "checkpoints/big")
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2", **{"sync-parallel-min-size": "20M"})
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-20:]))
        with open(self.path("ckpt2/big.bin"), "rb") as f:
            self.assertEqual(f.read(), big)
        gets = [e for e in self.gcs.log() if e["kind"] == "download" and "checkpoints/big" in (e["object"] or "")]
        done = sorted((e["headers"].get("range"), "generation" in e["query"]) for e in gets if e["status"] == 206)
        # 16 MiB parts (at least part size, at most 32 parts): three ranges, the
        # last one short; every range after the first pins the generation.
        mib16 = 16 * 1024 * 1024
        self.assertEqual(done, [(f"bytes=0-{mib16 - 1}", False),
                                (f"bytes={mib16}-{2 * mib16 - 1}", True),
                                (f"bytes={2 * mib16}-{len(big) - 1}", True)])
        self.assertEqual(len(gets), 4)  # the three, and the one that was cut

    def _restore_while_rewritten(self, replacement):
        """Issue #31: the object gets a new generation while its later ranges are held."""
        os.makedirs(self.path("ckpt"))
        big = os.urandom(40 * 1024 * 1024 + 12345)
        with open(self.path("ckpt/big.bin"), "wb") as f:
            f.write(big)
        p = self.vm(["--run-for", "10"], **{"sync-parallel-min-size": "0"})
        self.assertEqual(p.wait_exit(), 0)
        self.gcs.delete_object(self.BUCKET, self.PREFIX + "DONE")
        obj = self.manifest()["files"][0]["object"]
        self.gcs.reset_log()
        self.gcs.fault("slow", delay_ms=1500, kind="download", object_prefix=self.PREFIX + "checkpoints/big")
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2", **{"sync-parallel-min-size": "20M"})
        wait_until(lambda: any(e["kind"] == "download" and e["status"] == 206 for e in self.gcs.log()),
                   what="the first range, which pins the generation")
        self.put_object(obj, replacement(big))  # a rewrite: a new generation
        return p2, big

    def test_an_object_rewritten_with_the_same_bytes_mid_restore_is_read_at_its_new_generation(self):
        # A storage-class change or a rewrite gives the object a new generation
        # with the same bytes: the restore failed "not found" (exit 74).
        p2, big = self._restore_while_rewritten(lambda b: b)
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-20:]))
        with open(self.path("ckpt2/big.bin"), "rb") as f:
            self.assertEqual(f.read(), big)
        statuses = [e["status"] for e in self.gcs.log() if e["kind"] == "download"]
        self.assertIn(404, statuses, "a range asked for the old generation")

    def test_an_object_replaced_with_other_bytes_mid_restore_fails_the_restore_saying_so(self):
        p2, _ = self._restore_while_rewritten(lambda b: os.urandom(len(b)))
        self.assertEqual(p2.wait_exit(), 74)
        self.assertIn("was replaced during the restore", p2.wait_event("restore.failed")["message"])
        self.assertFalse(os.path.exists(self.path("ckpt2/big.bin")), "nothing of it is left as the file")

    def test_an_object_whose_size_is_not_the_manifests_fails_the_restore_loudly(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/big.bin"), "wb") as f:
            f.write(os.urandom(40 * 1024 * 1024))
        p = self.vm(["--run-for", "10"], **{"sync-parallel-min-size": "0"})
        self.assertEqual(p.wait_exit(), 0)
        self.gcs.delete_object(self.BUCKET, self.PREFIX + "DONE")
        obj = self.manifest()["files"][0]["object"]
        self.put_object(obj, os.urandom(41 * 1024 * 1024))  # someone replaced it
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2", **{"sync-parallel-min-size": "20M"})
        self.assertEqual(p2.wait_exit(), 74)
        failed = p2.wait_event("restore.failed")
        self.assertIn("not the 41943040 bytes the manifest names", failed["message"])
        self.assertFalse(os.path.exists(self.path("ckpt2/big.bin")))

    def test_a_long_sync_reports_its_progress_in_events_and_status(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(b"epoch-1")
        p = self.vm(["--marker-file", self.path("marker")], **{"sync-parallel-min-size": "0"})
        p.wait_trainer_ready()
        p.signal(signal.SIGUSR1)
        p.wait_event("sync.complete", kind="on-demand")
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(os.urandom(40 * 1024 * 1024))
        # Three 16 MiB chunks, each held 3 s by the server: the sync lasts about 9 s.
        self.gcs.fault("slow", delay_ms=3000, upload_type="chunk")
        p.signal(signal.SIGUSR1)
        prog = p.wait_event("sync.progress", timeout=30)
        self.assertEqual((prog["kind"], prog["bytes_total"], prog["files"]), ("on-demand", 40 * 1024 * 1024, 1))
        self.assertLessEqual(prog["bytes_done"], prog["bytes_total"])
        self.assertGreaterEqual(prog["elapsed_s"], 5)
        status = subprocess.run([os.environ["SPOTVISOR_BIN"], "status", "--state-dir", self.path("state")],
                                capture_output=True, text=True).stdout
        self.assertRegex(status, r"transfer:\s+on-demand sync: .* of 41\.9 MB \(\d+%\)")
        p.wait_event("sync.complete", kind="on-demand", sequence=2, timeout=60)
        self.gcs.fault("none")
        status = subprocess.run([os.environ["SPOTVISOR_BIN"], "status", "--state-dir", self.path("state"), "--json"],
                                capture_output=True, text=True).stdout
        self.assertNotIn("transfer", json.loads(status))

    def test_a_periodic_sync_cut_short_by_a_preemption_is_not_a_failure(self):
        # Issue #32: it was ERROR sync.failed ("syncing: cancelled"), which an
        # alert on sync.failed turns into a page at every preemption.
        os.makedirs(self.path("ckpt"))
        p = self.vm(["--marker-file", self.path("marker")], **{"sync-parallel-min-size": "0", "sync-interval": "1s"})
        p.wait_trainer_ready()
        self.gcs.fault("slow", delay_ms=3000, upload_type="chunk")
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(os.urandom(40 * 1024 * 1024))
        p.wait_event("sync.progress", kind="periodic", timeout=30)
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_exit(timeout=60)
        superseded = p.wait_event("sync.superseded")
        self.assertEqual(superseded["kind"], "periodic")
        self.assertIn(superseded["by"], ("final", "preemption"), "the sync that took over")
        self.assertEqual(superseded["severity"], "INFO")
        self.assertFalse(p.find("sync.failed"), "cut short by spotvisor itself is not a failure")

    def test_a_long_healthy_upload_raises_no_stall_alert(self):
        # Issue #32: an upload moving bytes the whole time was "stalled" (WARNING,
        # then ERROR), recovered, and ERROR again 1 ms later; docs/observing.md
        # suggests paging on sync.stalled. Five 16 MiB parts held 4 s each: the
        # sync lasts about 20 s against a limit of 15 s.
        os.makedirs(self.path("ckpt"))
        p = self.vm(["--marker-file", self.path("marker")],
                    **{"sync-parallel-min-size": "0", "sync-interval": "5s", "sync-alert-after": "15s"})
        p.wait_trainer_ready()
        self.gcs.fault("slow", delay_ms=4000, upload_type="chunk")
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(os.urandom(80 * 1024 * 1024))
        done = p.wait_event("sync.complete", kind="periodic", timeout=90,
                            **{"files_uploaded": 1})
        self.assertGreater(done["duration_s"], 15, "longer than sync-alert-after: the case at hand")
        self.gcs.fault("none")
        # More than a sync-alert-after of quiet training after the commit: four
        # more periodic syncs, 5 s apart, each finding nothing new.
        before = len(p.find("sync.complete", kind="periodic"))
        wait_until(lambda: len(p.find("sync.complete", kind="periodic")) >= before + 4, timeout=60,
                   what="four more periodic syncs (20 s of quiet training)")
        self.assertEqual([e["message"] for e in p.find("sync.stalled")], [], "no alert for a healthy upload")
        self.assertLessEqual(len([e for e in p.find("sync.skipped") if e.get("message", "").startswith("periodic")]), 1,
                             "a skipped periodic sync is said once per sync in flight")
        self.metadata.set("instance/preempted", "TRUE")
        p.wait_exit(timeout=60)

    def test_transient_faults_on_every_request_type_are_retried(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/small"), "w") as f:
            f.write("s" * 1000)
        with open(self.path("ckpt/big"), "wb") as f:
            f.write(os.urandom(17 * 1024 * 1024))
        self.gcs.fault("status", code=503, count=1, upload_type="multipart")
        self.gcs.fault("status", code=429, count=1, upload_type="resumable", add=True)
        self.gcs.fault("reset_mid_body", count=1, upload_type="chunk", add=True)
        self.gcs.fault("status", code=500, count=1, kind="list", add=True)
        p = self.vm(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-20:]))
        final = p.wait_event("sync.complete", kind="final")
        self.assertEqual(final["files_uploaded"], 2)
        # Downloads: a reset mid-body and a 503 on the manifest read.
        self.gcs.delete_object(self.BUCKET, self.PREFIX + "DONE")
        self.gcs.fault("reset_mid_body", count=1, kind="download", object_prefix=self.PREFIX + "checkpoints/big")
        self.gcs.fault("status", code=503, count=1, kind="download", object_prefix=self.PREFIX + "manifest", add=True)
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2")
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw[-20:]))
        with open(self.path("ckpt/big"), "rb") as a, open(self.path("ckpt2/big"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_kill_9_in_the_middle_of_a_sync_leaves_the_previous_checkpoint(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(b"epoch-1" * 1000)
        p = self.vm(["--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        p.signal(signal.SIGUSR1)
        p.wait_event("sync.complete", kind="on-demand")
        # Epoch 2 is big and its upload slow: the power goes in the middle.
        epoch2 = os.urandom(20 * 1024 * 1024)
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(epoch2)
        self.gcs.fault("slow", delay_ms=30000, upload_type="chunk")
        p.signal(signal.SIGUSR1)
        self.assertTrue(self.gcs.wait_for_inflight(1, 20), "the upload never started")
        p.proc.kill()  # SIGKILL: no final sync, no cleanup
        p.wait_exit()
        # Nobody is left to stop the trainer (that is the point of kill -9):
        # the test does, so nothing outlives it.
        start = [l for l in self.marker_lines() if l.startswith("start pid=")]
        if start:
            trainer = int(start[0].split("pid=")[1].split()[0])
            try:
                os.killpg(trainer, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.gcs.fault("none")
        p2 = self.vm(["--run-for", "10"], ckpt="ckpt2")
        self.assertEqual(p2.wait_exit(), 0)
        self.assertEqual(p2.wait_event("restore.complete")["sequence"], 1)
        with open(self.path("ckpt2/model"), "rb") as f:
            self.assertEqual(f.read(), b"epoch-1" * 1000)

    def test_a_file_rewritten_during_its_upload_is_sent_again(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/model"), "wb") as f:
            f.write(os.urandom(20 * 1024 * 1024))
        p = self.vm(["--marker-file", self.path("marker")])
        p.wait_trainer_ready()
        self.gcs.fault("slow", delay_ms=1500, upload_type="chunk", count=1)
        p.signal(signal.SIGUSR1)
        # The first chunk is being held: the old file is open and half sent.
        self.assertTrue(self.gcs.wait_for_hits("chunk", 1, 20))
        final = os.urandom(20 * 1024 * 1024)
        with open(self.path("ckpt/model.tmp"), "wb") as f:
            f.write(final)
        os.rename(self.path("ckpt/model.tmp"), self.path("ckpt/model"))  # how trainers save
        done = p.wait_event("sync.complete", kind="on-demand")
        self.assertEqual(done["files_uploaded"], 1)
        entry = [f for f in self.manifest()["files"] if f["path"] == "model"][0]
        self.assertEqual(self.object_bytes(entry["object"]), final, "the manifest points at the new bytes")
        p.signal(signal.SIGTERM)
        p.wait_exit()

    def test_a_missing_bucket_is_caught_before_training(self):
        p = self.vm(["--marker-file", self.path("marker")], bucket="gs://no-such-bucket")
        self.assertEqual(p.wait_exit(), 74)
        self.assertFalse(p.find("trainer.start"))
        self.assertIn("bucket gs://no-such-bucket does not exist", p.wait_event("restore.failed")["error"])

    def test_a_trainer_that_succeeds_but_cannot_sync_exits_73(self):
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/weights"), "w") as f:
            f.write("w")
        p = self.vm(["--run-for", "10"])
        p.wait_event("trainer.start")
        self.gcs.fault("status", code=403)  # e.g. a read-only scope
        self.assertEqual(p.wait_exit(), 73)
        failed = p.wait_event("sync.failed", kind="final")
        self.assertIn("storage-rw or storage-full", failed["error"])
        self.assertNotIn("DONE", self.objects())
        end = p.wait_event("run.end")
        self.assertEqual((end["reason"], end["severity"]), ("sync-failed", "ERROR"), "not 'completed': the work is not in the bucket")


class GcsAuthTest(SpotvisorTestCase):
    def test_the_token_comes_from_the_metadata_server_and_is_never_logged(self):
        from fake_gcs import FakeGcsServer
        gcs = FakeGcsServer(buckets=["auth-bucket"], require_token="fake-token-1").start()
        self.addCleanup(gcs.stop)
        os.makedirs(self.path("ckpt"))
        with open(self.path("ckpt/w"), "w") as f:
            f.write("w")
        # No STORAGE_EMULATOR_HOST: authentication stays on, the endpoint is configured.
        p = self.run_trainer(["--run-for", "10"], sets={
            "bucket": "gs://auth-bucket", "run-id": "r", "storage-endpoint": f"http://127.0.0.1:{gcs.port}",
            "sync-interval": "0", "sync-settle": "0s"}, env={"STORAGE_EMULATOR_HOST": ""})
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw[-15:]))
        p.wait_event("done.written")
        # The fake answers 401 to any request without "Bearer fake-token-1",
        # so a finished run means every request carried it; it was fetched
        # once and cached.
        self.assertGreater(len(gcs.log()), 3)
        self.assertFalse([e for e in gcs.log() if e["status"] in (401, 403)])
        self.assertEqual(self.metadata.hits("instance/service-accounts/default/token"), 1)
        self.assertNotIn("fake-token", "".join(p.raw) + p.stderr)


if __name__ == "__main__":
    unittest.main()

"""Save boundaries (issue #29), through the real binary against the fake
Cloud Storage server: a trainer killed mid-save by the preemption's SIGINT
(each framework's habits, tests/integration/framework_standins.py) gets only
its whole saves committed and resumes with the framework's own "resume from
latest"; a pause inside a save shorter than sync-settle never splits it; a
one-file saver faster than sync-settle is synced; a log held open never
starves a sync, and a file held open otherwise is named.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import unittest

from harness import SpotvisorTestCase, wait_until

PYTHON = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "framework_standins.py")
CKPT_TRAINER = os.path.join(HERE, "ckpt_trainer.py")

# What each framework's save of step 3 is called in the tree (None: it rewrites the same
# name, which keeps its committed version), and whether a final sync has it to leave out
# (Orbax's save in progress has a temporary name that is never scanned).
SAVE_3 = {"hf": ("checkpoint-3/", True), "lightning": ("epoch=0-step=3.ckpt", True),
          "deepspeed": ("global_step3/", True), "dcp": ("step-3/", True), "orbax": ("3/", False),
          "keras": (None, True)}
# Keras rewrites its one file in place: once save 3 has begun, no whole save is left on the
# disk, so save 2 must have been committed before (a periodic sync between saves 1.2 s apart).
EXTRA = {"keras": ["--step-time", "1.2"]}

# A one-file saver: NAME.tmp, then os.replace, every 0.2 s; each file holds its step.
RENAMER = """
import os, sys, time
d = os.environ["SPOTVISOR_CHECKPOINT_DIR"]
os.makedirs(d, exist_ok=True)
step = 0
while True:
    step += 1
    with open(os.path.join(d, "model.pt.tmp"), "wb") as f:
        f.write(b"step=%d\\n" % step + b"x" * 200000)
    os.replace(os.path.join(d, "model.pt.tmp"), os.path.join(d, "model.pt"))
    time.sleep(0.2)
"""

# Two files saved together every 2 s, and a file kept open all along: a log
# (appended, O_APPEND) or, with "w", a file written in place.
KEEPS_OPEN = """
import os, sys, time
d = os.environ["SPOTVISOR_CHECKPOINT_DIR"]
os.makedirs(d, exist_ok=True)
name, mode = sys.argv[1], sys.argv[2]
log = open(os.path.join(d, name), mode, buffering=1)
step = 0
last_save = 0
while True:
    log.write("line %d\\n" % step)
    if time.monotonic() - last_save > 2:
        step += 1
        for f in ("model.pt", "optimizer.pt"):
            with open(os.path.join(d, f), "wb") as out:
                out.write(b"step=%d\\n" % step + b"y" * 50000)
        last_save = time.monotonic()
    time.sleep(0.05)
"""


def step_of(data):
    line = data.split(b"\n", 1)[0].decode("utf-8", "replace")
    return int(line.split()[0][5:]) if line.startswith("step=") else None


class SaveBoundaryTest(SpotvisorTestCase):
    BUCKET = "ckpt-bucket"
    PREFIX = "exp/run1/"

    def setUp(self):
        super().setUp()
        from fake_gcs import FakeGcsServer
        self.gcs = FakeGcsServer(buckets=[self.BUCKET]).start()
        self.addCleanup(self.gcs.stop)
        self.store_env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.gcs.port}"}

    def vm(self, command, ckpt="ckpt", **sets):
        base = {"bucket": f"gs://{self.BUCKET}/exp", "run-id": "run1", "checkpoint-dir": self.path(ckpt),
                "state-dir": self.path(f"state-{ckpt}"), "sync-interval": "0", "sync-settle": "2s"}
        base.update(sets)
        return self.start(["run"] + self.base_sets(**base) + ["--"] + command, env=self.store_env)

    def log_lines(self, name):
        try:
            with open(self.path(name)) as f:
                return [l.strip() for l in f if l.strip()]
        except FileNotFoundError:
            return []

    def manifest(self):
        return json.loads(self.gcs.get_object_bytes(self.BUCKET, self.PREFIX + "manifest.json"))

    def committed(self):
        return {f["path"]: self.gcs.get_object_bytes(self.BUCKET, self.PREFIX + f["object"]) for f in self.manifest()["files"]}

    def watch_commits(self, stop, seen):
        while not stop.is_set():
            try:
                gen = self.gcs.object_resource(self.BUCKET, self.PREFIX + "manifest.json")["generation"]
                if gen not in seen:
                    seen[gen] = self.committed()
            except Exception:  # not there yet, or replaced between the two reads
                pass
            stop.wait(0.05)

    # ------------------------------------------------------------------ tests
    def test_each_framework_killed_mid_save_commits_only_whole_saves_and_resumes_from_latest(self):
        for framework, (torn, said_by_final) in SAVE_3.items():
            with self.subTest(framework=framework):
                log = f"{framework}.log"
                ckpt = f"ckpt-{framework}"
                self.metadata.set("instance/preempted", "FALSE")
                p = self.vm([PYTHON, STANDINS, "--framework", framework, "--log", self.path(log), "--save-every", "1",
                             "--stall-at", "3"] + EXTRA.get(framework, []),
                            ckpt=ckpt, **{"run-id": f"run-{framework}", "sync-interval": "1s"})
                # Save 3 stalls half-way through its biggest file; the
                # preemption's SIGINT lands there, and the trainer (no signal
                # handler, as nobody writes one) dies of KeyboardInterrupt.
                wait_until(lambda: "stalled 3" in self.log_lines(log), timeout=30, what=f"{framework}: save 3 under way")
                self.wait_parked()
                self.metadata.set("instance/preempted", "TRUE")
                self.assertEqual(p.wait_exit(30), 130)
                exit_event = p.wait_event("trainer.exit")
                self.assertEqual(exit_event.get("signal"), "SIGINT", "the trainer died of the signal")
                # One event says what the final sync left out: sync.left_out
                # when it committed other saves, sync.deferred when the
                # periodic syncs had committed them already.
                p.wait_event("run.end")
                said = [e["message"] for e in p.find("sync.left_out", kind="final") + p.find("sync.deferred", kind="final")]
                if said_by_final:
                    self.assertEqual(len(said), 1, said)
                    self.assertIn((torn or "model.keras").rstrip("/"), said[0])
                self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
                prefix = f"exp/run-{framework}/"
                m = json.loads(self.gcs.get_object_bytes(self.BUCKET, prefix + "manifest.json"))
                paths = [f["path"] for f in m["files"]]
                if torn:
                    self.assertFalse([x for x in paths if x.startswith(torn)], f"{framework}: the torn save is not committed")
                self.assertTrue(paths, f"{framework}: the whole saves are")

                # A new VM restores the commit; the framework's own "resume
                # from latest" finds a whole checkpoint of save 2.
                self.metadata.set("instance/preempted", "FALSE")
                log2 = f"{framework}-2.log"
                p2 = self.vm([PYTHON, STANDINS, "--framework", framework, "--log", self.path(log2), "--resume-only"],
                             ckpt=f"{ckpt}-2", **{"run-id": f"run-{framework}"})
                self.assertEqual(p2.wait_exit(30), 0, self.log_lines(log2))
                self.assertEqual(self.log_lines(log2)[0], "resumed 2")

    def test_with_the_helper_a_preemption_costs_at_most_one_step_in_every_framework(self):
        # python/spotvisor.py, reached through the PYTHONPATH spotvisor gives
        # the trainer: SIGINT sets a flag, the framework saves at the end of
        # the step under way and the trainer exits 0. Saves every 20 steps:
        # without the helper, a preemption at step 25 would cost 5 steps.
        for framework in ("hf", "lightning", "plain", "deepspeed", "dcp", "orbax", "keras"):
            with self.subTest(framework=framework):
                log = f"helper-{framework}.log"
                self.metadata.set("instance/preempted", "FALSE")
                p = self.vm([PYTHON, STANDINS, "--framework", framework, "--log", self.path(log), "--helper",
                             "--save-every", "20", "--step-time", "0.05"],
                            ckpt=f"helper-{framework}", **{"run-id": f"helper-{framework}"})
                try:
                    wait_until(lambda: "step 25" in self.log_lines(log), timeout=60, what=f"{framework}: step 25")
                except AssertionError as e:
                    raise AssertionError(f"{e}; trainer log: {self.log_lines(log)[-5:]}; spotvisor: "
                                         + "".join(p.raw[-15:]) + p.stderr) from None
                self.wait_parked()
                self.metadata.set("instance/preempted", "TRUE")
                p.wait_exit(30)
                self.assertEqual(p.wait_event("trainer.exit")["exit_code"], 0, self.log_lines(log)[-5:])
                self.assertEqual(p.wait_event("run.end")["reason"], "preempted")
                p.wait_event("sync.complete", kind="final")
                last = max(int(l.split()[1]) for l in self.log_lines(log) if l.startswith("step "))
                self.assertIn(f"saving {last}", self.log_lines(log), "saved at the end of the step under way")

                self.metadata.set("instance/preempted", "FALSE")
                log2 = f"helper-{framework}-2.log"
                p2 = self.vm([PYTHON, STANDINS, "--framework", framework, "--log", self.path(log2), "--resume-only"],
                             ckpt=f"helper-{framework}-2", **{"run-id": f"helper-{framework}"})
                self.assertEqual(p2.wait_exit(30), 0)
                resumed = int(self.log_lines(log2)[0].split()[1])
                self.assertLessEqual(last - resumed, 1, f"{framework}: trained to step {last}, resumed from {resumed}")

    def test_a_pause_inside_a_save_shorter_than_sync_settle_never_splits_it(self):
        # model.pt, a 1 s pause (an evaluation, a barrier), optimizer.pt; then
        # 2.5 s until the next save. Periodic syncs every 0.3 s with
        # sync-settle 2 s must commit only between saves.
        stop = threading.Event()
        seen = {}
        watcher = threading.Thread(target=self.watch_commits, args=(stop, seen))
        watcher.start()
        try:
            p = self.vm([PYTHON, CKPT_TRAINER, "--log", self.path("two.log"), "--layout", "two", "--gap", "1.0",
                         "--every", "2.5", "--size", "100000"], **{"sync-interval": "300ms"})
            wait_until(lambda: len(p.find("sync.complete", kind="periodic", judged_by="settle")) >= 2, timeout=40,
                       what="two periodic commits")
            p.signal(signal.SIGTERM)
            p.wait_exit(30)
        finally:
            stop.set()
            watcher.join()
        self.assertGreaterEqual(len(seen), 2)
        for files in seen.values():
            steps = {step_of(data) for data in files.values()}
            self.assertEqual(len(steps), 1, f"a commit mixes saves: {sorted(map(str, steps))}")
        deferred = [e["reason"] for e in p.find("sync.deferred", kind="periodic")]
        self.assertTrue(any("changed within sync-settle" in r and "model.pt" in r for r in deferred), deferred)

    def test_a_one_file_saver_faster_than_sync_settle_is_synced_before_a_power_off(self):
        script = self.path("renamer.py")
        with open(script, "w") as f:
            f.write(RENAMER)
        # sync-settle is the default 10 s: the tree never settles.
        p = self.vm([PYTHON, script], **{"sync-interval": "3s", "sync-settle": "10s"})
        first = p.wait_event("sync.complete", timeout=20, kind="periodic", judged_by="one-file")
        self.assertGreaterEqual(first["files_uploaded"], 1)
        self.assertFalse(p.find("sync.settle_defeated"))
        # A hard power-off: spotvisor and the trainer die at once.
        p.kill()
        subprocess.run(["pkill", "-9", "-f", script], check=False)
        files = self.committed()
        self.assertEqual(list(files), ["model.pt"])
        self.assertEqual(len(files["model.pt"]), len(b"step=%d\n" % step_of(files["model.pt"])) + 200000, "whole")

    def test_a_log_held_open_for_appending_never_holds_a_sync_back_and_goes_up_at_the_end(self):
        script = self.path("keeps_open.py")
        with open(script, "w") as f:
            f.write(KEEPS_OPEN)
        p = self.vm([PYTHON, script, "train.log", "a"], **{"sync-interval": "500ms", "sync-settle": "1s"})
        periodic = p.wait_event("sync.complete", timeout=20, kind="periodic", judged_by="settle")
        self.assertGreaterEqual(periodic["files_uploaded"], 2)
        self.assertNotIn("train.log", self.committed(), "a log still open is not taken")
        self.assertFalse(p.find("sync.settle_defeated"))
        p.signal(signal.SIGTERM)  # the trainer gets SIGINT and, with no handler, dies of it
        p.wait_exit(30)
        p.wait_event("sync.complete", kind="final")
        files = self.committed()
        self.assertIn("train.log", files, "closed at the end: synced")
        self.assertTrue(files["train.log"].startswith(b"line 0\n"))

    def test_a_file_held_open_for_writing_is_named_in_the_deferral_and_the_warning(self):
        script = self.path("keeps_open.py")
        with open(script, "w") as f:
            f.write(KEEPS_OPEN)
        p = self.vm([PYTHON, script, "metrics.csv", "w"], **{"sync-interval": "300ms", "sync-settle": "1s"})
        warning = p.wait_event("sync.settle_defeated", timeout=30)
        self.assertIn('"metrics.csv" stay open for writing', warning["message"])
        self.assertIn("appending", warning["message"])
        deferred = p.find("sync.deferred", kind="periodic")
        self.assertTrue(any('"metrics.csv" open for writing' in e["reason"] for e in deferred), deferred)
        p.signal(signal.SIGTERM)
        p.wait_exit(30)


if __name__ == "__main__":
    unittest.main()

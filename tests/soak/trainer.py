"""The soak's trainer: saves checkpoints in one of the layouts of layouts.py
and records what it did, so the soak can judge spotvisor afterwards.

    /usr/bin/python3 tests/soak/trainer.py CONFIG.json

Run by spotvisor as the trainer command (Debian's python3: it has crcmod).
CONFIG (written by soak.py for each boot) has the layout, the marker switch,
the content seed and sizes, `total_steps`, `interval_ms` [lo, hi] between
saves, `gap_ms` (the longest pause between two files of one save),
`signal_exit` (the exit code after a stop signal), `crash` (null, or
{"after_saves": N, "mid_save": bool}: after N saves in this boot, exit 3 on
its own, with the next save half written if mid_save), `rng_seed` and `log`.

Behaviour:
- at start, with SPOTVISOR_RESUMED=1 it resumes from the newest save it finds
  in $SPOTVISOR_CHECKPOINT_DIR (for `hf`, the newest complete checkpoint-N/;
  else whatever the files say, as a trainer loading them would); with 0 it
  starts from scratch and clears the directory of its own files (as a
  script that wipes its output dir would);
- then every interval it "trains" a step and saves it; after a complete
  save it touches the completion marker if `marker` is on;
- on SIGINT/SIGTERM it finishes the save under way (or saves the step in
  progress), then exits with `signal_exit`; after `total_steps` it exits 0.

The log (JSON lines, outside the checkpoint dir, appended with one write per
line): start, resume / fresh, saved (after each complete save, marker
included), signal, crash, exit.
"""
import json
import os
import pathlib
import random
import select
import shutil
import signal
import sys
import time

import crcmod.predefined

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layouts  # noqa: E402

CHUNK = 1 << 20  # in-place writes go out in slices, so a reader can see a torn file


class Trainer:
    def __init__(self, config):
        self.c = config
        self.dir = os.environ["SPOTVISOR_CHECKPOINT_DIR"]
        self.rng = random.Random(config["rng_seed"])
        self.judge = layouts.Judge(config, crcmod.predefined.mkPredefinedCrcFun("crc-32c"))
        self.log_fd = os.open(config["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.stop_signal = None
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signo, _frame):
        if self.stop_signal is None:
            self.stop_signal = signo

    def log(self, ev, **fields):
        line = json.dumps(dict(ev=ev, time=time.time(), pid=os.getpid(), **fields)) + "\n"
        os.write(self.log_fd, line.encode())

    def marker(self):
        return os.environ.get("SPOTVISOR_CHECKPOINT_MARKER") or os.path.join(self.dir, layouts.MARKER_NAME)

    # ---------------------------------------------------------------- start
    def start(self):
        resumed = os.environ.get("SPOTVISOR_RESUMED", "")
        self.log("start", pgid=os.getpgrp(), resumed_env=resumed,
                 marker_env=os.environ.get("SPOTVISOR_CHECKPOINT_MARKER"))
        if resumed == "1":
            step, problems, _ = layouts.read_local(self.judge, self.dir)
            self.log("resume", step=step, problems=problems)
            return max(step or 0, 0)
        cleared = 0
        for name in os.listdir(self.dir):
            if name.startswith(layouts.SPOTVISOR_OWN) and name != layouts.MARKER_NAME:
                continue  # spotvisor's own (its staging copies), not the trainer's to delete
            path = os.path.join(self.dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            cleared += 1
        self.log("fresh", cleared=cleared)
        return 0

    # ----------------------------------------------------------------- save
    def write(self, rel, step, in_place=True):
        data = layouts.content(self.c["content_seed"], step, rel, layouts.file_size(self.c["sizes"], rel, step))
        path = os.path.join(self.dir, rel)
        target = path if in_place else path + layouts.TMP_SUFFIX
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view[:CHUNK])
                view = view[n:]
        finally:
            os.close(fd)
        if not in_place:
            os.replace(target, path)

    def pause_between_files(self):
        if self.c["gap_ms"] > 0:
            time.sleep(self.rng.uniform(0, self.c["gap_ms"]) / 1000)

    def save(self, step, crash_mid_save=False):
        layout = self.c["layout"]
        files = layouts.save_files(layout, step)
        if layout == "hf":
            os.makedirs(os.path.join(self.dir, f"checkpoint-{step}"), exist_ok=True)
        for i, rel in enumerate(files):
            if i:
                self.pause_between_files()
            self.write(rel, step, in_place=layout != "rename")
            if crash_mid_save and i == 0:
                self.log("crash", step=step, mid_save=True)
                os._exit(3)
        if layout == "hf":
            self.rotate()
        if self.c["marker"]:
            # docs/checkpoints.md: past the clock tick of the last write.
            time.sleep(0.02)
            pathlib.Path(self.marker()).touch()
        self.log("saved", step=step)

    def rotate(self):
        """save_total_limit: remove the oldest checkpoint-N/ beyond HF_KEEP."""
        dirs = []
        for name in os.listdir(self.dir):
            if name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit():
                dirs.append(int(name[len("checkpoint-"):]))
        for n in sorted(dirs)[:-layouts.HF_KEEP]:
            shutil.rmtree(os.path.join(self.dir, f"checkpoint-{n}"), ignore_errors=True)

    # ----------------------------------------------------------------- loop
    def wait(self, seconds):
        """Sleeps, but a stop signal ends the wait at once."""
        deadline = time.monotonic() + seconds
        while self.stop_signal is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            select.select([self.wake_r], [], [], left)
            try:
                while os.read(self.wake_r, 64):
                    pass
            except BlockingIOError:
                pass

    def run(self):
        step = self.start()
        print(f"soak trainer started pid={os.getpid()} step={step}", flush=True)
        crash = self.c.get("crash")
        lo, hi = self.c["interval_ms"]
        saves = 0
        while True:
            if step >= self.c["total_steps"]:
                return self.exit(0, step)
            self.wait(self.rng.uniform(lo, hi) / 1000)
            step += 1
            if crash and saves == crash["after_saves"]:
                if crash["mid_save"]:
                    self.save(step, crash_mid_save=True)
                self.log("crash", step=step, mid_save=False)
                return self.exit(3, step)
            self.save(step)
            saves += 1
            if self.stop_signal is not None:
                self.log("signal", signal=self.stop_signal)
                return self.exit(self.c["signal_exit"], step)

    def exit(self, code, step):
        self.log("exit", code=code, step=step)
        return code


def main():
    with open(sys.argv[1]) as f:
        config = json.load(f)
    sys.exit(Trainer(config).run())


if __name__ == "__main__":
    main()

"""Trainers that save exactly as the common frameworks do (issue #29), without
the frameworks: the same file names, the same order, the same temporary
names and renames, the same rotation, and real formats (safetensors, the
zip that torch.save writes, JSON), so spotvisor judges them as it would the
real ones. Where each framework's habits come from: docs/checkpoints.md's
framework table (read from their sources).

  hf         Hugging Face Trainer 4.39+: checkpoint-N/ {config.json,
             model.safetensors, training_args.bin, optimizer.pt, scheduler.pt,
             rng_state.pth, trainer_state.json (last)}, in place;
             save_total_limit=2 removes the oldest afterwards (shutil.rmtree)
  lightning  ModelCheckpoint: epoch=E-step=S.ckpt (save_top_k=2, older ones
             removed after the new one) then last.ckpt, each one torch.save
             zip written in place (Lightning 2.3 and before)
  deepspeed  global_stepN/ {mp_rank_00_model_states.pt,
             zero_pp_rank_0_mp_rank_00_optim_states.pt}, then `latest`
  dcp        torch.distributed.checkpoint: step-N/ {__0_0.distcp,
             __1_0.distcp}, then .metadata.tmp renamed to .metadata
  orbax      CheckpointManager on local disk: N.orbax-checkpoint-tmp/
             {_CHECKPOINT_METADATA, default/...}, renamed to N/; max_to_keep=2
             removes older steps afterwards
  keras      ModelCheckpoint("model.keras"): one zip written in place

No signal handler (as nobody writes one): SIGINT raises KeyboardInterrupt
wherever the trainer is, mid-save included, and Python dies of the signal.
A step takes --step-time and is logged ("step N"); every --save-every steps
the trainer saves ("saving N", "saved N in S"). Every save writes its big
file in slices with a pause between them (--slice-pause), so a save takes a
while; --stall-at N stalls the save of step N half-way through its weights
(a slow disk), so a signal lands mid-save for certain.

--helper: the framework's loop with spotvisor's callback (python/spotvisor.py;
transformers' and Lightning's loops are tests/fakes/frameworks/): SIGINT
then makes the trainer save at the end of the step and exit 0.

  plain      model.pt, one torch.save zip written in place

--resume-only: resume as the framework's own "resume from latest" does, check
that what it found is whole and of one save, print "resumed N" (or "resumed
none") and exit 0; a torn or mixed checkpoint prints "resumed BROKEN ..." and
exits 3.
"""
import argparse
import io
import json
import os
import shutil
import struct
import sys
import time
import zipfile

SLICE = 64 * 1024
FAKE_FRAMEWORKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes", "frameworks")


def log(args, text):
    with open(args.log, "a") as f:
        f.write(text + "\n")


class Slow:
    """Writes a big payload in slices, pausing between them."""

    def __init__(self, args, step):
        self.args, self.step = args, step

    def write(self, path, data, stall=False):
        with open(path, "wb") as f:  # in place, O_TRUNC
            for i in range(0, len(data), SLICE):
                f.write(data[i:i + SLICE])
                f.flush()
                if stall and i >= len(data) // 2:
                    log(self.args, f"stalled {self.step}")
                    time.sleep(60)
                time.sleep(self.args.slice_pause)


def safetensors(step, size):
    data = bytes([step % 251]) * size
    header = json.dumps({"__metadata__": {"step": str(step)},
                         "w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    return struct.pack("<Q", len(header)) + header + data


def torch_zip(step, size):
    """What torch.save writes: a zip (stored, not compressed) of data.pkl and data/0."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", json.dumps({"step": step}))
        z.writestr("archive/data/0", bytes([step % 251]) * size)
    return buf.getvalue()


def zip_step(path):
    with zipfile.ZipFile(path) as z:  # raises on a zip cut short
        if z.testzip() is not None:
            raise ValueError(f"{path}: bad member")
        return json.loads(z.read("archive/data.pkl"))["step"]


def safetensors_step(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    if len(data) != 8 + n + header["w"]["data_offsets"][1]:
        raise ValueError(f"{path}: {len(data)} bytes, not what its header says")
    return int(header["__metadata__"]["step"])


# ---- Hugging Face Trainer ----
def hf_save(args, d, step):
    out = os.path.join(d, f"checkpoint-{step}")
    os.makedirs(out, exist_ok=True)
    w = Slow(args, step)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "standin"}, f)
    w.write(os.path.join(out, "model.safetensors"), safetensors(step, args.size), stall=args.stall_at == step)
    w.write(os.path.join(out, "training_args.bin"), torch_zip(0, 100))
    w.write(os.path.join(out, "optimizer.pt"), torch_zip(step, args.size // 2))
    w.write(os.path.join(out, "scheduler.pt"), torch_zip(step, 100))
    w.write(os.path.join(out, "rng_state.pth"), torch_zip(step, 100))
    with open(os.path.join(out, "trainer_state.json"), "w") as f:  # last, a plain open("w")
        json.dump({"global_step": step, "log_history": []}, f)
    # _rotate_checkpoints: the oldest beyond save_total_limit, after the save.
    kept = sorted((int(n.split("-")[1]) for n in os.listdir(d) if n.startswith("checkpoint-")), reverse=True)
    for old in kept[2:]:
        shutil.rmtree(os.path.join(d, f"checkpoint-{old}"), ignore_errors=True)


def hf_resume(d):
    # transformers.trainer_utils.get_last_checkpoint: the highest checkpoint-N
    # directory by name, without looking inside.
    dirs = [n for n in os.listdir(d) if n.startswith("checkpoint-") and n[11:].isdigit() and os.path.isdir(os.path.join(d, n))]
    if not dirs:
        return None
    n = max(int(x[11:]) for x in dirs)
    out = os.path.join(d, f"checkpoint-{n}")
    with open(os.path.join(out, "trainer_state.json")) as f:  # Trainer.train needs it
        step = json.load(f)["global_step"]
    steps = {step, safetensors_step(os.path.join(out, "model.safetensors")), zip_step(os.path.join(out, "optimizer.pt")),
             zip_step(os.path.join(out, "scheduler.pt")), n}
    if len(steps) != 1:
        raise ValueError(f"checkpoint-{n} mixes steps {sorted(steps)}")
    return n


# ---- PyTorch Lightning ModelCheckpoint ----
def lightning_save(args, d, step):
    w = Slow(args, step)
    name = f"epoch=0-step={step}.ckpt"
    w.write(os.path.join(d, name), torch_zip(step, args.size), stall=args.stall_at == step)
    # save_top_k=2: the worst (here the oldest) goes after the new one is written.
    tops = sorted((int(n.split("step=")[1][:-5]) for n in os.listdir(d) if n.startswith("epoch=")), reverse=True)
    for old in tops[2:]:
        os.remove(os.path.join(d, f"epoch=0-step={old}.ckpt"))
    w.write(os.path.join(d, "last.ckpt"), torch_zip(step, args.size))  # save_last=True: a second full save


def lightning_resume(d):
    # ckpt_path="last": the newest last*.ckpt by mtime.
    lasts = [n for n in os.listdir(d) if n.startswith("last") and n.endswith(".ckpt")]
    if not lasts:
        return None
    newest = max(lasts, key=lambda n: os.path.getmtime(os.path.join(d, n)))
    return zip_step(os.path.join(d, newest))


# ---- DeepSpeed ----
def deepspeed_save(args, d, step):
    tag = f"global_step{step}"
    os.makedirs(os.path.join(d, tag), exist_ok=True)
    w = Slow(args, step)
    w.write(os.path.join(d, tag, "mp_rank_00_model_states.pt"), torch_zip(step, args.size), stall=args.stall_at == step)
    w.write(os.path.join(d, tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt"), torch_zip(step, args.size // 2))
    with open(os.path.join(d, "latest"), "w") as f:  # after the tag's files, a plain write
        f.write(tag)


def deepspeed_resume(d):
    p = os.path.join(d, "latest")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        tag = f.read().strip()
    steps = {zip_step(os.path.join(d, tag, "mp_rank_00_model_states.pt")),
             zip_step(os.path.join(d, tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt")), int(tag[11:])}
    if len(steps) != 1:
        raise ValueError(f"{tag} mixes steps {sorted(steps)}")
    return steps.pop()


# ---- torch.distributed.checkpoint ----
def dcp_save(args, d, step):
    out = os.path.join(d, f"step-{step}")
    os.makedirs(out, exist_ok=True)
    w = Slow(args, step)
    sizes = {}
    for rank in (0, 1):
        name = f"__{rank}_0.distcp"
        data = bytes([step % 251]) * args.size
        w.write(os.path.join(out, name), data, stall=args.stall_at == step and rank == 1)
        sizes[name] = len(data)
    tmp = os.path.join(out, ".metadata.tmp")  # the coordinator, once every rank is done
    with open(tmp, "w") as f:
        json.dump({"step": step, "files": sizes}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(out, ".metadata"))


def dcp_resume(d):
    # The caller's choice: the highest step-N whose .metadata dcp.load can read.
    dirs = sorted((int(n[5:]) for n in os.listdir(d) if n.startswith("step-") and n[5:].isdigit()), reverse=True)
    for n in dirs:
        out = os.path.join(d, f"step-{n}")
        if not os.path.exists(os.path.join(out, ".metadata")):
            continue
        with open(os.path.join(out, ".metadata")) as f:
            meta = json.load(f)
        for name, size in meta["files"].items():
            with open(os.path.join(out, name), "rb") as f:
                data = f.read()
            if len(data) != size or set(data) != {meta["step"] % 251}:
                raise ValueError(f"step-{n}/{name} is not the save .metadata describes")
        return n
    return None


# ---- Orbax CheckpointManager (local disk) ----
def orbax_save(args, d, step):
    tmp = os.path.join(d, f"{step}.orbax-checkpoint-tmp")  # v0.11.20 and later
    shutil.rmtree(tmp, ignore_errors=True)  # _create_tmp_directory removes a stale one
    os.makedirs(os.path.join(tmp, "default"))
    with open(os.path.join(tmp, "_CHECKPOINT_METADATA"), "w") as f:
        json.dump({"init_timestamp_nsecs": time.time_ns()}, f)
    Slow(args, step).write(os.path.join(tmp, "default", "array.bin"), bytes([step % 251]) * args.size,
                           stall=args.stall_at == step)
    with open(os.path.join(tmp, "default", "_METADATA"), "w") as f:
        json.dump({"step": step, "size": args.size}, f)
    os.rename(tmp, os.path.join(d, str(step)))  # AtomicRenameTemporaryPath.finalize: the commit
    # max_to_keep=2: older steps go after the new one is committed.
    steps = sorted((int(n) for n in os.listdir(d) if n.isdigit()), reverse=True)
    for old in steps[2:]:
        shutil.rmtree(os.path.join(d, str(old)), ignore_errors=True)


def orbax_resume(d):
    # latest_step(): the highest step directory whose name is final.
    steps = [int(n) for n in os.listdir(d) if n.isdigit() and os.path.isdir(os.path.join(d, n))]
    if not steps:
        return None
    n = max(steps)
    with open(os.path.join(d, str(n), "default", "_METADATA")) as f:
        meta = json.load(f)
    with open(os.path.join(d, str(n), "default", "array.bin"), "rb") as f:
        data = f.read()
    if meta["step"] != n or len(data) != meta["size"] or set(data) != {n % 251}:
        raise ValueError(f"step {n} is not the save its metadata describes")
    return n


# ---- Keras: ModelCheckpoint("model.keras"), one zip written in place ----
def keras_save(args, d, step):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:  # saving_lib: config, metadata, weights
        z.writestr("config.json", json.dumps({"step": step}))
        z.writestr("metadata.json", json.dumps({"keras_version": "3.x"}))
        z.writestr("model.weights.h5", bytes([step % 251]) * args.size)
    Slow(args, step).write(os.path.join(d, "model.keras"), buf.getvalue(), stall=args.stall_at == step)


def keras_resume(d):
    p = os.path.join(d, "model.keras")
    if not os.path.exists(p):
        return None
    with zipfile.ZipFile(p) as z:  # keras.models.load_model: a zip cut short does not open
        step = json.loads(z.read("config.json"))["step"]
        if set(z.read("model.weights.h5")) != {step % 251}:
            raise ValueError("model.keras holds weights of another step")
    return step


# ---- plain PyTorch: torch.save of one file, in place ----
def plain_save(args, d, step):
    Slow(args, step).write(os.path.join(d, "model.pt"), torch_zip(step, args.size), stall=args.stall_at == step)


def plain_resume(d):
    p = os.path.join(d, "model.pt")
    return zip_step(p) if os.path.exists(p) else None


FRAMEWORKS = {
    "hf": (hf_save, hf_resume),
    "lightning": (lightning_save, lightning_resume),
    "deepspeed": (deepspeed_save, deepspeed_resume),
    "dcp": (dcp_save, dcp_resume),
    "orbax": (orbax_save, orbax_resume),
    "keras": (keras_save, keras_resume),
    "plain": (plain_save, plain_resume),
}


def timed_save(args, save, d, step):
    t0 = time.monotonic()
    log(args, f"saving {step}")
    save(args, d, step)
    log(args, f"saved {step} in {time.monotonic() - t0:.3f}s")


def train_step(args, step):
    time.sleep(args.step_time)  # the step's work
    log(args, f"step {step}")


def run_with_helper(args, save, d, start):
    """The framework's own loop with spotvisor's callback (python/spotvisor.py):
    the stand-ins of transformers' and Lightning's loops where the libraries
    are not installed, the flag and saved() for the others."""
    import spotvisor
    step_fn = lambda step: train_step(args, step)  # noqa: E731
    if args.framework == "hf":
        from transformers import Trainer
        t = Trainer(step_fn, lambda step: timed_save(args, save, d, step), args.save_every, args.steps, start)
        t.add_callback(spotvisor.HuggingFace())
        t.train()
        return 0
    if args.framework == "lightning":
        from lightning.pytorch import ModelCheckpoint, Trainer

        def write(path, step):
            t0 = time.monotonic()
            log(args, f"saving {step}")
            Slow(args, step).write(path, torch_zip(step, args.size), stall=args.stall_at == step)
            log(args, f"saved {step} in {time.monotonic() - t0:.3f}s")

        Trainer(step_fn, write, [spotvisor.Lightning(), ModelCheckpoint(d, args.save_every)], args.steps, start).fit()
        return 0
    step = start
    while not args.steps or step < args.steps:
        step += 1
        step_fn(step)
        if step % args.save_every == 0 or spotvisor.preempted():
            timed_save(args, save, d, step)
            spotvisor.saved()
        if spotvisor.preempted():
            return 0
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=sorted(FRAMEWORKS), required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--size", type=int, default=256 * 1024)
    ap.add_argument("--slice-pause", type=float, default=0.01)
    ap.add_argument("--step-time", type=float, default=0.03)
    ap.add_argument("--save-every", type=int, default=10, help="save every N steps")
    ap.add_argument("--steps", type=int, default=0, help="exit 0 after this many steps (0: until signalled)")
    ap.add_argument("--stall-at", type=int, default=0, help="stall the save of this step half-way")
    ap.add_argument("--helper", action="store_true", help="use spotvisor's helper (python/spotvisor.py)")
    ap.add_argument("--resume-only", action="store_true")
    args = ap.parse_args()
    save, resume = FRAMEWORKS[args.framework]
    d = os.environ["SPOTVISOR_CHECKPOINT_DIR"]
    os.makedirs(d, exist_ok=True)
    try:
        start = resume(d)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, struct.error) as e:
        log(args, f"resumed BROKEN {type(e).__name__}: {e}")
        return 3
    log(args, f"resumed {start if start is not None else 'none'}")
    if args.resume_only:
        return 0
    if args.helper:
        if args.framework in ("hf", "lightning"):
            sys.path.insert(0, FAKE_FRAMEWORKS)
        return run_with_helper(args, save, d, start or 0)
    step = start or 0
    while not args.steps or step < args.steps:
        step += 1
        train_step(args, step)
        if step % args.save_every == 0:
            timed_save(args, save, d, step)
    return 0


if __name__ == "__main__":
    sys.exit(main())

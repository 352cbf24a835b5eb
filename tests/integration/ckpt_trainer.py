"""A trainer with real trainers' saving habits, for the checkpoint tests.

Layouts:
  single  latest.ckpt rewritten in place
  atomic  model.pt written as model.pt.tmp, then renamed over (torch.save to a
          temp name, then os.replace: a save needs room for two copies)
  two     model.pt then optimizer.pt, one after the other (torch.save's habit)
  hf      checkpoint-N/{model.safetensors,optimizer.pt,trainer_state.json},
          trainer_state.json last, older ones deleted (save_total_limit=2)

Every file starts with "step=N path=REL\\n", so a checker can tell whether
the files of a commit come from one save. SIGINT/SIGTERM: finish the save
under way, save once more, exit 0. Progress goes to --log (outside the
checkpoint dir): "resumed N" / "resumed none" / "resumed INCONSISTENT ...",
"saved N".
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import sys
import time

stop = False


def on_signal(signo, frame):
    global stop
    stop = True


def payload(step, rel, size):
    if rel.endswith("trainer_state.json"):
        # Hugging Face's trainer_state.json is JSON, and spotvisor checks that it parses.
        return json.dumps({"global_step": step, "path": rel}).encode()
    head = f"step={step} path={rel}\n".encode()
    body = (f"{step}:{rel};".encode() * (size // max(1, len(rel) + 8) + 1))[:max(0, size - len(head))]
    return head + body


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:  # in place, O_TRUNC: what torch.save does
        f.write(data)


def step_of(path):
    with open(path, "rb") as f:
        if f.read(1) == b"{":
            f.seek(0)
            try:
                return json.load(f)["global_step"]
            except (ValueError, KeyError):
                return None
        f.seek(0)
        line = f.readline().decode("utf-8", "replace")
    if not line.startswith("step="):
        return None
    return int(line.split()[0][5:])


def resume(args, d):
    if args.layout in ("single", "atomic"):
        p = os.path.join(d, "latest.ckpt" if args.layout == "single" else "model.pt")
        return step_of(p) if os.path.exists(p) else None
    if args.layout == "two":
        files = [os.path.join(d, n) for n in ("model.pt", "optimizer.pt")]
        if not any(os.path.exists(p) for p in files):
            return None
        steps = {step_of(p) if os.path.exists(p) else None for p in files}
        if len(steps) != 1:
            raise ValueError(f"INCONSISTENT {sorted(map(str, steps))}")
        return steps.pop()
    dirs = sorted((int(n.split("-")[1]) for n in os.listdir(d) if n.startswith("checkpoint-")), reverse=True)
    for n in dirs:
        sub = os.path.join(d, f"checkpoint-{n}")
        names = ("model.safetensors", "optimizer.pt", "trainer_state.json")
        steps = {step_of(os.path.join(sub, x)) if os.path.exists(os.path.join(sub, x)) else None for x in names}
        if steps != {n}:
            raise ValueError(f"INCONSISTENT checkpoint-{n}: {sorted(map(str, steps))}")
        return n
    return None


def save(args, d, step):
    if args.layout == "single":
        write(os.path.join(d, "latest.ckpt"), payload(step, "latest.ckpt", args.size))
    elif args.layout == "atomic":
        final = os.path.join(d, "model.pt")
        write(final + ".tmp", payload(step, "model.pt", args.size))
        os.replace(final + ".tmp", final)
    elif args.layout == "two":
        write(os.path.join(d, "model.pt"), payload(step, "model.pt", args.size))
        time.sleep(args.gap)
        write(os.path.join(d, "optimizer.pt"), payload(step, "optimizer.pt", args.size // 2))
    else:
        sub = f"checkpoint-{step}"
        for i, name in enumerate(("model.safetensors", "optimizer.pt", "trainer_state.json")):
            if i:
                time.sleep(args.gap)
            write(os.path.join(d, sub, name), payload(step, f"{sub}/{name}", args.size if i < 2 else 64))
        kept = sorted((int(n.split("-")[1]) for n in os.listdir(d) if n.startswith("checkpoint-")), reverse=True)
        for old in kept[2:]:
            shutil.rmtree(os.path.join(d, f"checkpoint-{old}"), ignore_errors=True)
    if args.marker:
        # As docs/checkpoints.md says: past the clock tick of the last write.
        time.sleep(0.02)
        pathlib.Path(os.environ["SPOTVISOR_CHECKPOINT_MARKER"]).touch()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", choices=("single", "atomic", "two", "hf"), default="two")
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--gap", type=float, default=0.0)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=0, help="exit 0 after this many saves (0: until signalled)")
    ap.add_argument("--marker", action="store_true")
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    d = os.environ["SPOTVISOR_CHECKPOINT_DIR"]
    os.makedirs(d, exist_ok=True)
    log = open(args.log, "a", buffering=1)
    try:
        start = resume(args, d) if os.environ.get("SPOTVISOR_RESUMED") == "1" else None
    except ValueError as e:
        log.write(f"resumed {e}\n")
        return 3
    log.write(f"resumed {start if start is not None else 'none'}\n")
    print("ckpt_trainer started", flush=True)
    step = start or 0
    saves = 0
    while True:
        step += 1
        save(args, d, step)
        saves += 1
        log.write(f"saved {step}\n")
        if stop or (args.steps and saves >= args.steps):
            return 0
        deadline = time.monotonic() + args.every
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.05, args.every))


if __name__ == "__main__":
    sys.exit(main())

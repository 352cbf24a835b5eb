#!/usr/bin/env python3
"""A stand-in for a real training script, written the way spotvisor expects.

- writes checkpoints to $SPOTVISOR_CHECKPOINT_DIR (atomically: temp + rename)
- resumes from the newest checkpoint found there
- on SIGINT (what spotvisor sends on preemption) finishes the current step,
  saves a checkpoint and exits 130
- draws a tqdm-like progress bar with \\r, which spotvisor collapses in its logs

Standard library only, so the demo needs nothing from PyPI.
"""
import argparse
import json
import os
import signal
import sys
import time

stop_requested = False


def on_sigint(signum, frame):
    global stop_requested
    stop_requested = True


def save(ckpt_dir, epoch, step, loss):
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, "model.ckpt")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"epoch": epoch, "step": step, "loss": loss}, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def load(ckpt_dir):
    try:
        with open(os.path.join(ckpt_dir, "model.ckpt")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--step-time", type=float, default=0.02)
    args = ap.parse_args()
    signal.signal(signal.SIGINT, on_sigint)
    ckpt_dir = os.environ.get("SPOTVISOR_CHECKPOINT_DIR", "./checkpoints")

    state = load(ckpt_dir)
    epoch, step, loss = (state["epoch"], state["step"], state["loss"]) if state else (1, 0, 2.5)
    resumed = os.environ.get("SPOTVISOR_RESUMED") == "1"
    print(f"run {os.environ.get('SPOTVISOR_RUN_ID', '?')} (SPOTVISOR_RESUMED={int(resumed)}): "
          + (f"resuming at epoch {epoch} step {step}" if state else "starting from scratch"), flush=True)

    while epoch <= args.epochs:
        while step < args.steps:
            time.sleep(args.step_time)
            step += 1
            loss *= 0.995
            done = int(20 * step / args.steps)
            sys.stdout.write(f"\repoch {epoch}: {100 * step // args.steps:3d}%|{'#' * done}{' ' * (20 - done)}| "
                             f"{step}/{args.steps} loss={loss:.4f}")
            sys.stdout.flush()
            if stop_requested:
                print(flush=True)
                save(ckpt_dir, epoch, step, loss)
                print(f"SIGINT: saved checkpoint at epoch {epoch} step {step}; exiting", flush=True)
                return 130
        print(flush=True)
        epoch, step = epoch + 1, 0
        save(ckpt_dir, epoch, step, loss)
        print(f"checkpoint saved: next epoch {epoch}, loss={loss:.4f}", flush=True)
    print("training complete", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""A PyTorch DistributedDataParallel trainer for a spotvisor gang (one process per machine).

Run it under spotvisor on every member of the gang, e.g. in the config:

    command = /usr/bin/python3 /path/ddp_train.py --steps 200

spotvisor starts it with torch.distributed's env:// variables for one process per node
(MASTER_ADDR = the first host of the gang, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK=0,
NNODES, NODE_RANK) plus SPOTVISOR_GANG, SPOTVISOR_GANG_RANK, SPOTVISOR_GANG_SIZE,
SPOTVISOR_GANG_GENERATION, SPOTVISOR_GANG_HOSTS and SPOTVISOR_GANG_HOSTFILE, and per run
SPOTVISOR_CHECKPOINT_DIR, SPOTVISOR_RESUMED and SPOTVISOR_RUN_ID. No torchrun: the process
calls init_process_group("gloo", init_method="env://") itself. Without spotvisor, set those
variables by hand (tests/integration/test_ddp_example.py starts three ranks on 127.0.0.1).

What it does, the way spotvisor expects:
- checks the environment first: with SPOTVISOR_GANG set, RANK == SPOTVISOR_GANG_RANK ==
  NODE_RANK, WORLD_SIZE == SPOTVISOR_GANG_SIZE == NNODES, LOCAL_RANK == 0, and MASTER_ADDR is
  the first of SPOTVISOR_GANG_HOSTS; otherwise it exits 2 saying what is wrong;
- resumes: every rank loads $SPOTVISOR_CHECKPOINT_DIR/ddp.ckpt if there is one (spotvisor
  restores rank 0's copy into every member's dir), else rank 0's fresh weights are broadcast
  by DDP;
- on SIGINT (spotvisor sends it to every member when any one is preempted) the handler only
  sets a flag; after every step the ranks all_reduce(MAX) their flags, so all of them stop
  after the SAME step, even when the signals arrive a step apart; rank 0 then saves the
  checkpoint (model, optimizer, step), all ranks meet at a barrier and exit 130;
- rank 0 also saves every --save-every steps and at the end (atomically: temp file, fsync,
  rename; then touches $SPOTVISOR_CHECKPOINT_MARKER); exit 0 after --steps steps in total,
  counting the steps done before a resume. Training that reaches the last step wins over a
  SIGINT in that same step (exit 0: the work is done).

Prints (one line each, for logs and tests):
    ddp: rank=1 world=3 generation=2 master=10.0.0.5:29500 resumed=1 start_step=40
    ddp: rank=1 step=41 loss=0.012345
    ddp: rank=0 saved step=50 path=/.../ddp.ckpt
    ddp: rank=1 stopped step=43 exit=130        (after SIGINT)
    ddp: rank=1 done step=200 loss=0.000012 checksum=1.23456789

The data are synthetic (a linear regression with a fixed seed; every (step, rank) draws its
own batch), so an interrupted and resumed run ends with the same weights as one that ran
through. CPU only, gloo backend, nothing downloaded.
"""
import argparse
import os
import signal
import sys
import time

stop_requested = False


def on_sigint(signum, frame):
    global stop_requested
    stop_requested = True


CKPT_NAME = "ddp.ckpt"


def check_env():
    """Returns a list of what is wrong with the environment (empty if it is usable)."""
    errors = []
    env = os.environ
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        if not env.get(name):
            errors.append(f"{name} is not set (env:// needs it)")
    if not env.get("SPOTVISOR_GANG"):
        return errors

    def same(label, names):
        values = {n: env.get(n) for n in names}
        if len(set(values.values())) != 1:
            errors.append(f"{label} differ: " + ", ".join(f"{n}={v}" for n, v in values.items()))

    same("ranks", ("RANK", "SPOTVISOR_GANG_RANK", "NODE_RANK"))
    same("sizes", ("WORLD_SIZE", "SPOTVISOR_GANG_SIZE", "NNODES"))
    if env.get("LOCAL_RANK") != "0":
        errors.append(f"LOCAL_RANK={env.get('LOCAL_RANK')}, expected 0 (one process per node)")
    hosts = [h.strip() for h in env.get("SPOTVISOR_GANG_HOSTS", "").split(",") if h.strip()]
    if not hosts:
        errors.append("SPOTVISOR_GANG_HOSTS is empty")
    else:
        if env.get("MASTER_ADDR") != hosts[0]:
            errors.append(f"MASTER_ADDR={env.get('MASTER_ADDR')} is not the first of "
                          f"SPOTVISOR_GANG_HOSTS={env.get('SPOTVISOR_GANG_HOSTS')}")
        if str(len(hosts)) != env.get("WORLD_SIZE"):
            errors.append(f"SPOTVISOR_GANG_HOSTS has {len(hosts)} hosts, WORLD_SIZE={env.get('WORLD_SIZE')}")
    for name in ("RANK", "WORLD_SIZE", "SPOTVISOR_GANG_GENERATION"):
        if env.get(name) and not env[name].isdigit():
            errors.append(f"{name}={env[name]} is not a number")
    return errors


def save(torch, ckpt_dir, state):
    """Writes the checkpoint atomically: temp file, fsync, rename, fsync of the dir, marker."""
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, CKPT_NAME)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    dir_fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    marker = os.environ.get("SPOTVISOR_CHECKPOINT_MARKER")
    if marker:
        time.sleep(0.02)  # one clock tick, so the marker is newer than the file (docs/checkpoints.md)
        with open(marker, "a"):
            os.utime(marker)
    return path


def load(torch, ckpt_dir):
    path = os.path.join(ckpt_dir, CKPT_NAME)
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="total steps, counting those before a resume")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds to sleep per step (stands in for work)")
    ap.add_argument("--save-every", type=int, default=50, help="rank 0 saves every N steps (0: only at the end)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds a collective may wait for a peer before failing (a member that died)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    # First, before the slow import of torch: a SIGINT during start-up is kept, not lost.
    signal.signal(signal.SIGINT, on_sigint)

    errors = check_env()
    if errors:
        for e in errors:
            print(f"ddp: environment error: {e}", file=sys.stderr, flush=True)
        return 2

    import datetime
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    generation = os.environ.get("SPOTVISOR_GANG_GENERATION", "0")
    resumed = os.environ.get("SPOTVISOR_RESUMED") == "1"
    ckpt_dir = os.environ.get("SPOTVISOR_CHECKPOINT_DIR", "./checkpoints")

    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout))

    torch.manual_seed(args.seed)  # the same fresh weights everywhere (DDP broadcasts rank 0's anyway)
    dim = 8
    model = torch.nn.Linear(dim, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = load(torch, ckpt_dir)
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    ddp = DDP(model)
    true_w = torch.arange(1, dim + 1, dtype=torch.float32) / dim  # what the regression should find

    print(f"ddp: rank={rank} world={world} generation={generation} "
          f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
          f"resumed={int(resumed)} start_step={step} checkpoint={'yes' if state else 'no'}", flush=True)

    def checkpoint_state():
        return {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "world_size": world, "generation": generation}

    loss_value = float("nan")
    stop = False
    flag = torch.zeros(1)
    while step < args.steps:
        g = torch.Generator().manual_seed(args.seed + 1 + step * world + rank)  # this step's batch
        x = torch.randn(32, dim, generator=g)
        y = x @ true_w + 0.01 * torch.randn(32, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x).squeeze(1), y)
        loss.backward()  # DDP averages the gradients over all ranks here
        opt.step()
        time.sleep(args.step_time)
        step += 1
        loss_value = loss.item()
        print(f"ddp: rank={rank} step={step} loss={loss_value:.6f}", flush=True)

        # Every rank learns whether any rank was asked to stop, so all stop after this step.
        flag[0] = 1.0 if stop_requested else 0.0
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0 and step < args.steps:
            stop = True
            break
        if rank == 0 and args.save_every > 0 and step % args.save_every == 0 and step < args.steps:
            path = save(torch, ckpt_dir, checkpoint_state())
            print(f"ddp: rank=0 saved step={step} path={path}", flush=True)

    if rank == 0:
        path = save(torch, ckpt_dir, checkpoint_state())
        print(f"ddp: rank=0 saved step={step} path={path}", flush=True)
    dist.barrier()  # nobody exits before rank 0's checkpoint is on disk
    if stop:
        print(f"ddp: rank={rank} stopped step={step} exit=130", flush=True)
        code = 130
    else:
        checksum = sum(p.detach().double().sum().item() for p in model.parameters())
        print(f"ddp: rank={rank} done step={step} loss={loss_value:.6f} checksum={checksum:.8f}", flush=True)
        code = 0
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())

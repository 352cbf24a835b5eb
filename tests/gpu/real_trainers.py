"""The real Hugging Face Trainer and PyTorch Lightning, on CUDA when there is
one, behind the command line of tests/integration/framework_standins.py, so
that bench/preempt_cost.py drives them as it drives the stand-ins
(`--trainer tests/gpu/real_trainers.py`). Only on a machine that has the
libraries (the lent GPU machine, tests/gpu/README.md); nothing in the default
suite imports it.

  hf         transformers.Trainer on a small GPT-2 (built from a config: no
             download), save_steps = --save-every, save_total_limit = 2;
             resumes with get_last_checkpoint + train(resume_from_checkpoint)
  lightning  a small LightningModule, ModelCheckpoint(every_n_train_steps =
             --save-every, save_last = True); resumes with ckpt_path="last"

The log says what the stand-ins say: "step N" after every optimizer step,
"saving N" when a save begins, "saved N in S" when it is written, and with
--resume-only "resumed N" (or "resumed none", or "resumed BROKEN ...", exit
3). --helper adds spotvisor's callback (python/spotvisor.py, on PYTHONPATH
through spotvisor). No signal handler otherwise, as in most trainers.
"""
import argparse
import glob
import json
import os
import sys
import time


def log(args, text):
    with open(args.log, "a") as f:
        f.write(text + "\n")


def device():
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


# ------------------------------------------------------------------ hf

def hf(args, ckpt):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 100_000  # epochs repeat it; the sampler's permutation stays small

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 512, (64,), generator=g)
            return {"input_ids": ids, "labels": ids}

    class Log(TrainerCallback):
        began = None

        def on_step_end(self, a, state, control, **kw):
            log(args, f"step {state.global_step}")
            if control.should_save:
                self.began = time.monotonic()
                log(args, f"saving {state.global_step}")
            time.sleep(args.step_time)

        def on_save(self, a, state, control, **kw):
            took = time.monotonic() - self.began if self.began else 0.0
            log(args, f"saved {state.global_step} in {took:.3f}s")

    width = max(64, min(1024, int((args.size / 4 / 12) ** 0.5) // 64 * 64))  # about --size bytes of weights
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=width, n_layer=4, n_head=4))
    last = get_last_checkpoint(ckpt) if os.path.isdir(ckpt) else None
    max_steps = 10 ** 7
    if args.resume_only:
        if last is None:
            log(args, "resumed none")
            return 0
        with open(os.path.join(last, "trainer_state.json")) as f:
            max_steps = json.load(f)["global_step"]  # load everything, train no further
    targs = TrainingArguments(output_dir=ckpt, max_steps=max_steps, save_steps=args.save_every, save_total_limit=2,
                              per_device_train_batch_size=8, report_to=[], logging_strategy="no",
                              dataloader_num_workers=0, bf16=device() == "cuda", disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=[] if args.resume_only else [Log()])
    if args.helper:
        import spotvisor
        trainer.add_callback(spotvisor.HuggingFace())
    trainer.train(resume_from_checkpoint=last)
    if args.resume_only:
        log(args, f"resumed {trainer.state.global_step}")
    return 0


# ----------------------------------------------------------- lightning

def lightning(args, ckpt):
    import torch
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    width = max(64, min(4096, int((args.size / 4 / 3) ** 0.5)))

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))

        def training_step(self, batch, i):
            x = batch[0]
            return torch.nn.functional.mse_loss(self.net(x), x)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class Log(pl.Callback):
        began = None

        def on_save_checkpoint(self, trainer, module, checkpoint):
            self.began = time.monotonic()
            log(args, f"saving {trainer.global_step}")

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            if self.began is not None:  # the save of the step before is written by now
                log(args, f"saved {trainer.global_step - 1} in {time.monotonic() - self.began:.3f}s")
                self.began = None
            log(args, f"step {trainer.global_step}")
            time.sleep(args.step_time)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4096, width)), batch_size=32)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=ckpt, every_n_train_steps=args.save_every, save_last=True)
    lasts = glob.glob(os.path.join(ckpt, "last*.ckpt"))
    max_steps = -1
    if args.resume_only:
        if not lasts:
            log(args, "resumed none")
            return 0
        newest = max(lasts, key=os.path.getmtime)  # what ckpt_path="last" takes
        max_steps = torch.load(newest, map_location="cpu", weights_only=False)["global_step"]
    callbacks = [checkpoints] + ([] if args.resume_only else [Log()])
    if args.helper:
        import spotvisor
        callbacks.append(spotvisor.Lightning())
    trainer = pl.Trainer(max_steps=max_steps if args.resume_only else 10 ** 7, max_epochs=-1, accelerator="auto",
                         devices=1, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Net(), data, ckpt_path="last" if lasts else None)
    if args.resume_only:
        log(args, f"resumed {trainer.global_step}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--framework", choices=["hf", "lightning"], required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--size", type=int, default=4 << 20, help="about this many bytes of weights")
    ap.add_argument("--step-time", type=float, default=0.05, help="a pause after each step, so saves can be timed")
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--helper", action="store_true")
    ap.add_argument("--resume-only", action="store_true")
    args = ap.parse_args()
    ckpt = os.environ["SPOTVISOR_CHECKPOINT_DIR"]
    try:
        return (hf if args.framework == "hf" else lightning)(args, ckpt)
    except Exception as e:  # noqa: BLE001  a resume that cannot load what it found is the finding
        if args.resume_only:
            log(args, f"resumed BROKEN {type(e).__name__}: {str(e)[:300]}")
            return 3
        raise


if __name__ == "__main__":
    sys.exit(main())

"""spotvisor's helper for trainers: a preemption costs at most one step.

No dependencies; spotvisor puts this file's directory on the trainer's
PYTHONPATH (any interpreter, a virtual environment too), and the .deb also
installs it where Debian's python3 finds it. One line each:

    trainer.add_callback(spotvisor.HuggingFace())       # transformers.Trainer
    pl.Trainer(callbacks=[spotvisor.Lightning()])       # PyTorch Lightning
    if spotvisor.preempted(): save(); spotvisor.saved(); break   # plain PyTorch

Importing it replaces Python's SIGINT default (KeyboardInterrupt wherever the
trainer happens to be, mid-save included) with a flag: spotvisor's SIGINT on
a preemption then lets the current step finish, the framework saves at the
end of it and stops, and the trainer exits 0. A second SIGINT raises
KeyboardInterrupt as before (Ctrl-C twice at a terminal). A handler the
trainer installed itself is left alone.

After every save it touches the completion marker ($SPOTVISOR_CHECKPOINT_MARKER),
so spotvisor syncs the save at once instead of waiting for sync-settle
(docs/checkpoints.md). Outside spotvisor (no such variable) that is a no-op.
"""
import os
import signal
import threading
import time

__all__ = ["install", "preempted", "saved", "HuggingFace", "Lightning"]

_flag = threading.Event()
_lock = threading.Lock()
_installed = False


def _on_sigint(signo, frame):
    if _flag.is_set():
        raise KeyboardInterrupt  # the second one: stop now
    _flag.set()


def install():
    """Installs the SIGINT handler (done at import; call again from a thread
    that could not: signal handlers are set from the main thread only).
    Returns whether spotvisor's handler is in place."""
    global _installed
    with _lock:
        if _installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return False  # the trainer's own handler: not ours to replace
        signal.signal(signal.SIGINT, _on_sigint)
        _installed = True
        return True


def preempted():
    """True once SIGINT came (spotvisor's stop: a preemption, maintenance, a
    stop from the laptop): save at the end of this step and exit."""
    return _flag.is_set()


def saved():
    """Says a save is complete: touches the completion marker, past the clock
    tick of the save's last write (docs/checkpoints.md, "Why the pause")."""
    marker = os.environ.get("SPOTVISOR_CHECKPOINT_MARKER")
    if not marker:
        return
    time.sleep(0.02)
    with open(marker, "a"):
        pass
    os.utime(marker, None)


def _agreed(flag):
    """Whether any rank of a torch.distributed job was preempted: every rank
    must decide the same (a save is a collective), whichever got SIGINT first."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return flag
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def HuggingFace():
    """A transformers.TrainerCallback: on SIGINT the Trainer saves
    checkpoint-N/ at the end of the current step and stops; the marker is
    touched after every save."""
    from transformers import TrainerCallback  # the trainer's own copy

    class SpotvisorCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            install()
            return control

        def on_step_end(self, args, state, control, **kwargs):
            if _agreed(preempted()):
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args, state, control, **kwargs):
            saved()
            return control

    return SpotvisorCallback()


def Lightning(filename="last.ckpt"):
    """A Lightning Callback: on SIGINT the Trainer saves `filename` (beside
    ModelCheckpoint's files, else in $SPOTVISOR_CHECKPOINT_DIR) at the end of
    the current batch and stops; the marker is touched after every save."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class SpotvisorCallback(Callback):
        def __init__(self):
            self._pending = False  # a save was being written at the last hook

        def _flush(self):
            if self._pending:
                self._pending = False
                saved()

        def setup(self, trainer, pl_module, stage):
            install()

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            self._pending = True  # called before the file is written: touched at the next hook

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._flush()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._flush()
            decide = getattr(trainer.strategy, "reduce_boolean_decision", None)
            stop = decide(preempted(), all=False) if decide else preempted()
            if stop and not trainer.should_stop:
                cb = getattr(trainer, "checkpoint_callback", None)
                d = getattr(cb, "dirpath", None) or os.environ.get("SPOTVISOR_CHECKPOINT_DIR", ".")
                trainer.save_checkpoint(os.path.join(d, filename))
                self._pending = True
                self._flush()
                trainer.should_stop = True

        def on_train_epoch_end(self, trainer, pl_module):
            self._flush()

        def on_validation_end(self, trainer, pl_module):
            self._flush()

        def on_train_end(self, trainer, pl_module):
            self._flush()

    return SpotvisorCallback()


install()

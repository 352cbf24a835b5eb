"""Lightning's callback protocol, as the fit loop drives it (stand-in)."""


class Callback:
    def setup(self, trainer, pl_module, stage): pass
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx): pass
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx): pass
    def on_train_epoch_end(self, trainer, pl_module): pass
    def on_validation_end(self, trainer, pl_module): pass
    def on_train_end(self, trainer, pl_module): pass
    def on_save_checkpoint(self, trainer, pl_module, checkpoint): pass


class _Strategy:
    def reduce_boolean_decision(self, decision, all=True):
        return decision  # one process


class ModelCheckpoint(Callback):
    """every_n_train_steps and save_last: `epoch=0-step=S.ckpt`, then `last.ckpt`, in dirpath (run last, as
    Lightning orders it)."""

    def __init__(self, dirpath, every_n_train_steps):
        self.dirpath, self.every = dirpath, every_n_train_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.every and trainer.global_step % self.every == 0:
            trainer.save_checkpoint(f"{self.dirpath}/epoch=0-step={trainer.global_step}.ckpt")
            trainer.save_checkpoint(f"{self.dirpath}/last.ckpt")  # save_last=True


class Trainer:
    """`step_fn(step)` trains one batch; `write_fn(path, step)` is the
    CheckpointIO's write (torch.save of the dumped checkpoint)."""

    def __init__(self, step_fn, write_fn, callbacks, max_steps, start_step=0):
        self.step_fn, self.write_fn = step_fn, write_fn
        # Lightning moves ModelCheckpoint callbacks to the end.
        self.callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint)] + \
                         [c for c in callbacks if isinstance(c, ModelCheckpoint)]
        self.checkpoint_callback = next((c for c in callbacks if isinstance(c, ModelCheckpoint)), None)
        self.max_steps, self.global_step = max_steps, start_step
        self.should_stop = False
        self.strategy = _Strategy()

    def save_checkpoint(self, filepath):
        checkpoint = {"global_step": self.global_step}
        for c in self.callbacks:
            c.on_save_checkpoint(self, None, checkpoint)  # before the write, as dump_checkpoint does
        self.write_fn(filepath, self.global_step)

    def fit(self):
        for c in self.callbacks:
            c.setup(self, None, "fit")
        while not self.should_stop and (self.max_steps == 0 or self.global_step < self.max_steps):
            for c in self.callbacks:
                c.on_train_batch_start(self, None, None, self.global_step)
            self.step_fn(self.global_step + 1)
            self.global_step += 1
            for c in self.callbacks:
                c.on_train_batch_end(self, None, None, None, self.global_step)
        for c in self.callbacks:
            c.on_train_end(self, None)

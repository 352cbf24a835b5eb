"""transformers' callback protocol, as Trainer._inner_training_loop drives it (stand-in)."""
from dataclasses import dataclass


@dataclass
class TrainerControl:
    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False


@dataclass
class TrainerState:
    global_step: int = 0


class TrainerCallback:
    def on_init_end(self, args, state, control, **kwargs): pass
    def on_train_begin(self, args, state, control, **kwargs): pass
    def on_train_end(self, args, state, control, **kwargs): pass
    def on_epoch_begin(self, args, state, control, **kwargs): pass
    def on_epoch_end(self, args, state, control, **kwargs): pass
    def on_step_begin(self, args, state, control, **kwargs): pass
    def on_pre_optimizer_step(self, args, state, control, **kwargs): pass
    def on_optimizer_step(self, args, state, control, **kwargs): pass
    def on_substep_end(self, args, state, control, **kwargs): pass
    def on_step_end(self, args, state, control, **kwargs): pass
    def on_evaluate(self, args, state, control, **kwargs): pass
    def on_predict(self, args, state, control, **kwargs): pass
    def on_save(self, args, state, control, **kwargs): pass
    def on_log(self, args, state, control, **kwargs): pass
    def on_prediction_step(self, args, state, control, **kwargs): pass


class Trainer:
    """The loop's shape: DefaultFlowCallback's save_steps decision in
    on_step_end, then _maybe_log_save_evaluate saves and calls on_save, then
    should_training_stop ends the loop. `step_fn()` trains one step;
    `save_fn(step)` is _save_checkpoint."""

    def __init__(self, step_fn, save_fn, save_steps, max_steps, start_step=0):
        self.step_fn, self.save_fn = step_fn, save_fn
        self.save_steps, self.max_steps = save_steps, max_steps
        self.state = TrainerState(global_step=start_step)
        self.control = TrainerControl()
        self.callbacks = []
        self.args = None

    def add_callback(self, cb):
        self.callbacks.append(cb)

    def _event(self, name):
        for cb in self.callbacks:
            result = getattr(cb, name)(self.args, self.state, self.control)
            if result is not None:
                self.control = result

    def train(self):
        self._event("on_train_begin")
        while self.max_steps == 0 or self.state.global_step < self.max_steps:
            self._event("on_step_begin")
            self.step_fn(self.state.global_step + 1)
            self.state.global_step += 1
            if self.save_steps and self.state.global_step % self.save_steps == 0:
                self.control.should_save = True  # DefaultFlowCallback
            self._event("on_step_end")
            if self.control.should_save:  # _maybe_log_save_evaluate
                self.save_fn(self.state.global_step)
                self.control.should_save = False
                self._event("on_save")
            if self.control.should_training_stop:
                break
        self._event("on_train_end")

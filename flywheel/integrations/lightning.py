"""The Lightning callback (the `lightning` extra). Two lines in a Lightning script:

    from flywheel.integrations.lightning import FlywheelCallback
    trainer = lightning.Trainer(..., callbacks=[FlywheelCallback()])

Each optimizer step (`trainer.global_step`) goes to `flywheel.progress` with the loss `training_step` returned;
each checkpoint a `ModelCheckpoint` completed, once it is on disk; and a `fit(ckpt_path=...)` resume says from which
step and file. Outside Flywheel it does nothing. `checkpoint_dir(default)` is where the job keeps checkpoints
(FLYWHEEL_CHECKPOINT_DIR): a `ModelCheckpoint(dirpath=...)` there outlives a worker.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from flywheel.integrations.steps import StepClock, checkpoint_dir

__all__ = ["FlywheelCallback", "checkpoint_dir"]


def _loss(outputs: Any) -> float | None:
    """The loss `training_step` returned: a tensor, or a mapping with a "loss" entry; None otherwise."""
    value: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(value.detach()) if hasattr(value, "detach") else None
    except (TypeError, ValueError, RuntimeError):  # a tensor of more than one value
        return None


def saved_paths(trainer: L.Trainer) -> set[str]:
    """The files every ModelCheckpoint has written and still keeps."""
    paths: set[str] = set()
    for callback in trainer.checkpoint_callbacks:
        # best_k_models: saves ranked by a monitored metric; best_model_path: also the newest save without one
        paths.update(str(p) for p in getattr(callback, "best_k_models", {}) if p)
        newest = (getattr(callback, "best_model_path", ""), getattr(callback, "last_model_path", ""))
        paths.update(str(p) for p in newest if p)
    return paths


class FlywheelCallback(L.Callback):
    def __init__(self) -> None:
        self.clock = StepClock()
        self.known: set[str] = set()  # checkpoint files already reported (or there when training started)
        self.stepped = 0  # the last optimizer step reported

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.known, self.stepped = saved_paths(trainer), trainer.global_step
        # fit(ckpt_path=...) loaded a checkpoint: its global_step is where training goes on
        self.clock.begin(trainer.global_step if trainer.ckpt_path else 0, str(trainer.ckpt_path or ""))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._report_saves(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step > self.stepped:  # an optimizer step ended this batch (not one of gradient accumulation's)
            self.stepped = step
            self.clock.finished(step)
            self.clock.loss(_loss(outputs))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._report_saves(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._report_saves(trainer)
        self.clock.flush()

    def _report_saves(self, trainer: L.Trainer) -> None:
        """ModelCheckpoint saves after the other callbacks' hooks of a step: its new files show at the next hook,
        while `global_step` is still the step they hold."""
        new = saved_paths(trainer) - self.known
        for path in sorted(new):
            self.clock.saved(trainer.global_step, path)
        self.known |= new

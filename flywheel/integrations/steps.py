"""What both callbacks share: a step is reported once, with the loss when the framework has logged one for it, and
never after the checkpoint that follows it (the event log's order is the fold's: a checkpoint at step N after step
N's record)."""

from __future__ import annotations

from dataclasses import dataclass

from flywheel import progress
from flywheel.progress import checkpoint_dir

__all__ = ["StepClock", "checkpoint_dir"]


@dataclass
class StepClock:
    """Holds the newest finished step until its loss is known or something must follow it (the next step, a save,
    the end): a framework logs the loss after its step-end hook, and only every few steps."""

    pending: int | None = None  # a finished step not reported yet
    tokens_seen: int | None = None  # the framework's count of input tokens at the last reported step
    tokens: int | None = None  # the pending step's tokens, when the framework counts them

    def finished(self, step: int, tokens_seen: int | None = None) -> None:
        """Optimizer step `step` finished (1-based); `tokens_seen`: the framework's running count, if it keeps one."""
        if self.pending is not None and self.pending != step:
            self.flush()
        if tokens_seen and self.tokens_seen is not None and tokens_seen > self.tokens_seen:
            self.tokens = tokens_seen - self.tokens_seen
        self.tokens_seen = tokens_seen or self.tokens_seen
        self.pending = step

    def loss(self, value: float | None) -> None:
        """The framework logged a training loss: the pending step's, reported now with it."""
        if self.pending is not None:
            self.flush(value)

    def flush(self, loss: float | None = None) -> None:
        if self.pending is None:
            return
        step, tokens = self.pending, self.tokens
        self.pending = self.tokens = None
        progress.step(step, loss=loss, tokens=tokens)

    def saved(self, step: int, path: str) -> None:
        """The checkpoint of `step` is complete at `path`."""
        self.flush()
        progress.checkpoint(step, path)

    @staticmethod
    def begin(resumed_step: int, path: str) -> None:
        """Training begins, from the checkpoint of `resumed_step` at `path` when above 0."""
        if resumed_step > 0:
            progress.resumed(resumed_step, path)
        else:
            progress.begin()

"""One disk save in flight (the Checkpointer's record of it: manager.py), and the state dicts a save hands to its
writer: the snapshot of live tensors, and a memory save's borrow of the disk save's staged copy of the same step."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.trainer.checkpoint.staging import snapshot_unsafe_tensors
from flywheel.trainer.checkpoint.state import AppState


@dataclass
class SaveRecord:
    step: int
    path: Path
    started: float  # monotonic time save() was entered
    blocking_call: bool  # the loop waited for the whole save
    blocking: float = 0.0  # seconds the loop was held so far
    blocking_reported: bool = False
    staged: threading.Event = field(default_factory=threading.Event)
    copy: dict[str, Any] | None = None  # the staged state (in our buffers), once `staged` is set; None: failed
    after: Future[None] | None = None  # an earlier memory save still reading the buffers this one stages into
    future: Future[None] | None = None


def staged_copy(record: SaveRecord) -> Callable[[], dict[str, Any] | None]:
    """What a memory save of the same step calls to read the disk save's staged copy (None: staging failed)."""
    def borrow() -> dict[str, Any] | None:
        record.staged.wait()
        return record.copy
    return borrow


def snapshot(app: AppState, step: int) -> dict[str, Any]:
    """The state dict after `step` for an asynchronous save: live parameters and optimizer state (staged later,
    before the next optimizer.step()), the rest copied now."""
    state = app.state_dict()
    state["step"] = step
    return snapshot_unsafe_tensors(state, app.parameter_storages())

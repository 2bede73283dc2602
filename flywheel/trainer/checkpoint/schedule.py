"""When the disk tier is due (checkpoint.everySteps, checkpoint.everySeconds), the same answer on every rank.

everySteps is judged by the step number alone. everySeconds is judged by each rank's own clock, so the ranks agree
through a MAX all-reduce that runs in the background and is read one call later: a time-based save happens one step
after some rank saw the interval elapse, at the same step everywhere, and the loop never waits for the collective.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from flywheel.spec.job import CheckpointSpec


class SaveSchedule:
    def __init__(self, cfg: CheckpointSpec, world_size: int, group: Any) -> None:
        """`group`: the gloo group of the checkpointer's small agreements (not the training group)."""
        self.cfg, self.world_size, self.group = cfg, world_size, group
        self._last_save_time = time.monotonic()
        self._generation = 0  # counts started saves; all ranks agree on it
        self._pending: tuple[dist.Work, torch.Tensor, int] | None = None

    def disk_is_due(self, step: int) -> bool:
        """Call once per step on every rank (each call starts the next agreement on the clock)."""
        by_steps = self.cfg.every_steps > 0 and step % self.cfg.every_steps == 0
        if self.cfg.every_seconds <= 0:
            return by_steps
        elapsed = time.monotonic() - self._last_save_time >= self.cfg.every_seconds
        if self.world_size == 1:
            return by_steps or elapsed
        agreed = False
        if self._pending is not None:
            work, flag, generation = self._pending
            work.wait()
            # A save started since that flag was raised already reset the clock.
            agreed = bool(flag.item()) and generation == self._generation
        flag = torch.tensor([int(elapsed)], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = (work, flag, self._generation)
        return by_steps or agreed

    def started(self) -> None:
        """A disk save started now: the interval counts from here, and an agreement raised before it is void."""
        self._last_save_time = time.monotonic()
        self._generation += 1

    def restored(self) -> None:
        """A checkpoint was restored: the interval counts from here."""
        self._last_save_time = time.monotonic()

    def close(self) -> None:
        """Collect the agreement still in flight (before the process groups are destroyed)."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None

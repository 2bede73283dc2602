"""Fires the injected faults (flywheel/contracts/faults.py) in a rank of the embedded trainer: at the start of the step
a fault names, once per fault across restarts, SIGKILL or SIGSTOP of the rank itself after a `fault` event."""

from __future__ import annotations

import os
import signal
import time

from flywheel.contracts.faults import RANK_KINDS, Fault
from flywheel.eventlog.writer import EventLog


class FaultInjector:
    """Fires this rank's faults and idles `step_delay_s` before each step. `fault_dir` must be shared by all workers
    and outlive restarts."""

    def __init__(self, faults: list[Fault], *, rank: int, fault_dir: str | None, events: EventLog,
                 step_delay_s: float = 0.0):
        self.faults = [f for f in faults if f.kind in RANK_KINDS and f.rank == rank]
        self.rank = rank
        self.fault_dir = fault_dir
        self.events = events
        self.step_delay_s = step_delay_s
        if self.faults and not fault_dir:
            raise ValueError("FLYWHEEL_FAULTS names faults but there is no FLYWHEEL_FAULT_DIR for their markers")

    def maybe_fire(self, step: int) -> None:
        """Call at the start of each step, before its forward."""
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        for fault in self.faults:
            if fault.step == step and self._claim(fault):
                self.events.emit("fault", kind=fault.kind, rank=self.rank, step=step)
                os.kill(os.getpid(), signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)

    def _claim(self, fault: Fault) -> bool:
        assert self.fault_dir is not None
        os.makedirs(self.fault_dir, exist_ok=True)
        try:
            fd = os.open(os.path.join(self.fault_dir, f"{fault.id}.fired"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        os.close(fd)
        return True

"""Where a rank's start-up goes: the seconds of each phase from the process's start to its first step.

The entry and the loop mark the end of each phase in order (`mark("rendezvous")`: the time since the previous mark);
a part measured inside a phase (`part("materialize")` within parallelize) is reported on its own and left out of
the enclosing phase. The first mark, "imports", counts from the process's start as the kernel recorded it (a rank
forked by the agent's warm zygote starts at the fork, its imports already done). Rank 0 puts the phases up to the
restore in its `start` event (`startup_seconds`, docs/contracts.md) and logs them with the first step's.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager


def process_age() -> float:
    """Seconds since this process started (its fork, for a forked one); 0.0 where /proc cannot tell."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        started_ticks = int(stat[stat.rfind(b")") + 2:].split()[19])  # field 22, starttime: clock ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class StartupClock:
    """Phase durations in the order they were marked."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        # Set at the first mark, not here: a warm zygote imports this module before it forks the rank.
        self._last: float | None = None
        self._parts = 0.0  # seconds of parts measured since the last mark

    def mark(self, phase: str) -> float:
        """Ends `phase` now: the seconds since the previous mark, less the parts measured within it."""
        now = time.perf_counter()
        last = now - process_age() if self._last is None else self._last
        seconds = max(0.0, now - last - self._parts)
        self.phases[phase] = round(self.phases.get(phase, 0.0) + seconds, 4)
        self._last, self._parts = now, 0.0
        return seconds

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """A part of the current phase reported on its own (e.g. materialisation within parallelize)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - began
            self._parts += seconds
            self.phases[name] = round(self.phases.get(name, 0.0) + seconds, 4)

    def total(self) -> float:
        return sum(self.phases.values())

    def summary(self) -> str:
        return ", ".join(f"{name} {seconds:.2f}" for name, seconds in self.phases.items())


# One per process: a rank starts once (a restart is a new process).
CLOCK = StartupClock()


def freeze_startup_objects() -> None:
    """After the first step: one full garbage collection, then every object alive (modules, the model, optimizer
    state, compiled graphs) out of the cyclic collector's reach (`gc.freeze`; TorchTitan disables automatic
    collection instead). Otherwise each later full collection scans them all: ~330k objects and ~130 ms holding the
    GIL for a Llama here, and one falling in the checkpoint writer thread stalled the training step beside it.
    Reference counting still frees what they drop; only cycles among them stay."""
    gc.collect()
    gc.freeze()

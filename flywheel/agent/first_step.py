"""Whether the ranks an agent started have trained a step: a marker file the agent names in env FLYWHEEL_STEPPED_FILE
and empties before it starts its ranks, and that a rank's first step creates (the trainer, or `flywheel.progress`
in a user script). The agent's start-up crash rule (launch.py, flywheel/contracts/startup_crashes.py) reads it when its
ranks fail: a crash before the first step, with the same reason as the last one, would only crash again."""

from __future__ import annotations

import os

ENV = "FLYWHEEL_STEPPED_FILE"
_marked = False


def mark() -> None:
    """Called after each step; creates the marker once per process (no path, or an unwritable one: nothing)."""
    global _marked
    if _marked:
        return
    _marked = True
    path = os.environ.get(ENV)
    if path:
        try:
            open(path, "ab").close()
        except OSError:
            pass


def reset(path: str) -> None:
    """The agent, before it starts its ranks ("": no marker)."""
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def stepped(path: str) -> bool:
    """Whether a rank stepped since the last reset; with no marker ("") nobody can tell: taken as stepped."""
    return not path or os.path.exists(path)

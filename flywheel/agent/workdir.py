"""The agent's own temporary folder: what one `flywheel launch` keeps on local disk while it runs (the ranks'
first-step marker, torch's per-rank log folders, the warm zygote's socket) is in one folder, removed when the agent
ends. An agent that is killed (SIGKILL: a lost worker under `flywheel run`, a test) cannot remove it, so each agent
that starts first removes the folders whose agent is gone: the folder names its agent by pid and start time (a pid
alone may have been reused since). On a cluster /tmp is the pod's and goes with it anyway.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIX = "flywheel-agent-"
OWNER = "owner"  # in each folder: "<pid> <start time>" of the agent that made it


def identity(pid: int) -> str:
    """`pid` with its start time (clock ticks since boot, /proc/PID/stat field 22); "" when no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    return f"{pid} {fields[19]}" if len(fields) > 19 else ""


def remove_orphans(root: Path) -> list[Path]:
    """Remove the agent folders under `root` whose agent is gone; the folders removed. A folder without its owner
    file (being made, or made by an older version) is left alone."""
    removed = []
    for folder in root.glob(f"{PREFIX}*"):
        try:
            owner = (folder / OWNER).read_text().strip()
        except OSError:
            continue
        pid = owner.split(" ", 1)[0]
        if pid.isdigit() and identity(int(pid)) != owner:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


@contextlib.contextmanager
def agent_dir() -> Iterator[Path]:
    """This agent's folder under the temp dir (after removing those of agents that are gone), removed on exit."""
    root = Path(tempfile.gettempdir())
    remove_orphans(root)
    own = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
    try:
        (own / OWNER).write_text(identity(os.getpid()))
        yield own
    finally:
        shutil.rmtree(own, ignore_errors=True)

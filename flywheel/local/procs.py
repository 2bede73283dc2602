"""Process-tree plumbing for the supervisor (Linux /proc; degrades to process groups elsewhere).

A worker is `flywheel launch` in its own session; torch starts each rank in yet another session, so signalling
the worker's process group reaches only the agent. Killing "the whole worker" therefore walks the process tree.
The supervisor also makes itself a child subreaper: anything orphaned below it is re-parented to it instead of
init, so it can be found and killed rather than left behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterable

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        result: int = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        return result == 0
    except (OSError, AttributeError):
        return False


def _parent_map() -> dict[int, int]:
    """pid -> ppid for every visible process."""
    parents = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses; fields resume after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        parents[int(name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """All processes below `pid` (children first, then theirs)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parent_map().items():
        children.setdefault(parent, []).append(child)
    out, frontier = [], [pid]
    while frontier:
        nxt = [c for p in frontier for c in children.get(p, ())]
        out.extend(nxt)
        frontier = nxt
    return out


def with_env(pids: Iterable[int], key: str, value: str) -> list[int]:
    """The processes among `pids` whose environment has `key=value` (those this user may read)."""
    wanted, found = f"{key}={value}".encode(), []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def rank_processes(pids: Iterable[int], rank: int) -> list[int]:
    """Global rank `rank`'s processes among `pids`: one forked by a warm zygote is named `fw-rank-<RANK>` (its
    /proc environ is the zygote's); a cold one has RANK in its environment."""
    named = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                if f.read().strip() == f"fw-rank-{rank}".encode():
                    named.append(pid)
        except OSError:
            continue
    return named or with_env(pids, "RANK", str(rank))


def signal_quietly(pid: int, sig: int, group: bool = False) -> None:
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(pid: int) -> None:
    """SIGKILL a process, its process group and every descendant at once (a lost node, not a shutdown)."""
    below = descendants(pid)
    signal_quietly(pid, signal.SIGKILL, group=True)
    signal_quietly(pid, signal.SIGKILL)
    for child in below:
        signal_quietly(child, signal.SIGKILL)


def reap_orphans(tracked: Iterable[int]) -> list[int]:
    """Kill and reap direct children that are not tracked workers: orphans re-parented to this subreaper."""
    keep = set(tracked)
    me = os.getpid()
    orphans = [pid for pid, parent in _parent_map().items() if parent == me and pid not in keep]
    for pid in orphans:
        for child in descendants(pid):
            signal_quietly(child, signal.SIGKILL)
        signal_quietly(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return orphans

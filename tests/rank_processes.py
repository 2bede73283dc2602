"""Processes as tests watch them: a process's state, whether it is alive, and the rank processes below a worker's
agent (for tests that stop or watch them: a hang, a stopped rank)."""

from __future__ import annotations

from pathlib import Path

from flywheel.local.procs import descendants


def process_state(pid: int) -> str | None:
    """The one-letter state /proc gives `pid` (R, S, T, Z...), or None once it is gone. The process may go between
    any two reads of /proc (open succeeds, read raises ProcessLookupError): every such error means gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting to be reaped (its parent may not reap it soon)."""
    state = process_state(pid)
    return state is not None and state != "Z"


def trainer_ranks(agent_pid: int) -> list[int]:
    """The rank processes below a worker's agent: forked by its warm-start zygote (named fw-rank-<RANK>), or started
    cold as `python -m flywheel.trainer` -- not the zygote, which is no rank, nor the warm client the agent started
    for a rank (stopping it would leave the rank running)."""
    ranks = []
    for pid in descendants(agent_pid):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm.startswith("fw-rank-") or (b"flywheel.trainer" in cmdline and b"flywheel.agent.warm" not in cmdline):
            ranks.append(pid)
    return ranks

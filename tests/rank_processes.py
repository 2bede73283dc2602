"""The rank processes below a worker's agent, for tests that stop or watch them (a hang, a stopped rank)."""

from __future__ import annotations

from pathlib import Path

from flywheel.local.procs import descendants


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
        if comm.startswith("fw-rank-") or (b"flywheel.trainer" in cmdline and b"flywheel.trainer.warm" not in cmdline):
            ranks.append(pid)
    return ranks

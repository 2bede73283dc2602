"""The writer thread's gathers over the checkpointer's writer group, on every rank: each rank's failure cause before
dcp.save (every rank enters it or none does), and each rank's file checksums for rank 0's commit marker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist

from flywheel.trainer.checkpoint import integrity
from flywheel.trainer.checkpoint.failure import RankCause, SaveFailed, rank_cause


def gather_causes(error: BaseException | None, rank: int, world_size: int, group: Any | None) -> list[RankCause]:
    """Every rank's cause (empty: no rank failed); one collective on `group` (None: not distributed)."""
    mine = rank_cause(rank, error) if error is not None else None
    if group is None:
        return [mine] if mine else []
    gathered: list[RankCause | None] = [None] * world_size
    dist.all_gather_object(gathered, mine, group=group)
    return [c for c in gathered if c is not None]


def gather_checksums(path: Path, rank: int, world_size: int, group: Any | None) -> dict[str, str]:
    """Every rank checksums the files it wrote (off the loop); all of them, on every rank (`group` None: not
    distributed). A rank that could not read its files fails the save with its cause (SaveFailed)."""
    mine: tuple[dict[str, str], RankCause | None]
    try:
        mine = (integrity.checksums(path, integrity.own_files(path, rank)), None)
    except OSError as err:
        mine = ({}, rank_cause(rank, err))
    parts: list[Any] = [mine]
    if group is not None:
        parts = [None] * world_size
        dist.all_gather_object(parts, mine, group=group)
    causes = [cause for _, cause in parts if cause is not None]
    if causes:
        raise SaveFailed(causes)
    return {name: crc for sums, _ in parts for name, crc in sums.items()}

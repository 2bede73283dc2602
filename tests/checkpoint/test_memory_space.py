"""The memory tier when host memory runs out: a failed write leaves nothing behind, a failing save is reported once
per cause, a host that keeps failing does not make the other hosts' copies pile up, and a listing survives files
deleted under it."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ckpt_helpers import FakeEvents, FakeMetrics, run_ranks

from flywheel.trainer.checkpoint.tiers import memory as mem
from flywheel.trainer.checkpoint.tiers import memory_file as step_format
from flywheel.trainer.checkpoint.tiers import peer

_write = step_format.write


def _no_space(path: Path, *args: Any) -> None:
    """/dev/shm filling up mid-write: part of the file is there when the write raises."""
    with open(path, "wb") as out:
        out.write(b"x" * 1000)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _state(step: int) -> dict[str, Any]:
    return {"w": torch.full((64,), float(step)), "step": step}


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.usefixtures("one_rank")
def test_a_save_without_room_leaves_no_partial_file_and_is_reported_once_per_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events, metrics = FakeEvents(), FakeMetrics()
    tier = peer.MemoryTier(tmp_path / "shm", 1, rank=0, world_size=1, ranks_per_worker=1, events=events,
                           metrics=metrics)
    own = mem.own_dir(tmp_path / "shm", 0)
    try:
        own.mkdir(parents=True)
        mem.step_file(own, 9, 1).write_bytes(b"z")  # saved before a restore to an older step: abandoned
        assert tier.save(1, _state(1), None)
        assert _files(own) == ["step-00000001-w1.bin"]
        monkeypatch.setattr(step_format, "write", _no_space)
        assert not tier.save(2, _state(2), None)
        # the partial file is gone (it held the room every later save needs); step 1 stays
        assert _files(own) == ["step-00000001-w1.bin"]
        assert tier.newest_step == 1
        stale = own / ".step-00000007-w1.bin.tmp"  # a rank killed mid-write
        stale.write_bytes(b"y" * 5000)
        assert tier.held_bytes() == mem.steps_in(own)[1][0] + 5000  # a temporary file takes room too
        assert not tier.save(3, _state(3), None)
        assert not stale.exists()  # cleaned when the next save starts
        [failed] = events.named("checkpoint_failed")  # once for the cause, not once per failing step
        assert failed["reason"] == "no_space" and failed["source"] == "memory" and failed["step"] == 2
        assert "memory copy of step 2 failed: no space left" in failed["message"]
        assert "newest complete memory copy: step 1" in failed["message"]
        assert "No space left" in failed["error"]
        assert metrics.checkpoint_failures_total.by_reason == {"no_space": 2}  # every failed save counts
        monkeypatch.setattr(step_format, "write", _write)
        assert tier.save(4, _state(4), None)
        assert _files(own) == ["step-00000004-w1.bin"]
        monkeypatch.setattr(step_format, "write", _no_space)
        assert not tier.save(5, _state(5), None)  # failing again after a save that worked: said again
        assert [e["step"] for e in events.named("checkpoint_failed")] == [2, 5]
        assert _files(own) == ["step-00000004-w1.bin"]
    finally:
        tier.close()


def test_a_failed_step_file_write_deletes_its_temporary_file(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_format, "write", _no_space)
    with pytest.raises(OSError, match="No space"):
        mem.save_file(tmp_path, 3, 1, 0, _state(3))
    assert _files(tmp_path) == []


def _one_host_full(rank: int, world_size: int, root: str) -> None:
    """Rank 1's host has no room from step 2 on; rank 0's is fine."""
    host = Path(root) / f"worker-{rank}"
    events = FakeEvents()
    tier = peer.MemoryTier(host, 1, rank=rank, world_size=world_size, ranks_per_worker=1, events=events)
    try:
        for step in range(1, 6):
            if step == 2 and rank == 1:
                step_format.write = _no_space  # type: ignore[assignment]
            assert tier.save(step, _state(step), tier.group) == (step == 1)
        # The healthy host keeps the newest complete step and the one just written, not one more per step.
        assert sorted(mem.steps_in(mem.own_dir(host, rank))) == ([1, 5] if rank == 0 else [1])
        assert sorted(mem.steps_in(mem.replica_dir(host, 1 - rank))) == ([1] if rank == 0 else [1, 5])
        assert tier.newest_step == 1
        if rank == 0:  # the committing rank reports, with the failing rank's cause
            [failed] = events.named("checkpoint_failed")
            assert failed["reason"] == "no_space" and failed["error"].startswith("rank 1: "), failed
        else:
            assert not events.named("checkpoint_failed")
        dist.barrier()
    finally:
        tier.close()


def test_one_full_host_does_not_make_the_others_memory_grow(tmp_path: Path) -> None:
    run_ranks(_one_host_full, 2, str(tmp_path), str(tmp_path))


def test_a_save_that_worked_keeps_only_its_step_whatever_the_others_world_size(tmp_path: Path) -> None:
    for step, world in ((3, 4), (9, 2), (5, 2)):  # 9: saved before a restore to step 4 (an abandoned lineage)
        mem.step_file(tmp_path, step, world).write_bytes(b"z")
    (tmp_path / ".step-00000006-w2.bin.tmp").write_bytes(b"t")
    mem.keep_only(tmp_path, {5})
    assert _files(tmp_path) == ["step-00000005-w2.bin"]


def test_a_step_file_deleted_while_listed_is_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another local rank discards a damaged copy between the listing and its stat: the inventory goes on (a raise
    there would leave the other ranks waiting in the plan's all-gather)."""
    for step in (4, 5):
        mem.step_file(tmp_path, step, 1).write_bytes(b"z" * step)
    scandir = os.scandir

    def then_deleted(path: Any) -> list[os.DirEntry[str]]:
        entries = list(scandir(path))
        mem.step_file(tmp_path, 4, 1).unlink()
        return entries

    monkeypatch.setattr(mem.os, "scandir", then_deleted)
    assert mem.steps_in(tmp_path) == {5: (5, 1)}

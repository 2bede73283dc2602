"""Several gloo ranks: FSDP2 resharding 4 -> 2, a write failing on one rank, rank-consistent due()."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ckpt_helpers import MLP, FakeEvents, assert_same_state, full_state, make_app, run_ranks, train_step

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint import store
from flywheel.trainer.checkpoint.manager import Checkpointer

pytestmark = pytest.mark.slow


def _save_at_world_4(rank: int, world_size: int, root: str) -> None:
    app, data = make_app(seed=0, rank=rank, world_size=world_size, model=MLP(), fsdp=True)
    ckpt = Checkpointer(CheckpointSpec(dir=root, every_steps=2), root)
    for step in (1, 2):
        train_step(app, data, ckpt)
    ckpt.save(2, app)  # async: staged from FSDP2's sharded DTensors while step 3 runs
    expected, consumed = full_state(app), data.consumed_samples
    train_step(app, data, ckpt)
    ckpt.close()
    if rank == 0:
        torch.save({"state": expected, "consumed": consumed}, Path(root) / "expected.pt")


def _restore_at_world_2(rank: int, world_size: int, root: str) -> None:
    app, data = make_app(seed=1, rank=rank, world_size=world_size, model=MLP(), fsdp=True)
    events = FakeEvents()
    assert Checkpointer(CheckpointSpec(dir=root), root, events=events).restore(app) == 2
    expected = torch.load(Path(root) / "expected.pt", weights_only=False)
    assert_same_state(full_state(app), expected["state"])
    assert data.consumed_samples == expected["consumed"]
    if rank == 0:
        assert events.named("restore") == [{"step": 2, "path": str(store.step_dir(root, 2)), "from_world_size": 4,
                                            "world_size": 2, "source": "disk"}]
    train_step(app, data)  # the resharded state trains


def test_fsdp2_save_at_4_restore_at_2(tmp_path: Path) -> None:
    run_ranks(_save_at_world_4, 4, str(tmp_path), str(tmp_path))
    run_ranks(_restore_at_world_2, 2, str(tmp_path), str(tmp_path))


def _failure_and_due(rank: int, world_size: int, root: str) -> None:
    events = FakeEvents()
    app, data = make_app(seed=0, rank=rank, world_size=world_size, model=MLP())
    cfg = CheckpointSpec(dir=root, every_steps=0, every_seconds=0.05, keep=10)
    ckpt = Checkpointer(cfg, root, events=events)
    train_step(app, data, ckpt)
    ckpt.save(1, app, blocking=True)

    # Rank 1's write fails after rank 0's succeeded: nobody commits, rank 0 reports rank 1's cause (its own view is
    # a follow-on error), the partial folder goes, training goes on.
    real_write = dcp.FileSystemWriter.write_data
    if rank == 1:
        def disk_full(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise OSError(errno.ENOSPC, "No space left on device")
        dcp.FileSystemWriter.write_data = disk_full  # type: ignore[method-assign]
    train_step(app, data, ckpt)
    ckpt.save(2, app)
    train_step(app, data, ckpt)
    ckpt.close()
    dcp.FileSystemWriter.write_data = real_write  # type: ignore[method-assign]
    if rank == 0:
        [failed] = events.named("checkpoint_failed")
        assert failed["step"] == 2 and "No space left on device" in failed["error"] and failed["reason"] == "no_space"
        assert failed["message"].startswith(f"checkpoint at step 2 failed: no space left on {root}")
    else:
        assert events.named("checkpoint_failed") == []
    assert [r.step for r in store.committed(root)] == [1]
    assert not store.step_dir(root, 2).exists()

    # everySeconds: rank 1's clock runs ahead and the ranks step at different paces, yet they agree.
    ckpt = Checkpointer(cfg, root, events=events)
    if rank == 1:
        ckpt._schedule._last_save_time -= 0.03
    decisions = []
    for step in range(4, 40):
        time.sleep(0.002 if rank == 0 else 0.006)
        train_step(app, data, ckpt)
        if ckpt.due(step):
            decisions.append(step)
            ckpt.save(step, app)
    ckpt.close()
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, decisions)
    assert everyone[0] == everyone[1] and len(decisions) >= 2, everyone
    committed = [r.step for r in store.committed(root)]
    assert 1 in committed and 2 not in committed and set(committed) <= {1, *decisions}


def test_failure_on_one_rank_and_rank_consistent_due(tmp_path: Path) -> None:
    run_ranks(_failure_and_due, 2, str(tmp_path), str(tmp_path))

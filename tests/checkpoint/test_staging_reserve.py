"""Staging buffers allocated before the first save (Checkpointer.restore reserves them), and one copy for a step due
for both tiers: the memory tier writes from the disk save's staged copy."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from ckpt_helpers import assert_same_state, full_state, make_app, train_step

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.staging import StagingBuffers
from flywheel.trainer.checkpoint.tiers import memory as mem


def _shapes(tensors: list[torch.Tensor]) -> Counter[tuple[tuple[int, ...], torch.dtype]]:
    return Counter((tuple(t.shape), t.dtype) for t in tensors)


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    return []


def test_the_first_stage_takes_the_reserved_buffers_and_frees_the_rest():
    state = {"a": torch.ones(4, 3), "b": {"c": torch.arange(5)}}
    buffers = StagingBuffers(pin_memory=False)
    buffers.reserve([torch.empty(4, 3), torch.empty(5, dtype=torch.int64), torch.empty(7)])
    reserved = {b.data_ptr() for pool in buffers._reserved.values() for b in pool}
    staged = buffers.stage(state)
    assert {staged["a"].data_ptr(), staged["b"]["c"].data_ptr()} <= reserved
    assert torch.equal(staged["a"], state["a"]) and torch.equal(staged["b"]["c"], state["b"]["c"])
    assert buffers.nbytes == 4 * 3 * 4 + 5 * 8  # the unmatched (7,) buffer is gone
    buffers.reserve([torch.empty(9)])  # once only
    assert buffers.nbytes == 4 * 3 * 4 + 5 * 8


@pytest.mark.usefixtures("one_rank")
def test_the_template_takes_no_optimizer_step_and_matches_what_a_save_stages():
    app, data = make_app(seed=0)
    template = app.staging_template()
    assert not app.optimizer.state  # a DCP state dict now would have taken a zero step (step counts off by one)
    train_step(app, data)
    state = app.state_dict()
    staged = _tensors(state["model"]) + _tensors(state["optim"]["state"])
    assert _shapes(template) == _shapes(staged)


@pytest.mark.usefixtures("one_rank")
def test_a_step_due_for_both_tiers_is_staged_once_and_restores_bitwise(tmp_path: Path):
    disk, shm = tmp_path / "ckpt", tmp_path / "shm"
    cfg = CheckpointSpec(dir=str(disk), every_steps=2, memory_every_steps=2, keep=2)
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, disk, memory_dir=shm)
    assert ckpt.restore(app) is None
    assert ckpt.memory is not None
    assert ckpt._buffers.nbytes > 0 and ckpt.memory._buffers.nbytes == 0  # every memory step has a disk save
    for step in range(1, 5):
        train_step(app, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, app)
            ckpt.memory.wait()
            ckpt._wait_inflight()  # each save done before the next: none skipped
    expected = full_state(app)
    ckpt.close()
    assert ckpt.memory._buffers.nbytes == 0  # it never staged a copy of its own
    assert 4 in mem.steps_in(mem.own_dir(shm, 0))
    resumed, _ = make_app(seed=1)
    again = Checkpointer(cfg, disk, memory_dir=shm)
    assert again.restore(resumed) == 4 and again.restored_path is not None
    assert_same_state(full_state(resumed), expected)
    again.close()


@pytest.mark.usefixtures("one_rank")
def test_memory_copies_between_disk_saves_reserve_their_own_buffers(tmp_path: Path):
    cfg = CheckpointSpec(dir=str(tmp_path / "ckpt"), every_steps=4, memory_every_steps=1, keep=2)
    app, _ = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path / "ckpt", memory_dir=tmp_path / "shm")
    ckpt.restore(app)
    assert ckpt.memory is not None and ckpt.memory._buffers.nbytes == ckpt._buffers.nbytes > 0
    ckpt.close()

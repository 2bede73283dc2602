"""A memory restore that fails after writing into the live state (a copy's digest is checked as its bytes land)
with no disk checkpoint to load over it: the start fails instead of training from scratch on that state; the
damaged copy is deleted, so the next start is clean."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_helpers import FakeEvents, assert_same_state, flip_byte, full_state, make_app, train_step

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.tiers import memory as mem

pytestmark = pytest.mark.usefixtures("one_rank")


def test_a_failed_memory_restore_without_a_disk_checkpoint_fails_the_start(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    cfg = CheckpointSpec(dir=str(tmp_path / "ckpt"), every_steps=100, memory_every_steps=1, keep=2)
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, cfg.dir, memory_dir=shm)
    for step in range(1, 4):
        train_step(app, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, app)
            assert ckpt.memory is not None
            ckpt.memory.wait()
    ckpt.close()
    copy = mem.step_file(mem.own_dir(shm, 0), 3, 1)
    flip_byte(copy, copy.stat().st_size - 1)  # the last tensor: every other one is written in first

    events = FakeEvents()
    resumed, _ = make_app(seed=0)
    ckpt = Checkpointer(cfg, cfg.dir, events=events, memory_dir=shm)
    with pytest.raises(RuntimeError, match=r"not start from scratch with that state.*restarting the job starts"):
        ckpt.restore(resumed)
    ckpt.close()
    assert [e["source"] for e in events.named("checkpoint_bad")] == ["memory"]

    fresh, _ = make_app(seed=0)
    initial = full_state(fresh)
    ckpt = Checkpointer(cfg, cfg.dir, memory_dir=shm)
    assert ckpt.restore(fresh) is None  # the damaged copy is gone: a clean start
    ckpt.close()
    assert_same_state(full_state(fresh), initial)

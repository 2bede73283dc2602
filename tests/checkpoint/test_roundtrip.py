"""Save/restore round trip: the resumed run continues bit for bit."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ckpt_helpers import FakeEvents, FakeMetrics, assert_same_state, full_state, make_app, train_step

from flywheel.spec import CheckpointSpec
from flywheel.trainer.checkpoint import Checkpointer
from flywheel.trainer.checkpoint_staging import StagingBuffers
from flywheel.trainer.checkpoint_store import COMMIT_MARKER, step_dir

pytestmark = pytest.mark.usefixtures("one_rank")


def _rng_draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


@pytest.mark.parametrize("async_", [True, False])
def test_resume_is_bitwise_exact(tmp_path: Path, async_: bool) -> None:
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=3, keep=3, **{"async": async_})
    events, metrics = FakeEvents(), FakeMetrics()
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path, events=events, metrics=metrics)
    losses, at_save = {}, None
    for step in range(1, 6):
        losses[step] = train_step(app, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, app)
            at_save = full_state(app), data.consumed_samples
            rng_state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    ckpt.close()
    final = full_state(app)
    # what the RNGs would have produced right after the save
    random.setstate(rng_state[0]), np.random.set_state(rng_state[1]), torch.set_rng_state(rng_state[2])
    expected_draws = _rng_draws()

    assert (step_dir(tmp_path, 3) / COMMIT_MARKER).is_file()
    assert [e["step"] for e in events.named("checkpoint")] == [3]
    assert metrics.checkpoint_last_step.value == 3
    assert len(metrics.checkpoint_blocking_seconds.values) == 1
    assert metrics.checkpoint_failures_total.value == 0

    # A fresh process: different init and RNG, then restore.
    app2, data2 = make_app(seed=123)
    events2 = FakeEvents()
    ckpt2 = Checkpointer(cfg, tmp_path, events=events2)
    assert ckpt2.restore(app2) == 3
    assert events2.named("restore") == [{"step": 3, "path": str(step_dir(tmp_path, 3)), "from_world_size": 1,
                                         "world_size": 1, "source": "disk"}]
    assert data2.consumed_samples == at_save[1]
    assert_same_state(full_state(app2), at_save[0])
    rng_now = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    draws = _rng_draws()
    assert draws[0] == expected_draws[0] and draws[1] == expected_draws[1]
    assert torch.equal(draws[2], expected_draws[2])
    random.setstate(rng_now[0]), np.random.set_state(rng_now[1]), torch.set_rng_state(rng_now[2])

    for step in range(4, 6):
        assert train_step(app2, data2, ckpt2) == losses[step], f"loss at step {step} differs after resume"
    ckpt2.close()
    assert_same_state(full_state(app2), final)


def test_async_save_captures_the_state_at_its_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training goes on while the save is staged; the checkpoint still holds the state of the save's step,
    including BatchNorm buffers that the next forward updates in place."""
    real_stage = StagingBuffers.stage

    def slow_stage(self: StagingBuffers, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)  # the next forward surely runs before the copy starts
        return real_stage(self, *args, **kwargs)

    monkeypatch.setattr(StagingBuffers, "stage", slow_stage)
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=2, keep=1)
    app, data = make_app(seed=1)
    ckpt = Checkpointer(cfg, tmp_path)
    train_step(app, data, ckpt)
    train_step(app, data, ckpt)
    expected = full_state(app)
    ckpt.save(2, app)
    for _ in range(3):  # forward runs before wait_staged, optimizer steps after it
        train_step(app, data, ckpt)
    ckpt.close()
    app2, _ = make_app(seed=2)
    assert Checkpointer(cfg, tmp_path).restore(app2) == 2
    assert_same_state(full_state(app2), expected)

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

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.staging import StagingBuffers
from flywheel.trainer.checkpoint.store import COMMIT_MARKER, step_dir

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


def test_a_restore_asks_only_for_the_rng_parts_the_checkpoint_holds(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Found on a GPU host running a CPU job: pinned staging buffers initialised CUDA after the first save's
    capture, the restore's template then asked for CUDA generator states that save never wrote, and no checkpoint
    loaded. The CUDA states now follow the model's device, and a template part the checkpoint lacks is left out."""
    from flywheel.trainer.checkpoint import state as checkpoint_state

    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=1, keep=2)
    app, data = make_app(seed=0)
    assert app.cuda_rng is False and "cuda" not in app.state_dict()["rng_rank0"]  # a CPU model
    ckpt = Checkpointer(cfg, tmp_path)
    train_step(app, data, ckpt)
    ckpt.save(1, app)
    ckpt.close()
    saved = full_state(app)
    capture = checkpoint_state.capture_rng

    def with_a_part_never_saved(cuda: bool) -> dict[str, Any]:  # as CUDA's states would be on a GPU host
        return {**capture(cuda), "cuda": [torch.zeros(8, dtype=torch.uint8)]}

    monkeypatch.setattr(checkpoint_state, "capture_rng", with_a_part_never_saved)
    app2, _ = make_app(seed=5)
    assert Checkpointer(cfg, tmp_path).restore(app2) == 1
    assert_same_state(full_state(app2), saved)


def test_drop_not_saved_keeps_what_the_checkpoint_has() -> None:
    from flywheel.trainer.checkpoint.state import drop_not_saved

    state = {"rng_rank1": {"python": 1, "torch": 2, "cuda": [3]}, "model": {}}
    drop_not_saved(state, 1, {"rng_rank1.python": 0, "rng_rank1.torch": 0, "rng_rank10.cuda.0": 0})
    assert state["rng_rank1"] == {"python": 1, "torch": 2}
    kept = {"rng_rank0": {"cuda": [3]}}
    drop_not_saved(kept, 0, {"rng_rank0.cuda.0": 0})
    assert kept == {"rng_rank0": {"cuda": [3]}}

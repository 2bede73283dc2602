"""The run's final save (train_loop._finish) and the memory tier with `async: false`: the last step always ends up
committed on disk before the memory copy is given back."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ckpt_helpers import FakeEvents, assert_same_state, full_state, make_app, train_saving, train_step

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer import train_loop
from flywheel.trainer.checkpoint import store
from flywheel.trainer.checkpoint.failure import FinalSaveFailed
from flywheel.trainer.checkpoint.manager import AppState, Checkpointer
from flywheel.trainer.checkpoint.tiers import memory as mem

pytestmark = pytest.mark.usefixtures("one_rank")
STEPS = 4


def _cfg(root: Path, **extra: Any) -> CheckpointSpec:
    return CheckpointSpec.model_validate({"dir": str(root), "everySteps": 2, "memoryEverySteps": 2, "keep": 3,
                                          **extra})


class _Metrics:
    def record_final_save(self, *, timestamp: float) -> None:
        pass


def _finish(ckpt: Checkpointer, app: AppState, start: int, events: FakeEvents) -> None:
    """train_loop._finish on a run of STEPS steps at world size 1."""
    env = SimpleNamespace(rank=0, spec=SimpleNamespace(trainer=SimpleNamespace(training=SimpleNamespace(
        steps=STEPS))))
    run = SimpleNamespace(env=env, ckpt=ckpt, app=app, model=app.model, device=torch.device("cpu"))
    train_loop._finish(cast(Any, run), start, cast(Any, events), cast(Any, _Metrics()),
                       cast(Any, SimpleNamespace(stop=lambda: None)))


def _train(ckpt: Checkpointer, app: AppState, data: Any) -> None:
    assert ckpt.memory is not None
    for step in range(1, STEPS + 1):
        train_step(app, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, app)
            ckpt._wait_inflight()  # each save lands (a real step outlasts this tiny write)
            ckpt.memory.wait()


def test_a_final_step_restored_from_memory_is_written_to_disk_before_its_memory_is_released(
        tmp_path: Path) -> None:
    disk, shm = tmp_path / "ckpt", tmp_path / "shm"
    app, data = make_app(seed=0)
    ckpt = Checkpointer(_cfg(disk), disk, memory_dir=shm)
    _train(ckpt, app, data)
    expected = full_state(app)
    ckpt.close()
    store.delete_checkpoint(store.step_dir(disk, STEPS))  # the worker died before the last disk save committed
    assert [r.step for r in store.committed(disk)] == [2]

    events = FakeEvents()
    resumed, _ = make_app(seed=1)
    ckpt = Checkpointer(_cfg(disk), disk, events=events, memory_dir=shm)
    assert ckpt.restore(resumed) == STEPS and not ckpt.on_disk(STEPS)
    _finish(ckpt, resumed, STEPS, events)
    assert [r.step for r in store.committed(disk)] == [2, STEPS]
    assert not shm.exists()  # released only once the step is on disk
    [done] = events.named("done")
    assert done["already_complete_checkpoint"] == str(store.step_dir(disk, STEPS))
    again, _ = make_app(seed=2)
    assert Checkpointer(_cfg(disk), disk).restore(again) == STEPS
    assert_same_state(full_state(again), expected)


def test_a_final_step_that_cannot_reach_disk_fails_the_run_and_keeps_its_memory_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No success without the final checkpoint: the worker fails saying why (a retry restores the memory copy and
    saves it again)."""
    disk, shm = tmp_path / "ckpt", tmp_path / "shm"
    app, data = make_app(seed=0)
    ckpt = Checkpointer(_cfg(disk), disk, memory_dir=shm)
    _train(ckpt, app, data)
    ckpt.close()
    store.delete_checkpoint(store.step_dir(disk, STEPS))
    resumed, _ = make_app(seed=1)
    ckpt = Checkpointer(_cfg(disk), disk, events=FakeEvents(), memory_dir=shm)
    assert ckpt.restore(resumed) == STEPS
    real_write = dcp.FileSystemWriter.write_data
    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    events = FakeEvents()
    with pytest.raises(FinalSaveFailed, match=rf"final checkpoint \(step {STEPS}\) was not saved: no space left on "
                       rf"{disk}.*memory copy under .* is kept"):
        _finish(ckpt, resumed, STEPS, events)
    assert events.named("done") == []
    assert [r.step for r in store.committed(disk)] == [2]
    assert list(mem.steps_in(mem.own_dir(shm, 0))) == [STEPS]  # the only copy of the last step stays

    # Room made: the retry restores the memory copy and saves it.
    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", real_write)
    again, _ = make_app(seed=2)
    ckpt = Checkpointer(_cfg(disk), disk, events=events, memory_dir=shm)
    assert ckpt.restore(again) == STEPS
    _finish(ckpt, again, STEPS, events)
    assert [r.step for r in store.committed(disk)] == [2, STEPS] and len(events.named("done")) == 1


def test_a_final_step_already_on_disk_is_not_saved_again(tmp_path: Path) -> None:
    disk, shm = tmp_path / "ckpt", tmp_path / "shm"
    app, data = make_app(seed=0)
    ckpt = Checkpointer(_cfg(disk), disk, memory_dir=shm)
    _train(ckpt, app, data)
    ckpt.close()
    marker = (store.step_dir(disk, STEPS) / store.COMMIT_MARKER).stat().st_mtime_ns
    events = FakeEvents()
    resumed, _ = make_app(seed=1)
    ckpt = Checkpointer(_cfg(disk), disk, events=events)  # no memory tier: restored from disk
    assert ckpt.restore(resumed) == STEPS and ckpt.on_disk(STEPS)
    _finish(ckpt, resumed, STEPS, events)
    assert (store.step_dir(disk, STEPS) / store.COMMIT_MARKER).stat().st_mtime_ns == marker
    [done] = events.named("done")
    assert done["already_complete_checkpoint"] == str(store.step_dir(disk, STEPS))


def test_sync_saves_keep_memory_only_steps_in_memory(tmp_path: Path) -> None:
    """`async: false` makes the due disk saves wait; a step due for the memory tier only is still a memory copy,
    not a disk checkpoint (whose retention would push out the real everySteps checkpoints)."""
    disk, shm = tmp_path / "ckpt", tmp_path / "shm"
    cfg = CheckpointSpec.model_validate({"dir": str(disk), "everySteps": 3, "memoryEverySteps": 1, "keep": 2,
                                         "async": False})
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, disk, memory_dir=shm)
    train_saving(app, data, ckpt, 5)
    assert ckpt.on_disk(3)  # the sync save of step 3 committed; steps 4 and 5 stayed memory copies
    at_5 = full_state(app)
    ckpt.close()
    assert [r.step for r in store.committed(disk)] == [3]
    assert list(mem.steps_in(mem.own_dir(shm, 0))) == [5]
    resumed, _ = make_app(seed=1)
    assert Checkpointer(cfg, disk, memory_dir=shm).restore(resumed) == 5
    assert_same_state(full_state(resumed), at_5)

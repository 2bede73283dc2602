"""Commit protocol: torn and corrupt checkpoints are never restored; retention; one save in flight; due()."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.checkpoint as dcp
from ckpt_helpers import FakeEvents, assert_same_state, full_state, make_app, train_step

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint import store
from flywheel.trainer.checkpoint.manager import Checkpointer

pytestmark = pytest.mark.usefixtures("one_rank")


def _cfg(tmp_path: Path, **kw: Any) -> CheckpointSpec:
    return CheckpointSpec(dir=str(tmp_path), **{"every_steps": 1, "keep": 5, **kw})


def _train_and_save(ckpt: Checkpointer, app: Any, data: Any, steps: range) -> dict[int, Any]:
    """Blocking saves: an async save requested while the previous one is still writing would be skipped."""
    states = {}
    for step in steps:
        train_step(app, data, ckpt)
        ckpt.save(step, app, blocking=True)
        states[step] = full_state(app)
    ckpt.close()
    return states


def test_uncommitted_and_partial_folders_are_never_restored(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    app, data = make_app(seed=0)
    ckpt = Checkpointer(_cfg(tmp_path), tmp_path)
    states = _train_and_save(ckpt, app, data, range(1, 3))
    # Step 4: DCP's write finishes (".metadata" exists) but the commit never happens: the process dies there, so
    # the failed save's clean-up does not run either.
    monkeypatch.setattr(store, "write_commit", lambda *a, **k: (_ for _ in ()).throw(OSError("crashed")))
    monkeypatch.setattr(store, "remove_partial", lambda path: False)
    train_step(app, data)
    ckpt2 = Checkpointer(_cfg(tmp_path), tmp_path)
    ckpt2.save(4, app, blocking=True)
    monkeypatch.undo()
    assert (store.step_dir(tmp_path, 4) / ".metadata").is_file()
    # Step 6: a folder with a partial file only.
    store.step_dir(tmp_path, 6).mkdir()
    (store.step_dir(tmp_path, 6) / "__0_0.distcp").write_bytes(b"\x00" * 100)

    app2, _ = make_app(seed=9)
    assert Checkpointer(_cfg(tmp_path), tmp_path).restore(app2) == 2
    assert_same_state(full_state(app2), states[2])
    # Restore cleaned the torn folders up; committed ones stay.
    assert [s for s, _ in store.step_dirs(tmp_path)] == [1, 2]


def test_corrupt_newest_falls_back_to_previous(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app, data = make_app(seed=0)
    states = _train_and_save(Checkpointer(_cfg(tmp_path), tmp_path), app, data, range(1, 4))
    for shard in store.step_dir(tmp_path, 3).glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:50])  # truncated
    app2, _ = make_app(seed=9)
    with caplog.at_level(logging.WARNING, logger="flywheel.checkpoint"):
        assert Checkpointer(_cfg(tmp_path), tmp_path).restore(app2) == 2
    assert_same_state(full_state(app2), states[2])
    assert any("is damaged" in r.message and "step-00000003" in r.message for r in caplog.records)
    [kept] = tmp_path.glob("bad-step-00000003-*")  # never deleted: marked bad, out of the listings
    assert store.read_commit(kept) is not None


def test_a_checkpoint_without_checksums_that_fails_to_load_falls_back(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    app, data = make_app(seed=0)
    states = _train_and_save(Checkpointer(_cfg(tmp_path), tmp_path), app, data, range(1, 4))
    store.write_commit(store.step_dir(tmp_path, 3), 3, 1)  # as an older trainer wrote it: no checksums
    for shard in store.step_dir(tmp_path, 3).glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:50])  # truncated
    app2, _ = make_app(seed=9)
    with caplog.at_level(logging.WARNING, logger="flywheel.checkpoint"):
        assert Checkpointer(_cfg(tmp_path), tmp_path).restore(app2) == 2
    assert_same_state(full_state(app2), states[2])
    assert any("could not restore checkpoint" in r.message and "step-00000003" in r.message
               for r in caplog.records)
    assert store.read_commit(store.step_dir(tmp_path, 3)) is not None  # never deleted


def test_all_committed_corrupt_raises(tmp_path: Path) -> None:
    app, data = make_app(seed=0)
    _train_and_save(Checkpointer(_cfg(tmp_path), tmp_path), app, data, range(1, 2))
    store.write_commit(store.step_dir(tmp_path, 1), 1, 1)  # no checksums: the damage shows only when loading
    (store.step_dir(tmp_path, 1) / ".metadata").write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="none of the committed checkpoints"):
        Checkpointer(_cfg(tmp_path), tmp_path).restore(make_app(seed=9)[0])


def test_empty_or_missing_directory_restores_nothing(tmp_path: Path) -> None:
    assert Checkpointer(_cfg(tmp_path), tmp_path / "absent").restore(make_app(seed=0)[0]) is None


def test_retention_keeps_newest_n(tmp_path: Path) -> None:
    events = FakeEvents()
    app, data = make_app(seed=0)
    store.step_dir(tmp_path, 0).mkdir(parents=True)  # a torn leftover of an older step
    ckpt = Checkpointer(_cfg(tmp_path, keep=2), tmp_path, events=events)
    _train_and_save(ckpt, app, data, range(1, 6))
    assert [s for s, _ in store.step_dirs(tmp_path)] == [4, 5]
    assert [r.step for r in store.committed(tmp_path)] == [4, 5]
    assert [e["step"] for e in events.named("checkpoint")] == [1, 2, 3, 4, 5]


def test_save_while_writing_is_skipped_and_blocking_save_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    real_write = dcp.FileSystemWriter.write_data

    def held_write(self: Any, *args: Any, **kwargs: Any) -> Any:
        release.wait(30)
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", held_write)
    app, data = make_app(seed=0)
    ckpt = Checkpointer(_cfg(tmp_path), tmp_path)
    train_step(app, data, ckpt)
    ckpt.save(1, app)
    train_step(app, data, ckpt)  # wait_staged returns although the write is held
    with caplog.at_level(logging.WARNING, logger="flywheel.checkpoint"):
        ckpt.save(2, app)
    assert any("checkpoint at step 2 skipped" in r.message for r in caplog.records)
    train_step(app, data, ckpt)
    threading.Timer(0.3, release.set).start()
    ckpt.save(3, app, blocking=True)  # waits for step 1's write, then writes step 3
    assert [r.step for r in store.committed(tmp_path)] == [1, 3]
    ckpt.close()


def test_due_by_steps_and_seconds(tmp_path: Path) -> None:
    ckpt = Checkpointer(_cfg(tmp_path, every_steps=4), tmp_path)
    assert [s for s in range(1, 13) if ckpt.due(s)] == [4, 8, 12]
    timed = Checkpointer(_cfg(tmp_path, every_steps=0, every_seconds=0.2), tmp_path)
    assert not timed.due(1)
    time.sleep(0.25)
    assert timed.due(2)
    ckpt.close(), timed.close()

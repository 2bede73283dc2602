"""A failing save is reported and training goes on; committed checkpoints stay intact."""

from __future__ import annotations

import errno
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.checkpoint as dcp
from ckpt_helpers import FakeEvents, FakeMetrics, assert_same_state, full_state, make_app, train_step
from torch.distributed.checkpoint.api import CheckpointException

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint import failure as checkpoint_failure
from flywheel.trainer.checkpoint import store
from flywheel.trainer.checkpoint.failure import (
    FailureReason,
    RankCause,
    SaveFailed,
    causes_of,
    classify,
    failure_message,
    in_words,
    primary,
)
from flywheel.trainer.checkpoint.manager import Checkpointer

pytestmark = pytest.mark.usefixtures("one_rank")


def test_disk_full_is_reported_and_training_continues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=1, keep=5)
    events, metrics = FakeEvents(), FakeMetrics()
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path, events=events, metrics=metrics)
    train_step(app, data, ckpt)
    ckpt.save(1, app, blocking=True)  # committed before the disk fills up
    expected = full_state(app)
    train_step(app, data, ckpt)

    def disk_full(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", disk_full)
    with caplog.at_level(logging.ERROR, logger="flywheel.checkpoint"):
        ckpt.save(2, app)
        train_step(app, data, ckpt)  # training goes on
        ckpt.close()
    errors = [r.message for r in caplog.records if r.levelno == logging.ERROR]
    assert any("step-00000002" in m and "No space left on device" in m for m in errors), errors
    assert metrics.checkpoint_failures_total.by_reason == {"no_space": 1}
    [failed] = events.named("checkpoint_failed")
    assert failed["step"] == 2 and "No space left on device" in failed["error"] and failed["reason"] == "no_space"
    assert failed["message"].startswith(f"checkpoint at step 2 failed: no space left on {tmp_path} (needs ~")
    assert failed["message"].endswith("; training continues; newest good checkpoint: step 1")
    assert failed["message"] in errors
    assert not store.step_dir(tmp_path, 2).exists()  # the partial folder is gone
    assert [e["step"] for e in events.named("checkpoint")] == [1]
    assert [r.step for r in store.committed(tmp_path)] == [1]
    monkeypatch.undo()

    # The next save works; the older checkpoint is still restorable and intact.
    ckpt2 = Checkpointer(cfg, tmp_path, events=events, metrics=metrics)
    ckpt2.save(3, app, blocking=True)
    assert [r.step for r in store.committed(tmp_path)] == [1, 3]
    store.delete_checkpoint(store.step_dir(tmp_path, 3))
    app2, _ = make_app(seed=5)
    assert Checkpointer(cfg, tmp_path).restore(app2) == 1
    assert_same_state(full_state(app2), expected)


def test_unwritable_directory_is_reported(tmp_path: Path) -> None:
    """Root ignores permission bits, so make the directory impossible: its parent is a regular file."""
    (tmp_path / "file").write_text("not a directory")
    target = tmp_path / "file" / "ckpt"
    cfg = CheckpointSpec(dir=str(target), every_steps=1)
    events, metrics = FakeEvents(), FakeMetrics()
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, target, events=events, metrics=metrics)
    for step in (1, 2):
        train_step(app, data, ckpt)
        ckpt.save(step, app, blocking=step == 2)
    ckpt.close()
    assert metrics.checkpoint_failures_total.value == 2
    assert [e["step"] for e in events.named("checkpoint_failed")] == [1, 2]
    assert all("Not a directory" in e["error"] for e in events.named("checkpoint_failed"))
    assert Checkpointer(cfg, target).restore(make_app(seed=0)[0]) is None


def test_the_most_telling_cause_wins_over_a_peers_follow_on_error() -> None:
    no_space = OSError(errno.ENOSPC, "No space left on device")
    follow_on = CheckpointException("save", {0: (FileNotFoundError(errno.ENOENT, "gone"), None),
                                             1: (RuntimeError("wrapped"), None)})
    follow_on.failures[1][0].__cause__ = no_space
    cause = primary(causes_of(follow_on, 0))
    assert (cause.rank, cause.reason) == (1, FailureReason.NO_SPACE)
    assert classify(OSError(errno.EROFS, "ro")) is FailureReason.PERMISSION
    assert classify(ValueError("x")) is FailureReason.OTHER
    staged = SaveFailed([RankCause(0, FailureReason.OTHER, "RuntimeError: x"), RankCause(3, FailureReason.IO_ERROR,
                                                                                        "OSError: EIO")])
    assert primary(causes_of(staged, 0)).rank == 3
    assert in_words(cause, "/ckpt", 1_800_000) == "no space left on /ckpt (needs ~1.8 MB)"
    assert failure_message(20, "no space left on /ckpt (needs ~1.8 MB)", 10) == (
        "checkpoint at step 20 failed: no space left on /ckpt (needs ~1.8 MB); training continues; newest good "
        "checkpoint: step 10")


def test_a_full_disk_makes_room_by_deleting_older_checkpoints_never_the_newest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=1, keep=3)
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path, events=FakeEvents())
    for step in (1, 2, 3):
        train_step(app, data, ckpt)
        ckpt.save(step, app, blocking=True)
    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    ckpt.save(4, app, blocking=True)
    assert [r.step for r in store.committed(tmp_path)] == [3]
    assert [step for step, _ in store.step_dirs(tmp_path)] == [3]


def test_an_opaque_error_on_a_full_disk_is_no_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's zip writer meets a short write on a full disk with a RuntimeError of no errno ("unexpected pos"): with
    less room left than a save needs it is reported, and made room for, as no space; with room left it stays other."""
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=1, keep=5)
    events = FakeEvents()
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path, events=events)
    for step in (1, 2):
        train_step(app, data, ckpt)
        ckpt.save(step, app, blocking=True)
    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")))
    ckpt.save(3, app, blocking=True)
    full = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint_failure.shutil, "disk_usage", lambda path: full._replace(free=1000))
    ckpt.save(4, app, blocking=True)
    other, no_space = events.named("checkpoint_failed")
    assert other["reason"] == "other" and "unexpected pos" in other["message"], other
    assert no_space["reason"] == "no_space" and no_space["message"].startswith(
        f"checkpoint at step 4 failed: no space left on {tmp_path}"), no_space
    assert "unexpected pos 704 vs 598" in no_space["error"]
    assert [r.step for r in store.committed(tmp_path)] == [2]  # room made: the older checkpoint went


def _no_space(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_save_of_the_last_step_is_not_taken_the_final_save_writes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last step's own (async) save fails; the final blocking save of that step must still write it, not skip
    it as "already taken", and the state it writes resumes bitwise."""
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=2, keep=5)
    events = FakeEvents()
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path, events=events)
    for step in (1, 2, 3, 4):
        train_step(app, data, ckpt)
        if step == 4:
            ckpt._wait_inflight()  # step 2's save committed; only step 4's fails
            monkeypatch.setattr(dcp.FileSystemWriter, "write_data", _no_space)
        if ckpt.due(step):
            ckpt.save(step, app)
    ckpt._wait_inflight()
    monkeypatch.undo()  # room again (make-room, or a transient shortage)
    assert not ckpt.on_disk(4)
    expected = full_state(app)
    ckpt.save(4, app, blocking=True)  # train_loop's _finish
    ckpt.close()
    assert [e["step"] for e in events.named("checkpoint_failed")] == [4]
    assert [r.step for r in store.committed(tmp_path)] == [2, 4] and ckpt.on_disk(4)
    resumed, _ = make_app(seed=3)
    assert Checkpointer(cfg, tmp_path).restore(resumed) == 4
    assert_same_state(full_state(resumed), expected)


def test_a_committed_step_is_still_not_saved_twice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=1, keep=5)
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path)
    train_step(app, data, ckpt)
    ckpt.save(1, app)
    with caplog.at_level(logging.INFO, logger="flywheel.checkpoint"):
        ckpt.save(1, app, blocking=True)  # waits for the one in flight, then skips
    ckpt.close()
    assert any("already taken" in r.message for r in caplog.records)
    assert ckpt.on_disk(1) and [r.step for r in store.committed(tmp_path)] == [1]


def test_making_room_keeps_the_checkpoint_this_run_restored_not_a_newer_one_that_failed_to_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=1, keep=3)
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path)
    for step in (1, 2):
        train_step(app, data, ckpt)
        ckpt.save(step, app, blocking=True)
        if step == 1:
            expected = full_state(app)
    ckpt.close()
    # Step 2 cannot load but passes verification: an older checkpoint without checksums, its data file truncated.
    folder = store.step_dir(tmp_path, 2)
    marker = json.loads((folder / store.COMMIT_MARKER).read_text())
    marker["checksums"] = {}
    (folder / store.COMMIT_MARKER).write_text(json.dumps(marker))
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])

    events = FakeEvents()
    app, data = make_app(seed=1)
    ckpt = Checkpointer(cfg, tmp_path, events=events)
    assert ckpt.restore(app) == 1
    train_step(app, data, ckpt)
    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", _no_space)
    ckpt.save(3, app, blocking=True)
    ckpt.close()
    monkeypatch.undo()
    [failed] = events.named("checkpoint_failed")
    assert failed["newest_step"] == 1 and failed["message"].endswith("newest good checkpoint: step 1")
    assert [step for step, _ in store.step_dirs(tmp_path)] == [1, 2]  # the unloadable one is kept, not deleted
    resumed, _ = make_app(seed=2)
    assert Checkpointer(cfg, tmp_path).restore(resumed) == 1
    assert_same_state(full_state(resumed), expected)


def test_a_save_whose_marker_is_written_counts_as_committed_when_the_ranks_cannot_agree_afterwards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank lost right after rank 0 wrote the marker breaks the last agreement, but every rank's files were
    written and checksummed: the checkpoint is committed, restores use it, and rank 0 says so (it had reported the
    step abandoned, with an older 'newest good checkpoint', while the restart then resumed from it)."""
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=1, keep=5)
    events = FakeEvents()
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path, events=events)
    train_step(app, data, ckpt)
    expected = full_state(app)
    written = []
    write_commit = store.write_commit

    def marker_then_loss(*args: Any, **kwargs: Any) -> None:
        write_commit(*args, **kwargs)
        written.append(True)

    monkeypatch.setattr(store, "write_commit", marker_then_loss)
    _lose_a_peer_once(monkeypatch, written)
    ckpt.save(1, app)
    ckpt.close()
    monkeypatch.undo()
    assert written and not events.named("checkpoint_failed")
    assert [e["step"] for e in events.named("checkpoint")] == [1] and ckpt.committed_step == 1
    resumed, _ = make_app(seed=3)
    assert Checkpointer(cfg, tmp_path).restore(resumed) == 1
    assert_same_state(full_state(resumed), expected)


def test_a_save_that_fails_before_its_marker_is_still_reported_when_the_agreement_fails_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=1, keep=5)
    events = FakeEvents()
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path, events=events)
    train_step(app, data, ckpt)

    tried = []

    def no_marker(*args: Any, **kwargs: Any) -> None:
        tried.append(True)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store, "write_commit", no_marker)
    _lose_a_peer_once(monkeypatch, tried)
    ckpt.save(1, app)
    ckpt.close()
    monkeypatch.undo()
    [failed] = events.named("checkpoint_failed")
    assert failed["step"] == 1 and not events.named("checkpoint") and ckpt.committed_step is None
    assert store.committed(tmp_path) == []


def _lose_a_peer_once(monkeypatch: pytest.MonkeyPatch, marker_tried: list[bool]) -> None:
    """The ranks' agreements fail (a peer's connection reset) once the commit marker has been tried."""
    agree = Checkpointer._agree

    def lost_peer(self: Checkpointer, flag: bool, group: Any, *, any_rank: bool) -> bool:
        if marker_tried:
            raise RuntimeError("Connection reset by peer")
        return agree(self, flag, group, any_rank=any_rank)

    monkeypatch.setattr(Checkpointer, "_agree", lost_peer)

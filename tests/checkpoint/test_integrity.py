"""Each committed checkpoint records a checksum per file; a byte flipped after the commit is detected on restore,
the damaged checkpoint is marked bad (kept, never restored) and reported, and the previous good one is used: the
run's final parameters equal those of a run that never saw the damage."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
from ckpt_helpers import FakeEvents, assert_same_state, full_state, make_app, train_step

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint import integrity, store
from flywheel.trainer.checkpoint.manager import Checkpointer

pytestmark = pytest.mark.usefixtures("one_rank")
STEPS = 6


def cfg(root: Path) -> CheckpointSpec:
    return CheckpointSpec(dir=str(root), every_steps=2, keep=5)


def _save_steps_2_and_4(root: Path) -> None:
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg(root), root)
    for step in range(1, 5):
        train_step(app, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, app, blocking=True)
    ckpt.close()


def test_every_file_of_a_commit_has_its_checksum(tmp_path: Path) -> None:
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg(tmp_path), tmp_path)
    train_step(app, data, ckpt)
    ckpt.save(1, app)  # asynchronous: the writer thread checksums
    ckpt.close()
    folder = store.step_dir(tmp_path, 1)
    marker = json.loads((folder / store.COMMIT_MARKER).read_text())
    files = {p.name for p in folder.iterdir() if p.name != store.COMMIT_MARKER}
    assert marker["algorithm"] == "crc32" and set(marker["checksums"]) == files and ".metadata" in files
    assert all(integrity.checksum(folder / n) == c for n, c in marker["checksums"].items())


def test_a_flipped_byte_is_detected_and_the_previous_checkpoint_gives_the_fault_free_result(tmp_path: Path) -> None:
    clean, data = make_app(seed=0)
    for _ in range(STEPS):
        train_step(clean, data)
    expected = full_state(clean)

    _save_steps_2_and_4(tmp_path)
    shard = next(store.step_dir(tmp_path, 4).glob("__0_*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))

    events = FakeEvents()
    resumed, data = make_app(seed=7)
    ckpt = Checkpointer(cfg(tmp_path), tmp_path, events=events)
    assert ckpt.restore(resumed) == 2
    [bad] = events.named("checkpoint_bad")
    assert bad["step"] == 4 and shard.name in bad["reason"] and Path(bad["path"]).name.startswith("bad-step-00000004")
    assert (Path(bad["path"]) / integrity.BAD_MARKER).is_file()  # kept for inspection
    assert [r.step for r in store.committed(tmp_path)] == [2]
    for step in range(3, STEPS + 1):
        train_step(resumed, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, resumed, blocking=True)  # step 4 again: a clean folder, committed
    ckpt.close()
    assert_same_state(full_state(resumed), expected)
    assert [r.step for r in store.committed(tmp_path)] == [2, 4, 6]
    # A second restart does not meet the damage again (no restart loop): the newest good checkpoint loads.
    again, _ = make_app(seed=9)
    assert Checkpointer(cfg(tmp_path), tmp_path).restore(again) == 6


@pytest.mark.parametrize("damage", [b'{"step": 4, "world_si\x00', b"", b'["not", "a", "record"]',
                                    b'{"step": 5, "world_size": 1, "time": 1.0, "checksums": {}}'],
                         ids=["torn-bytes", "emptied", "not-a-record", "another-step"])
def test_a_damaged_commit_marker_sets_the_checkpoint_aside_never_deletes_it(tmp_path: Path, damage: bytes) -> None:
    """A marker is written atomically, so one that is there but unreadable is damage after the commit, not a torn
    save: the folder is kept (marked bad) and reported like a damaged shard, never removed as torn, neither by the
    restore nor by a later save's clean-up."""
    _save_steps_2_and_4(tmp_path)
    shards = sorted(p.name for p in store.step_dir(tmp_path, 4).iterdir())
    (store.step_dir(tmp_path, 4) / store.COMMIT_MARKER).write_bytes(damage)

    events = FakeEvents()
    resumed, data = make_app(seed=7)
    ckpt = Checkpointer(cfg(tmp_path), tmp_path, events=events)
    assert ckpt.restore(resumed) == 2
    [bad] = events.named("checkpoint_bad")
    kept = Path(bad["path"])
    assert bad["step"] == 4 and "its commit marker is" in bad["reason"] and kept.name.startswith("bad-step-00000004")
    assert sorted(p.name for p in kept.iterdir()) == sorted([*shards, integrity.BAD_MARKER])  # every byte kept
    for step in range(3, 7):
        train_step(resumed, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, resumed, blocking=True)  # its clean-up removes torn folders: not this one
    ckpt.close()
    assert kept.is_dir() and [r.step for r in store.committed(tmp_path)] == [2, 4, 6]
    assert store.remove_partial(kept) is False and kept.is_dir()


def test_a_marker_that_cannot_be_read_now_is_skipped_not_set_aside(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An I/O error reading a marker (a storage hiccup) says nothing about its bytes: the step is skipped for this
    restore, and kept as it is for the next."""
    _save_steps_2_and_4(tmp_path)
    marker = store.step_dir(tmp_path, 4) / store.COMMIT_MARKER
    real_read = Path.read_bytes

    def flaky(path: Path) -> bytes:
        if path == marker:
            raise OSError(5, "Input/output error")
        return real_read(path)

    monkeypatch.setattr(Path, "read_bytes", flaky)
    events = FakeEvents()
    resumed, _ = make_app(seed=7)
    assert Checkpointer(cfg(tmp_path), tmp_path, events=events).restore(resumed) == 2
    assert not events.named("checkpoint_bad") and marker.is_file()
    monkeypatch.setattr(Path, "read_bytes", real_read)
    assert [r.step for r in store.committed(tmp_path)] == [2, 4]  # readable again: restorable again


def _flip_a_byte(root: Path, step: int) -> None:
    shard = next(store.step_dir(root, step).glob("__0_*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))


@pytest.mark.parametrize("rename_fails", [False, True], ids=["disk-full", "read-only"])
def test_damage_found_on_a_full_or_read_only_disk_is_skipped_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rename_fails: bool) -> None:
    """The bad marker cannot be written (no space; read-only: nor can the folder be renamed). Restore still skips
    the damaged step for the previous good one, on every start: no crash, so no restart loop."""
    _save_steps_2_and_4(tmp_path)
    _flip_a_byte(tmp_path, 4)
    write_text, rename = Path.write_text, Path.rename

    def no_marker(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.name == integrity.BAD_MARKER:
            raise OSError(errno.EROFS if rename_fails else errno.ENOSPC, "cannot write")
        return write_text(self, *args, **kwargs)

    def no_rename(self: Path, target: Any) -> Path:
        if rename_fails:
            raise OSError(errno.EROFS, "Read-only file system")
        return rename(self, target)

    monkeypatch.setattr(Path, "write_text", no_marker)
    monkeypatch.setattr(Path, "rename", no_rename)
    for start in (1, 2):
        events = FakeEvents()
        resumed, _ = make_app(seed=7)
        assert Checkpointer(cfg(tmp_path), tmp_path, events=events).restore(resumed) == 2
        # renamed aside, it is out of the listings; else it is found (and reported) again
        assert [e["step"] for e in events.named("checkpoint_bad")] == ([4] if start == 1 or rename_fails else [])
    names = sorted(p.name for p in tmp_path.iterdir())
    if rename_fails:
        assert names == ["step-00000002", "step-00000004"]  # kept as it was, found again next start
    else:
        assert names[0].startswith("bad-step-00000004-") and names[1:] == ["step-00000002"]


def test_a_save_moves_a_leftover_bad_marked_folder_of_its_step_aside(tmp_path: Path) -> None:
    """mark_bad killed between its marker and its rename leaves step-N with a bad marker; a later commit of step N
    must not be hidden by it, and the damaged folder is still kept."""
    _save_steps_2_and_4(tmp_path)
    (store.step_dir(tmp_path, 4) / integrity.BAD_MARKER).write_text(json.dumps({"reason": "test", "time": 0}))
    resumed, data = make_app(seed=7)
    ckpt = Checkpointer(cfg(tmp_path), tmp_path)
    assert ckpt.restore(resumed) == 2
    for step in (3, 4):
        train_step(resumed, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, resumed, blocking=True)
    expected = full_state(resumed)
    ckpt.close()
    assert [r.step for r in store.committed(tmp_path)] == [2, 4]
    [kept] = tmp_path.glob("bad-step-00000004-*")
    assert (kept / integrity.BAD_MARKER).is_file()
    again, _ = make_app(seed=9)
    assert Checkpointer(cfg(tmp_path), tmp_path).restore(again) == 4
    assert_same_state(full_state(again), expected)

"""Whose memory copies a restore may take: the memory root is named after the job and the checkpoint dir's path,
so a run started again under the same name after its checkpoint dir was deleted must not find the earlier run's
copies (the checkpoint dir's identity), and folders of another layout do not outlive the run."""

from __future__ import annotations

import errno
import multiprocessing
import shutil
from pathlib import Path

import pytest
from ckpt_helpers import make_app, train_step

from flywheel.contracts import memory_root as roots
from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.tiers import memory as mem
from flywheel.trainer.checkpoint.tiers import peer


def _run(ckpt_dir: Path, shm: Path, steps: int, *, seed: int = 0) -> int | None:
    """A run that restores, then trains `steps` steps (disk every 2, memory every step) and is killed: closed
    without releasing its memory copies. The step it restored."""
    app, data = make_app(seed)
    cfg = CheckpointSpec(dir=str(ckpt_dir), every_steps=2, memory_every_steps=1, keep=5)
    ck = Checkpointer(cfg, ckpt_dir, memory_dir=shm)
    assert ck.memory is not None
    start = ck.restore(app)
    for step in range((start or 0) + 1, (start or 0) + steps + 1):
        train_step(app, data, ck)
        if ck.due(step):
            ck.save(step, app)
            ck.memory.wait()
            ck._wait_inflight()  # a real step outlasts this tiny write; here the next disk save would be skipped
    ck.close()
    return start


@pytest.mark.usefixtures("one_rank")
def test_a_deleted_checkpoint_dir_takes_the_earlier_runs_memory_copies_with_it(tmp_path: Path) -> None:
    ckpt_dir, shm = tmp_path / "ckpt", tmp_path / "shm"
    assert _run(ckpt_dir, shm, 5) is None
    assert _run(ckpt_dir, shm, 1) == 5  # a restart in place: the same dir, its copies restored
    shutil.rmtree(ckpt_dir)  # `make demo`, or a user starting over under the same job name
    assert _run(ckpt_dir, shm, 0) is None  # a fresh run: the earlier run's step 6 is not restored
    assert mem.steps_in(mem.own_dir(shm, 0)) == {}


@pytest.mark.usefixtures("one_rank")
def test_a_memory_copy_newer_than_a_rolled_back_disk_is_still_restored(tmp_path: Path) -> None:
    """Deleting the newer step folders of the same dir keeps its identity: the memory copy of a newer step is this
    run's, and restoring it is the tier's point (docs/operator.md: to roll back, delete the memory copies too)."""
    ckpt_dir, shm = tmp_path / "ckpt", tmp_path / "shm"
    _run(ckpt_dir, shm, 5)
    shutil.rmtree(ckpt_dir / "step-00000004")
    assert _run(ckpt_dir, shm, 0) == 5


def _hold(root: Path, *names: str) -> None:
    for name in names:
        mem.step_file(root / name, 4, 8).parent.mkdir(parents=True, exist_ok=True)
        mem.step_file(root / name, 4, 8).write_bytes(b"z")


@pytest.mark.usefixtures("one_rank")
def test_folders_of_another_layout_are_deleted_at_start_and_at_release(tmp_path: Path) -> None:
    root, run_dir = tmp_path / "shm", tmp_path / "ckpt"
    peer.MemoryTier(root, 1, rank=0, world_size=1, ranks_per_worker=1, run_dir=run_dir).close()
    _hold(root, "own-rank-00000", "own-rank-00003", "replica-rank-00007")  # 3, 7: an earlier, larger world
    tier = peer.MemoryTier(root, 1, rank=0, world_size=1, ranks_per_worker=1, run_dir=run_dir)
    try:
        assert sorted(p.name for p in root.iterdir()) == ["own-rank-00000", roots.ROOT_ID]
        _hold(root, "own-rank-00003", "replica-rank-00007")
        tier.release()  # their owners never come back to delete them
        assert not root.exists()
    finally:
        tier.close()


@pytest.mark.usefixtures("one_rank")
def test_a_root_another_local_rank_removed_first_is_released_quietly(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Local ranks share the root and release it at once: one may find it gone between looking and listing (it
    crashed the rank at the end of a finished run, and its agent restarted ranks that could never regroup)."""
    root, run_dir = tmp_path / "shm", tmp_path / "ckpt"
    tier = peer.MemoryTier(root, 1, rank=0, world_size=1, ranks_per_worker=1, run_dir=run_dir)
    try:
        shutil.rmtree(root)  # the other local rank released it first
        monkeypatch.setattr(Path, "is_dir", lambda self: True)  # ... just after this rank looked
        tier.release()
        assert mem.copy_folders(root) == [] and mem.held_bytes(root) == 0
    finally:
        monkeypatch.undo()
        tier.close()


def test_layout_folders_are_a_workers_own_copies_and_its_sources_replicas() -> None:
    assert mem.layout_folders(5, 8, 2) == {"own-rank-00004", "own-rank-00005", "replica-rank-00002",
                                           "replica-rank-00003"}
    assert mem.layout_folders(0, 1, 1) == {"own-rank-00000"}  # one worker: no replica


def test_a_root_is_wiped_unless_it_records_the_dirs_identity(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "own-rank-00000").mkdir(parents=True)  # from before identities: whose is unknown
    assert roots.adopt(root, "a") is True
    assert sorted(p.name for p in root.iterdir()) == [roots.ROOT_ID]
    (root / "own-rank-00000").mkdir()
    assert roots.adopt(root, "a") is False and (root / "own-rank-00000").is_dir()
    assert roots.adopt(root, "b") is True and not (root / "own-rank-00000").exists()


def _identity(path: str) -> str:
    return roots.dir_identity(Path(path))


def test_workers_creating_the_identity_at_once_agree_on_it(tmp_path: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        found = pool.map(_identity, [str(tmp_path / "ckpt")] * 8)
    assert len(set(found)) == 1 and found[0]
    assert _identity(str(tmp_path / "ckpt")) == found[0]
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [roots.DIR_ID]  # no temporary file left


def test_the_identity_is_created_where_hard_links_are_not_supported(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def no_link(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(roots.os, "link", no_link)
    first = roots.dir_identity(tmp_path)
    assert first and roots.dir_identity(tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [roots.DIR_ID]


@pytest.mark.usefixtures("one_rank")
def test_copies_stay_when_the_checkpoint_dir_cannot_be_read(tmp_path: Path) -> None:
    root, not_a_dir = tmp_path / "shm", tmp_path / "file"
    not_a_dir.write_text("")
    mem.step_file(mem.own_dir(root, 0), 4, 1).parent.mkdir(parents=True)
    mem.step_file(mem.own_dir(root, 0), 4, 1).write_bytes(b"z")
    tier = peer.MemoryTier(root, 1, rank=0, world_size=1, ranks_per_worker=1, run_dir=not_a_dir)
    tier.close()
    assert list(mem.steps_in(mem.own_dir(root, 0))) == [4]


def _two_local_ranks(rank: int, world_size: int, root: str) -> None:
    """Both ranks of one worker share its root: each checks whose copies it holds at once, and neither deletes
    what the other saves after."""
    import torch
    import torch.distributed as dist

    shm = Path(root) / "shm"
    tier = peer.MemoryTier(shm, 1, rank=rank, world_size=world_size, ranks_per_worker=2, run_dir=Path(root) / "ckpt")
    try:
        assert all(4 not in mem.steps_in(mem.own_dir(shm, r)) for r in range(2))  # the earlier run's are gone
        assert tier.save(1, {"w": torch.full((8,), float(rank))}, tier.group)
        dist.barrier()
        assert sorted(p.name for p in shm.iterdir()) == ["own-rank-00000", "own-rank-00001", roots.ROOT_ID]
        dist.barrier()
        tier.release()
        dist.barrier()
        assert not shm.exists()  # the last rank out took the folder, and its record, with it
    finally:
        tier.close()


def test_the_ranks_sharing_a_root_check_it_together(tmp_path: Path) -> None:
    from ckpt_helpers import run_ranks

    _hold(tmp_path / "shm", "own-rank-00000", "own-rank-00001")  # an earlier run's, its dir since deleted
    (tmp_path / "shm" / roots.ROOT_ID).write_text("earlier\n")
    run_ranks(_two_local_ranks, 2, str(tmp_path), str(tmp_path))

"""The memory tier's integrity: a memory copy whose bytes were damaged after it was written (a flipped byte in
/dev/shm) is detected by its digests whichever way it is read (own file, a replica's file on the same host, a replica
sent over gloo, its header by the rank sending it), deleted, reported as a `checkpoint_bad` event of source memory,
and the restore takes that rank's other copy of the same step, else the disk checkpoint: the resumed run still
ends bitwise equal to the fault-free run, and no damaged copy is ever loaded. A replica that vanishes between the
plan and its sending is answered with nothing, so its rank falls back to disk instead of waiting forever."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ckpt_helpers import (
    FakeEvents,
    assert_same_state,
    flip_byte,
    full_state,
    make_app,
    memory_worker,
    run_ranks,
    save_memory_steps,
    train_on_to_step_8,
    train_saving,
    train_step,
)

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.tiers import memory as mem
from flywheel.trainer.checkpoint.tiers import memory_file as step_format


@pytest.mark.usefixtures("one_rank")
def test_a_damaged_own_copy_is_deleted_and_reported_and_disk_gives_the_fault_free_result(tmp_path: Path) -> None:
    clean, data = make_app(seed=0)
    for _ in range(8):
        train_step(clean, data)
    expected = full_state(clean)

    shm = tmp_path / "shm"
    cfg = CheckpointSpec(dir=str(tmp_path), every_steps=3, memory_every_steps=1, keep=2)
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg, tmp_path, memory_dir=shm)
    train_saving(app, data, ckpt, 5)
    ckpt.close()
    copy = mem.step_file(mem.own_dir(shm, 0), 5, 1)
    flip_byte(copy, copy.stat().st_size // 2)  # somewhere in the tensors' bytes

    events = FakeEvents()
    resumed, data = make_app(seed=9)
    ckpt = Checkpointer(cfg, tmp_path, events=events, memory_dir=shm)
    assert ckpt.restore(resumed) == 3  # not the damaged step 5: the disk checkpoint
    [bad] = events.named("checkpoint_bad")
    assert bad["source"] == "memory" and bad["step"] == 5 and bad["path"] == str(copy)
    assert "is damaged: xxh3 of" in bad["reason"]
    assert not copy.exists()  # deleted: never offered again
    assert [r["source"] for r in events.named("restore")] == ["disk"]
    for _ in range(3, 8):
        train_step(resumed, data, ckpt)
    ckpt.close()
    assert_same_state(full_state(resumed), expected)


def _restore_after_damage(rank: int, world_size: int, root: str, same_host: bool, want_step: int,
                          want_source: str, want_bad: list[str]) -> None:
    app, data, ckpt = memory_worker(rank, world_size, root)
    assert ckpt.memory is not None
    ckpt.memory.same_host_reads = same_host
    assert ckpt.restore(app) == want_step
    if rank == 0:
        assert [r["source"] for r in ckpt.events.named("restore")] == [want_source]
        bad = ckpt.events.named("checkpoint_bad")
        assert [b["path"] for b in bad] == want_bad, bad
        assert all(b["source"] == "memory" and b["step"] == 6 for b in bad)
    train_on_to_step_8(app, data, ckpt, want_step)


def _file(root: Path, worker: int, folder: str, src: int) -> Path:
    host = root / "shm" / f"worker-{worker}"
    return mem.step_file(host / f"{folder}-rank-{src:05d}", 6, 2)


@pytest.mark.slow
@pytest.mark.parametrize("same_host", [False, True], ids=["replica-over-gloo", "replica-file-on-same-host"])
def test_a_damaged_own_copy_is_replaced_by_the_peers_replica_of_the_same_step(tmp_path: Path,
                                                                               same_host: bool) -> None:
    root = str(tmp_path)
    run_ranks(save_memory_steps, 2, root, root)
    own = _file(tmp_path, 1, "own", 1)
    flip_byte(own, own.stat().st_size - 1)  # the last tensor's last byte
    run_ranks(_restore_after_damage, 2, root, root, same_host, 6, "memory-peer", [str(own)])
    assert not own.exists() and _file(tmp_path, 0, "replica", 1).exists()


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("same_host", [False, True], ids=["replica-over-gloo", "replica-file-on-same-host"])
def test_a_lost_worker_whose_replica_is_damaged_restores_from_disk(tmp_path: Path, same_host: bool) -> None:
    root = str(tmp_path)
    run_ranks(save_memory_steps, 2, root, root)
    shutil.rmtree(tmp_path / "shm" / "worker-1")  # worker 1's host is gone: rank 1's state is only on worker 0
    replica = _file(tmp_path, 0, "replica", 1)
    flip_byte(replica, replica.stat().st_size - 1)
    run_ranks(_restore_after_damage, 2, root, root, same_host, 4, "disk", [str(replica)])
    assert not replica.exists()


@pytest.mark.slow
def test_a_replica_whose_header_is_damaged_is_caught_by_its_sender(tmp_path: Path) -> None:
    root = str(tmp_path)
    run_ranks(save_memory_steps, 2, root, root)
    shutil.rmtree(tmp_path / "shm" / "worker-1")
    replica = _file(tmp_path, 0, "replica", 1)
    flip_byte(replica, len(step_format.MAGIC) + 8 + 20)  # inside the pickled header: the holder cannot even send it
    run_ranks(_restore_after_damage, 2, root, root, False, 4, "disk", [str(replica)])
    assert not replica.exists()


def _restore_with_replica_gone(rank: int, world_size: int, root: str) -> None:
    """Rank 0 plans with rank 1's replica, then it vanishes before it is sent (taken away, e.g. /dev/shm
    cleaned): rank 0 answers with nothing to send and every rank falls back to disk, none left waiting."""
    app, data, ckpt = memory_worker(rank, world_size, root)
    assert ckpt.memory is not None
    ckpt.memory.same_host_reads = False
    plan = ckpt.memory.plan

    def plan_then_lose_the_replica(*args: object) -> object:
        made = plan(*args)  # type: ignore[arg-type]
        if rank == 0:
            _file(Path(root), 0, "replica", 1).unlink()
        return made

    ckpt.memory.plan = plan_then_lose_the_replica  # type: ignore[method-assign]
    assert ckpt.restore(app) == 4
    if rank == 0:
        assert [r["source"] for r in ckpt.events.named("restore")] == ["disk"]
        assert not ckpt.events.named("checkpoint_bad")  # gone, not damaged
    train_on_to_step_8(app, data, ckpt, 4)


@pytest.mark.slow
def test_a_replica_gone_before_it_is_sent_falls_back_to_disk_without_a_hang(tmp_path: Path) -> None:
    root = str(tmp_path)
    run_ranks(save_memory_steps, 2, root, root)
    shutil.rmtree(tmp_path / "shm" / "worker-1")
    run_ranks(_restore_with_replica_gone, 2, root, root)

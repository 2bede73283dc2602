"""The memory tier: the restore plan (pure), and bitwise-exact resumes from a rank's own memory copy, from a peer's
replica after a whole worker is lost, and from disk when memory has nothing complete or the world size changed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from ckpt_helpers import (
    FakeEvents,
    FakeMetrics,
    assert_same_state,
    full_state,
    make_app,
    memory_worker,
    run_ranks,
    save_memory_steps,
    train_on_to_step_8,
    train_step,
)

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.tiers import memory as mem
from flywheel.trainer.checkpoint.tiers import peer, peer_restore

# ---- the plan -------------------------------------------------------------------------------------------------------


def _inv(rank: int, own: dict[int, int], replicas: dict[int, dict[int, int]] | None = None,
         world: int = 2) -> mem.Inventory:
    return mem.Inventory(rank, {s: (100, world) for s in own},
                         {src: {s: (100, world) for s in steps} for src, steps in (replicas or {}).items()})


def test_the_plan_takes_the_newest_step_every_rank_has_own_copy_first() -> None:
    plan = mem.plan_restore([_inv(0, {4: 0, 5: 0}, {1: {4: 0}}), _inv(1, {4: 0}, {0: {5: 0}})], 2, None)
    assert isinstance(plan, mem.MemoryPlan)
    assert plan.step == 4 and plan.kind == "memory-own"
    assert {r: s.holder for r, s in plan.sources.items()} == {0: 0, 1: 1}


def test_a_lost_worker_is_covered_by_its_peers_replica() -> None:
    # Worker 1 came back empty: rank 1's copy of step 6 is on worker 0.
    plan = mem.plan_restore([_inv(0, {6: 0}, {1: {6: 0}}), _inv(1, {})], 2, 4)
    assert isinstance(plan, mem.MemoryPlan)
    assert plan.step == 6 and plan.kind == "memory-peer" and plan.source_of(1) == "memory-peer"
    assert plan.sources[1].holder == 0 and plan.source_of(0) == "memory-own"


@pytest.mark.parametrize(("replicas", "per_worker", "moving", "kept"), [
    (["0", "1"], 1, set(), True),
    (["0", "1"], 1, {"1"}, True),  # worker 1's copy is on worker 0 (the ring), which stays
    (["0", "1"], 1, {"0", "1"}, False),  # every worker on the drained node
    (["0"], 1, {"0"}, False),  # one worker: no peer holds its copy
    (["0", "0", "1", "1"], 2, {"0"}, True),
    (["0", "0", "1", "1"], 2, {"0", "1"}, False),
    (["0", "1", "2"], 1, {"0", "2"}, False),  # worker 2's replica is on worker 0: both go
    (["0", "1", "2"], 1, {"2", "1"}, False),
    (["0", "1", "2", "3"], 1, {"0", "2"}, True),  # every moved worker's replica is on one that stays
])
def test_a_move_keeps_the_memory_checkpoint_only_while_a_copy_of_every_rank_stays(
        replicas: list[str], per_worker: int, moving: set[str], kept: bool) -> None:
    assert mem.copies_outlive(replicas, per_worker, moving) is kept


def test_the_plan_falls_back_to_disk_with_the_reason() -> None:
    # the peer is lost too: rank 1's step 6 is nowhere
    assert "no step" in str(mem.plan_restore([_inv(0, {6: 0}), _inv(1, {})], 2, 4))
    assert mem.plan_restore([_inv(0, {}), _inv(1, {})], 2, 4) == "no memory copy"
    assert "older than disk checkpoint step 8" in str(mem.plan_restore([_inv(0, {6: 0}), _inv(1, {6: 0})], 2, 8))
    resized = mem.plan_restore([_inv(0, {6: 0}, world=4), _inv(1, {6: 0}, world=4)], 2, None)
    assert "world size 4, now 2: they are not resharded" in str(resized)


def test_a_replica_goes_in_stripe_pieces_taken_round_the_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_restore, "STRIPE", 4)
    pieces = list(peer_restore._pieces([0, 9, 4, 3], ["a", "b"]))
    # (tensor, offset, size, group): the empty tensor sends nothing, the last piece of each tensor is shorter
    assert pieces == [(1, 0, 4, "a"), (1, 4, 4, "b"), (1, 8, 1, "a"), (2, 0, 4, "b"), (3, 0, 3, "a")]


def test_memory_root_keeps_jobs_and_workers_apart(tmp_path: Path) -> None:
    a = mem.memory_root("job", "0", "/ckpt/a", tmp_path)
    assert a != mem.memory_root("job", "1", "/ckpt/a", tmp_path) != mem.memory_root("job", "0", "/ckpt/b", tmp_path)
    assert a.parent.name.startswith("flywheel-job-")


# ---- one rank: own copy ---------------------------------------------------------------------------------------------


def _cfg(root: Path) -> CheckpointSpec:
    return CheckpointSpec(dir=str(root), every_steps=3, memory_every_steps=1, keep=2)


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("memory", [True, False], ids=["memory", "disk"])
def test_resume_from_own_memory_is_bitwise_exact(tmp_path: Path, memory: bool) -> None:
    clean, data = make_app(seed=0)
    for _ in range(8):
        train_step(clean, data)
    expected = full_state(clean)

    shm = tmp_path / "shm"
    app, data = make_app(seed=0)
    metrics = FakeMetrics()
    metrics.checkpoint_memory_bytes = _Gauge()
    ckpt = Checkpointer(_cfg(tmp_path), tmp_path, metrics=metrics, memory_dir=shm)
    assert ckpt.memory is not None
    for step in range(1, 6):
        train_step(app, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, app)
            ckpt.memory.wait()  # a real step outlasts this tiny write; here the next memory save would be skipped
    at_5 = full_state(app)
    ckpt.close()  # a restart in place: the process goes, /dev/shm stays
    assert list(mem.steps_in(mem.own_dir(shm, 0))) == [5]  # only the newest complete step is kept
    assert ckpt.memory_bytes == metrics.checkpoint_memory_bytes.value > 0
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-00000003"]  # memory-only saves write no disk

    events = FakeEvents()
    resumed, data = make_app(seed=9)
    ckpt = Checkpointer(_cfg(tmp_path), tmp_path, events=events, memory_dir=shm if memory else None)
    start = ckpt.restore(resumed)
    [record] = events.named("restore")
    if memory:
        assert start == 5 and record["source"] == "memory-own" and record["step"] == 5
        assert_same_state(full_state(resumed), at_5)
    else:
        assert start == 3 and record["source"] == "disk"
    for _ in range(start or 0, 8):
        train_step(resumed, data, ckpt)
    ckpt.close()
    assert_same_state(full_state(resumed), expected)
    if ckpt.memory is not None:  # the run finished: its host memory is given back
        ckpt.memory.release()
        assert not shm.exists()


class _Gauge:
    value: float | None = None

    def set(self, value: float) -> None:
        self.value = value


# ---- two workers: the peer's replica --------------------------------------------------------------------------------


def _noting(method: Any, name: str, calls: list[str]) -> Any:
    def call(*args: Any) -> Any:
        calls.append(name)
        return method(*args)
    return call


def _restore(rank: int, world_size: int, root: str, want_step: int, want_source: str, same_host: bool = True
             ) -> None:
    peer_restore.STRIPE = 1000  # a tensor's bytes go in many pieces, split inside elements, round every group
    app, data, ckpt = memory_worker(rank, world_size, root)
    assert ckpt.memory is not None
    ckpt.memory.same_host_reads = same_host
    paths: list[str] = []
    for name in ("_read_file", "_receive"):  # which way this rank's copy came
        setattr(ckpt.memory, name, _noting(getattr(ckpt.memory, name), name, paths))
    received_on: list[Any] = []
    irecv = dist.irecv
    dist.irecv = lambda *args, group=None, **kw: received_on.append(group) or irecv(*args, group=group, **kw)
    assert ckpt.restore(app) == want_step
    dist.irecv = irecv
    if "_receive" in paths:  # the pieces came over all three of the checkpointer's groups, in turn
        assert len(ckpt.transfer_groups) == 3
        assert received_on[:6] == ckpt.transfer_groups * 2, received_on[:6]
    if rank == 0:
        [record] = ckpt.events.named("restore")
        assert record["source"] == want_source, record
    if want_source == "memory-peer":
        # rank 0 reads its own copy; rank 1's replica is on worker 0, read from its file when /dev/shm is shared
        assert paths == ["_read_file" if rank == 0 or same_host else "_receive"], paths
    train_on_to_step_8(app, data, ckpt, want_step)


@pytest.mark.slow
@pytest.mark.parametrize("same_host", [False, True], ids=["replica-over-gloo", "replica-file-on-same-host"])
def test_a_lost_worker_restores_from_its_peers_replica_then_disk_when_the_peer_is_lost_too(
        tmp_path: Path, same_host: bool) -> None:
    root = str(tmp_path)
    run_ranks(save_memory_steps, 2, root, root)
    shutil.rmtree(tmp_path / "shm" / "worker-1")  # worker 1's host is gone: its own copy and rank 0's replica
    run_ranks(_restore, 2, root, root, 6, "memory-peer", same_host)
    # Losing both hosts leaves only disk (step 4).
    shutil.rmtree(tmp_path / "shm")
    run_ranks(_restore, 2, root, root, 4, "disk", same_host)


def test_a_replica_file_is_read_directly_only_where_that_very_file_is_visible(tmp_path: Path) -> None:
    path = tmp_path / "step.bin"
    path.write_bytes(b"x" * 10)
    seen = mem.FileId.of(path)
    assert seen.visible()
    # another pod's /dev/shm: a file at the same path is another file (another device or inode)
    assert not mem.FileId(seen.path, seen.device + 1, seen.inode, seen.size, seen.mtime_ns).visible()
    replaced = tmp_path / "new.bin"
    replaced.write_bytes(b"y" * 10)
    replaced.replace(path)
    assert not seen.visible()
    path.unlink()
    assert not seen.visible()
    # the plan hands the holder's view of the file to the rank that restores from it
    plan = mem.plan_restore([mem.Inventory(0, {6: (100, 2)}, {1: {6: (100, 2)}}, {(1, 6): seen}),
                             mem.Inventory(1)], 2, None)
    assert isinstance(plan, mem.MemoryPlan) and plan.sources[1].file == seen and plan.sources[0].file is None


@pytest.mark.usefixtures("one_rank")
def test_a_step_due_for_disk_and_memory_takes_the_state_dict_once(tmp_path: Path) -> None:
    # The memory save starts last and shares the disk save's state dict: a thread started earlier took the GIL
    # from the loop's thread mid-save, and a second state dict cost its time again.
    app, data = make_app(seed=0)
    calls: list[int] = []
    state_dict = app.state_dict

    def counted(**kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        return state_dict(**kwargs)

    app.state_dict = counted
    ckpt = Checkpointer(_cfg(tmp_path), tmp_path, memory_dir=tmp_path / "shm")
    assert ckpt.memory is not None
    for step in range(1, 4):  # memory at every step, disk at step 3
        train_step(app, data, ckpt)
        calls.clear()
        assert ckpt.due(step)
        ckpt.save(step, app)
        ckpt.wait_staged()
        assert len(calls) == 1, step
        ckpt.memory.wait()
    ckpt.close()
    assert list(mem.steps_in(mem.own_dir(tmp_path / "shm", 0))) == [3]
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-00000003"]


def _replicate(rank: int, world_size: int, root: str) -> None:
    peer.CHUNK = 4096  # a copy goes in many messages, the last one shorter
    app, data, ckpt = memory_worker(rank, world_size, root)
    assert ckpt.memory is not None
    hosts = [Path(root) / "shm" / f"worker-{r}" for r in range(world_size)]
    for step in (1, 2):
        train_step(app, data, ckpt)
        if step == 2 and rank == 1:  # no room for rank 0's replica on worker 1: a file where its folder goes
            shutil.rmtree(mem.replica_dir(hosts[1], 0))
            mem.replica_dir(hosts[1], 0).write_text("")
        assert ckpt.due(step)
        ckpt.save(step, app)
        ckpt.memory.wait()
        if step == 1:
            dist.barrier()
            other = 1 - rank  # the replica this worker holds is the other rank's own file, byte for byte
            held = mem.step_file(mem.replica_dir(hosts[rank], other), 1, world_size).read_bytes()
            assert held == mem.step_file(mem.own_dir(hosts[other], other), 1, world_size).read_bytes()
            dist.barrier()
    # Step 2 is not complete on every rank: step 1 stays the newest complete one, and nothing hung.
    assert ckpt.memory.newest_step == 1
    assert sorted(mem.steps_in(mem.own_dir(hosts[rank], rank))) == [1, 2]
    ckpt.close()


def test_a_replica_arrives_in_chunks_and_a_worker_without_room_for_it_leaves_the_previous_step(
        tmp_path: Path) -> None:
    run_ranks(_replicate, 2, str(tmp_path), str(tmp_path))


def _slow_copies(rank: int, world_size: int, root: str) -> None:
    """A copy every step, each slower than a step (its exchange delayed): with catch_up before a step is
    reported, as the train loop does, no copy is skipped and the copy of the step before every reported step is
    complete on every rank (its replica on disk at the peer), so a loss then replays at most one step."""
    import time

    exchange = peer.MemoryTier._exchange

    # Well over a step, however loaded the machine: 3 times the last step's time, and at least 0.5 s (a fixed 0.5 s
    # was not, with the rest of the suite on the 2 cores).
    copy_seconds = [0.5]

    def slow(self: peer.MemoryTier, *args: Any) -> bool:
        time.sleep(copy_seconds[0])
        return exchange(self, *args)

    peer.MemoryTier._exchange = slow  # type: ignore[method-assign]
    app, data, ckpt = memory_worker(rank, world_size, root)
    assert ckpt.memory is not None
    hosts = [Path(root) / "shm" / f"worker-{r}" for r in range(world_size)]
    waited = []
    for step in range(1, 7):
        began = time.monotonic()
        train_step(app, data, ckpt)
        copy_seconds[0] = max(0.5, 3 * (time.monotonic() - began))
        began = time.monotonic()
        ckpt.catch_up(step)
        waited.append(time.monotonic() - began)
        # "Reported": the previous copy is complete on every rank, this rank's replica of its source included.
        if step > 1:
            assert ckpt.memory.newest_step == step - 1, (step, ckpt.memory.newest_step)
            source = (rank - 1) % world_size
            assert step - 1 in mem.steps_in(mem.replica_dir(hosts[rank], source))
        ckpt.save(step, app)
    assert min(waited[1:]) > 0.05  # the loop waited for each slow copy: none was skipped
    ckpt.close()
    assert ckpt.memory.newest_step == 6


def test_a_copy_slower_than_a_step_slows_the_loop_rather_than_fall_behind(tmp_path: Path) -> None:
    run_ranks(_slow_copies, 2, str(tmp_path), str(tmp_path))


@pytest.mark.usefixtures("one_rank")
def test_catch_up_waits_only_on_due_steps_and_never_for_a_stuck_copy(tmp_path: Path) -> None:
    import threading
    import time

    tier = peer.MemoryTier(tmp_path / "shm", 2, rank=0, world_size=1, ranks_per_worker=1)
    release = threading.Event()
    try:
        tier._future, tier._future_step = tier._executor.submit(release.wait, 30), 2
        tier._future_began = time.monotonic()
        assert tier.catch_up(3) == 0.0  # not due: reported at once
        threading.Timer(0.2, release.set).start()
        assert tier.catch_up(4) >= 0.15 and not tier.busy  # due: waited for the copy of step 2
        release.clear()
        tier._future = tier._executor.submit(release.wait, 30)
        tier._future_began = time.monotonic() - peer.STUCK_SECONDS  # stuck: begin() skips, nothing waits
        assert tier.catch_up(6) < 0.1 and tier.busy
    finally:
        release.set()
        tier.close()


@pytest.mark.usefixtures("one_rank")
def test_a_copy_stuck_under_way_is_said_once_with_where_its_thread_waits(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A copy that never ends (a peer that never answers its exchange) makes every later copy skip, so the memory
    tier falls behind the disk checkpoints without an error: after STUCK_SECONDS the skip says so, once, with the
    tier thread's stack."""
    import threading
    import time

    tier = peer.MemoryTier(tmp_path / "shm", 1, rank=0, world_size=1, ranks_per_worker=1)
    release = threading.Event()

    def never_answered() -> None:
        release.wait(30)

    try:
        tier._future, tier._future_step = tier._executor.submit(never_answered), 7
        tier._future_began = time.monotonic() - peer.STUCK_SECONDS - 1
        with caplog.at_level("WARNING", logger="flywheel.checkpoint"):
            assert tier.begin(8, None) is False and tier.begin(9, None) is False
        stuck = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(stuck) == 1 and "step 7" in stuck[0] and "never_answered" in stuck[0], stuck
        skipped = [r for r in caplog.records if "skipped: the copy of step 7" in r.getMessage()]
        assert len(skipped) == 2
    finally:
        release.set()
        tier.close()
    fresh = peer.MemoryTier(tmp_path / "shm2", 1, rank=0, world_size=1, ranks_per_worker=1)
    try:
        fresh._future_began = time.monotonic() - 100  # idle: nothing under way, nothing to say
        fresh._say_if_stuck()
    finally:
        fresh.close()
    assert peer.thread_stack("no-such-thread").startswith("(no thread")


@pytest.mark.usefixtures("one_rank")
def test_a_replica_that_cannot_be_put_in_place_is_lost_not_raised(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The last move of a received replica failing (its file taken away meanwhile) must not raise out of the
    exchange: the peer would then wait for chunks forever and every later copy be skipped."""
    tier = peer.MemoryTier(tmp_path / "shm", 1, rank=0, world_size=1, ranks_per_worker=1)

    def taken(src: object, dst: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", str(src))

    monkeypatch.setattr(peer.os, "replace", taken)
    try:
        error = tier._receive_replica(0, 3, None)
        assert isinstance(error, FileNotFoundError)  # the replica is lost, and why is returned for the report
    finally:
        tier.close()

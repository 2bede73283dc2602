"""Drain ahead, the ranks' side, through a real etcd: the operator's checkpoint request makes every rank save the
same step to the memory tier (not due by memoryEverySteps), answer {id, step} and stop with STOPPED, training no
step after it (trainer/checkpoint/request.py, train_loop.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flywheel.contracts import exitcodes
from flywheel.contracts.memory_root import forget, memory_root
from flywheel.etcd import requests as etcd_requests
from flywheel.etcd.session import EtcdSession
from flywheel.trainer.checkpoint.tiers import memory as mem
from tests.rendezvous.etcd_server import EtcdServer, etcd_server  # noqa: F401 (the fixture)

from .workers import events, job_spec, launch, logs

pytestmark = pytest.mark.timeout(240)
RUN = "drain-run"


def _wait_for_step(workdir: Path, step: int, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["event"] == "step" and e["step"] >= step for e in events(workdir)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no step {step} within {timeout}s\n{logs(workdir)}")


@pytest.mark.parametrize("moving", [(), (0,)], ids=["memory", "disk-when-the-move-takes-every-copy"])
def test_a_checkpoint_request_saves_every_rank_at_one_step_then_stops(etcd_server: EtcdServer,  # noqa: F811
                                                                      tmp_path: Path, moving: tuple[int, ...]) -> None:
    """Both ranks here are replica 0 (no FLYWHEEL_REPLICA_INDEX): a request moving it takes every rank's own copy
    and the replica its peer holds, so that checkpoint must go to disk; a request moving no worker of theirs stays
    in memory."""
    spec = job_spec(2, steps=2000)
    spec["checkpoint"]["memoryEverySteps"] = 1000  # the tier is on; no step of this test is due for it
    env = {"PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": etcd_server.endpoint, "PET_RDZV_ID": RUN}
    root = memory_root("tiny", "0", str(tmp_path / "ckpt"))
    procs = launch(2, spec, tmp_path, extra_env=env)
    session = EtcdSession(etcd_server.endpoint, retry_seconds=5.0)
    try:
        _wait_for_step(tmp_path, 3)
        session.run(etcd_requests.put_request(session, RUN, etcd_requests.CheckpointRequest("r1", "node n1 test",
                                                                                               moving)))
        codes = [p.wait(timeout=120) for p in procs]
        assert codes == [exitcodes.STOPPED] * 2, logs(tmp_path)
        done = session.run(etcd_requests.read_state(session, RUN)).done
        assert sorted(done) == [0, 1] and {d.id for d in done.values()} == {"r1"}
        step = done[0].step
        assert done[1].step == step >= 3  # one step, agreed in the per-step collective
        trained = [e["step"] for e in events(tmp_path) if e["event"] == "step"]
        assert max(trained) == step  # no step after the checkpoint: nothing to replay
        if not moving:
            for rank in (0, 1):
                assert step in mem.steps_in(mem.own_dir(root, rank)), logs(tmp_path)
            assert not list((tmp_path / "ckpt").glob("step-*")), "a memory-tier drain writes no disk checkpoint"
        else:
            saved = [e["step"] for e in events(tmp_path) if e["event"] == "checkpoint"]
            assert saved[-1] == step and (tmp_path / "ckpt" / f"step-{step:08d}").is_dir(), logs(tmp_path)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        session.close()
        forget(root.parent)


def test_a_request_already_answered_is_not_pending(etcd_server: EtcdServer) -> None:  # noqa: F811
    from flywheel.trainer.checkpoint.request import CheckpointRequests

    env = {"PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": etcd_server.endpoint, "PET_RDZV_ID": "run-a"}
    first = CheckpointRequests.from_environ(0, env)
    assert first is not None and not first.pending()
    session = EtcdSession(etcd_server.endpoint, retry_seconds=5.0)
    try:
        session.run(etcd_requests.put_request(session, "run-a", etcd_requests.CheckpointRequest("r7")))
        deadline = time.monotonic() + 5
        while not first.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert first.pending() and first.answer(12) == "r7" and not first.pending()
        first.close()
        again = CheckpointRequests.from_environ(0, env)  # the rank restarted in place: its answer is there
        assert again is not None and not again.pending()
        again.close()
        assert CheckpointRequests.from_environ(0, {}) is None  # no etcd rendezvous: nothing to follow
    finally:
        session.close()

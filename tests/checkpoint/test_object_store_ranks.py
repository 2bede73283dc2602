"""Two ranks with an s3:// checkpoint.dir and a local staging directory each (as pods with their own emptyDir):
each rank uploads the shards it wrote, rank 0 the marker last; a rank's own folder (shards without the marker) is
not kept; after both local tiers are wiped, both ranks download the step and resume with the saved state; after a
restart that keeps rank 0's directory (its marker and its own shards), the missing shards are downloaded and the
bucket's copy is never marked bad; an upload failing on one rank is reported with that rank's cause."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ckpt_helpers import FakeEvents, assert_same_state, full_state, make_app, run_ranks, train_step

from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint import store
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.tiers.bucket import RemoteStore
from tests.s3_server import s3_server, use_server

pytestmark = pytest.mark.slow


def _cfg(url: str, root: str, rank: int) -> CheckpointSpec:
    return CheckpointSpec(dir=url, local_dir=str(Path(root) / f"pod-{rank}"), every_steps=2)


def _save(rank: int, world_size: int, url: str, root: str) -> None:
    app, data = make_app(seed=0, rank=rank, world_size=world_size)
    ckpt = Checkpointer(_cfg(url, root, rank), url)
    for step in (1, 2):
        train_step(app, data, ckpt)
    ckpt.save(2, app)  # asynchronous: staged while step 3 runs, then written and uploaded
    expected = full_state(app)
    train_step(app, data, ckpt)
    ckpt.close()
    if rank == 0:
        torch.save(expected, Path(root) / "expected.pt")


def _restore(rank: int, world_size: int, url: str, root: str) -> None:
    app, _ = make_app(seed=1, rank=rank, world_size=world_size)
    ckpt = Checkpointer(_cfg(url, root, rank), url)
    assert ckpt.restore(app) == 2
    assert ckpt.restored_path == str(store.step_dir(Path(root) / f"pod-{rank}", 2))
    assert_same_state(full_state(app), torch.load(Path(root) / "expected.pt", weights_only=False))
    ckpt.close()


def test_per_pod_local_dirs_upload_their_shards_and_download_the_whole_step(tmp_path, monkeypatch):
    url = "s3://ranks/job"
    with s3_server() as env:
        use_server(env, monkeypatch, "ranks")  # the spawned ranks inherit the environment
        run_ranks(_save, 2, str(tmp_path), url, str(tmp_path))
        [record] = RemoteStore(url).committed()
        assert record.step == 2 and record.world_size == 2
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(record.checksums)
        assert store.read_commit(store.step_dir(tmp_path / "pod-0", 2)) is not None
        assert not store.step_dirs(tmp_path / "pod-1")  # shards without a marker: uploaded, not kept
        shutil.rmtree(tmp_path / "pod-0")
        run_ranks(_restore, 2, str(tmp_path), url, str(tmp_path))


def _save_2_and_4(rank: int, world_size: int, url: str, root: str) -> None:
    app, data = make_app(seed=0, rank=rank, world_size=world_size)
    ckpt = Checkpointer(_cfg(url, root, rank), url)
    for step in (1, 2, 3, 4):
        train_step(app, data, ckpt)
        if step % 2 == 0:
            ckpt.save(step, app, blocking=True)
    ckpt.close()
    if rank == 0:
        torch.save(full_state(app), Path(root) / "expected.pt")


def _restore_4(rank: int, world_size: int, url: str, root: str) -> None:
    app, _ = make_app(seed=1, rank=rank, world_size=world_size)
    events = FakeEvents()
    ckpt = Checkpointer(_cfg(url, root, rank), url, events=events)
    assert ckpt.restore(app) == 4
    assert events.named("checkpoint_bad") == []
    assert_same_state(full_state(app), torch.load(Path(root) / "expected.pt", weights_only=False))
    ckpt.close()


def test_a_restart_keeping_rank_0s_directory_downloads_the_other_shards(tmp_path, monkeypatch):
    url = "s3://ranks/kept"
    with s3_server() as env:
        use_server(env, monkeypatch, "ranks")
        run_ranks(_save_2_and_4, 2, str(tmp_path), url, str(tmp_path))
        step4 = store.step_dir(tmp_path / "pod-0", 4)
        assert "__1_0.distcp" not in {p.name for p in step4.iterdir()}  # rank 1's shard is in the bucket only
        run_ranks(_restore_4, 2, str(tmp_path), url, str(tmp_path))  # pod-0 kept (an in-place restart)
        remote = RemoteStore(url)
        assert [r.step for r in remote.committed()] == [2, 4] and not remote.is_bad(4) and not remote.is_bad(2)
        assert "__1_0.distcp" in {p.name for p in step4.iterdir()}


def _save_rank_1_denied(rank: int, world_size: int, url: str, root: str) -> None:
    if rank == 1:
        def denied(self: RemoteStore, folder: object, step: int, names: list[str]) -> None:
            raise PermissionError(13, "AccessDenied: this node's role may not PutObject")

        RemoteStore.upload = denied  # type: ignore[method-assign]  # this spawned process only
    app, data = make_app(seed=0, rank=rank, world_size=world_size)
    events = FakeEvents()
    ckpt = Checkpointer(_cfg(url, root, rank), url, events=events)
    for step in (1, 2):
        train_step(app, data, ckpt)
    ckpt.save(2, app, blocking=True)
    ckpt.close()
    if rank == 0:
        Path(root, "failed.json").write_text(json.dumps(events.named("checkpoint_failed")))


def test_an_upload_failing_on_one_rank_is_reported_with_its_cause(tmp_path, monkeypatch):
    url = "s3://ranks/denied"
    with s3_server() as env:
        use_server(env, monkeypatch, "ranks")
        run_ranks(_save_rank_1_denied, 2, str(tmp_path), url, str(tmp_path))
    [failed] = json.loads((tmp_path / "failed.json").read_text())
    assert failed["reason"] == "permission" and failed["step"] == 2
    assert "failed on rank 1: PermissionError" in failed["message"] and "AccessDenied" in failed["message"]
    assert "rank 1: PermissionError" in failed["error"]

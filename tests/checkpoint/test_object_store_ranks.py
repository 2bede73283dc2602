"""Two ranks with an s3:// checkpoint.dir and a local staging directory each (as pods with their own emptyDir):
each rank uploads the shards it wrote, rank 0 the marker last; a rank's own folder (shards without the marker) is
not kept; after both local tiers are wiped, both ranks download the step and resume with the saved state."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from ckpt_helpers import assert_same_state, full_state, make_app, run_ranks, train_step

from flywheel.spec import CheckpointSpec
from flywheel.trainer import checkpoint_store as store
from flywheel.trainer.checkpoint import Checkpointer
from flywheel.trainer.checkpoint_remote import RemoteStore
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

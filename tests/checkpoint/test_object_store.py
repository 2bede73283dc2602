"""checkpoint.dir as s3://bucket/prefix against an S3-compatible server (moto): a save commits to the local staging
directory and is uploaded with its commit marker last; a restore with the local tier wiped downloads the newest
committed step and resumes bitwise-exact; the local copy is preferred when it is the newest; a torn upload is never
listed; retention and bad-marking work in the bucket; a local copy that lacks files or is damaged is replaced by the
bucket's copy of that step (the bucket's copy never marked bad for it); an unreadable bucket fails the start; a
failing bucket is one notice per cause."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ckpt_helpers import FakeEvents, assert_same_state, flip_byte, full_state, make_app, train_saving, train_step

from flywheel.contracts.memory_root import read_identity
from flywheel.eventlog import RunFold, parse_record
from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint import integrity, store
from flywheel.trainer.checkpoint.manager import Checkpointer
from flywheel.trainer.checkpoint.tiers import remote as checkpoint_remote
from flywheel.trainer.checkpoint.tiers.bucket import RemoteStore
from flywheel.trainer.checkpoint.tiers.remote import RemoteUnreadable
from tests.s3_server import s3_server, use_server

pytestmark = pytest.mark.usefixtures("one_rank")
BUCKET = "ckpt-bucket"
STEPS = 6


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, str]]:
    with s3_server() as env:
        yield env


@pytest.fixture
def url(server: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    use_server(server, monkeypatch, BUCKET)
    return f"s3://{BUCKET}/{tmp_path.name}/run"


def cfg(url: str, local: Path, keep: int = 5) -> CheckpointSpec:
    return CheckpointSpec(dir=url, local_dir=str(local), every_steps=2, keep=keep)


def train(url: str, local: Path, steps: range, app: Any, data: Any, keep: int = 5, events: Any = None,
          blocking: bool = True) -> None:
    ckpt = Checkpointer(cfg(url, local, keep), url, events=events)
    for step in steps:
        train_step(app, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, app, blocking=blocking)
    ckpt.close()


def test_saves_commit_locally_then_upload_with_the_marker(url: str, tmp_path: Path) -> None:
    app, data = make_app(seed=0)
    events = FakeEvents()
    for steps in (range(1, 3), range(3, 5)):  # asynchronous: the upload runs on the writer thread; close waits
        train(url, tmp_path / "local", steps, app, data, events=events, blocking=False)
    assert [r.step for r in store.committed(tmp_path / "local")] == [2, 4]
    remote = RemoteStore(url).committed()
    assert [r.step for r in remote] == [2, 4] and remote[-1].path == f"{url}/step-00000004"
    local_marker = store.read_commit(store.step_dir(tmp_path / "local", 4))
    assert local_marker is not None and remote[-1].checksums == local_marker.checksums


def test_with_the_local_tier_wiped_restore_downloads_and_resumes_bitwise(url: str, tmp_path: Path) -> None:
    clean, data = make_app(seed=0)
    for _ in range(STEPS):
        train_step(clean, data)
    expected = full_state(clean)

    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    shutil.rmtree(tmp_path / "local")  # the pod and its emptyDir are gone

    events = FakeEvents()
    resumed, data = make_app(seed=7)
    ckpt = Checkpointer(cfg(url, tmp_path / "fresh"), url, events=events)
    assert ckpt.restore(resumed) == 4
    assert ckpt.restored_path == str(store.step_dir(tmp_path / "fresh", 4))
    assert not list((tmp_path / "fresh").glob(".incoming-*"))
    for step in range(5, STEPS + 1):
        train_step(resumed, data, ckpt)
        if ckpt.due(step):
            ckpt.save(step, resumed)
    ckpt.close()
    assert_same_state(full_state(resumed), expected)
    assert [r.step for r in RemoteStore(url).committed()] == [2, 4, 6]


def test_the_local_copy_is_preferred_when_it_is_the_newest(url: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    downloads: list[int] = []
    monkeypatch.setattr(RemoteStore, "download", lambda self, step, root: downloads.append(step))
    resumed, _ = make_app(seed=7)
    assert Checkpointer(cfg(url, tmp_path / "local"), url).restore(resumed) == 4
    assert downloads == []


def test_a_torn_upload_is_never_listed_and_is_reported(url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 3), app, data)
    real_upload = RemoteStore.upload

    def upload_one_file_then_fail(self: RemoteStore, folder: Any, step: int, names: list[str]) -> None:
        real_upload(self, folder, step, names[:1])
        raise OSError(5, "connection reset by peer")

    monkeypatch.setattr(RemoteStore, "upload", upload_one_file_then_fail)
    events = FakeEvents()
    train(url, tmp_path / "local", range(3, 5), app, data, events=events)
    remote = RemoteStore(url)
    assert remote.fs.ls(f"{BUCKET}/{tmp_path.name}/run/step-00000004")  # a part of step 4 is in the bucket ...
    assert [r.step for r in remote.committed()] == [2]  # ... but not its marker: not committed there
    [failed] = events.named("checkpoint_failed")
    assert failed["step"] == 4 and failed["reason"] == "io_error" and "connection reset" in failed["message"]
    assert failed["message"].startswith(f"upload of checkpoint step 4 to {url} failed")
    assert [r.step for r in store.committed(tmp_path / "local")] == [2, 4]  # the local copy stays committed

    shutil.rmtree(tmp_path / "local")
    resumed, _ = make_app(seed=7)
    assert Checkpointer(cfg(url, tmp_path / "fresh"), url).restore(resumed) == 2


def test_a_final_step_whose_upload_failed_is_saved_again(url: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The final save (train_loop._finish) counts a step as saved only once the bucket holds it: committed locally
    is not enough (a per-pod dir keeps rank 0's shards only)."""
    app, data = make_app(seed=0)
    ckpt = Checkpointer(cfg(url, tmp_path / "local"), url, events=FakeEvents())
    real_upload = RemoteStore.upload

    def refused(self: RemoteStore, folder: Any, step: int, names: list[str]) -> None:
        raise PermissionError(13, "AccessDenied")

    for step in range(1, 5):
        train_step(app, data, ckpt)
        if step == 4:
            monkeypatch.setattr(RemoteStore, "upload", refused)
        if ckpt.due(step):
            ckpt.save(step, app, blocking=True)
    ckpt.close()
    assert ckpt.on_disk(4) and not ckpt.holds(4)
    assert ckpt.unsaved_reason(4) == f"upload to {url} failed: PermissionError: [Errno 13] AccessDenied"

    monkeypatch.setattr(RemoteStore, "upload", real_upload)
    expected = full_state(app)
    ckpt.save_final(4, app)
    assert ckpt.holds(4) and ckpt.unsaved_reason(4) is None
    assert [r.step for r in RemoteStore(url).committed()] == [2, 4]
    shutil.rmtree(tmp_path / "local")
    resumed, _ = make_app(seed=7)
    assert Checkpointer(cfg(url, tmp_path / "fresh"), url).restore(resumed) == 4
    assert_same_state(full_state(resumed), expected)


def test_a_deleted_prefix_used_again_starts_fresh_over_its_staged_steps(url: str, tmp_path: Path) -> None:
    """Deleting the bucket prefix starts the job over: the steps (and memory copies) staged for the earlier prefix
    in the same local dir are not resumed. Without the prefix deleted they stay (an upload that failed)."""
    local, shm = tmp_path / "local", tmp_path / "shm"
    spec = CheckpointSpec.model_validate({"dir": url, "localDir": str(local), "everySteps": 2, "memoryEverySteps": 2,
                                          "async": False})
    app, data = make_app(seed=0)
    ckpt = Checkpointer(spec, url, memory_dir=shm)
    train_saving(app, data, ckpt, 4)
    ckpt.close()
    assert [r.step for r in store.committed(local)] == [2, 4]
    ckpt = Checkpointer(spec, url, memory_dir=shm)
    assert ckpt.restore(make_app(seed=1)[0]) == 4  # the same prefix: resumed
    ckpt.close()

    RemoteStore(url).fs.rm(url, recursive=True)  # the user starts over
    fresh, _ = make_app(seed=2)
    ckpt = Checkpointer(spec, url, memory_dir=shm)
    assert ckpt.restore(fresh) is None
    ckpt.close()
    assert store.committed(local) == []
    assert read_identity(local) == RemoteStore(url).identity()[0]


def test_retention_applies_to_the_bucket(url: str, tmp_path: Path) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 9), app, data, keep=2)
    assert [r.step for r in RemoteStore(url).committed()] == [6, 8]
    assert [r.step for r in store.committed(tmp_path / "local")] == [6, 8]


def test_a_damaged_object_is_marked_bad_in_the_bucket_and_the_previous_step_used(url: str, tmp_path: Path) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    shutil.rmtree(tmp_path / "local")
    remote = RemoteStore(url)
    [shard] = [k for k in remote.fs.ls(f"{BUCKET}/{tmp_path.name}/run/step-00000004") if k.endswith(".distcp")]
    raw = bytearray(remote.fs.cat_file(shard))
    raw[len(raw) // 2] ^= 0x01
    remote.fs.pipe_file(shard, bytes(raw))

    events = FakeEvents()
    resumed, _ = make_app(seed=7)
    assert Checkpointer(cfg(url, tmp_path / "fresh"), url, events=events).restore(resumed) == 2
    assert events.named("checkpoint_bad")[0]["step"] == 4
    assert remote.is_bad(4) and [r.step for r in RemoteStore(url).committed()] == [2]


def _damage_marker(remote: RemoteStore, prefix: str) -> list[str]:
    """The step's objects, its marker then made unreadable (a torn write of it)."""
    objects = sorted(k.rsplit("/", 1)[-1] for k in remote.fs.ls(prefix, detail=False))
    remote.fs.pipe_file(f"{prefix}/{store.COMMIT_MARKER}", b'{"step": 4, "wor')
    return objects


def test_a_damaged_marker_in_the_bucket_is_set_aside_and_the_step_saved_again_cleanly(url: str,
                                                                                        tmp_path: Path) -> None:
    """A step whose marker object is there but unreadable is damage after its commit, not a torn upload: it is
    marked bad in the bucket and reported, the previous step restored; saving that step again first moves the
    damaged one aside (kept, bad-step-N-<time>), so the new save is listed and the old bytes are not lost."""
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    shutil.rmtree(tmp_path / "local")
    remote = RemoteStore(url)
    run = f"{BUCKET}/{tmp_path.name}/run"
    objects = _damage_marker(remote, f"{run}/step-00000004")

    events = FakeEvents()
    resumed, data = make_app(seed=7)
    assert Checkpointer(cfg(url, tmp_path / "fresh"), url, events=events).restore(resumed) == 2
    [bad] = events.named("checkpoint_bad")
    assert bad["step"] == 4 and "commit marker is unreadable" in bad["reason"] and bad["path"].endswith(
        "step-00000004")
    assert remote.is_bad(4)
    train(url, tmp_path / "fresh", range(3, 7), resumed, data)  # saves step 4 again, then 6
    remote.fs.invalidate_cache()
    [aside] = [k for k in remote.fs.ls(run, detail=False) if k.rsplit("/", 1)[-1].startswith("bad-step-00000004-")]
    kept = sorted(k.rsplit("/", 1)[-1] for k in remote.fs.ls(aside, detail=False))
    assert kept == sorted([*objects, integrity.BAD_MARKER])  # every object of the damaged step kept
    assert [r.step for r in RemoteStore(url).committed()] == [2, 4, 6]


def test_retention_never_deletes_a_step_whose_marker_is_damaged(url: str, tmp_path: Path) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data, keep=2)
    remote = RemoteStore(url)
    prefix = f"{BUCKET}/{tmp_path.name}/run/step-00000002"
    objects = _damage_marker(remote, prefix)  # while the run goes on: no restore has seen it
    train(url, tmp_path / "local", range(5, 9), app, data, keep=2)  # retention after each upload
    remote.fs.invalidate_cache()
    assert sorted(k.rsplit("/", 1)[-1] for k in remote.fs.ls(prefix, detail=False)) == objects
    assert [r.step for r in RemoteStore(url).committed()] == [6, 8]


def _no_downloads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    downloads: list[int] = []
    real = RemoteStore.download

    def counted(self: RemoteStore, step: int, root: Any) -> Path:
        downloads.append(step)
        return real(self, step, root)

    monkeypatch.setattr(RemoteStore, "download", counted)
    return downloads


def test_a_local_copy_missing_files_of_its_commit_is_completed_from_the_bucket(url: str, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As rank 0's per-pod directory after a restart in place: the marker and its own files only. It is not
    damaged: the missing files are downloaded, nothing is marked bad."""
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    expected = full_state(app)
    (store.step_dir(tmp_path / "local", 4) / ".metadata").unlink()
    downloads = _no_downloads(monkeypatch)
    events = FakeEvents()
    resumed, _ = make_app(seed=7)
    assert Checkpointer(cfg(url, tmp_path / "local"), url, events=events).restore(resumed) == 4
    assert downloads == [4] and events.named("checkpoint_bad") == []
    assert_same_state(full_state(resumed), expected)
    assert [r.step for r in RemoteStore(url).committed()] == [2, 4]


def test_a_damaged_local_copy_is_replaced_by_the_buckets_copy_of_that_step(url: str, tmp_path: Path) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    expected = full_state(app)
    shard = next(store.step_dir(tmp_path / "local", 4).glob("*.distcp"))
    flip_byte(shard, shard.stat().st_size // 2)
    events = FakeEvents()
    resumed, _ = make_app(seed=7)
    ckpt = Checkpointer(cfg(url, tmp_path / "local"), url, events=events)
    assert ckpt.restore(resumed) == 4
    assert ckpt.restored_path == str(store.step_dir(tmp_path / "local", 4))
    assert_same_state(full_state(resumed), expected)
    [bad] = events.named("checkpoint_bad")  # the local copy: kept aside, reported
    assert bad["step"] == 4 and "bad-step-00000004-" in bad["path"]
    assert [r.step for r in RemoteStore(url).committed()] == [2, 4]  # the bucket's copy is good: never marked


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_remote, "BACKOFF_S", 0.0)


@pytest.mark.usefixtures("quick_retries")
def test_an_unreachable_bucket_fails_the_start_naming_the_field_and_endpoint(url: str, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()
    resumed, _ = make_app(seed=7)
    with pytest.raises(RemoteUnreadable, match=rf"spec\.checkpoint\.dir: could not read .*127\.0\.0\.1:{port}"):
        Checkpointer(cfg(url, tmp_path / "fresh"), url).restore(resumed)


@pytest.mark.usefixtures("quick_retries")
def test_a_download_that_keeps_failing_fails_the_start(url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    shutil.rmtree(tmp_path / "local")
    tries: list[int] = []

    def full(self: RemoteStore, step: int, root: Any) -> Path:
        tries.append(step)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RemoteStore, "download", full)
    resumed, _ = make_app(seed=7)
    with pytest.raises(RemoteUnreadable, match=r"could not download checkpoint step 4 .*No space left"):
        Checkpointer(cfg(url, tmp_path / "fresh"), url).restore(resumed)
    assert tries == [4] * checkpoint_remote.ATTEMPTS  # retried, never an older step instead
    assert [r.step for r in RemoteStore(url).committed()] == [2, 4]


@pytest.mark.usefixtures("quick_retries")
def test_a_brief_outage_is_retried(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app, data = make_app(seed=0)
    train(url, tmp_path / "local", range(1, 5), app, data)
    shutil.rmtree(tmp_path / "local")
    real, calls = RemoteStore.committed, []

    def flaky(self: RemoteStore) -> list[store.Committed]:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("endpoint restarting")
        return real(self)

    monkeypatch.setattr(RemoteStore, "committed", flaky)
    resumed, _ = make_app(seed=7)
    assert Checkpointer(cfg(url, tmp_path / "fresh"), url).restore(resumed) == 4


def _notices(events: FakeEvents) -> list[int | None]:
    fold = RunFold()
    for i, (name, fields) in enumerate(events.emitted):
        record = parse_record({"event": name, "time": float(i), **fields})
        if record is not None:
            fold.add(record)
    return [n.step for n in fold.checkpoint_notices]


def test_a_failing_bucket_is_one_notice_per_cause(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = RemoteStore.upload

    def denied(self: RemoteStore, folder: Any, step: int, names: list[str]) -> None:
        raise PermissionError(13, "AccessDenied")

    monkeypatch.setattr(RemoteStore, "upload", denied)
    app, data = make_app(seed=0)
    events = FakeEvents()
    train(url, tmp_path / "local", range(1, 9), app, data, events=events)  # four saves, four failed uploads
    assert len(events.named("checkpoint_failed")) == 4
    assert _notices(events) == [2]
    monkeypatch.setattr(RemoteStore, "upload", real)
    train(url, tmp_path / "local", range(9, 13), app, data, events=events)  # the bucket works again ...
    monkeypatch.setattr(RemoteStore, "upload", denied)
    train(url, tmp_path / "local", range(13, 15), app, data, events=events)  # ... then fails again: said again
    assert _notices(events) == [2, 14]

"""checkpoint.dir as an object-store URL: what counts as one, where it is staged locally, and the refusals of
`flywheel plan/run` for an unknown scheme or a missing library (naming checkpoint.dir); the restore candidates over
the local tier and the bucket."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.cli import EXIT_BAD_INPUT, main
from flywheel.spec import SpecError, parse_job
from flywheel.spec import storage as object_store
from flywheel.spec.parse import check_local_paths
from flywheel.trainer.checkpoint.store import Committed
from flywheel.trainer.checkpoint.tiers.bucket import RemoteStore
from flywheel.trainer.checkpoint.tiers.remote import newest_first
from tests.builders import example, job_file

DIR, LOCAL_DIR = "spec.checkpoint.dir", "spec.checkpoint.localDir"


@pytest.mark.parametrize("directory,url", [("s3://bucket/prefix", True), ("gs://b", True), ("S3://b/p", True),
                                           ("memory://x", True), ("/ckpt", False), ("ckpt", False),
                                           ("file:///ckpt", False), ("./s3:/x", False)])
def test_what_counts_as_an_object_store(directory: str, url: bool) -> None:
    assert object_store.is_url(directory) is url


def test_a_url_is_staged_under_tmp_by_bucket_and_prefix_unless_local_dir_says_where() -> None:
    assert object_store.local_dir("s3://bucket/a/b/") == "/tmp/flywheel-checkpoints/s3/bucket/a/b"
    assert object_store.local_dir("s3://bucket/../x") == "/tmp/flywheel-checkpoints/s3/bucket/x"  # never escapes
    assert object_store.local_dir("gs://bucket", "/scratch/ckpt") == "/scratch/ckpt"
    assert object_store.local_dir("/ckpt", "/scratch/ckpt") == "/ckpt"  # a path dir is its own local dir


def test_unknown_schemes_and_missing_libraries_are_refused_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    assert object_store.storage_problem("/ckpt") is None
    assert object_store.storage_problem("s3://bucket/prefix") is None  # s3fs is installed here
    problem = object_store.storage_problem("nosuch://bucket/prefix")
    assert problem and "spec.checkpoint.dir" in problem and "unknown storage scheme 'nosuch'" in problem
    from fsspec.registry import known_implementations

    monkeypatch.setitem(known_implementations, "fake", {"class": "flywheel_no_such_module.FakeFS",
                                                        "err": "Install fakefs to access fake://"})
    problem = object_store.storage_problem("fake://bucket")
    assert problem and "spec.checkpoint.dir" in problem and "Install fakefs" in problem


def test_run_checks_the_scheme_and_the_local_dir(tmp_path: Path) -> None:
    job = example(**{DIR: "nosuch://b/p"})
    with pytest.raises(SpecError, match=r"spec\.checkpoint\.dir: unknown storage scheme"):
        check_local_paths(parse_job(job))
    blocker = tmp_path / "file"
    blocker.write_text("")
    job = example(**{DIR: "s3://b/p", LOCAL_DIR: str(blocker / "x")})
    with pytest.raises(SpecError, match=r"spec\.checkpoint\.localDir: .* is not writable"):
        check_local_paths(parse_job(job))
    job = example(**{DIR: "s3://b/p", LOCAL_DIR: str(tmp_path / "staging")})
    check_local_paths(parse_job(job))


def test_plan_refuses_an_unknown_scheme(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(job_file(tmp_path, example(**{DIR: "nosuch://bucket/prefix"})))]) == EXIT_BAD_INPUT
    assert "spec.checkpoint.dir: unknown storage scheme" in capsys.readouterr().out
    assert main(["plan", str(job_file(tmp_path, example(**{DIR: "s3://bucket/prefix"})))]) == 0


def _committed(step: int, path: str) -> Committed:
    return Committed(step=step, path=path, world_size=1, time=0.0)


def test_restore_candidates_prefer_the_local_copy_and_know_what_the_bucket_has() -> None:
    local = [_committed(2, "/l/2"), _committed(4, "/l/4")]
    remote = [_committed(2, "s3://b/2"), _committed(6, "s3://b/6")]
    assert [(r.path, in_bucket) for r, in_bucket in newest_first(local, remote)] == [
        ("s3://b/6", True), ("/l/4", False), ("/l/2", True)]
    assert newest_first([], []) == []


def test_the_store_addresses_steps_under_the_prefix() -> None:
    remote = RemoteStore("memory://bucket/some/prefix/")
    assert remote.url == "memory://bucket/some/prefix"
    assert remote.step_url(7) == "memory://bucket/some/prefix/step-00000007"
    assert remote.committed() == []  # a prefix nothing was written to yet

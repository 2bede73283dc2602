"""checkpoint.dir URL edge cases decided at plan time the way the trainer reads them: a scheme in upper case is
the same store, a URL without a bucket is refused naming the field, file:// is its path (and so not shared by the
cluster rule); and the fold's one rule for a failing bucket: one notice per cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.cli import EXIT_BAD_INPUT, main
from flywheel.eventlog.fold import fold
from flywheel.eventlog.records import Checkpoint, CheckpointFailed, Record, parse_record
from flywheel.spec import storage as object_store
from flywheel.spec.storage import CheckpointStorage, cluster_storage_problems
from flywheel.trainer.checkpoint.tiers.bucket import RemoteStore
from tests.builders import example, job_file


def test_a_scheme_in_upper_case_is_the_same_store() -> None:
    assert object_store.normalise("S3://Bucket/Prefix") == "s3://Bucket/Prefix"
    assert object_store.normalise("/ckpt") == "/ckpt"
    assert RemoteStore("MEMORY://bucket/p").url == "memory://bucket/p"
    assert object_store.local_dir("S3://bucket/p") == "/tmp/flywheel-checkpoints/s3/bucket/p"


@pytest.mark.parametrize("directory", ["s3://", "s3:///prefix", "GS://"])
def test_a_url_without_a_bucket_is_refused_naming_the_field(directory: str) -> None:
    problem = object_store.storage_problem(directory)
    assert problem and problem.startswith("spec.checkpoint.dir:") and "names no bucket" in problem


def test_a_file_url_is_its_path() -> None:
    assert object_store.local_dir("file:///ckpt") == "/ckpt"
    assert object_store.local_dir("FILE:///ckpt", "/ignored") == "/ckpt"  # localDir is for object stores only
    assert object_store.storage_problem("file:///ckpt") is None
    problem = object_store.storage_problem("file://")
    assert problem and "spec.checkpoint.dir" in problem and "names no directory" in problem


def test_the_cluster_rule_takes_a_file_url_for_a_pod_local_path() -> None:
    def refused(directory: str) -> bool:
        return bool(cluster_storage_problems(CheckpointStorage(2, "", directory, False)))

    assert refused("file:///ckpt") and refused("/ckpt")
    assert not refused("s3://bucket/p") and not refused("S3://bucket/p")


def test_plan_refuses_a_url_without_a_bucket(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(job_file(tmp_path, example(**{"spec.checkpoint.dir": "s3://"})))]) == EXIT_BAD_INPUT
    assert "spec.checkpoint.dir: 's3://' names no bucket" in capsys.readouterr().out


def _upload_failed(t: float, step: int, reason: str = "permission") -> CheckpointFailed:
    return CheckpointFailed(t, step, reason=reason, message=f"upload of checkpoint step {step} to s3://b/p failed",
                            source="bucket")


def test_a_failing_bucket_is_one_notice_per_cause_until_an_upload_succeeds() -> None:
    records: list[Record] = []
    for i, step in enumerate((2, 4, 6)):  # each local commit, then its upload failing for the same cause
        records += [Checkpoint(10.0 * i, step), _upload_failed(10.0 * i + 1, step)]
    assert [n.step for n in fold(records).checkpoint_notices] == [2]
    records += [Checkpoint(40.0, 8), _upload_failed(41.0, 8, "io_error")]  # another cause: said
    assert [n.step for n in fold(records).checkpoint_notices] == [2, 8]
    records += [Checkpoint(50.0, 10), Checkpoint(60.0, 12), _upload_failed(61.0, 12, "io_error")]  # 10 uploaded
    assert [n.step for n in fold(records).checkpoint_notices] == [2, 8, 12]


def test_a_failing_save_is_still_said_again_after_a_commit() -> None:
    saves: list[Record] = [CheckpointFailed(1.0, 2, reason="no_space"), Checkpoint(2.0, 4),
                           CheckpointFailed(3.0, 6, reason="no_space")]
    assert [n.step for n in fold(saves).checkpoint_notices] == [2, 6]


def test_each_tier_s_failures_are_said_once_per_cause_apart_from_the_others() -> None:
    """A failing memory tier between failing disk saves neither hides nor repeats the disk's notice; the memory
    tier's records are each a notice (its trainer says each cause once; its working saves leave no record)."""
    records: list[Record] = [CheckpointFailed(1.0, 2, reason="no_space"),
                             CheckpointFailed(2.0, 3, reason="no_space", source="memory"),
                             CheckpointFailed(3.0, 4, reason="no_space"),
                             CheckpointFailed(4.0, 5, reason="no_space", source="memory")]
    assert [(n.step, n.source) for n in fold(records).checkpoint_notices] == [(2, "disk"), (3, "memory"),
                                                                               (5, "memory")]


def test_a_checkpoint_failed_record_names_its_tier() -> None:
    raw = {"event": "checkpoint_failed", "time": 1.0, "step": 2, "reason": "no_space", "source": "memory"}
    parsed = parse_record(raw)
    assert isinstance(parsed, CheckpointFailed) and parsed.source == "memory"
    older = parse_record({k: v for k, v in raw.items() if k != "source"})
    assert isinstance(older, CheckpointFailed) and older.source == "disk"

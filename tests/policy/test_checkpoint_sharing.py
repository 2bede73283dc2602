"""One unfinished job per checkpoint location: a newer job waits, creating no worker, while an older unfinished one
writes where it would (policy/checkpoint_sharing.py), and the job cache says who writes where (operator/caches.py)."""

from __future__ import annotations

import asyncio

import pytest

from flywheel.operator import caches
from flywheel.policy import reasons as R
from flywheel.policy.checkpoint_sharing import RECHECK_SECONDS, STOPPING_RECHECK_SECONDS, checkpoint_location
from flywheel.policy.conditions import condition
from flywheel.policy.decisions import CreatePod
from flywheel.policy.due import next_due
from flywheel.policy.observed import CheckpointSharing, DirUser, ObservedProgress
from flywheel.spec.status import ConditionType, Phase, TrainingJobStatus
from tests.builders import NOW, pod, reconcile, spec, view

CLAIM = {"checkpoint.claimName": "shared", "checkpoint.dir": "/ckpt/a"}
EARLIER, LATER = "2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z"


@pytest.mark.parametrize(("namespace", "directory", "claim", "location"), [
    ("ml", "/ckpt/a", "shared", "ml/shared:/ckpt/a"),
    ("ml", "ckpt/a/", "shared", "ml/shared:/ckpt/a"),  # the folder the claim's subPath names
    ("ml", "/ckpt/./a//", "shared", "ml/shared:/ckpt/a"),
    ("ml", "/ckpt/a", "", None),  # each pod's own volume
    ("ml", "s3://bucket/runs/a/", "", "s3://bucket/runs/a"),  # one place in every namespace
    ("other", "S3://bucket/runs/a", "shared", "s3://bucket/runs/a"),
])
def test_where_checkpoints_land(namespace: str, directory: str, claim: str, location: str | None) -> None:
    assert checkpoint_location(namespace, directory, claim) == location


def _pass(others: tuple[DirUser, ...], pods: list | None = None, created: str = LATER,
          status: TrainingJobStatus | None = None):
    sharing = CheckpointSharing("ml", "b", created, others)
    return reconcile(spec(**CLAIM), None, status or TrainingJobStatus(), pods or [], ObservedProgress(), NOW,
                     sharing=sharing)


def _in_use(status: TrainingJobStatus):
    return condition(status, ConditionType.CHECKPOINT_DIR_IN_USE)


def test_a_newer_job_waits_for_an_older_unfinished_one_creating_no_worker() -> None:
    out = _pass((DirUser("ml", "a", EARLIER, finished=False),))
    assert out.status.phase is Phase.PENDING and not [a for a in out.actions if isinstance(a, CreatePod)]
    held = _in_use(out.status)
    assert held is not None and held.status == "True" and held.reason == R.CHECKPOINT_DIR_IN_USE
    assert "ml/shared:/ckpt/a is in use by TrainingJob ml/a" in held.message and "own checkpoint.dir" in held.message
    assert [(e.type, e.reason) for e in out.events if e.reason == R.CHECKPOINT_DIR_IN_USE] == [
        ("Warning", R.CHECKPOINT_DIR_IN_USE)]
    assert out.next_due == NOW + RECHECK_SECONDS  # a deleted holder wakes no one: looked at again
    again = _pass((DirUser("ml", "a", EARLIER, finished=False),), status=out.status)
    assert not [e for e in again.events if e.reason == R.CHECKPOINT_DIR_IN_USE]  # said once


def test_once_the_older_job_finishes_the_newer_one_creates_its_workers() -> None:
    held = _pass((DirUser("ml", "a", EARLIER, finished=False),))
    out = _pass((DirUser("ml", "a", EARLIER, finished=True),), status=held.status)
    assert len([a for a in out.actions if isinstance(a, CreatePod)]) == 2
    freed = _in_use(out.status)
    assert freed is not None and freed.status == "False" and freed.reason == R.CHECKPOINT_DIR_FREE
    assert _pass(()).status.phase is Phase.PENDING and _in_use(_pass(()).status) is None  # never held: no condition


@pytest.mark.parametrize("other", [
    DirUser("ml", "a", LATER, finished=False),  # same time: the name decides, and "a" < "b"
    DirUser("ml", "c", "2026-11-29T09:00:00Z", finished=False),
])
def test_the_oldest_unfinished_job_has_the_location(other: DirUser) -> None:
    mine = _pass((other,), created=LATER)
    assert mine.status.phase is Phase.PENDING and _in_use(mine.status) is not None
    theirs = reconcile(spec(**CLAIM), None, TrainingJobStatus(), [], ObservedProgress(), NOW,
                       sharing=CheckpointSharing("ml", other.name, other.created, (DirUser("ml", "b", LATER, False),)))
    assert len([a for a in theirs.actions if isinstance(a, CreatePod)]) == 2  # the older one is never held


def test_a_job_whose_workers_run_is_not_stopped_for_it() -> None:
    out = _pass((DirUser("ml", "a", EARLIER, finished=False),), pods=[pod(0), pod(1)],
                status=TrainingJobStatus(phase=Phase.RUNNING))
    assert out.status.phase is Phase.RUNNING and _in_use(out.status) is None


def test_the_recheck_is_due_only_while_held() -> None:
    held = _pass((DirUser("ml", "a", EARLIER, finished=False),))
    job = view(spec(**CLAIM), [])
    assert next_due(held.status, job) == NOW + RECHECK_SECONDS
    assert next_due(TrainingJobStatus(), job) is None


def _body(name: str, directory: str, claim: str = "shared", phase: str = "") -> dict:
    return {"metadata": {"namespace": "ml", "name": name, "creationTimestamp": EARLIER},
            "spec": {"checkpoint": {"dir": directory, "claimName": claim}}, "status": {"phase": phase}}


def test_the_job_cache_files_each_job_under_its_location_too() -> None:
    index: dict = {}
    for body in (_body("a", "/ckpt/x"), _body("b", "/ckpt/x/", phase="Succeeded"), _body("c", "/ckpt/x", claim=""),
                 _body("d", "/ckpt/y")):
        for key, value in caches.job_entry(body).items():
            index.setdefault(key, []).append(value)
    reads = caches.WatchCaches(index, {}, {}, {})
    users = asyncio.run(reads.checkpoint_users("ml/shared:/ckpt/x"))
    assert users == [DirUser("ml", "a", EARLIER, False), DirUser("ml", "b", EARLIER, True)]
    assert sorted(j["metadata"]["name"] for j in asyncio.run(reads.jobs(()))) == ["a", "b", "c", "d"]
    no_dir = {"metadata": {"namespace": "ml", "name": "e"}, "spec": {"checkpoint": {"claimName": "shared"}}}
    assert caches.dir_user(no_dir) == ("ml/shared:/ckpt", DirUser("ml", "e", "", False))  # the spec's default dir


def test_a_deleted_jobs_stopping_pods_hold_the_location_whatever_the_order() -> None:
    """Deleted, its pods still write their emergency checkpoint within their grace period: a job of any age waits
    for them to be gone, then creates its workers (and resumes from that checkpoint)."""
    stopping = DirUser("ml", "a", "", False, "uid-a", ("a-worker-0", "a-worker-1"))
    out = _pass((stopping,), created=EARLIER)
    held = _in_use(out.status)
    assert out.status.phase is Phase.PENDING and not [a for a in out.actions if isinstance(a, CreatePod)]
    assert held is not None and held.status == "True", held
    assert ("still written by pods of deleted TrainingJob ml/a (a-worker-0, a-worker-1)" in held.message
            and "until they are gone" in held.message), held.message
    assert out.next_due == NOW + STOPPING_RECHECK_SECONDS  # they are gone within their grace period: looked at soon
    gone = _pass((), created=EARLIER, status=out.status)
    assert len([a for a in gone.actions if isinstance(a, CreatePod)]) == 2
    assert _in_use(gone.status).status == "False"


def _pod_body(name: str, job: str, owner: str, location: str | None, phase: str = "Running") -> dict:
    annotations = {} if location is None else {"flywheel.dev/checkpoint-location": location}
    return {"metadata": {"namespace": "ml", "name": name, "uid": f"pod-{name}", "annotations": annotations,
                         "labels": {"flywheel.dev/job": job},
                         "ownerReferences": [{"kind": "TrainingJob", "name": job, "uid": owner}]},
            "spec": {}, "status": {"phase": phase}}


def test_the_pod_cache_files_the_pods_that_may_still_write_a_location() -> None:
    """A pod is filed under its location until its container ends; its own job being in the job cache, it is that
    job's; otherwise (the job deleted) its job is a user that holds the place while such pods remain."""
    at = "ml/shared:/ckpt/x"
    jobs: dict = {}
    for key, value in caches.job_entry({**_body("a", "/ckpt/x"), "metadata": {
            "namespace": "ml", "name": "a", "creationTimestamp": EARLIER, "uid": "uid-a"}}).items():
        jobs.setdefault(key, []).append(value)
    pods: dict = {}
    for body in (_pod_body("a-worker-0", "a", "uid-a", at),  # a live job's: that job already counts
                 _pod_body("old-worker-1", "old", "uid-old", at), _pod_body("old-worker-0", "old", "uid-old", at),
                 _pod_body("old-worker-2", "old", "uid-old", at, phase="Failed"),  # ended: writes no more
                 _pod_body("other-worker-0", "other", "uid-other", "ml/shared:/ckpt/y"),
                 _pod_body("legacy-worker-0", "legacy", "uid-legacy", None)):  # from before the annotation
        for key, value in caches.pod_entry(body).items():
            pods.setdefault(key, []).append(value)
    reads = caches.WatchCaches(jobs, pods, {}, {})
    assert asyncio.run(reads.checkpoint_users(at)) == [
        DirUser("ml", "a", EARLIER, False, "uid-a"),
        DirUser("ml", "old", "", False, "uid-old", ("old-worker-0", "old-worker-1"))]
    assert len(asyncio.run(reads.all_pods(()))) == 6  # each pod once
    assert [p["metadata"]["name"] for p in asyncio.run(reads.pods("ml", "old"))] == [
        "old-worker-1", "old-worker-0", "old-worker-2"]

"""How the kopf handlers (operator/handlers.py) wire watch events to runners and a deleted job to its etcd cleanup,
without a cluster: the handlers are called as kopf calls them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest

from flywheel.contracts.labels import FINALIZER
from flywheel.operator import handlers
from flywheel.operator.handlers import NoDiffBase, forget_run, training_jobs


def job_body(name: str = "j", uid: str = "0123456789ab", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": "5",
                            "finalizers": [FINALIZER]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": meta,
            "spec": {"replicas": {"min": 1, "max": 1}, "checkpoint": {"dir": "/ckpt", "ephemeral": True}}}


class Runner:
    def __init__(self) -> None:
        self.events: list[str | None] = []

    def job_event(self, version: str | None) -> None:
        self.events.append(version)


class Etcd:
    """The operator's SharedEtcd as forget_run uses it; `delete_run` is replaced to record the run ids."""

    async def session(self) -> str:
        return "session"


def memo(runners: dict[Any, Any] | None = None) -> kopf.Memo:
    return kopf.Memo(runners=runners or {}, forgotten={}, background=set(), etcd=Etcd())


@pytest.fixture
def deleted_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    runs: list[str] = []
    monkeypatch.setattr(handlers, "delete_run", lambda session, run: runs.append(run) or 3)
    return runs


def test_the_operator_registers_no_changing_handler_or_timer() -> None:
    """NoDiffBase (no diff kept) is only right while nothing reads kopf's diffs: on.create/update/delete, timers."""
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == []
    assert [str(h) for h in registry._spawning.get_all_handlers()] == ["Daemon 'run_job'"]
    assert NoDiffBase().build(body=kopf.Body(job_body())) == {}


def test_a_job_event_reaches_its_runner_through_the_index_handler() -> None:
    runner = Runner()
    entry = asyncio.run(training_jobs(body=kopf.Body(job_body()), memo=memo({("ml", "j"): runner})))
    assert entry == {("ml", "j"): job_body()}
    assert runner.events == ["5"]


def test_a_job_deleted_while_no_daemon_ran_it_has_its_keys_deleted_once(deleted_runs: list[str]) -> None:
    async def scenario() -> None:
        m = memo()
        for _ in range(3):  # kopf's finalizer removal and other late events show the same deleting job
            await training_jobs(body=kopf.Body(job_body(deleting=True)), memo=m)
            await asyncio.gather(*m.background)
        await training_jobs(body=kopf.Body(job_body(uid="fedcba987654", deleting=True)), memo=m)
        await asyncio.gather(*m.background)

    asyncio.run(scenario())
    assert deleted_runs == ["ml-j-01234567", "ml-j-fedcba98"]


def test_a_running_job_is_not_cleaned_up_by_its_index_handler(deleted_runs: list[str]) -> None:
    async def scenario() -> None:
        m = memo({("ml", "j"): Runner()})  # its daemon runs: the daemon cleans up on its way out
        await training_jobs(body=kopf.Body(job_body(deleting=True)), memo=m)
        await training_jobs(body=kopf.Body(job_body()), memo=memo())  # not deleting
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert deleted_runs == []


def test_a_failed_cleanup_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def unreachable(session: Any, run: str) -> int:
        raise ConnectionError("etcd down")

    monkeypatch.setattr(handlers, "delete_run", unreachable)
    with caplog.at_level(logging.WARNING):
        asyncio.run(forget_run(memo(), job_body(), logging.getLogger("t")))
    assert "could not delete the etcd keys of run ml-j-01234567: etcd down" in caplog.text


def _pod(owner_uid: str) -> dict[str, Any]:
    return {"metadata": {"name": "j-worker-0", "namespace": "ml", "labels": {"flywheel.dev/job": "j"},
                         "ownerReferences": [{"kind": "TrainingJob", "name": "j", "uid": owner_uid}]}}


def test_each_deleted_pod_of_a_forgotten_run_sweeps_its_keys_again(deleted_runs: list[str]) -> None:
    """forget_run runs while the job's agents may still run (their pods go after the job) and one may write a
    rendezvous key again before it stops: each pod of the run, once deleted, deletes the keys again."""
    async def scenario() -> None:
        m = memo()
        await training_jobs(body=kopf.Body(job_body(deleting=True)), memo=m)
        await asyncio.gather(*m.background)
        for pod in (_pod("0123456789ab"), _pod("0123456789ab"), _pod("another-job")):
            await handlers.pod_deleted(body=kopf.Body(pod), memo=m)
            await asyncio.gather(*m.background)
        await handlers.worker_pods(body=kopf.Body(_pod("0123456789ab")), memo=m)  # not gone yet: nothing
        await asyncio.gather(*m.background)

    asyncio.run(scenario())
    assert deleted_runs == ["ml-j-01234567"] * 3  # forgotten, then once per deleted pod; another job's pod: none


class Poked:
    def __init__(self) -> None:
        self.pokes = 0

    def poke(self) -> None:
        self.pokes += 1

    def job_event(self, version: str | None) -> None:
        pass

    def pod_event(self, event_type: str | None, pod: Any) -> None:
        pass


def test_a_job_or_pod_that_stops_writing_a_checkpoint_location_wakes_the_jobs_there() -> None:
    """A job waiting for a checkpoint location (policy/checkpoint_sharing.py) looks again as soon as the job that
    has it finishes, or a pod still writing there ends or is deleted -- not at its next recheck; jobs elsewhere and
    events that free nothing wake no one."""
    from flywheel.operator import caches

    at = "ml/shared:/ckpt/x"

    def job(name: str, directory: str, phase: str = "") -> dict[str, Any]:
        return {"metadata": {"namespace": "ml", "name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                             "creationTimestamp": "2026-11-29T10:00:00Z"},
                "spec": {"checkpoint": {"dir": directory, "claimName": "shared"}}, "status": {"phase": phase}}

    def pod(phase: str) -> dict[str, Any]:
        return {"metadata": {"namespace": "ml", "name": "old-worker-0", "uid": "p",
                             "labels": {"flywheel.dev/job": "old"},
                             "annotations": {"flywheel.dev/checkpoint-location": at},
                             "ownerReferences": [{"kind": "TrainingJob", "uid": "uid-old"}]},
                "status": {"phase": phase}}

    index: dict[Any, list[Any]] = {}
    for body in (job("owner", "/ckpt/x"), job("waiting", "/ckpt/x"), job("elsewhere", "/ckpt/y")):
        for key, value in caches.job_entry(body).items():
            index.setdefault(key, []).append(value)
    runners = {("ml", name): Poked() for name in ("owner", "waiting", "elsewhere")}
    m = kopf.Memo(runners=runners, forgotten={}, background=set(), etcd=None,
                  caches=caches.WatchCaches(index, {}, {}, {}))

    def pokes() -> dict[str, int]:
        return {key[1]: r.pokes for key, r in runners.items()}

    async def scenario() -> None:
        await training_jobs(body=kopf.Body(job("owner", "/ckpt/x", "Running")), memo=m)
        assert pokes() == {"owner": 0, "waiting": 0, "elsewhere": 0}  # still has it
        await training_jobs(body=kopf.Body(job("owner", "/ckpt/x", "Succeeded")), memo=m)
        assert pokes() == {"owner": 0, "waiting": 1, "elsewhere": 0}
        await handlers.worker_pods(body=kopf.Body(pod("Running")), memo=m)
        assert pokes()["waiting"] == 1
        await handlers.worker_pods(body=kopf.Body(pod("Failed")), memo=m)
        await handlers.pod_deleted(body=kopf.Body(pod("Running")), memo=m)
        assert pokes() == {"owner": 2, "waiting": 3, "elsewhere": 0}

    asyncio.run(scenario())


def test_the_health_monitor_reads_rank_restarts_from_the_jobs_runner() -> None:
    """Pod by pod, when its agent last restarted its ranks in place, from the pods of the runner's last pass; a job
    without a runner here has none."""
    from flywheel.policy.observed import PodView

    runner = Runner()
    runner.seen_pods = [PodView("j-worker-0", "u0", 0, 0, "Running"),  # type: ignore[attr-defined]
                        PodView("j-worker-1", "u1", 1, 0, "Running", rank_restart_at=123.0)]
    memo = kopf.Memo(runners={("ml", "j"): runner})
    assert handlers.ranks_restarted(memo, "ml", "j") == {"j-worker-1": 123.0}
    assert handlers.ranks_restarted(memo, "ml", "other") == {}


def test_a_pods_events_reach_its_runner_once_each_deletions_through_the_event_handler() -> None:
    """kopf calls the pod index handler on every event but a deletion: it wakes the runner; the event handler is
    filtered to deletions (no second handler call per event)."""
    class Recorder:
        def __init__(self) -> None:
            self.events: list[str | None] = []

        def pod_event(self, event_type: str | None, pod: Any) -> None:
            self.events.append(event_type)

    runner = Recorder()
    m = kopf.Memo(runners={("ml", "j"): runner}, forgotten={}, background=set(), etcd=None)

    async def scenario() -> None:
        entry = await handlers.worker_pods(body=kopf.Body(_pod("0123456789ab")), memo=m)
        assert list(entry) == [("ml", "j")]
        await handlers.pod_deleted(body=kopf.Body(_pod("0123456789ab")), memo=m)

    asyncio.run(scenario())
    assert runner.events == [None, "DELETED"]
    watching = [h for h in kopf.get_default_registry()._watching.get_all_handlers() if str(h.id) == "pod_deleted"]
    assert len(watching) == 1 and watching[0].when is not None
    assert [watching[0].when(type=t) for t in (None, "ADDED", "MODIFIED", "DELETED")] == [False, False, False, True]

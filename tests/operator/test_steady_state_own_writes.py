"""The runner's own writes laid over the watch-fed caches (own_writes.py), and what the kopf index handlers store
(caches.py): pure, no cluster."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

from flywheel.operator import caches
from flywheel.operator import manifests as m
from flywheel.operator.executor import JobRunner
from flywheel.operator.observe import pod_view
from flywheel.operator.own_writes import PENDING_SECONDS, OwnWrites
from tests.operator.frozen_caches import FrozenCaches


def pod(name: str, uid: str, generation: int = 0, deleting: bool = False, namespace: str = "ml") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1",
                            "labels": {m.JOB_LABEL: "j", m.INDEX_LABEL: "0", m.GENERATION_LABEL: str(generation)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running"}}


def job(rv: str, restarts: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "ml", "uid": "u", "resourceVersion": rv},
            "status": {"restarts": restarts}}


def test_a_created_pod_counts_as_present_until_the_cache_shows_it():
    own = OwnWrites()
    created = pod("j-worker-0", "new")
    own.wrote_pod(created, 100.0)
    assert own.pods([], 101.0) == [created]  # not in the cache yet: never created a second time
    old = pod("j-worker-0", "old", deleting=True)
    assert own.pods([old], 101.0) == [created]  # the cache still shows the pod it replaced
    seen = pod("j-worker-0", "new")
    assert own.pods([seen], 102.0) == [seen] and not own.created  # seen: the cache is the truth again
    own.wrote_pod(created, 100.0)
    assert own.pods([], 100.0 + PENDING_SECONDS) == []  # deleted before its watch event: believed gone


def test_the_watch_echo_of_a_pods_own_create_wakes_no_pass_and_any_later_change_does():
    r = JobRunner(None, m.OperatorSettings(etcd_endpoints=""), "ml", "j", "u", logging.getLogger("t"))  # type: ignore[arg-type]
    created = pod("j-worker-0", "new")
    r.observer.own.wrote_pod(created, 100.0)
    r.pod_event("ADDED", copy.deepcopy(created))  # exactly as the create answered
    assert not r.wake.is_set() and not r.observer.own.created  # the cache holds it now: the overlay let it go
    r.observer.own.wrote_pod(created, 100.0)
    scheduled = copy.deepcopy(created)
    scheduled["metadata"]["resourceVersion"] = "2"  # the scheduler or the kubelet changed it
    r.pod_event("MODIFIED", scheduled)
    assert r.wake.is_set()
    r.wake.clear()
    r.pod_event("DELETED", copy.deepcopy(created))  # a deletion always counts
    assert r.wake.is_set()
    r.wake.clear()
    r.pod_event("ADDED", pod("j-worker-1", "other"))  # a pod this runner did not create (or no longer remembers)
    assert r.wake.is_set()


def test_a_deleted_pod_is_terminating_until_the_cache_says_so_and_a_relabel_shows_at_once():
    own = OwnWrites()
    running = pod("j-worker-0", "a")
    own.deleted_pod("a", 100.0)
    (view,) = own.pods([running], 101.0)
    assert view["metadata"]["deletionTimestamp"] and not running["metadata"].get("deletionTimestamp")
    assert own.pods([], 101.0) == [] and not own.deleted  # gone from the cache: forgotten
    own.relabelled_pod("b", {m.GENERATION_LABEL: "3"}, 100.0)
    (view,) = own.pods([pod("j-worker-1", "b")], 101.0)
    assert view["metadata"]["labels"][m.GENERATION_LABEL] == "3"
    own.pods([pod("j-worker-1", "b", generation=3)], 101.0)
    assert not own.relabelled


def test_the_watch_event_of_the_last_status_write_lets_the_written_job_go():
    r = JobRunner(None, m.OperatorSettings(etcd_endpoints=""), "ml", "j", "u", logging.getLogger("t"))  # type: ignore[arg-type]
    r.observer.own.wrote_job(job("4"), job("5"))
    r.records.written_versions.append("5")
    r.job_event("5")  # its own write: no pass, and nothing held for a pass that may never come
    assert not r.wake.is_set() and r.observer.own.job_written is None
    r.observer.own.wrote_job(job("5"), job("6"))
    r.records.written_versions.append("6")
    r.job_event("5")  # an older write's late event: the last one is still laid over the cache
    assert r.observer.own.job_written is not None and r.observer.own.job(job("5")) == job("6")


def test_the_job_as_written_is_read_until_the_cache_shows_that_write_or_a_newer_one():
    own = OwnWrites()
    assert own.job(job("1")) == job("1")
    own.wrote_job(job("1"), job("2", restarts=1))
    assert own.job(job("1")) == job("2", restarts=1)  # the watch has not delivered it: our answer is fresher
    own.wrote_job(job("2", restarts=1), job("3", restarts=2))
    assert own.job(job("1")) == job("3", restarts=2)  # chained writes, the cache two behind
    assert own.job(job("4")) == job("4")  # the cache caught up (or newer): the truth again
    assert own.job(job("1")) == job("1") and own.job(None) is None


def test_index_entries_and_the_reads_over_them():
    lost = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    ready = {"metadata": {"name": "n2"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert caches.node_entry(lost) == {caches.LOST: "n1"} and caches.node_entry(ready) == {caches.USABLE: "n2"}
    p = pod("j-worker-0", "a")
    assert caches.pod_entry(p) == {("ml", "j"): caches.slim_pod(p)}
    full = {**p, "spec": {"nodeName": "n1", "containers": [{"name": "worker", "env": [{"name": "X", "value": "y"}]}]},
            "metadata": {**p["metadata"], "managedFields": [{"manager": "kubectl"}]}}
    slim = caches.slim_pod(full)
    assert slim["spec"] == {"nodeName": "n1"} and "managedFields" not in slim["metadata"]
    assert slim["status"] == full.get("status", {}) and slim["metadata"]["labels"] == p["metadata"]["labels"]
    assert pod_view(slim, set()) == pod_view(full, set())  # the pass reads the same from either
    written = {**job("1"), "metadata": {**job("1")["metadata"], "managedFields": [{"manager": "kopf"}]}}
    assert caches.job_entry(written)[("ml", "j")] == job("1")  # the job without its managedFields
    jobs = {("ml", "j"): [job("1")]}
    pods = {("ml", "j"): [p], ("other", "k"): [pod("k-worker-0", "b", namespace="other")]}
    reads = caches.WatchCaches(jobs, pods, {("ml", "j-workers"): [True]}, {caches.LOST: ["n1"], caches.USABLE: ["n2"]})

    async def check() -> None:
        assert await reads.job("ml", "j") == job("1") and await reads.job("ml", "x") is None
        assert await reads.pods("ml", "j") == [p] and await reads.pods("ml", "x") == []
        assert await reads.service_exists("ml", "j-workers") and not await reads.service_exists("ml", "x")
        assert await reads.lost_nodes() == {"n1"} and await reads.usable_nodes() == {"n2"}
        assert len(await reads.all_pods(())) == 2 and await reads.all_pods(("ml",)) == [p]
        assert await reads.jobs(("other",)) == []
    asyncio.run(check())


class WritingKube:
    """Answers writes as an API server would: a status write bumps the resourceVersion, a create gets a uid."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job, self.creates, self.preconditions = job, [], []  # type: ignore[var-annotated]

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.creates.append(body["metadata"]["name"])
        return {**body, "metadata": {**body["metadata"], "uid": f"pod-{len(self.creates)}", "resourceVersion": "9"}}

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        assert path.endswith("/status")
        self.preconditions.append(patch["metadata"]["resourceVersion"])
        rv = str(int(self.job["metadata"]["resourceVersion"]) + 1)
        self.job = {**self.job, "metadata": {**self.job["metadata"], "resourceVersion": rv}, "status": patch["status"]}
        return copy.deepcopy(self.job)

    async def post_event(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_a_pass_on_a_lagging_cache_creates_no_pod_twice_and_writes_on_the_status_it_wrote():
    job = {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "j", "namespace": "ml", "uid": "uid-1", "resourceVersion": "1", "generation": 1},
           "spec": {"replicas": {"min": 2, "max": 2}, "trainer": {"training": {"globalBatch": 4, "microBatch": 1}},
                    "checkpoint": {"ephemeral": True}}}
    kube = WritingKube(job)
    runner = JobRunner(kube, m.OperatorSettings(etcd_endpoints=""), "ml", "j", "uid-1",  # type: ignore[arg-type]
                       logging.getLogger("test"), reads=FrozenCaches(job))  # type: ignore[arg-type]

    async def passes() -> None:
        for _ in range(3):
            await runner.reconcile_once()
    asyncio.run(passes())
    # once each, though the cache never showed them ("j": the job's PodDisruptionBudget, once)
    assert sorted(kube.creates) == ["j", "j-worker-0", "j-worker-1"]
    assert kube.preconditions[0] == "1" and all(rv != "1" for rv in kube.preconditions[1:]), kube.preconditions

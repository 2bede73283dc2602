"""Warm spares in the operator, without a cluster: the spare pod (spare_pods.py), how a pod reads back
(observe.pod_view), render, and the runner's CreateSpare/PromoteSpare (relabel first, then the etcd promotion)."""

from __future__ import annotations

import asyncio
import copy
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from flywheel.contracts.timefmt import parse_rfc3339
from flywheel.operator import job_actions, spare_pods
from flywheel.operator import manifests as m
from flywheel.operator.executor import JobRunner
from flywheel.operator.observe import pod_view
from flywheel.operator.progress_follower import JobProgress
from flywheel.operator.render import render_objects
from flywheel.policy.decisions import Pass, PromoteSpare
from flywheel.policy.observed import PodView
from flywheel.spec import parse_job
from flywheel.spec.status import TrainingJobStatus
from tests import builders
from tests.operator.frozen_caches import FrozenCaches

DOC = {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
       "metadata": {"name": "j", "namespace": "ml", "uid": "uid-1", "resourceVersion": "1", "generation": 1},
       "spec": {"replicas": {"min": 2, "max": 2, "spares": 1}, "checkpoint": {"ephemeral": True},
                "trainer": {"training": {"globalBatch": 4, "microBatch": 1}}}}
JOB = parse_job(copy.deepcopy(DOC))
SETTINGS = m.OperatorSettings(etcd_endpoints="etcd:2379")


def env_of(body: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in body["spec"]["containers"][0]["env"]}


def test_a_spare_pod_is_a_worker_pod_without_an_index_and_away_from_the_workers() -> None:
    workers = m.plan(JOB, "uid-1", SETTINGS, None)
    worker, spare = m.pod(JOB, workers[0], 2, SETTINGS), spare_pods.spare_pod(JOB, workers[0], 7, 2, SETTINGS)
    assert spare["metadata"]["name"] == "j-spare-7" and spare["spec"]["hostname"] == "j-spare-7"
    assert spare["metadata"]["labels"] == {m.JOB_LABEL: "j", m.GENERATION_LABEL: "2", m.ROLE_LABEL: "spare"}
    assert worker["metadata"]["labels"][m.ROLE_LABEL] == "worker"
    env, worker_env = env_of(spare), env_of(worker)
    assert env[spare_pods.SPARE_ENV] == "1" and env[spare_pods.SPARE_ID_ENV] == "j-spare-7"
    assert "FLYWHEEL_REPLICA_INDEX" not in env
    assert {k: v for k, v in worker_env.items() if k != "FLYWHEEL_REPLICA_INDEX"} == {
        k: v for k, v in env.items() if k not in (spare_pods.SPARE_ENV, spare_pods.SPARE_ID_ENV)}
    assert spare["spec"]["containers"][0]["command"] == worker["spec"]["containers"][0]["command"]
    (term,) = spare["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == {m.JOB_LABEL: "j", m.ROLE_LABEL: "worker"}
    assert spare_pods.promotion_env(workers[1]) == {"FLYWHEEL_REPLICA_INDEX": "1"}


def test_pod_view_tells_spares_from_workers() -> None:
    workers = m.plan(JOB, "uid-1", SETTINGS, None)
    spare = spare_pods.spare_pod(JOB, workers[0], 0, 1, SETTINGS)
    spare["metadata"]["uid"] = "s"
    spare["spec"]["nodeName"] = "n1"
    view = pod_view(spare, set())
    assert view is not None and view.is_spare and view.index == -1 and view.generation == 1 and view.node == "n1"
    promoted = copy.deepcopy(spare)
    promoted["metadata"]["labels"].update(spare_pods.promoted_labels(1, 2))
    view = pod_view(promoted, set())
    assert view is not None and not view.is_spare and view.index == 1 and view.generation == 2
    legacy = {"metadata": {"name": "j-worker-0", "uid": "w", "labels": {m.JOB_LABEL: "j", m.INDEX_LABEL: "0"}}}
    view = pod_view(legacy, set())
    assert view is not None and view.role == "worker"  # a pod from before spares is a worker


def test_render_shows_the_spares() -> None:
    kinds = [(o["kind"], o["metadata"]["name"]) for o in render_objects(JOB, SETTINGS)]
    assert kinds == [("Service", "j-workers"), ("PodDisruptionBudget", "j"), ("Pod", "j-worker-0"),
                     ("Pod", "j-worker-1"), ("Pod", "j-spare-0")]


class Kube:
    def __init__(self, job: dict[str, Any]) -> None:
        self.job, self.calls = job, []  # type: ignore[var-annotated]

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", body["metadata"]["name"]))
        return {**body, "metadata": {**body["metadata"], "uid": f"uid-{body['metadata']['name']}"}}

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/status"):
            self.job = {**self.job, "metadata": {**self.job["metadata"], "resourceVersion": "2"},
                        "status": patch["status"]}
            return copy.deepcopy(self.job)
        self.calls.append(("relabel", path.rsplit("/", 1)[-1], patch["metadata"]["labels"]))
        return {"metadata": {"uid": "uid-spare"}}

    async def post_event(self, *args: Any, **kwargs: Any) -> None:
        return None


def runner(kube: Kube, etcd: Any = None) -> JobRunner:
    return JobRunner(kube, SETTINGS, "ml", "j", "uid-1", logging.getLogger("test"),  # type: ignore[arg-type]
                     etcd=etcd, reads=FrozenCaches(kube.job))  # type: ignore[arg-type]


def test_a_pass_creates_the_workers_and_the_spare_once() -> None:
    kube = Kube(copy.deepcopy(DOC))
    r = runner(kube)

    async def passes() -> None:
        for _ in range(3):
            await r.reconcile_once()
    asyncio.run(passes())
    # "j": the job's PodDisruptionBudget, written once over the passes
    assert sorted(c[1] for c in kube.calls if c[0] == "create") == ["j", "j-spare-0", "j-worker-0", "j-worker-1"]
    assert kube.job["status"]["nextSpare"] == 1


def test_promotion_relabels_first_then_tells_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = Kube(copy.deepcopy(DOC))
    promoted: list[tuple[Any, ...]] = []

    async def promote(session: Any, run_id: str, spare_id: str, replica: int, env: dict[str, str]) -> None:
        promoted.append((run_id, spare_id, replica, env, list(kube.calls)))

    class Session:
        def run(self, coro: Any, timeout: float | None = None) -> Any:
            return asyncio.run(coro)

    class Etcd:
        async def session(self) -> Session:
            return Session()

    monkeypatch.setattr(job_actions.etcd_spares, "promote", promote)
    r = runner(kube, Etcd())
    action = PromoteSpare("j-spare-0", 1, 3)
    asyncio.run(r.actuator.act(kube.job, JOB, Pass(TrainingJobStatus(), actions=[action])))
    labels = {m.ROLE_LABEL: "worker", m.INDEX_LABEL: "1", m.GENERATION_LABEL: "3"}
    assert kube.calls == [("relabel", "j-spare-0", labels)]
    (run_id, spare_id, replica, env, calls_before) = promoted[0]
    assert run_id == m.run_id(JOB, "uid-1") and spare_id == "j-spare-0" and replica == 1
    assert env == {"FLYWHEEL_REPLICA_INDEX": "1"}
    assert calls_before == [("relabel", "j-spare-0", labels)]  # the agent is told only once the pod is relabelled
    assert "uid-spare" in r.observer.acted.promoted_at


def test_a_promoted_spare_is_not_judged_by_its_predecessor_s_worker_key() -> None:
    """The lost worker's key (written after the spare pod was created, still in its TTL) is not the promoted
    spare's: its expiry before the spare's agent registers must not read as the spare's death."""
    kube = Kube(copy.deepcopy(DOC))
    r = runner(kube)
    pod = spare_pods.spare_pod(JOB, m.plan(JOB, "uid-1", SETTINGS, None)[0], 0, 1, SETTINGS)
    pod["metadata"].update(uid="s", creationTimestamp="2026-01-01T00:00:00Z", ownerReferences=[{"uid": "uid-1"}])
    pod["metadata"]["labels"].update(spare_pods.promoted_labels(1, 1))
    pod["status"] = {"phase": "Running"}
    created = parse_rfc3339("2026-01-01T00:00:00Z") or 0.0
    r.observer.acted.promoted_at["s"] = created + 50
    r.observer.etcd.live = {"1": SimpleNamespace(since=created + 10, exited=False, rank_restarts=0,
                                                 rank_restart_reason="", rank_restart_at=0.0)}

    async def observe() -> list[PodView]:
        r.observer.reads.pods = lambda namespace, job: _pods([pod])  # type: ignore[method-assign]
        views = await r.observer._pods()
        return views
    asyncio.run(observe())
    assert "s" not in r.observer.etcd.seen_live  # the old key was not taken for the promoted spare's


def test_a_running_spare_does_not_start_the_hang_clock() -> None:
    """The etcd hang check waits until the current generation's workers all run; a spare is not one of them."""
    progress = JobProgress(lambda: None)
    running = builders.pod(0, uid="w0")
    spare = builders.spare(0)
    progress.clock(JOB.spec, [running, spare], 0, 100.0)  # worker 1 is not there yet
    assert progress.running is None


async def _pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return pods


def test_a_moved_spare_is_required_on_the_free_nodes_on_top_of_the_template_s_affinity() -> None:
    plan = m.plan(JOB, "uid-1", SETTINGS, None)[0]
    spare = spare_pods.spare_pod(JOB, plan, 8, 2, SETTINGS, ("b", "d"))
    names = {"key": "metadata.name", "operator": "In", "values": ["b", "d"]}
    required = spare["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {"nodeSelectorTerms": [{"matchFields": [names]}]}
    assert "nodeAffinity" not in spare_pods.spare_pod(JOB, plan, 8, 2, SETTINGS)["spec"]["affinity"]
    # The template's terms are ORed: the name requirement joins each of them (ANDed within a term).
    gpu = {"key": "pool", "operator": "In", "values": ["gpu"]}
    affinity: dict[str, Any] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [gpu]}, {"matchFields": [{"key": "metadata.name",
                                                                             "operator": "NotIn", "values": ["x"]}]}]}}}
    spare_pods.only_on(affinity, ("b",))
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    only_b = {"key": "metadata.name", "operator": "In", "values": ["b"]}
    assert terms == [{"matchExpressions": [gpu], "matchFields": [only_b]},
                     {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}, only_b]}]

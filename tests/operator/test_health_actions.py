"""The health monitor's Kubernetes side (`flywheel/operator/health_executor.py`) against the test cluster's real
control plane, with no kubelet and no trainers for the jobs here: TrainingJobs, their Nodes (which no kubelet serves)
and Running pods bound to them are written directly, Prometheus is `tests/fakes/prometheus_api.py`, and the job's
reconcile pass is `JobRunner.reconcile_once()` called by hand."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.contracts.labels import RESTART_ANNOTATION, XID_HANDLED_ANNOTATION
from flywheel.kube.client import Connection, Kube
from flywheel.monitor import HealthMonitor, MonitorSettings
from flywheel.monitor import OperatorMetrics as MonitorMetrics
from flywheel.monitor.findings import FindingsInbox
from flywheel.monitor.operator_metrics import OperatorMetrics
from flywheel.operator import manifests as m
from flywheel.operator.executor import JobRunner
from flywheel.operator.health_executor import BackgroundMonitor, KubeHealthActions, KubeJobInventory
from flywheel.operator.xid_memory import KubeXidMemory
from flywheel.policy.conditions import iso
from flywheel.policy.health_checks import HealthSettings
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from tests.cluster.cluster import TestCluster as RunningCluster
from tests.cluster.fixtures import start_cluster
from tests.fakes.prometheus_api import FakePrometheus
from tests.operator.reconcile_json import condition

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "operator-tiny.yaml"
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
NS = "default"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    # The kubelet's one node is not one the tests bind pods to: their pods stay as written.
    running = start_cluster(tmp_path_factory.mktemp("health-cluster"), nodes=1)
    try:
        async def install() -> None:
            kube = Kube(admin(running))
            await kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                              yaml.safe_load(CRD.read_text()))
            await kube.close()
        asyncio.run(install())
        running.wait_established("trainingjobs.flywheel.dev")
        yield running
    finally:
        running.stop()


def admin(cluster: RunningCluster) -> Connection:
    return Connection(cluster.api_url, cluster.admin_token, str(cluster.ca_file))


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()
    try:
        yield fake
    finally:
        fake.stop()


class World:
    """One job of two Running pods (worker i on nodes[i]) and helpers to look at it."""

    def __init__(self, kube: Kube, name: str, runner: JobRunner) -> None:
        self.kube, self.name, self.runner = kube, name, runner
        self.path = Kube.custom(GROUP, VERSION, NS, PLURAL, name)

    @classmethod
    async def create(cls, kube: Kube, name: str, nodes: tuple[str, str], tmp: Path, **fault_tolerance: Any) -> World:
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"] = {"name": name, "namespace": NS}
        doc["spec"]["checkpoint"]["dir"] = str(tmp / name)
        doc["spec"]["faultTolerance"].update(fault_tolerance)
        job = await kube.create(Kube.custom(GROUP, VERSION, NS, PLURAL), doc)
        assert job is not None
        started = iso(time.time() - 100)
        for node in nodes:
            await kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        for i, node in enumerate(nodes):
            pod = f"{name}-worker-{i}"
            await kube.create(Kube.core(NS, "pods"), {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": NS,
                             "labels": {m.JOB_LABEL: name, m.INDEX_LABEL: str(i), m.GENERATION_LABEL: "0"},
                             "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
                                                  "name": name, "uid": job["metadata"]["uid"], "controller": True}]},
                "spec": {"nodeName": node, "containers": [{"name": "worker", "image": "flywheel:latest"}]}})
            await kube.merge_patch(Kube.core(NS, "pods", pod) + "/status", {"status": {
                "phase": "Running", "startTime": started, "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "worker", "ready": True, "restartCount": 0, "image": "flywheel:latest",
                                       "state": {"running": {"startedAt": started}}}]}})
        runner = JobRunner(kube, m.OperatorSettings(etcd_endpoints=""), NS, name, job["metadata"]["uid"],
                           logging.getLogger(f"test.{name}"))
        world = cls(kube, name, runner)
        await runner.reconcile_once()
        assert (await world.status())["phase"] == "Running"
        return world

    async def status(self) -> dict[str, Any]:
        obj = await self.kube.get(self.path)
        assert obj is not None
        return dict(obj.get("status") or {})

    async def condition(self, ctype: str) -> dict[str, Any]:
        cond = condition(await self.status(), ctype)
        assert cond is not None, f"no {ctype} condition"
        return cond

    async def deleted_pods(self) -> list[str]:
        """Workers deleted (gone, or terminating: no kubelet serves their node to finish the deletion)."""
        listed = await self.kube.list(Kube.core(NS, "pods"), f"{m.JOB_LABEL}={self.name}")
        pods = {p["metadata"]["name"]: p for p in listed}
        names = [f"{self.name}-worker-{i}" for i in range(2)]
        return [n for n in names if n not in pods or pods[n]["metadata"].get("deletionTimestamp")]

    async def events(self, involved: str | None = None) -> list[tuple[str, str]]:
        """The operator's events on the job (or a node): kube-controller-manager's on the nodes (RegisteredNode)
        are not the test's."""
        items = await self.kube.list(Kube.core(NS, "events"))
        return [(e["reason"], e["message"]) for e in items if e["involvedObject"]["name"] == (involved or self.name)
                and (e.get("source") or {}).get("component") == "flywheel-operator"]


def monitor(kube: Kube, prom: FakePrometheus, cordon: bool = True, runners: tuple[JobRunner, ...] = (),
            memory: bool = False) -> tuple[HealthMonitor, list[tuple[str, str]]]:
    """The monitor with the findings inboxes of `runners`; the list: the jobs whose inbox was looked up."""
    inventory = KubeJobInventory(kube)
    woken: list[tuple[str, str]] = []
    by_key = {(r.namespace, r.name): r for r in runners}

    def inbox(namespace: str, name: str) -> FindingsInbox | None:
        woken.append((namespace, name))
        runner = by_key.get((namespace, name))
        return runner.findings if runner is not None else None

    settings = MonitorSettings(prometheus_url=prom.url, interval_seconds=0.05, query_timeout_seconds=2.0,
                               health=HealthSettings(staleness_allowance_seconds=1.0, cordon_nodes=cordon,
                                                     straggler_evaluations=1))
    actions = KubeHealthActions(kube, inventory, inbox)
    return HealthMonitor(settings, inventory, actions, MonitorMetrics(),
                         xid_memory=KubeXidMemory(kube) if memory else None), woken


def rank(job: str, replica: int, value: float) -> tuple[dict[str, str], float]:
    return {"namespace": NS, "job": job, "replica": str(replica), "rank": str(replica)}, value


def xid(node: str, code: int, pod: str | None = None) -> tuple[dict[str, str], float]:
    labels = {"Hostname": node, "gpu": "0", "UUID": f"GPU-{node}", "err_code": str(code)}
    if pod:
        labels |= {"exported_pod": pod, "exported_namespace": NS}
    return labels, float(code)


def run(cluster: RunningCluster, scenario: Any) -> None:
    async def main() -> None:
        kube = Kube(admin(cluster))
        try:
            await scenario(kube)
        finally:
            await kube.close()
    asyncio.run(main())


def test_the_inventory_carries_the_runners_view_of_rank_restarts_in_place(
        cluster: RunningCluster, tmp_path: Path) -> None:
    """The hang check's start-up allowance for ranks restarted in place comes from the job runner's etcd liveness
    view (handlers.ranks_restarted), pod by pod."""
    async def scenario(kube: Kube) -> None:
        await World.create(kube, "rsr", ("rsr-a", "rsr-b"), tmp_path)
        asked: list[tuple[str, str]] = []

        def ranks_restarted(namespace: str, name: str) -> dict[str, float]:
            asked.append((namespace, name))
            return {"rsr-worker-1": 123.0}

        [job] = [j for j in await KubeJobInventory(kube, ranks_restarted=ranks_restarted).jobs() if j.name == "rsr"]
        assert {p.name: p.ranks_restarted_at for p in job.pods} == {"rsr-worker-0": 0.0, "rsr-worker-1": 123.0}
        assert (NS, "rsr") in asked
    run(cluster, scenario)


def test_hang_is_reported_to_the_runner_whose_pass_marks_and_restarts_the_job(
        cluster: RunningCluster, prom: FakePrometheus, tmp_path: Path) -> None:
    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "hang", ("hang-a", "hang-b"), tmp_path, progressTimeoutSeconds=5)
        now = time.time()
        prom.set("last_step", [rank("hang", 0, now - 50), rank("hang", 1, now - 0.5)])
        mon, woken = monitor(kube, prom, runners=(world.runner,))
        try:
            prom.unavailable = True  # Prometheus down: the check is skipped, nothing is reported, nothing raises
            assert (await mon.evaluate_once()).hangs == ()
            assert world.runner.findings.snapshot().hang is None
            assert mon.metrics.registry.get_sample_value("flywheel_monitor_query_errors_total",
                                                         {"query": "progress", "reason": "http"}) == 1
            prom.unavailable = False
            assert [h.job for h in (await mon.evaluate_once()).hangs] == ["hang"]
        finally:
            await mon.aclose()
        # Reported, not written: the runner's pass is the one writer of the status (and it was woken).
        report = world.runner.findings.snapshot().hang
        assert report is not None and "replica 0 rank 0" in report.message and report.generation == 0
        assert world.runner.wake.is_set() and woken == [(NS, "hang")]
        assert condition(await world.status(), "Hung") is None and await world.deleted_pods() == []
        # The job's reconcile pass records the hang and carries the restart out: counted as a Hang.
        await world.runner.reconcile_once()
        status = await world.status()
        assert status["restarts"] == 1 and status["lastRestartReason"] == "Hung" and status["phase"] == "Restarting"
        assert condition(status, "Hung")["status"] == "False"
        assert condition(status, "Hung")["reason"] == "RestartedAfterHang" and "replica 0 rank 0" in \
            condition(status, "Hung")["message"]
        assert await world.deleted_pods() == ["hang-worker-0", "hang-worker-1"]
        reasons = [r for r, _ in await world.events()]
        assert reasons.count("ProgressStalled") == 1 and "Restarting" in reasons
        assert world.runner.findings.snapshot().hang is None  # consumed by the pass that wrote its status
    run(cluster, scenario)


def test_hang_of_a_job_without_a_runner_here_requests_a_restart_by_annotation(
        cluster: RunningCluster, prom: FakePrometheus, tmp_path: Path) -> None:
    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "orphan", ("orphan-a", "orphan-b"), tmp_path, progressTimeoutSeconds=5)
        prom.set("last_step", [rank("orphan", 0, time.time() - 50), rank("orphan", 1, time.time())])
        mon, _ = monitor(kube, prom)
        try:
            await mon.evaluate_once()
        finally:
            await mon.aclose()
        obj = await kube.get(world.path)
        assert obj is not None and RESTART_ANNOTATION in obj["metadata"]["annotations"]
        await world.runner.reconcile_once()
        status = await world.status()
        assert status["restarts"] == 1 and status["lastRestartReason"] == "RestartRequested"
    run(cluster, scenario)


def test_fatal_xid_replaces_pods_and_cordons_only_when_allowed(
        cluster: RunningCluster, prom: FakePrometheus, tmp_path: Path) -> None:
    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "fatal", ("fatal-a", "fatal-b"), tmp_path)
        prom.set("XID", [xid("fatal-a", 79)])
        on, _ = monitor(kube, prom, cordon=True)
        try:
            # A fatal XID already present at the first answer is acted on (a baseline keeps only the fatal ones).
            assert [f.node for f in (await on.evaluate_once()).node_faults] == ["fatal-a"]
        finally:
            await on.aclose()
        assert (await kube.get("/api/v1/nodes/fatal-a"))["spec"]["unschedulable"] is True
        assert await world.deleted_pods() == ["fatal-worker-0"]
        assert [r for r, _ in await world.events("fatal-a")] == ["NodeCordoned"]
        [(_, message)] = [e for e in await world.events() if e[0] == "GPUFatalXid"]
        assert "XID 79" in message and "node cordoned" in message

        prom.set("XID", [xid("fatal-b", 48)])
        off, _ = monitor(kube, prom, cordon=False)
        try:
            await off.evaluate_once()
        finally:
            await off.aclose()
        assert not (await kube.get("/api/v1/nodes/fatal-b")).get("spec", {}).get("unschedulable")
        assert await world.deleted_pods() == ["fatal-worker-0", "fatal-worker-1"]
        assert any("XID 48" in msg and "--no-cordon" in msg for r, msg in await world.events() if r == "GPUFatalXid")
        assert (await world.status()).get("restarts", 0) == 0  # replacing pods is not a restart
    run(cluster, scenario)


def test_an_operator_restarted_while_the_fatal_xid_shows_does_not_act_again(
        cluster: RunningCluster, prom: FakePrometheus, tmp_path: Path) -> None:
    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "again", ("again-a", "again-b"), tmp_path)
        prom.set("XID", [xid("again-a", 79)])
        first, _ = monitor(kube, prom, memory=True)
        try:
            assert [f.node for f in (await first.evaluate_once()).node_faults] == ["again-a"]
        finally:
            await first.aclose()
        node = await kube.get("/api/v1/nodes/again-a")
        assert node is not None and node["metadata"]["annotations"][XID_HANDLED_ANNOTATION] == "GPU-again-a=79"
        assert await world.deleted_pods() == ["again-worker-0"]  # terminating: still on the node, no kubelet here
        await kube.merge_patch("/api/v1/nodes/again-a", {"spec": {"unschedulable": False}})  # see a second cordon
        # The operator restarts (a fresh monitor, no memory of its own); the exporter still shows XID 79.
        restarted, _ = monitor(kube, prom, memory=True)
        try:
            assert (await restarted.evaluate_once()).node_faults == ()
            assert (await restarted.evaluate_once()).node_faults == ()
            prom.set("XID", [xid("again-a", 48)])  # a new fatal code on that GPU is a new event
            assert [f.codes for f in (await restarted.evaluate_once()).node_faults] == [(48,)]
        finally:
            await restarted.aclose()
        assert [r for r, _ in await world.events("again-a")] == ["NodeCordoned", "NodeCordoned"]
        assert len([e for e in await world.events() if e[0] == "GPUFatalXid"]) == 2
    run(cluster, scenario)


def test_app_level_xid_restarts_only_the_affected_pod(
        cluster: RunningCluster, prom: FakePrometheus, tmp_path: Path) -> None:
    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "app", ("app-a", "app-b"), tmp_path)
        prom.set("XID", [xid("app-b", 0, "app-worker-1")])
        mon, _ = monitor(kube, prom)
        try:
            await mon.evaluate_once()  # the baseline
            prom.set("XID", [xid("app-b", 13, "app-worker-1")])
            assert [r.pods for r in (await mon.evaluate_once()).rank_restarts] == [("app-worker-1",)]
        finally:
            await mon.aclose()
        assert await world.deleted_pods() == ["app-worker-1"]
        assert any("XID 13" in msg for r, msg in await world.events() if r == "GPUAppXid")
        assert not (await kube.get("/api/v1/nodes/app-b")).get("spec", {}).get("unschedulable")
    run(cluster, scenario)


def test_straggler_verdict_sets_and_clears_degraded_through_the_pass(
        cluster: RunningCluster, prom: FakePrometheus, tmp_path: Path) -> None:
    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "slow", ("slow-a", "slow-b"), tmp_path)
        prom.set("step_seconds", [rank("slow", 0, 1.0), rank("slow", 1, 3.0)])
        mon, _ = monitor(kube, prom, runners=(world.runner,))
        try:
            await mon.evaluate_once()
            assert condition(await world.status(), "Degraded") is None  # reported, not written
            await world.runner.reconcile_once()
            degraded = await world.condition("Degraded")
            assert degraded["status"] == "True" and degraded["reason"] == "Straggler"
            assert "replica 1 rank 1" in degraded["message"]
            await world.runner.reconcile_once()  # the verdict holds until the monitor changes it
            assert (await world.condition("Degraded"))["reason"] == "Straggler"
            prom.set("step_seconds", [rank("slow", 0, 1.0), rank("slow", 1, 1.1)])
            await mon.evaluate_once()
        finally:
            await mon.aclose()
        await world.runner.reconcile_once()
        cleared = await world.condition("Degraded")
        assert cleared["status"] == "False" and cleared["reason"] == "StragglerRecovered"
        assert sorted(r for r, _ in await world.events() if r.startswith("Straggler")) == ["Straggler",
                                                                                "StragglerRecovered"]
    run(cluster, scenario)


def test_background_monitor_runs_in_the_operator_loop_and_stops_cleanly(
        cluster: RunningCluster, prom: FakePrometheus) -> None:
    async def scenario(kube: Kube) -> None:
        operator_metrics = OperatorMetrics()
        prom.unavailable = True
        settings = MonitorSettings(prometheus_url=prom.url, interval_seconds=0.05, query_timeout_seconds=1.0)
        background = BackgroundMonitor(kube, settings, (), operator_metrics, None)
        get = operator_metrics.registry.get_sample_value
        deadline = time.monotonic() + 10
        while (get("flywheel_monitor_evaluations_total") or 0) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await background.close()
        assert background.task.done() and (get("flywheel_monitor_evaluations_total") or 0) >= 2
        assert (get("flywheel_monitor_query_errors_total", {"query": "xids", "reason": "http"}) or 0) >= 2
        # One registry holds the operator's and the monitor's series: each family exactly once.
        names = [m.name for m in operator_metrics.registry.collect()]
        assert "flywheel_operator_jobs" in names and len(names) == len(set(names))
    run(cluster, scenario)

"""The code paths whose Kubernetes requests the recorded RBAC test (test_rbac_recorded.py) needs beyond one job run
by the operator process, driven in-process against the test cluster with the identity under test:

- `drive_executor`: a worker-scope restart (one worker Failed): the executor deletes it and relabels the survivor.
- `drive_health`: the health monitor's actions from fake Prometheus answers: a hang (mark_hung), a straggler
  (mark_degraded), a fatal XID (cordon_node + replace_pods) and an app-level XID (restart_ranks).
- `drive_api`: `flywheel api` wired as `attach()` wires it for the chart's arguments: its watch cache syncs, a
  caller's token is reviewed (TokenReview: a real token is authenticated, a made-up one is not) and the caller's access
  (SubjectAccessReview: no grant, refused), and unless read-only the suspend, resume, restart and scale actions run.

Set-up objects (jobs, pods, nodes) are written with the admin kube; only the code under test uses the identity.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from flywheel.kube.client import Kube
from flywheel.monitor import HealthMonitor, MonitorSettings, OperatorMetrics
from flywheel.operator import manifests as m
from flywheel.operator.caches import ApiReads
from flywheel.operator.executor import JobRunner
from flywheel.operator.health_executor import KubeHealthActions, KubeJobInventory
from flywheel.operator.xid_memory import KubeXidMemory
from flywheel.policy.health_checks import HealthSettings
from flywheel.policy.reconcile import iso
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from tests.cluster.audit import Identity
from tests.fakes.prometheus_api import FakePrometheus

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "operator-tiny.yaml"


def kubeconfig_with_token(source: Path, target: Path, token: str) -> Path:
    """A copy of the test cluster's kubeconfig whose user presents `token` (the API server authenticates it)."""
    config = yaml.safe_load(source.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    target.write_text(yaml.safe_dump(config))
    return target


async def create_world(admin: Kube, namespace: str, name: str, nodes: tuple[str, str], ckpt: Path,
                       **fault_tolerance: Any) -> dict[str, Any]:
    """A TrainingJob with two Running worker pods (worker i on nodes[i]), as the kubelet would report them."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["checkpoint"]["dir"] = str(ckpt / name)
    doc["spec"]["scheduling"] = {"gang": False}
    doc["spec"]["faultTolerance"].update(fault_tolerance)
    job = await admin.create(Kube.custom(GROUP, VERSION, namespace, PLURAL), doc)
    assert job is not None
    started = iso(time.time() - 100)
    for node in nodes:
        await admin.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    for i, node in enumerate(nodes):
        pod = f"{name}-worker-{i}"
        await admin.create(Kube.core(namespace, "pods"), {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace,
                         "labels": {m.JOB_LABEL: name, m.INDEX_LABEL: str(i), m.GENERATION_LABEL: "0"},
                         "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
                                              "name": name, "uid": job["metadata"]["uid"], "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "worker", "image": "flywheel:latest"}]}})
        await set_pod(admin, namespace, pod, "Running", started)
    return job


async def set_pod(admin: Kube, namespace: str, pod: str, phase: str, started: str, exit_code: int = 0) -> None:
    state: dict[str, Any] = {"running": {"startedAt": started}}
    if phase == "Failed":
        state = {"terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": started,
                                "finishedAt": iso(time.time())}}
    await admin.merge_patch(Kube.core(namespace, "pods", pod) + "/status", {"status": {
        "phase": phase, "startTime": started, "conditions": [{"type": "Ready", "status": str(phase == "Running")}],
        "containerStatuses": [{"name": "worker", "ready": phase == "Running", "restartCount": 0,
                               "image": "flywheel:latest", "state": state}]}})


def runner(admin: Kube, kube: Kube, namespace: str, job: dict[str, Any]) -> JobRunner:
    """Writes with the identity under test; reads, which the operator takes from kopf's watch-fed caches (the
    operator process's watches are recorded for its identity), with the admin's."""
    return JobRunner(kube, m.OperatorSettings(etcd_endpoints=""), namespace, job["metadata"]["name"],
                     job["metadata"]["uid"], logging.getLogger(f"rbac.{job['metadata']['name']}"),
                     reads=ApiReads(admin))


async def drive_executor(admin: Kube, kube: Kube, namespace: str, ckpt: Path, prefix: str) -> None:
    name = f"{prefix}-worker"
    job = await create_world(admin, namespace, name, (f"{name}-a", f"{name}-b"), ckpt, restartScope="worker")
    run = runner(admin, kube, namespace, job)
    await run.reconcile_once()
    # A later operator's runner finds the job's PodDisruptionBudget there: it patches it (job_actions.py).
    await runner(admin, kube, namespace, job).reconcile_once()
    await set_pod(admin, namespace, f"{name}-worker-1", "Failed", iso(time.time() - 100), exit_code=1)
    await run.reconcile_once()
    pods = {p["metadata"]["name"]: p for p in await admin.list(Kube.core(namespace, "pods"), f"{m.JOB_LABEL}={name}")}
    survivor = pods[f"{name}-worker-0"]["metadata"]["labels"][m.GENERATION_LABEL]
    failed = pods.get(f"{name}-worker-1")
    assert survivor == "1" and (failed is None or failed["metadata"].get("deletionTimestamp")), pods


async def drive_health(admin: Kube, kube: Kube, namespace: str, ckpt: Path, prefix: str) -> None:
    name, now = f"{prefix}-health", time.time()
    a, b = f"{name}-a", f"{name}-b"
    job = await create_world(admin, namespace, name, (a, b), ckpt, progressTimeoutSeconds=5)
    await runner(admin, kube, namespace, job).reconcile_once()  # Running

    def rank(i: int, value: float) -> tuple[dict[str, str], float]:
        return {"namespace": namespace, "job": name, "replica": str(i), "rank": str(i)}, value

    def xid(node: str, code: int, pod: str) -> tuple[dict[str, str], float]:
        return ({"Hostname": node, "gpu": "0", "UUID": f"GPU-{node}", "err_code": str(code), "exported_pod": pod,
                 "exported_namespace": namespace}, float(code))

    prom = FakePrometheus()
    inventory = KubeJobInventory(kube, (namespace,), ApiReads(admin))
    settings = MonitorSettings(prometheus_url=prom.url, interval_seconds=0.05, query_timeout_seconds=2.0,
                               health=HealthSettings(staleness_allowance_seconds=1.0, cordon_nodes=True,
                                                     straggler_evaluations=1))
    monitor = HealthMonitor(settings, inventory, KubeHealthActions(kube, inventory), OperatorMetrics(),
                            xid_memory=KubeXidMemory(kube))
    try:
        prom.set("last_step", [rank(0, now - 50), rank(1, now - 0.5)])
        prom.set("step_seconds", [rank(0, 1.0), rank(1, 3.0)])
        prom.set("XID", [xid(b, 0, f"{name}-worker-1")])  # the XID baseline
        first = await monitor.evaluate_once()
        assert first.hangs and first.degradations, first
        prom.set("XID", [xid(a, 79, f"{name}-worker-0"), xid(b, 13, f"{name}-worker-1")])
        second = await monitor.evaluate_once()
        assert second.node_faults and second.rank_restarts, second
        errors = [s for f in monitor.metrics.registry.collect() if f.name == "flywheel_monitor_action_errors"
                  for s in f.samples if s.name.endswith("_total") and s.value]
        assert not errors, errors
    finally:
        await monitor.aclose()
        prom.stop()


def drive_api(kubeconfig: Path, api_args: list[str], namespace: str, job: str, caller: Identity) -> None:
    """`api_args`: the chart's API container args (`api --host ... [--namespace N] [--read-only]`); `caller`: a
    user of the cluster with no grant on TrainingJobs."""
    asyncio.run(_drive_api(kubeconfig, api_args, namespace, job, caller))


async def _drive_api(kubeconfig: Path, api_args: list[str], namespace: str, job: str, caller: Identity) -> None:
    from flywheel.api.auth import Access
    from flywheel.api.server import ServerConfig, attach
    from flywheel.cli import build_parser

    args = build_parser().parse_args(api_args)
    cfg = ServerConfig(kubeconfig=str(kubeconfig), namespace=args.namespace, token_file=args.token_file,
                       read_only=args.read_only)  # as flywheel.cli._api builds it
    app = SimpleNamespace(state=SimpleNamespace())
    stop = await attach(app, cfg, wait_seconds=20)
    try:
        assert app.state.source.ready(), "the API's cache did not sync"
        assert await app.state.auth.authenticate("a-made-up-token") is None
        who = await app.state.auth.authenticate(caller.token)
        assert who is not None and who.user == caller.user, who
        allowed, why = await app.state.auth.authorize(who, Access("patch", namespace, job))
        assert not allowed and caller.user in why, why
        actions = app.state.actions
        if actions is not None:
            await actions.suspend(namespace, job, True)
            await actions.suspend(namespace, job, False)
            await actions.restart(namespace, job)
            await actions.scale(namespace, job, 2)
    finally:
        await stop()

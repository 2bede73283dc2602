"""The chart's RBAC equals what the code asks for, derived from the requests it really makes.

The test cluster's API emulator records every request as Kubernetes' authorizer sees it (verb, apiGroup,
resource[/subresource], namespace), keyed by the caller's token (tests/k8s_emulator/requestlog.py). The operator runs as
a process with exactly the chart Deployment's arguments and its own token, and one job goes from apply to Succeeded
to its TTL deletion (kopf's watches, finalizer and namespace/CRD observers, the executor's pods, Service, PodGroup,
status, events, nodes and job deletion); then the paths one clean run does not take are driven in-process with the
same token (tests/chart/rbac_drivers.py: a worker-scope restart, every health-monitor action). The REST API is wired
as `flywheel api` wires it, with the chart's API arguments and its own token.

Each recording is compared with the grants the rendered chart gives that ServiceAccount (tests/chart/rbac.py): a
request no grant allows is a missing permission, a grant no request needs is an excess one. Both fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.kube.client import Connection, Kube
from tests.chart import rbac
from tests.chart.conftest import NAMESPACE, RELEASE, ROOT, find_tool, render
from tests.chart.rbac_drivers import drive_api, drive_executor, drive_health, kubeconfig_with_token
from tests.chart.test_apply_test_cluster import free_port
from tests.k8s_emulator.runtime import TOKEN as ADMIN_TOKEN

pytestmark = pytest.mark.slow

KUBECTL = find_tool("kubectl")
OPERATOR_SA, API_SA = f"{RELEASE}-flywheel", f"{RELEASE}-flywheel-api"
PODGROUP_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {"group": "scheduling.x-k8s.io", "scope": "Namespaced",
             "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}
# One shared host: workers serve no metrics port, one torch thread each (values, not code paths). And no etcd
# liveness watch: with a job this short a worker's lease key can vanish before its pod reports Succeeded, which the
# operator takes for a lost worker and restarts the job (the same requests either way; the liveness watch talks to
# etcd, not to the Kubernetes API).
HOST_VALUES = ("operator.workerMetricsPortBase=0", "operator.workerEnv.OMP_NUM_THREADS=1",
               "operator.extraArgs={--no-worker-liveness}")


@dataclass
class Env:
    cluster: Any
    tmp: Path

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig), *args], input=stdin,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0 or not check, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout if result.returncode == 0 else ""

    def admin(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(self.cluster.api_url + path, method=method)
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    def recorded(self, token: str) -> set[rbac.Request]:
        return {tuple(r) for r in self.admin("/_flywheel/recorded-requests").get(token, [])}  # type: ignore[misc]

    def kubeconfig(self, token: str) -> Path:
        return kubeconfig_with_token(self.cluster.kubeconfig, self.tmp / f"kubeconfig-{token}", token)

    def drive(self, token: str, *drivers: Any) -> None:
        async def main() -> None:
            admin, kube = Kube(Connection(self.cluster.api_url, ADMIN_TOKEN)), Kube(Connection(self.cluster.api_url,
                                                                                              token))
            try:
                for driver in drivers:
                    await driver(admin, kube, NAMESPACE, self.tmp / "ckpt", token)
            finally:
                await admin.close()
                await kube.close()
        asyncio.run(main())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if KUBECTL is None:
        pytest.skip("kubectl not found (make tools)")
    fixtures = pytest.importorskip("tests.k8s_emulator.fixtures")
    tmp = tmp_path_factory.mktemp("rbac-recorded")
    # No node is lost here: a long node grace keeps a slow kubelet heartbeat on a loaded machine from looking like one.
    with fixtures.start_cluster(tmp / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=30.0,
                                heartbeat_seconds=0.5) as cluster:
        env = Env(cluster, tmp)
        env.admin("/_flywheel/record-requests?on=true", "POST")
        env.kubectl("create", "namespace", NAMESPACE)
        env.kubectl("apply", "-f", str(ROOT / "crds" / "trainingjobs.flywheel.dev.yaml"))
        env.kubectl("apply", "-f", "-", stdin=json.dumps(PODGROUP_CRD))
        yield env


def compare(docs: list[dict[str, Any]], account: str, recorded: set[rbac.Request]) -> None:
    grants = rbac.grants_for(docs, account, NAMESPACE)
    assert recorded, f"nothing recorded for {account}"
    missing, excess = rbac.missing(grants, recorded), rbac.excess(grants, recorded)
    assert not missing, f"{account} lacks permissions its code uses: {rbac.describe(missing)}"
    assert not excess, (f"{account} has permissions no request of its code needed: " +
                        ", ".join(f"{g.verb} {g.group}/{g.resource} ({g.source})" for g in excess))


def operator_run(env: Env, docs: list[dict[str, Any]], token: str, name: str, prometheus_url: str) -> None:
    """The operator process with the chart Deployment's args runs one job to Succeeded and its TTL deletion."""
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator"))
    (op,) = dep["spec"]["template"]["spec"]["containers"]
    args = [f"--etcd-endpoints={env.cluster.etcd_url}" if a.startswith("--etcd-endpoints=") else
            f"--prometheus-url={prometheus_url}" if a.startswith("--prometheus-url=") else a for a in op["args"][1:]]
    liveness = next(p["containerPort"] for p in op["ports"] if p["name"] == "liveness")
    log = env.tmp / f"operator-{token}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "operator", "--kubeconfig",
                                 str(env.kubeconfig(token)), *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
    try:
        probe = op["livenessProbe"]["httpGet"]
        deadline = time.monotonic() + 30
        while True:  # kopf's liveness endpoint answers once the operator has started
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{liveness}{probe['path']}", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        job = yaml.safe_load((ROOT / "examples" / "operator-tiny.yaml").read_text())
        job["metadata"]["name"] = name
        job["spec"]["trainer"]["training"]["steps"] = 6
        job["spec"]["checkpoint"].update({"dir": str(env.tmp / "ckpt" / name), "everySteps": 3})
        job["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 0}
        env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(job))
        deadline = time.monotonic() + 150
        while obj := env.kubectl("get", "tj", name, "-n", NAMESPACE, "-o", "json", check=False):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, (f"{name} not deleted by its TTL: {json.loads(obj).get('status')}\n"
                                                 + env.kubectl("get", "events", "-n", NAMESPACE)[-3000:])
            time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def operator_values(*sets: str) -> tuple[str, ...]:
    return (*sets, *HOST_VALUES, f"operator.metricsPort={free_port()}", f"operator.livenessPort={free_port()}")


def test_operator_namespaced_rbac_equals_its_recorded_requests(env: Env):
    """Namespaced (the default), with every operator feature that needs a permission: health monitor with
    cordoning, gang scheduling (scheduler-plugins)."""
    from tests.fakes.prometheus_api import FakePrometheus

    sets = operator_values("operator.healthMonitor.enabled=true", "operator.gangScheduler=scheduler-plugins")
    docs = render(*sets)
    prom = FakePrometheus()
    try:
        operator_run(env, docs, "operator-ns", "rbac-ns", prom.url)
    finally:
        prom.stop()
    env.drive("operator-ns", drive_executor, drive_health)
    recorded = env.recorded("operator-ns")
    assert ("create", "scheduling.x-k8s.io", "podgroups", NAMESPACE) in recorded  # the gang path was taken
    assert ("patch", "", "nodes", "") in recorded and ("create", "", "events", "default") in recorded  # cordon
    compare(docs, OPERATOR_SA, recorded)


def test_operator_cluster_wide_rbac_equals_its_recorded_requests(env: Env):
    """rbac.clusterWide=true (all namespaces), health monitor off, no gang scheduler."""
    docs = render(*operator_values("rbac.clusterWide=true"))
    operator_run(env, docs, "operator-cw", "rbac-cw", "")
    env.drive("operator-cw", drive_executor)
    recorded = env.recorded("operator-cw")
    assert ("watch", "flywheel.dev", "trainingjobs", "") in recorded  # all namespaces
    compare(docs, OPERATOR_SA, recorded)


@pytest.mark.parametrize("sets", [(), ("api.readOnly=true",), ("rbac.clusterWide=true",)],
                         ids=["namespaced", "read-only", "cluster-wide"])
def test_api_rbac_equals_its_recorded_requests(env: Env, sets: tuple[str, ...]):
    docs = render("api.enabled=true", *sets)
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{RELEASE}-flywheel-api")
    (api,) = dep["spec"]["template"]["spec"]["containers"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == API_SA
    token = "api-" + ("-".join(s.replace("=", "-").replace(".", "-") for s in sets) or "default")
    job = f"drv-{token}".lower()[:50]
    doc = yaml.safe_load((ROOT / "examples" / "operator-tiny.yaml").read_text())
    doc["metadata"]["name"] = job
    doc["spec"]["replicas"] = {"min": 1, "max": 2}
    doc["spec"]["suspend"] = True  # nothing runs it: only the API's requests matter
    env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(doc))
    drive_api(env.kubeconfig(token), api["args"], NAMESPACE, job)
    compare(docs, API_SA, env.recorded(token))

"""The e2e suite's own cluster, for when KUBECONFIG names none (CI, a laptop): the test cluster (`python -m
tests.cluster up`: the real control plane and the process kubelet) with the chart installed on it the way
NOTES.txt and docs/install.md say, `helm template --include-crds | kubectl apply -f -`, so the operator runs as the
pod of its Deployment under the chart's ServiceAccount and RBAC, enforced by the real authorizer.

What one shared host needs beside the chart's defaults: the cluster's rendezvous etcd (etcd.externalEndpoints: the
process kubelet runs no etcd image, so the two scenarios that restart or read the chart's etcd pods skip), free ports
for the operator's metrics and liveness endpoints (every pod shares 127.0.0.1), no worker metrics port, one torch
thread per worker. The jobs' namespace gets a ReadWriteMany checkpoint claim, so the shared-claim scenarios run,
and the lost-node scenario freezes and thaws nodes through `python -m tests.cluster fault`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.chart.conftest import find_tool
from tests.cluster.cluster import claim_objects
from tests.etcd_process import free_port

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "flywheel"
RELEASE, OPERATOR_NAMESPACE, JOB_NAMESPACE = "fw", "flywheel-system", "flywheel-e2e"
CHECKPOINT_CLAIM = "flywheel-ckpt"
NODES, NODE_GRACE_SECONDS = 3, 4.0  # a third node for the drain and spare scenarios; a lost node noticed in seconds
ROLLOUT_TIMEOUT_S = 180


def _tool(name: str) -> str:
    return find_tool(name) or name


@dataclass(frozen=True)
class LocalCluster:
    kubeconfig: Path
    work: Path

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        argv = [_tool("kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[1:])}: {result.stderr.strip()}")
        return result.stdout


def settings(work: Path) -> dict[str, str]:
    """The FLYWHEEL_E2E_* settings (conftest.py's table) that point the suite at the cluster `up` will start here;
    known before it starts, as the suite's skip marks read them when the test modules are imported."""
    kubeconfig = work / "kubeconfig"
    fault = f"{sys.executable} -m tests.cluster fault --kubeconfig {kubeconfig}"
    return {"FLYWHEEL_E2E_KUBECONFIG": str(kubeconfig), "FLYWHEEL_E2E_NAMESPACE": JOB_NAMESPACE,
            "FLYWHEEL_E2E_CKPT_DIR": str(work / "ckpt"), "FLYWHEEL_E2E_CKPT_CLAIM": CHECKPOINT_CLAIM,
            "FLYWHEEL_E2E_OPERATOR": f"{OPERATOR_NAMESPACE}:app.kubernetes.io/name=flywheel,"
                                     "app.kubernetes.io/component=operator",
            "FLYWHEEL_E2E_LOSE_NODE": f"{fault} lose-node node={{node}}",
            "FLYWHEEL_E2E_RESTORE_NODE": f"{fault} restore-node node={{node}}",
            "FLYWHEEL_E2E_KUBECTL": _tool("kubectl")}


def bring_up(work: Path) -> LocalCluster:
    """Starts the test cluster and installs the chart; returns once the operator's pod is ready."""
    work.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(work / "kubeconfig", work)
    try:
        _install(cluster)
    except BaseException:
        bring_down(cluster)
        raise
    return cluster


def _install(cluster: LocalCluster) -> None:
    work = cluster.work
    up = subprocess.run([sys.executable, "-m", "tests.cluster", "up", "--kubeconfig", str(cluster.kubeconfig),
                         "--nodes", str(NODES), "--node-grace", str(NODE_GRACE_SECONDS), "--work-dir",
                         str(work / "cluster")], cwd=REPO, capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        raise RuntimeError(f"the test cluster did not come up: {up.stdout}{up.stderr}")
    state = json.loads(cluster.kubeconfig.with_name("kubeconfig.state.json").read_text())
    for namespace in (OPERATOR_NAMESPACE, JOB_NAMESPACE):
        cluster.kubectl("create", "namespace", namespace)
    _add_claim(cluster, JOB_NAMESPACE, CHECKPOINT_CLAIM)
    cluster.kubectl("apply", "-f", "-", stdin=_render_chart(state["etcd_url"]))
    cluster.kubectl("rollout", "status", f"deployment/{RELEASE}-flywheel-operator", "-n", OPERATOR_NAMESPACE,
                    f"--timeout={ROLLOUT_TIMEOUT_S}s", timeout=ROLLOUT_TIMEOUT_S + 10)


def bring_down(cluster: LocalCluster) -> None:
    subprocess.run([sys.executable, "-m", "tests.cluster", "down", "--kubeconfig", str(cluster.kubeconfig)],
                   cwd=REPO, capture_output=True, text=True, timeout=120)


def _render_chart(etcd_url: str) -> str:
    host_port = etcd_url.split("://", 1)[-1]
    sets = {"etcd.enabled": "false", "etcd.externalEndpoints": f"{{{host_port}}}",
            "operator.metricsPort": str(free_port()), "operator.livenessPort": str(free_port()),
            "operator.workerMetricsPortBase": "0", "operator.workerEnv.OMP_NUM_THREADS": "1",
            "operator.watchNamespaces": f"{{{JOB_NAMESPACE}}}"}
    argv = [_tool("helm"), "template", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--include-crds"]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "HELM_CACHE_HOME": "/tmp/flywheel-helm-cache"})
    if result.returncode != 0:
        raise RuntimeError(f"helm template: {result.stderr.strip()}")
    return result.stdout


def _add_claim(cluster: LocalCluster, namespace: str, name: str) -> None:
    """A ReadWriteMany claim bound to a hostPath volume of its own (the process kubelet mounts nothing: pods see the
    host's paths)."""
    items = claim_objects(namespace, name, cluster.work / f"{namespace}-{name}")
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)}))

"""The rendered chart on the test cluster (API emulator + process kubelet + real etcd) with real kubectl.

The test cluster serves the core kinds, CRDs and (stored only) RBAC, but no Deployments/StatefulSets and no
authorization. So: the chart's CRD, ServiceAccount, RBAC, Services and ConfigMaps are applied with kubectl; the
operator runs as a process with exactly the arguments of the chart's Deployment (the etcd endpoint pointed at the test
cluster's etcd, plus --kubeconfig); and examples/operator-tiny.yaml, applied as NOTES.txt says, runs to Succeeded.
That exercises the default namespaced mode (`--namespace=<release namespace>`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, KUBE_VERSION, NAMESPACE, RELEASE, ROOT, find_tool, run_helm

SERVED = {"CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
          "Service", "ConfigMap"}
KUBECTL = find_tool("kubectl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Env:
    def __init__(self, cluster: Any, tmp: Path, ports: dict[str, int], docs: list[dict[str, Any]]) -> None:
        self.cluster, self.tmp, self.ports, self.docs = cluster, tmp, ports, docs

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig), *args], input=stdin,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if KUBECTL is None:
        pytest.skip("kubectl not found (make tools)")
    fixtures = pytest.importorskip("tests.cluster.fixtures")
    ports = {"metrics": free_port(), "liveness": free_port()}
    # Values for one shared host: workers serve no metrics port (they would all want 9400), one torch thread each.
    rendered = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                        "--include-crds", "--set", "api.enabled=true",
                        "--set", f"operator.metricsPort={ports['metrics']}",
                        "--set", f"operator.livenessPort={ports['liveness']}", "--set", "operator.workerMetricsPortBase=0",
                        "--set", "operator.workerEnv.OMP_NUM_THREADS=1").stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    tmp = tmp_path_factory.mktemp("chart-cluster")
    with fixtures.start_cluster(tmp / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=3.0,
                                heartbeat_seconds=0.5) as cluster:
        yield Env(cluster, tmp, ports, docs)


def test_chart_objects_apply(env: Env):
    assert {d["kind"] for d in env.docs} - SERVED == {"Deployment", "StatefulSet"}
    assert len([d for d in env.docs if d["kind"] == "ServiceAccount"]) == 2  # the operator's and the API's
    served = [d for d in env.docs if d["kind"] in SERVED]
    crds = [d for d in served if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in served if d["kind"] != "CustomResourceDefinition"]
    assert len(crds) == 1
    env.kubectl("create", "namespace", NAMESPACE)
    env.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(crds))
    env.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(rest))
    for doc in rest:
        ns = doc["metadata"].get("namespace")
        env.kubectl("get", doc["kind"].lower(), doc["metadata"]["name"], *(["-n", ns] if ns else []))


@pytest.mark.slow
def test_operator_with_the_chart_args_runs_the_example_to_succeeded(env: Env):
    if "trainingjobs.flywheel.dev" not in env.kubectl("get", "crd"):
        pytest.skip("test_chart_objects_apply did not install the CRD")
    dep = next(d for d in env.docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator"))
    (op,) = dep["spec"]["template"]["spec"]["containers"]
    assert op["args"][0] == "operator"
    args = [a if not a.startswith("--etcd-endpoints=") else f"--etcd-endpoints={env.cluster.etcd_url}"
            for a in op["args"][1:]]
    assert f"--namespace={NAMESPACE}" in args
    log = env.tmp / "operator.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "operator", "--kubeconfig",
                                 str(env.cluster.kubeconfig), *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
    try:
        # The chart's liveness and readiness probes: kopf's endpoint on the port named in the probe.
        ports = {p["name"]: p["containerPort"] for p in op["ports"]}
        assert ports == env.ports
        for probe in (op["livenessProbe"]["httpGet"], op["readinessProbe"]["httpGet"]):
            deadline = time.monotonic() + 30
            while True:
                try:
                    url = f"http://127.0.0.1:{ports[probe['port']]}{probe['path']}"
                    with urllib.request.urlopen(url, timeout=2) as r:
                        assert r.status == 200 and r.headers["Content-Type"].startswith("application/json")
                        break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                    time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{env.ports['metrics']}/metrics", timeout=5) as r:
            assert b"flywheel_operator_jobs" in r.read()
        job = yaml.safe_load((ROOT / "examples" / "operator-tiny.yaml").read_text())
        job["spec"]["checkpoint"]["dir"] = str(env.tmp / "ckpt")  # /ckpt on a real cluster (a shared volume)
        env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(job))
        deadline = time.monotonic() + 150
        phase = ""
        while phase != "Succeeded":
            obj = json.loads(env.kubectl("get", "tj", "op-tiny", "-n", NAMESPACE, "-o", "json"))
            phase = (obj.get("status") or {}).get("phase", "")
            assert phase != "Failed", obj.get("status")
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"still {phase}: {obj.get('status')}\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        table = env.kubectl("get", "tj", "-n", NAMESPACE).splitlines()
        assert table[1].split()[:2] == ["op-tiny", "Succeeded"]
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

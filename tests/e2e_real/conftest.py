"""The operator scenarios against a real Kubernetes cluster. Skipped unless KUBECONFIG is set.

The cluster must already run the operator (the Helm chart) with etcd, and have the TrainingJob CRD. Settings:

| env | default | meaning |
|---|---|---|
| `KUBECONFIG` | (required) | the cluster |
| `FLYWHEEL_E2E_NAMESPACE` | `flywheel-e2e` | created if missing; jobs are applied here |
| `FLYWHEEL_E2E_IMAGE` | `flywheel:latest` | worker image (this package installed) |
| `FLYWHEEL_E2E_CKPT_DIR` | `/ckpt` | checkpoint dir inside the worker image |
| `FLYWHEEL_E2E_CKPT_CLAIM` | `""` | a ReadWriteMany PVC for the checkpoints (empty: per-pod, `ephemeral: true`) |
| `FLYWHEEL_E2E_OPERATOR` | `flywheel-system:` + the chart's operator labels (below) | the operator pod: ns:selector |
| `FLYWHEEL_E2E_KUBECTL` | `kubectl` on PATH, else .tools/bin/kubectl | the kubectl binary |
| `FLYWHEEL_E2E_ETCD` | `<operator ns>:app.kubernetes.io/component=etcd` | the chart's etcd pods: ns:selector |
| `FLYWHEEL_E2E_GANG` | `""` | `scheduler-plugins`: the chart's gangScheduler, with that scheduler running |
| `FLYWHEEL_E2E_API_URL`, `FLYWHEEL_E2E_API_TOKEN` | `""` | the chart's REST API (port-forwarded), a token for it |

Scenarios of tests/operator that need the test cluster's own hooks (a frozen node, forced 409 conflicts, dropped
watch streams; a DisruptionTarget condition patched in, for which the Eviction API stands in) have no real-cluster
twin; the rest do, a rank kill standing in for the killed worker process. The
warm spares' lost node is the exception: given the platform's commands to freeze and thaw a node
(test_real_spares_lost_node.py), it runs too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.waiting import eventually as _eventually

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "operator-tiny.yaml"
# The chart's operator pod (deployment.yaml: the chart's name label and component `operator`, whatever the release;
# `name=flywheel-operator` matched no pod, and the operator-restart scenario deleted none).
DEFAULT_OPERATOR = "flywheel-system:app.kubernetes.io/name=flywheel,app.kubernetes.io/component=operator"



def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KUBECONFIG"):
        return
    skip = pytest.mark.skip(reason="real-cluster suite: set KUBECONFIG (see tests/e2e_real/conftest.py)")
    for item in items:
        if "e2e_real" in str(item.fspath):
            item.add_marker(skip)


eventually = partial(_eventually, interval=1.0)  # a real cluster: poll gently


class RealCluster:
    def __init__(self) -> None:
        self.kubectl_bin = os.environ.get("FLYWHEEL_E2E_KUBECTL") or shutil.which("kubectl") or \
            str(REPO / ".tools" / "bin" / "kubectl")
        self.namespace = os.environ.get("FLYWHEEL_E2E_NAMESPACE", "flywheel-e2e")
        self.image = os.environ.get("FLYWHEEL_E2E_IMAGE", "flywheel:latest")
        self.ckpt = os.environ.get("FLYWHEEL_E2E_CKPT_DIR", "/ckpt")
        op = os.environ.get("FLYWHEEL_E2E_OPERATOR", DEFAULT_OPERATOR)
        self.operator_ns, _, self.operator_selector = op.partition(":")

    def kubectl(self, *args: str, check: bool = True, namespace: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [self.kubectl_bin, "-n", namespace or self.namespace, *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed: {result.stderr}")
        return result

    def apply_job(self, name: str, tmp: Path, **spec_changes: Any) -> None:
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"] = {"name": name, "namespace": self.namespace}
        doc["spec"]["image"] = self.image
        doc["spec"]["checkpoint"]["dir"] = f"{self.ckpt}/{name}-{int(time.time())}"
        # The example's claim only where the cluster has it; else per-pod checkpoints, accepted as such.
        claim = os.environ.get("FLYWHEEL_E2E_CKPT_CLAIM", "")
        doc["spec"]["checkpoint"].update(claimName=claim, ephemeral=not claim)
        for dotted, value in spec_changes.items():
            node = doc["spec"]
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        self.kubectl("apply", "-f", str(path))

    def status(self, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "tj", name, "-o", "json").stdout).get("status") or {}

    def pods(self, name: str) -> list[dict[str, Any]]:
        return json.loads(self.kubectl("get", "pods", "-l", f"flywheel.dev/job={name}", "-o", "json").stdout)["items"]

    def jobs_with_pods(self, *names: str) -> set[str]:
        """Which of these jobs have pods, from one LIST: one snapshot (a call per job would race a pod's end)."""
        out = self.kubectl("get", "pods", "-l", f"flywheel.dev/job in ({','.join(names)})", "-o", "json").stdout
        return {p["metadata"]["labels"]["flywheel.dev/job"] for p in json.loads(out)["items"]}

    def wait_phase(self, name: str, phase: str, timeout: float) -> dict[str, Any]:
        return eventually(lambda: (s := self.status(name)).get("phase") == phase and s, timeout,
                          f"{name} to reach {phase}")


@pytest.fixture(scope="session")
def real() -> Iterator[RealCluster]:
    cluster = RealCluster()
    if cluster.kubectl("get", "namespace", cluster.namespace, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", cluster.namespace, namespace="default")
    yield cluster
    cluster.kubectl("delete", "tj", "--all", "--wait=false", check=False)

"""The operator scenarios against a Kubernetes cluster with the chart installed: the one KUBECONFIG names, else
the suite's own (local_cluster.py: the test cluster -- the real control plane and the process kubelet -- with the
chart applied, the operator running as its Deployment's pod; CI runs the suite so).

A cluster of your own must already run the operator (the Helm chart) with etcd, and have the TrainingJob CRD.
Settings (the suite's own cluster sets those it needs; a variable already set wins):

| env | default | meaning |
|---|---|---|
| `KUBECONFIG` | (the suite's own cluster) | the cluster |
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
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_real import local_cluster
from tests.waiting import eventually as _eventually

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "operator-tiny.yaml"
# The chart's operator pod (deployment.yaml: the chart's name label and component `operator`, whatever the release;
# `name=flywheel-operator` matched no pod, and the operator-restart scenario deleted none).
DEFAULT_OPERATOR = "flywheel-system:app.kubernetes.io/name=flywheel,app.kubernetes.io/component=operator"



# Without KUBECONFIG the suite brings its cluster up itself, in this folder (one per pytest process: each xdist
# worker that runs a module of the suite has its own); its settings are known before the test modules read them.
# A setting the user gave stays; one that a parent pytest process set for its own cluster (xdist's controller
# imports this file when given the folder, and its workers inherit its environment) is replaced by this one's.
OWN_CLUSTER = Path(tempfile.gettempdir()) / f"flywheel-e2e-{os.getpid()}" if not os.environ.get("KUBECONFIG") else None
_OWNER = "FLYWHEEL_E2E_OWN_CLUSTER_PID"
if OWN_CLUSTER is not None:
    _parent = os.environ.get(_OWNER)
    _inherited = local_cluster.settings(OWN_CLUSTER.with_name(f"flywheel-e2e-{_parent}")) if _parent else {}
    for _key, _value in local_cluster.settings(OWN_CLUSTER).items():
        if _key not in os.environ or os.environ[_key] == _inherited.get(_key):
            os.environ[_key] = _value
    os.environ[_OWNER] = str(os.getpid())


# `make test` runs these scenarios on the suite's own cluster (the chart's operator pod, kubectl drain and the
# Eviction API, a lost node, the invalid table's two kinds of refusal, the hardened pod, the user script); each of
# the rest has a twin in tests/operator on the same control plane, and all run with FLYWHEEL_E2E_ALL=1 (`make e2e`).
IN_MAKE_TEST = frozenset({
    "test_tiny_job_succeeds_with_columns", "test_a_new_jobs_first_status_write_does_not_lose_to_kopfs_own_patches",
    "test_invalid_table_is_refused_before_any_pod[model-missing]",
    "test_invalid_table_is_refused_before_any_pod[template-volume]",
    "test_invalid_table_is_refused_before_any_pod[tp-heads]",
    "test_an_evicted_worker_restarts_without_spending_budget",
    "test_kubectl_drain_waits_on_the_jobs_budget_while_the_worker_moves_ahead",
    "test_a_lost_node_is_replaced_by_the_warm_spare",
    "test_a_script_writing_outside_its_volumes_fails_under_the_hardened_context",
    "test_a_gated_templated_job_with_secrets_and_a_priority_class_waits_then_runs",
    "test_a_user_script_runs_under_the_same_agent", "test_render_prints_the_pods_the_operator_created",
    "test_the_product_client_lists_in_pages"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if OWN_CLUSTER is None or os.environ.get("FLYWHEEL_E2E_ALL") == "1":
        return
    mine = [item for item in items if "e2e_real" in str(item.fspath)]
    left = [item for item in mine if item.name not in IN_MAKE_TEST]
    if left:
        config.hook.pytest_deselected(items=left)
        dropped = {id(item) for item in left}
        items[:] = [item for item in items if id(item) not in dropped]


eventually = partial(_eventually, interval=1.0)  # a real cluster: poll gently


class RealCluster:
    def __init__(self) -> None:
        self.kubeconfig = os.environ.get("KUBECONFIG") or os.environ["FLYWHEEL_E2E_KUBECONFIG"]
        self.kubectl_bin = os.environ.get("FLYWHEEL_E2E_KUBECTL") or shutil.which("kubectl") or \
            str(REPO / ".tools" / "bin" / "kubectl")
        self.namespace = os.environ.get("FLYWHEEL_E2E_NAMESPACE", "flywheel-e2e")
        self.image = os.environ.get("FLYWHEEL_E2E_IMAGE", "flywheel:latest")
        self.ckpt = os.environ.get("FLYWHEEL_E2E_CKPT_DIR", "/ckpt")
        op = os.environ.get("FLYWHEEL_E2E_OPERATOR", DEFAULT_OPERATOR)
        self.operator_ns, _, self.operator_selector = op.partition(":")

    def kubectl(self, *args: str, check: bool = True, namespace: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [self.kubectl_bin, "--kubeconfig", self.kubeconfig, "-n", namespace or self.namespace, *args]
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
    if OWN_CLUSTER is None:
        yield from _on(RealCluster())
        return
    own = local_cluster.bring_up(OWN_CLUSTER)
    try:
        yield from _on(RealCluster())
    finally:
        local_cluster.bring_down(own)
        shutil.rmtree(OWN_CLUSTER, ignore_errors=True)


def _on(cluster: RealCluster) -> Iterator[RealCluster]:
    if cluster.kubectl("get", "namespace", cluster.namespace, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", cluster.namespace, namespace="default")
    yield cluster
    cluster.kubectl("delete", "tj", "--all", "--wait=false", check=False)

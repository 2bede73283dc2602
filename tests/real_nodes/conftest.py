"""A test cluster with two real nodes (tests/cluster/real_node.py: the kubelet of the control-plane binary on
containerd and runc) beside one node of the process kubelet, holding the project's image (tests/image/build.py),
and the operator run as a process against it for the namespace `default` (tests/operator/conftest.py's
OperatorProcess, progress from etcd)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import TestCluster
from tests.cluster.fixtures import start_cluster
from tests.cluster.real_node import REAL_NODE_LABEL
from tests.image.build import project_image
from tests.operator.conftest import KUBECTL, OperatorProcess, operator_running
from tests.waiting import eventually

NODE_GRACE_SECONDS = 6.0
CLAIM = "flywheel-ckpt"


def on_real_nodes(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """`pod_spec` made to run on a real node: selected and tolerated there, on the host network (the nodes have
    no pod network: loopback CNI only)."""
    return {**pod_spec, "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]}


@dataclass
class RealEnv:
    cluster: TestCluster
    image: str
    operator: OperatorProcess
    tmp: Path

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig), *args], input=stdin,
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout))

    def pod_state(self, name: str) -> dict[str, Any]:
        statuses = (self.get("pod", name).get("status") or {}).get("containerStatuses") or [{}]
        return dict(statuses[0].get("state") or {})

    def wait(self, what: Any, timeout: float, said: str) -> Any:
        return eventually(what, timeout, lambda: said, interval=0.5)

    def logs(self, name: str) -> str:
        """The pod's log so far ("" while its container has not started)."""
        return self.kubectl("logs", name, check=False).stdout


@pytest.fixture(scope="module")
def real_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEnv]:
    if not KUBECTL.exists():
        pytest.skip("real kubectl missing: run scripts/install-tools.sh")
    image = project_image()
    tmp = tmp_path_factory.mktemp("real-nodes")
    cluster = start_cluster(tmp / "cluster", nodes=1, etcd=True, node_monitor_grace_seconds=NODE_GRACE_SECONDS,
                            heartbeat_seconds=0.5, real_nodes=2, real_node_images=(image,))
    operator = OperatorProcess(cluster, None, tmp / "operator.log")
    operator.extra_args = ["--namespace", "default"]  # the chart's operator (a test) has a namespace of its own
    cluster.add_claim(CLAIM)
    with operator_running(cluster, operator):
        yield RealEnv(cluster, image, operator, tmp)

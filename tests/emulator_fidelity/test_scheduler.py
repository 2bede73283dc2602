"""The test cluster schedules as kube-scheduler does, read back with the real kubectl: well-known node labels,
GPU taints and a fake `nvidia.com/gpu` count; a pod without the toleration, or asking for more GPUs than are free,
stays Pending with the scheduler's reason, and runs once it tolerates the taint or the GPUs are free."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.emulator_fidelity.conftest import KUBECTL
from tests.k8s_emulator.fixtures import RunningCluster, start_cluster
from tests.k8s_emulator.nodes import NodeSetup
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="run scripts/install-tools.sh for .tools/bin/kubectl")

GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    """Two GPU nodes (one GPU each), tainted as GPU node pools are."""
    setup = {f"node-{i}": NodeSetup(labels={"nvidia.com/gpu.product": "H100"}, taints=[GPU_TAINT],
                                    resources={"nvidia.com/gpu": "1"}) for i in (1, 2)}
    running = start_cluster(tmp_path_factory.mktemp("gpu"), nodes=2, heartbeat_seconds=0.3, node_setup=setup)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def kubectl(gpu_cluster: RunningCluster) -> Kubectl:
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(gpu_cluster.kubeconfig), *args], input=stdin,
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result
    return run


def sleeper(name: str, gpus: int = 0, seconds: float = 0.0, **spec: Any) -> str:
    container: dict[str, Any] = {"name": "main", "image": "python:3.11",
                                 "command": ["python", "-c", f"import time; time.sleep({seconds})"]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                    "containers": [container], **spec}})


def get(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return json.loads(kubectl("get", "pod", name, "-o", "json").stdout)


def unschedulable(kubectl: Kubectl, name: str) -> str:
    def condition() -> dict[str, Any] | None:
        conditions = get(kubectl, name)["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)
    found = eventually(condition, 15, f"{name} to be unschedulable", interval=0.2)
    assert found["reason"] == "Unschedulable"
    assert get(kubectl, name)["status"]["phase"] == "Pending" and not get(kubectl, name)["spec"].get("nodeName")
    return str(found["message"])


def reaches(kubectl: Kubectl, name: str, *phases: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = get(kubectl, name)
        return pod if pod["status"].get("phase") in phases else None
    return eventually(check, 30, f"{name} to reach {phases}", interval=0.2)


def test_nodes_carry_the_well_known_labels_taints_and_gpus(kubectl: Kubectl) -> None:
    node = json.loads(kubectl("get", "node", "node-1", "-o", "json").stdout)
    assert {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": "node-1"}.items() <= node["metadata"]["labels"].items()
    assert node["spec"]["taints"] == [GPU_TAINT]
    assert node["status"]["capacity"]["nvidia.com/gpu"] == node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert "linux" in kubectl("get", "nodes", "-L", "kubernetes.io/os").stdout


def test_a_pod_without_the_gpu_toleration_stays_pending_with_the_schedulers_reason(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=sleeper("no-toleration"))
    assert unschedulable(kubectl, "no-toleration") == (
        "0/2 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu: }. "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.")
    events = json.loads(kubectl("get", "events", "--field-selector", "involvedObject.name=no-toleration",
                                "-o", "json").stdout)["items"]
    assert any(e["reason"] == "FailedScheduling" and e["source"]["component"] == "default-scheduler"
               for e in events)
    kubectl("delete", "pod", "no-toleration")
    kubectl("apply", "-f", "-", stdin=sleeper("tolerates", tolerations=[TOLERATE_GPU]))
    assert reaches(kubectl, "tolerates", "Succeeded")["spec"]["nodeName"] in ("node-1", "node-2")
    kubectl("delete", "pod", "tolerates")


def test_gpu_requests_are_counted_per_node(kubectl: Kubectl) -> None:
    for name in ("gpu-a", "gpu-b"):
        kubectl("apply", "-f", "-", stdin=sleeper(name, gpus=1, seconds=60, tolerations=[TOLERATE_GPU]))
    nodes = {reaches(kubectl, name, "Running")["spec"]["nodeName"] for name in ("gpu-a", "gpu-b")}
    assert nodes == {"node-1", "node-2"}
    kubectl("apply", "-f", "-", stdin=sleeper("gpu-c", gpus=1, tolerations=[TOLERATE_GPU]))
    assert unschedulable(kubectl, "gpu-c") == (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. "
        "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.")
    kubectl("delete", "pod", "gpu-a")
    reaches(kubectl, "gpu-c", "Succeeded")
    kubectl("delete", "pod", "gpu-b", "gpu-c")


def test_node_selector_and_required_affinity_follow_the_labels(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=sleeper("wants-ssd", nodeSelector={"disk": "ssd"}, tolerations=[TOLERATE_GPU]))
    assert unschedulable(kubectl, "wants-ssd").startswith(
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.")
    kubectl("label", "node", "node-2", "disk=ssd")
    assert reaches(kubectl, "wants-ssd", "Succeeded")["spec"]["nodeName"] == "node-2"
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "disk", "operator": "DoesNotExist"},
                              {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}]}}}
    kubectl("apply", "-f", "-", stdin=sleeper("no-ssd", affinity=affinity, tolerations=[TOLERATE_GPU]))
    assert reaches(kubectl, "no-ssd", "Succeeded")["spec"]["nodeName"] == "node-1"
    kubectl("delete", "pod", "wants-ssd", "no-ssd")
    kubectl("label", "node", "node-2", "disk-")


def test_kubectl_taint_no_execute_keeps_new_pods_off_the_node(kubectl: Kubectl, gpu_cluster: RunningCluster) -> None:
    kubectl("taint", "nodes", "node-1", "dedicated=infra:NoExecute")
    try:
        for i in range(3):
            kubectl("apply", "-f", "-", stdin=sleeper(f"spread-{i}", tolerations=[TOLERATE_GPU]))
            assert reaches(kubectl, f"spread-{i}", "Succeeded")["spec"]["nodeName"] == "node-2"
    finally:
        kubectl("taint", "nodes", "node-1", "dedicated=infra:NoExecute-")
    assert json.loads(kubectl("get", "node", "node-1", "-o", "json").stdout)["spec"]["taints"] == [GPU_TAINT]
    kubectl("delete", "pod", "spread-0", "spread-1", "spread-2")


def test_set_resources_brings_up_gpus_at_runtime(kubectl: Kubectl, gpu_cluster: RunningCluster) -> None:
    kubectl("apply", "-f", "-", stdin=sleeper("eight-gpus", gpus=8, tolerations=[TOLERATE_GPU]))
    assert "2 Insufficient nvidia.com/gpu" in unschedulable(kubectl, "eight-gpus")
    assert gpu_cluster.kubelet is not None
    gpu_cluster.kubelet.set_resources("node-2", {"nvidia.com/gpu": "8"})
    assert reaches(kubectl, "eight-gpus", "Succeeded")["spec"]["nodeName"] == "node-2"
    gpu_cluster.kubelet.set_resources("node-2", {"nvidia.com/gpu": "1"})
    kubectl("delete", "pod", "eight-gpus")

"""The test cluster schedules as kube-scheduler does, read back with the real kubectl: well-known node labels,
GPU taints and a fake `nvidia.com/gpu` count; a pod without the toleration, or asking for more GPUs than are free,
stays Pending with the scheduler's reason, and runs once it tolerates the taint or the GPUs are free. The pod's own
pod (anti-)affinity is honoured: required terms filter nodes, preferred ones pick among them."""

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


def sleeper(name: str, gpus: int = 0, seconds: float = 0.0, labels: dict[str, str] | None = None, **spec: Any) -> str:
    container: dict[str, Any] = {"name": "main", "image": "python:3.11",
                                 "command": ["python", "-c", f"import time; time.sleep({seconds})"]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
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


def pod_affinity(kind: str, mode: str, weight: int = 0, **selector: str) -> dict[str, Any]:
    """One `kind` (podAffinity/podAntiAffinity) term per node (hostname), required or preferred with `weight`."""
    term = {"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"}
    if mode == "required":
        return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": weight, "podAffinityTerm": term}]}}


def run_pods(kubectl: Kubectl, names: list[str], seconds: float = 60, **spec: Any) -> dict[str, str]:
    """Create the pods one at a time, each once the last is running; {name: node}."""
    nodes = {}
    for name in names:
        kubectl("apply", "-f", "-", stdin=sleeper(name, seconds=seconds, tolerations=[TOLERATE_GPU], **spec))
        nodes[name] = reaches(kubectl, name, "Running", "Succeeded")["spec"]["nodeName"]
    return nodes


def test_required_anti_affinity_spreads_one_per_node_and_leaves_the_rest_pending(kubectl: Kubectl) -> None:
    anti = pod_affinity("podAntiAffinity", "required", app="spread")
    nodes = run_pods(kubectl, ["spread-a", "spread-b"], labels={"app": "spread"}, affinity=anti)
    assert sorted(nodes.values()) == ["node-1", "node-2"]
    kubectl("apply", "-f", "-", stdin=sleeper("spread-c", labels={"app": "spread"}, affinity=anti,
                                              tolerations=[TOLERATE_GPU]))
    assert unschedulable(kubectl, "spread-c") == (
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. "
        "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.")
    kubectl("delete", "pod", "spread-a")
    assert reaches(kubectl, "spread-c", "Running", "Succeeded")["spec"]["nodeName"] == nodes["spread-a"]
    kubectl("delete", "pod", "spread-b", "spread-c")


def test_required_affinity_co_locates_from_the_first_pod(kubectl: Kubectl) -> None:
    together = pod_affinity("podAffinity", "required", group="g")
    nodes = run_pods(kubectl, ["group-0", "group-1", "group-2"], labels={"group": "g"}, affinity=together)
    assert len(set(nodes.values())) == 1  # round robin alone would have spread them
    follower = pod_affinity("podAffinity", "required", group="absent")
    kubectl("apply", "-f", "-", stdin=sleeper("orphan", affinity=follower, tolerations=[TOLERATE_GPU]))
    assert unschedulable(kubectl, "orphan") == (
        "0/2 nodes are available: 2 node(s) didn't match pod affinity rules. "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.")
    kubectl("delete", "pod", "orphan", *nodes)


def test_preferred_anti_affinity_avoids_the_workers_node_while_it_can(kubectl: Kubectl) -> None:
    worker = run_pods(kubectl, ["worker"], labels={"role": "worker"})["worker"]
    away = pod_affinity("podAntiAffinity", "preferred", weight=50, role="worker")
    spares = run_pods(kubectl, ["spare-0", "spare-1", "spare-2"], seconds=0, labels={"role": "spare"}, affinity=away)
    assert worker not in spares.values()
    pinned = run_pods(kubectl, ["spare-pinned"], seconds=0, labels={"role": "spare"}, affinity=away,
                      nodeSelector={"kubernetes.io/hostname": worker})
    assert pinned == {"spare-pinned": worker}  # preferred only: it still schedules where nothing better is feasible
    kubectl("delete", "pod", "worker", "spare-pinned", *spares)


def test_preferred_affinity_pulls_a_pod_to_the_matching_pods_node(kubectl: Kubectl) -> None:
    leader = run_pods(kubectl, ["leader"], labels={"job": "j"})["leader"]
    near = pod_affinity("podAffinity", "preferred", weight=100, job="j")
    followers = run_pods(kubectl, ["near-0", "near-1", "near-2"], seconds=0, affinity=near)
    assert set(followers.values()) == {leader}
    kubectl("delete", "pod", "leader", *followers)

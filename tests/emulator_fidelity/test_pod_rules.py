"""The test cluster's scheduler filters and security-context plan as pure functions: tolerations, node
selectors and affinity, extended resources, the scheduler's message; the user, groups and writable paths a
container gets, and the kubelet's runAsNonRoot refusals."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s_emulator import sandbox, scheduling
from tests.k8s_emulator.podenv import ConfigError

GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         gpus: int = 0, cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or [], "unschedulable": cordoned},
            "status": {"allocatable": {"cpu": "2", "nvidia.com/gpu": str(gpus)}}}


def pod(gpus: int = 0, tolerations: list[dict[str, Any]] | None = None, node_name: str = "", phase: str = "",
        **spec: Any) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u-1"},
            "spec": {"containers": [{"name": "worker", "image": "python:3.11", "resources": resources}],
                     "tolerations": tolerations or [], "nodeName": node_name, **spec},
            "status": {"phase": phase}}


@pytest.mark.parametrize(("toleration", "tolerated"), [
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "", "effect": "NoSchedule"}, True),
    ({"key": "nvidia.com/gpu", "value": "present"}, False),
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "other", "operator": "Exists"}, False),
])
def test_tolerations_match_taints_as_core_v1_says(toleration: dict[str, Any], tolerated: bool) -> None:
    assert scheduling.tolerates([toleration], GPU_TAINT) is tolerated


def test_prefer_no_schedule_never_blocks() -> None:
    assert scheduling.untolerated_taint(pod(), [{"key": "a", "effect": "PreferNoSchedule"}]) is None
    assert scheduling.untolerated_taint(pod(), [{"key": "a", "effect": "NoExecute"}]) == \
        {"key": "a", "effect": "NoExecute"}


@pytest.mark.parametrize(("expression", "matches"), [
    ({"key": "gpu", "operator": "In", "values": ["h100", "a100"]}, True),
    ({"key": "gpu", "operator": "In", "values": ["a100"]}, False),
    ({"key": "gpu", "operator": "NotIn", "values": ["a100"]}, True),
    ({"key": "zone", "operator": "NotIn", "values": ["a"]}, True),
    ({"key": "gpu", "operator": "Exists"}, True),
    ({"key": "zone", "operator": "Exists"}, False),
    ({"key": "zone", "operator": "DoesNotExist"}, True),
    ({"key": "gpu", "operator": "DoesNotExist"}, False),
    ({"key": "count", "operator": "Gt", "values": ["4"]}, True),
    ({"key": "count", "operator": "Lt", "values": ["4"]}, False),
])
def test_required_node_affinity_operators(expression: dict[str, Any], matches: bool) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}
    target = node("n1", {"gpu": "h100", "count": "8"})
    assert scheduling.matches_node_affinity(pod(affinity=affinity), target) is matches


def test_node_affinity_terms_are_ored_and_node_selector_anded() -> None:
    terms = [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
             {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    assert scheduling.matches_node_affinity(pod(affinity=affinity), node("n1", {"gpu": "h100"}))
    assert not scheduling.matches_node_affinity(pod(affinity=affinity), node("n2", {"gpu": "h100"}))
    selector = {"gpu": "h100", "kubernetes.io/hostname": "n2"}
    assert not scheduling.matches_node_affinity(pod(nodeSelector=selector), node("n1", {"gpu": "h100"}))
    assert scheduling.matches_node_affinity(pod(nodeSelector=selector), node("n2", {"gpu": "h100"}))


def test_extended_resources_sum_the_unfinished_pods_on_the_node() -> None:
    running = [pod(gpus=6, node_name="n1"), pod(gpus=8, node_name="n1", phase="Succeeded"),
               pod(gpus=8, node_name="n2")]
    assert scheduling.node_misfit(pod(gpus=2), node("n1", gpus=8), running) is None
    assert scheduling.node_misfit(pod(gpus=3), node("n1", gpus=8), running) == "Insufficient nvidia.com/gpu"
    assert scheduling.node_misfit(pod(gpus=1), node("n3"), running) == "Insufficient nvidia.com/gpu"
    init = pod(gpus=1, initContainers=[{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "4"}}}])
    assert scheduling.pod_requests(init)["nvidia.com/gpu"] == 4


def test_the_first_failing_filter_names_the_node() -> None:
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists"}
    assert scheduling.node_misfit(pod(), node("n", cordoned=True, taints=[GPU_TAINT]), []) == \
        "node(s) were unschedulable"
    assert scheduling.node_misfit(pod(nodeSelector={"x": "y"}), node("n", taints=[GPU_TAINT]), []) == \
        "node(s) had untolerated taint {nvidia.com/gpu: }"
    assert scheduling.node_misfit(pod(tolerations=[gpu], nodeSelector={"x": "y"}), node("n", taints=[GPU_TAINT]),
                                  []) == "node(s) didn't match Pod's node affinity/selector"


def test_the_scheduler_message_is_kube_schedulers() -> None:
    tainted = [node("node-1", taints=[GPU_TAINT]), node("node-2", taints=[GPU_TAINT])]
    fit, misfits = scheduling.feasible_nodes(pod(), tainted, [], lost=set())
    assert fit == []
    assert scheduling.unschedulable_message(misfits) == (
        "0/2 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu: }. "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.")
    mixed = [node("node-1", taints=[{"key": "dedicated", "value": "infra", "effect": "NoExecute"}]),
             node("node-2"), node("node-3")]
    fit, misfits = scheduling.feasible_nodes(pod(gpus=1), mixed, [], lost={"node-3"})
    assert scheduling.unschedulable_message(misfits) == (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
        "{dedicated: infra}, 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }. preemption: 0/3 "
        "nodes are available: 1 No preemption victims found for incoming pod, 2 Preemption is not helpful for "
        "scheduling.")


HARDENED_POD = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                "supplementalGroups": [44]}
HARDENED_CONTAINER = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}


def secured(pod_context: dict[str, Any], container_context: dict[str, Any] | None = None,
            image: str = "python:3.11") -> tuple[dict[str, Any], dict[str, Any]]:
    container = {"name": "worker", "image": image, "securityContext": container_context or {},
                 "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt/job"}, {"name": "tmp", "mountPath": "/tmp"},
                                  {"name": "data", "mountPath": "/data", "readOnly": True}]}
    spec = {"securityContext": pod_context, "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "ckpt", "emptyDir": {}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    return {"metadata": {"name": "w-0", "namespace": "default", "uid": "u-1"}, "spec": spec}, container


def test_the_hardened_context_plans_a_non_root_read_only_sandbox() -> None:
    box = sandbox.plan(*secured(HARDENED_POD, HARDENED_CONTAINER))
    assert (box.uid, box.gid, box.groups) == (10001, 10001, (10001, 44))
    assert box.read_only_root and box.drop_all_capabilities and box.no_new_privs and box.needed
    assert box.writable == ("/tmp", "/ckpt/job") and box.read_only == ("/data",)
    argv = sandbox.wrap(["python", "-c", "pass"], box)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert argv[-3:] == ["python", "-c", "pass"]
    script = argv[7]
    assert script.index("mount --bind /tmp /tmp") < script.index("mount -o remount,bind,ro /\n")
    assert "setpriv --reuid=10001 --regid=10001 --groups=10001,44 --inh-caps=-all,+dac_read_search " \
           "--ambient-caps=+dac_read_search --bounding-set=-all,+dac_read_search --no-new-privs" in script
    assert script.index("mount -o remount,bind,ro /data") < script.index("mount --bind /ckpt/job /ckpt/job")
    nested = sandbox.Sandbox(uid=0, gid=0, writable=("/data/out",), read_only=("/data",))
    nested_script = sandbox.wrap(["true"], nested)[7]
    assert nested_script.index("mount --bind /data /data") < nested_script.index("mount --bind /data/out /data/out")
    root = sandbox.wrap(["true"], sandbox.plan(*secured({}, HARDENED_CONTAINER)))[7]
    assert "exec setpriv --inh-caps=-all --bounding-set=-all --no-new-privs -- " in root
    rdma = {**HARDENED_CONTAINER, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}
    assert "--bounding-set=-all,+ipc_lock " in sandbox.wrap(["true"], sandbox.plan(*secured({}, rdma)))[7]


def test_the_container_context_overrides_the_pod_field_by_field() -> None:
    box = sandbox.plan(*secured(HARDENED_POD, {"runAsUser": 0, "runAsNonRoot": False}))
    assert (box.uid, box.gid) == (0, 10001)
    assert not box.read_only_root
    root = sandbox.plan(*secured({}, {}))
    assert (root.uid, root.gid, root.read_only_root) == (0, 0, False)


def test_a_root_image_under_run_as_non_root_is_refused_with_the_kubelets_message() -> None:
    with pytest.raises(ConfigError) as refused:
        sandbox.identity(*secured({"runAsNonRoot": True}))
    assert str(refused.value) == ('container has runAsNonRoot and image will run as root '
                                  '(pod: "w-0_default(u-1)", container: worker)')
    with pytest.raises(ConfigError, match=r"^container's runAsUser breaks non-root policy \(pod: "):
        sandbox.identity(*secured({"runAsNonRoot": True, "runAsUser": 0}))


def test_the_project_image_runs_as_its_dockerfile_user() -> None:
    assert sandbox.identity(*secured({"runAsNonRoot": True}, image="ghcr.io/acme/flywheel:0.3")) == (10001, 10001)

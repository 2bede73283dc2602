"""PriorityClass and RuntimeClass on the test cluster with the real kubectl, as kube-apiserver's Priority and
RuntimeClass admission plugins treat them (tests/k8s_emulator/pod_classes.py): a pod gets its class's priority, a
missing class is a 403 naming it, one globalDefault at most; a RuntimeClass's scheduling constraints join the
pod's; host networking makes every container port a host port. Pods go through `--dry-run=server`, so nothing
runs."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.emulator_fidelity.conftest import KUBECTL
from tests.k8s_emulator import pod_classes
from tests.k8s_emulator.fixtures import RunningCluster

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="run scripts/install-tools.sh for .tools/bin/kubectl")
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kubectl(shared_cluster: RunningCluster) -> Kubectl:
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(KUBECTL), "--kubeconfig", str(shared_cluster.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, timeout=60, check=False)
    return run


def apply(kubectl: Kubectl, obj: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", "-f", "-", *flags, stdin=yaml.safe_dump(obj))


def admitted(kubectl: Kubectl, pod: dict[str, Any]) -> dict[str, Any]:
    result = apply(kubectl, pod, "--dry-run=server", "-o", "json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "python:3.11", "command": ["true"]}], **spec}}


def priority_class(name: str, value: int, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, **fields}


def test_the_system_classes_exist_and_print_as_kubectl_shows_them(kubectl: Kubectl) -> None:
    out = kubectl("get", "priorityclasses").stdout.splitlines()
    assert out[0].split() == ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert rows["system-node-critical"][1:3] == ["2000001000", "false"]
    assert rows["system-cluster-critical"][1] == "2000000000"


def test_a_pod_gets_its_classes_priority_and_a_missing_class_is_refused(kubectl: Kubectl) -> None:
    assert apply(kubectl, priority_class("fw-high", 1000, preemptionPolicy="Never")).returncode == 0
    spec = admitted(kubectl, pod("prio", priorityClassName="fw-high"))["spec"]
    assert (spec["priority"], spec["preemptionPolicy"]) == (1000, "Never")
    plain = admitted(kubectl, pod("plain"))["spec"]
    assert (plain["priority"], plain["preemptionPolicy"]) == (0, "PreemptLowerPriority")
    assert "priorityClassName" not in plain

    missing = apply(kubectl, pod("orphan", priorityClassName="fw-none"), "--dry-run=server")
    assert missing.returncode != 0
    assert 'pods "orphan" is forbidden: no PriorityClass with name fw-none was found' in missing.stderr
    forced = apply(kubectl, pod("forced", priorityClassName="fw-high", priority=7), "--dry-run=server")
    assert "the integer value of priority (7) must not be provided in pod spec" in forced.stderr


def test_priority_class_rules(kubectl: Kubectl) -> None:
    too_high = apply(kubectl, priority_class("fw-too-high", 1_000_000_001))
    assert "value: Forbidden: maximum allowed value of a user defined priority is 1000000000" in too_high.stderr
    reserved = apply(kubectl, priority_class("system-mine", 5))
    assert "priority class names with 'system-' prefix are reserved for system use only" in reserved.stderr
    assert apply(kubectl, priority_class("fw-default", 5, globalDefault=True)).returncode == 0
    second = apply(kubectl, priority_class("fw-default-2", 6, globalDefault=True))
    assert "PriorityClass fw-default is already marked as default. Only one default can exist" in second.stderr
    spec = admitted(kubectl, pod("defaulted"))["spec"]
    assert (spec["priorityClassName"], spec["priority"]) == ("fw-default", 5)
    changed = apply(kubectl, priority_class("fw-default", 9, globalDefault=True))
    assert "value: Forbidden: may not be changed in an update" in changed.stderr
    assert kubectl("delete", "priorityclass", "fw-default").returncode == 0


def test_a_runtime_class_is_required_and_its_scheduling_joins_the_pods(kubectl: Kubectl) -> None:
    missing = apply(kubectl, pod("no-rc", runtimeClassName="gvisor"), "--dry-run=server")
    assert 'pods "no-rc" is forbidden: pod rejected: RuntimeClass "gvisor" not found' in missing.stderr
    assert "handler: Required value" in apply(kubectl, {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                        "metadata": {"name": "bad"}}).stderr
    toleration = {"key": "sandboxed", "operator": "Exists", "effect": "NoSchedule"}
    assert apply(kubectl, {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "fw-rc"},
                           "handler": "runc", "overhead": {"podFixed": {"cpu": "10m"}},
                           "scheduling": {"nodeSelector": {"kubernetes.io/os": "linux"},
                                          "tolerations": [toleration]}}).returncode == 0
    assert kubectl("get", "runtimeclass", "fw-rc").stdout.split()[:4] == ["NAME", "HANDLER", "AGE", "fw-rc"]
    spec = admitted(kubectl, pod("rc", runtimeClassName="fw-rc", nodeSelector={"team": "a"}))["spec"]
    assert spec["nodeSelector"] == {"team": "a", "kubernetes.io/os": "linux"}
    # After DefaultTolerationSeconds' two, which that plugin adds before RuntimeClass's runs (kube-apiserver's order).
    assert [t["key"] for t in spec["tolerations"]] == [*pod_classes.TOLERATED_BY_DEFAULT, "sandboxed"]
    assert spec["tolerations"][-1] == toleration and spec["overhead"] == {"cpu": "10m"}
    conflict = apply(kubectl, pod("rc-conflict", runtimeClassName="fw-rc", nodeSelector={"kubernetes.io/os": "w"}),
                     "--dry-run=server")
    assert "conflict: runtimeClass.scheduling.nodeSelector[kubernetes.io/os] = linux" in conflict.stderr


def test_host_network_makes_every_container_port_a_host_port(kubectl: Kubectl) -> None:
    spec = pod("hostnet", hostNetwork=True)["spec"]
    spec["containers"][0]["ports"] = [{"containerPort": 29500}, {"containerPort": 9400, "hostPort": 9400}]
    ports = admitted(kubectl, {**pod("hostnet"), "spec": spec})["spec"]["containers"][0]["ports"]
    assert [(p["containerPort"], p["hostPort"]) for p in ports] == [(29500, 29500), (9400, 9400)]
    spec["hostNetwork"] = False
    ports = admitted(kubectl, {**pod("podnet"), "spec": spec})["spec"]["containers"][0]["ports"]
    assert "hostPort" not in ports[0]

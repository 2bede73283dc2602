"""The Node objects the process kubelet registers and the status it reports: the well-known labels
(`kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch`), and what a test gives a node through
`NodeSetup` -- more labels, taints, and extended resources (e.g. a fake `nvidia.com/gpu` count, as a device
plugin advertises it in capacity and allocatable)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

from tests.kubelet import podenv


@dataclass
class NodeSetup:
    """What a node carries besides the well-known labels: more labels, taints (`{"key", "value", "effect"}`) and
    extended resources by name (e.g. `{"nvidia.com/gpu": "8"}`: capacity and allocatable)."""
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    resources: dict[str, str] = field(default_factory=dict)


def node_object(node: str, setup: NodeSetup) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              **setup.labels}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels},
            "spec": {"taints": list(setup.taints)} if setup.taints else {}}


def node_status(node: str, setup: NodeSetup, kubelet_version: str) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ok = [("MemoryPressure", "False", "KubeletHasSufficientMemory"),
          ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
          ("PIDPressure", "False", "KubeletHasSufficientPID"), ("Ready", "True", "KubeletReady")]
    resources = {"cpu": str(os.cpu_count() or 1), "memory": "16Gi", "pods": "110", **setup.resources}
    return {"conditions": [{"type": t, "status": s, "reason": r, "message": f"kubelet: {r}",
                            "lastHeartbeatTime": now, "lastTransitionTime": now} for t, s, r in ok],
            "addresses": [{"type": "InternalIP", "address": podenv.POD_IP}, {"type": "Hostname", "address": node}],
            "capacity": dict(resources), "allocatable": dict(resources),
            "nodeInfo": {"kubeletVersion": kubelet_version, "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "process://local",
                         "kernelVersion": os.uname().release, "osImage": "process kubelet", "machineID": node,
                         "systemUUID": node, "bootID": node}}

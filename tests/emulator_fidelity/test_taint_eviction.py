"""NoExecute taints as a cluster acts on them: every pod gets the DefaultTolerationSeconds tolerations, and the taint
manager evicts (DisruptionTarget DeletionByTaintManager, then a graceful delete) the pods of a NoExecute-tainted
node that do not tolerate the taint at once, and those that tolerate it for a while once that has passed."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.emulator_fidelity.conftest import KUBECTL
from tests.k8s_emulator.fixtures import RunningCluster
from tests.waiting import eventually as wait_for

DEFAULTS = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300}]


@pytest.fixture(scope="module")
def core(two_node_cluster: RunningCluster) -> Iterator[client.CoreV1Api]:
    api_client = config.new_client_from_config(config_file=str(two_node_cluster.kubeconfig))
    yield client.CoreV1Api(api_client)
    api_client.close()


def sleeper(name: str, node: str, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A pod that ignores SIGTERM: deleted, it stays Terminating for its 2 s grace period."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2, "tolerations": tolerations or [],
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "main", "image": "busybox:1.36",
                                     "command": ["sh", "-c", "trap '' TERM; sleep 60 & wait; wait"]}]}}


def read(core: client.CoreV1Api, name: str) -> dict[str, Any] | None:
    try:
        raw: dict[str, Any] = core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, "default"))
        return raw
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def running(core: client.CoreV1Api, name: str) -> bool:
    return bool((pod := read(core, name)) and pod["status"].get("phase") == "Running")


def test_every_pod_gets_the_default_tolerations(core: client.CoreV1Api) -> None:
    created = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod("default", sleeper("defaults", "node-1"), dry_run="All"))
    assert created["spec"]["tolerations"] == DEFAULTS
    everything = [{"operator": "Exists"}]  # tolerates every taint: nothing added
    created = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod("default", sleeper("all", "node-1", everything), dry_run="All"))
    assert created["spec"]["tolerations"] == everything


def test_a_no_execute_taint_evicts_what_does_not_tolerate_it(two_node_cluster: RunningCluster,
                                                             core: client.CoreV1Api) -> None:
    forever = {"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}
    briefly = {**forever, "tolerationSeconds": 3}
    for name, tolerations in (("plain", []), ("forever", [forever]), ("briefly", [briefly])):
        core.create_namespaced_pod("default", sleeper(name, "node-1", tolerations))
    for name in ("plain", "forever", "briefly"):
        wait_for(lambda n=name: running(core, n), 30, f"{name} to run")
    kubectl = [str(KUBECTL), "--kubeconfig", str(two_node_cluster.kubeconfig)]
    subprocess.run([*kubectl, "taint", "nodes", "node-1", "maintenance=now:NoExecute"], check=True, timeout=60,
                   capture_output=True)
    tainted = time.monotonic()
    try:
        marked = wait_for(lambda: (p := read(core, "plain")) and p["metadata"].get("deletionTimestamp") and p,
                          10, "the untolerating pod's eviction")
        target = next(c for c in marked["status"]["conditions"] if c["type"] == "DisruptionTarget")
        assert (target["status"], target["reason"]) == ("True", "DeletionByTaintManager")
        assert not (read(core, "briefly") or {}).get("metadata", {}).get("deletionTimestamp")  # its 3 s run on
        wait_for(lambda: (p := read(core, "briefly")) is None or p["metadata"].get("deletionTimestamp"), 30,
                 "the briefly tolerating pod's eviction")
        assert time.monotonic() - tainted >= 2.5
        wait_for(lambda: read(core, "plain") is None and read(core, "briefly") is None, 30, "the evicted pods to go")
        assert running(core, "forever")
        node = json.loads(subprocess.run([*kubectl, "get", "node", "node-1", "-o", "json"], check=True, timeout=60,
                                         capture_output=True, text=True).stdout)
        taint = next(t for t in node["spec"]["taints"] if t["key"] == "maintenance")
        assert taint.get("timeAdded"), taint  # the API server's stamp on a NoExecute taint
        events = core.list_namespaced_event("default", field_selector="involvedObject.name=plain").items
        assert any(e.reason == "TaintManagerEviction" for e in events)
    finally:
        subprocess.run([*kubectl, "taint", "nodes", "node-1", "maintenance-"], timeout=60, capture_output=True)
        core.delete_namespaced_pod("forever", "default", grace_period_seconds=0)

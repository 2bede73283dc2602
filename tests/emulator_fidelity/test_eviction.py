"""The Eviction API as a real API server serves it (pod disruption conditions on, no PodDisruptionBudgets here), and
`kubectl drain`, which uses it, with the real kubectl."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.emulator_fidelity.conftest import KUBECTL
from tests.emulator_fidelity.test_kubelet import gone, phase_is, pod
from tests.k8s_emulator.fixtures import RunningCluster
from tests.waiting import eventually as wait_for

SLEEP = "import time; time.sleep(600)"
# Lives out its grace period: the evicted pod is still there (Terminating) when the test reads it. (A container that
# ends at its SIGTERM lets the kubelet remove the pod before a loaded host's next request, on a real cluster too.)
SLEEP_THROUGH_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


@pytest.fixture(scope="module")
def core(two_node_cluster: RunningCluster) -> Iterator[client.CoreV1Api]:
    api_client = config.new_client_from_config(config_file=str(two_node_cluster.kubeconfig))
    yield client.CoreV1Api(api_client)
    api_client.close()


def _eviction(name: str, **delete_options: Any) -> client.V1Eviction:
    return client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="default"),
                             delete_options=client.V1DeleteOptions(**delete_options) if delete_options else None)


def test_discovery_names_the_eviction_subresource_with_its_group(core: client.CoreV1Api) -> None:
    entry = next(r for r in core.get_api_resources().resources if r.name == "pods/eviction")
    assert (entry.group, entry.version, entry.kind, entry.verbs) == ("policy", "v1", "Eviction", ["create"])


def test_an_eviction_marks_the_pod_then_deletes_it_gracefully(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("evict-me", SLEEP_THROUGH_TERM, grace=5))
    running = wait_for(phase_is(core, "evict-me", "Running"), what="Running")
    seen: list[tuple[bool, bool]] = []  # (DisruptionTarget=True, deletionTimestamp set) per MODIFIED event

    def watch_it() -> None:
        for event in watch.Watch().stream(core.list_namespaced_pod, "default", field_selector="metadata.name=evict-me",
                                          resource_version=running.metadata.resource_version, timeout_seconds=20):
            obj = event["object"]
            if event["type"] == "DELETED":
                return
            target = any(c.type == "DisruptionTarget" and c.status == "True" for c in obj.status.conditions or [])
            seen.append((target, obj.metadata.deletion_timestamp is not None))

    watcher = threading.Thread(target=watch_it)
    watcher.start()
    core.create_namespaced_pod_eviction("evict-me", "default", _eviction("evict-me"))
    evicted = core.read_namespaced_pod("evict-me", "default")
    condition = next(c for c in evicted.status.conditions if c.type == "DisruptionTarget")
    assert (condition.status, condition.reason, condition.message) == \
        ("True", "EvictionByEvictionAPI", "Eviction API: evicting")
    assert evicted.metadata.deletion_grace_period_seconds == 5  # the pod's own grace: a graceful deletion
    wait_for(gone(core, "evict-me"), 30, "the evicted pod to go")
    watcher.join(30)
    # A watcher sees the condition first, then the deletion (never a deletion without its reason).
    assert seen[0] == (True, False) and (True, True) in seen, seen


def test_eviction_errors_and_preconditions_are_the_api_servers(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as missing:
        core.create_namespaced_pod_eviction("no-such-pod", "default", _eviction("no-such-pod"))
    assert missing.value.status == 404
    core.create_namespaced_pod("default", pod("kept", SLEEP, grace=1))
    wait_for(phase_is(core, "kept", "Running"), what="Running")
    with pytest.raises(ApiException) as mismatch:
        core.create_namespaced_pod_eviction("kept", "default", _eviction("other-name"))
    assert mismatch.value.status == 400
    with pytest.raises(ApiException) as precondition:
        core.create_namespaced_pod_eviction("kept", "default", _eviction(
            "kept", preconditions=client.V1Preconditions(uid="not-the-pods-uid")))
    assert precondition.value.status == 409
    core.create_namespaced_pod_eviction("kept", "default", _eviction("kept"), dry_run="All")
    still = core.read_namespaced_pod("kept", "default")
    assert still.metadata.deletion_timestamp is None and not any(
        c.type == "DisruptionTarget" for c in still.status.conditions or [])
    # The pod's current resourceVersion as a precondition holds, though the condition's write moves it on.
    current = client.V1Preconditions(uid=still.metadata.uid, resource_version=still.metadata.resource_version)
    core.create_namespaced_pod_eviction("kept", "default", _eviction("kept", preconditions=current))
    wait_for(gone(core, "kept"), 30, "the evicted pod to go")


def test_kubectl_drain_cordons_and_evicts(two_node_cluster: RunningCluster, core: client.CoreV1Api) -> None:
    if not KUBECTL.exists():
        pytest.skip("run scripts/install-tools.sh for .tools/bin/kubectl")
    core.create_namespaced_pod("default", pod("on-node-1", SLEEP, grace=2, node="node-1"))
    wait_for(phase_is(core, "on-node-1", "Running"), what="Running")
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    # An owned pod: kubectl drain leaves unreplicated pods alone without --force.
    owned = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid, "controller": True}
    core.patch_namespaced_pod("on-node-1", "default", {"metadata": {"ownerReferences": [owned]}})
    drain = subprocess.run([str(KUBECTL), "--kubeconfig", str(two_node_cluster.kubeconfig), "drain", "node-1",
                            "--timeout=60s"], capture_output=True, text=True, timeout=90)
    try:
        assert drain.returncode == 0, drain.stderr
        assert "evicting pod default/on-node-1" in drain.stderr + drain.stdout
        assert "pod/on-node-1 evicted" in drain.stdout and "node/node-1 drained" in drain.stdout
        assert core.read_node("node-1").spec.unschedulable is True
        with pytest.raises(ApiException):
            core.read_namespaced_pod("on-node-1", "default")  # drain waited for it to be gone
    finally:
        core.patch_node("node-1", json.loads('{"spec": {"unschedulable": null}}'))

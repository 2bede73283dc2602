"""The process kubelet's init containers on the real control plane: run in order before the main container, a
failed one fails the pod under `restartPolicy: Never` (its state and message in initContainerStatuses, the main
container never started) or is restarted under `OnFailure`; sidecars run beside the main container and are stopped
when it ends; an init container's unpullable image holds the pod in `Init:ErrImagePull`. kubectl's STATUS column
is the real API server's printing of what the kubelet reported."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.cluster import TestCluster
from tests.k8s.kubelet_pods import Kubectl, core_api, kubectl_of, read
from tests.waiting import eventually as wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def core(cluster: TestCluster) -> Iterator[client.CoreV1Api]:
    yield from core_api(cluster)


@pytest.fixture(scope="module")
def kubectl(cluster: TestCluster) -> Kubectl:
    return kubectl_of(cluster)


def sh(name: str, script: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox:1.36", "command": ["sh", "-c", script], **fields}


def pod(name: str, inits: list[dict[str, Any]], main: str, restart: str = "Never") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 5, "initContainers": inits,
                     "containers": [sh("main", main)]}}


def phase(core: client.CoreV1Api, name: str, *phases: str) -> Callable[[], Any]:
    return lambda: (p := read(core, name))["status"].get("phase") in phases and p


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in pod["status"]["conditions"] if c["type"] == kind)


def test_init_containers_run_in_order_before_the_main_one(core: client.CoreV1Api, kubectl: Kubectl,
                                                           tmp_path: Path) -> None:
    trail = tmp_path / "trail"
    inits = [sh("first", f"echo first >> {trail}; echo hello from first"), sh("second", f"echo second >> {trail}")]
    core.create_namespaced_pod("default", pod("init-order", inits, f"echo main >> {trail}"))
    done = wait_for(phase(core, "init-order", "Succeeded", "Failed"), 60, "the pod to end")
    assert done["status"]["phase"] == "Succeeded" and trail.read_text().split() == ["first", "second", "main"]
    statuses = done["status"]["initContainerStatuses"]
    assert [(s["name"], s["state"]["terminated"]["reason"], s["ready"]) for s in statuses] == \
        [("first", "Completed", True), ("second", "Completed", True)]
    assert condition(done, "Initialized")["status"] == "True"
    assert kubectl("logs", "init-order", "-c", "first").stdout.strip() == "hello from first"


def test_a_failed_init_container_fails_the_pod_under_never(core: client.CoreV1Api, kubectl: Kubectl,
                                                            tmp_path: Path) -> None:
    marker = tmp_path / "main-ran"
    inits = [sh("fetch", "echo dataset s3://x missing >&2; exit 3", terminationMessagePolicy="FallbackToLogsOnError")]
    core.create_namespaced_pod("default", pod("init-fails", inits, f"touch {marker}"))
    failed = wait_for(phase(core, "init-fails", "Failed", "Succeeded"), 60, "the pod to fail")
    assert failed["status"]["phase"] == "Failed" and not marker.exists()
    fetch = failed["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert (fetch["exitCode"], fetch["reason"]) == (3, "Error")
    assert fetch["message"].strip() == "dataset s3://x missing"
    assert failed["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"
    initialized = condition(failed, "Initialized")
    assert (initialized["status"], initialized["reason"]) == ("False", "ContainersNotInitialized")
    assert "[fetch]" in initialized["message"]
    assert "Init:Error" in kubectl("get", "pod", "init-fails").stdout


def test_a_failed_init_container_is_restarted_under_on_failure(core: client.CoreV1Api, tmp_path: Path) -> None:
    tries = tmp_path / "tries"
    script = f"echo x >> {tries}; [ $(wc -l < {tries}) -ge 3 ]"  # fails twice, then passes
    core.create_namespaced_pod("default", pod("init-retries", [sh("flaky", script)], "true", restart="OnFailure"))
    done = wait_for(phase(core, "init-retries", "Succeeded", "Failed"), 60, "the pod to end")
    assert done["status"]["phase"] == "Succeeded"
    flaky = done["status"]["initContainerStatuses"][0]
    assert flaky["restartCount"] == 2 and flaky["lastState"]["terminated"]["exitCode"] == 1


def test_a_sidecar_runs_beside_the_main_container_and_stops_with_it(core: client.CoreV1Api, tmp_path: Path) -> None:
    beat = tmp_path / "beat"
    inits = [sh("helper", f"while true; do date +%s.%N >> {beat}; sleep 0.1; done", restartPolicy="Always")]
    main = f"sleep 1; test -s {beat}"  # the sidecar runs while the main container does
    core.create_namespaced_pod("default", pod("sidecar", inits, main))
    done = wait_for(phase(core, "sidecar", "Succeeded", "Failed"), 60, "the pod to end")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    helper = done["status"]["initContainerStatuses"][0]
    assert "terminated" in helper["state"], helper  # stopped once the main container ended
    lines = beat.read_text().count("\n")
    time.sleep(0.5)  # five beats, had it been left running
    assert beat.read_text().count("\n") == lines


def test_an_init_containers_unpullable_image_holds_the_pod(core: client.CoreV1Api, kubectl: Kubectl) -> None:
    inits = [{"name": "fetch", "image": "registry.invalid/flywheel/no-such-image:1", "command": ["true"]}]
    core.create_namespaced_pod("default", pod("init-image", inits, "true"))

    def pulling() -> dict[str, Any] | None:
        status = read(core, "init-image")["status"]
        waiting = ((status.get("initContainerStatuses") or [{}])[0].get("state") or {}).get("waiting") or {}
        return status if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    status = wait_for(pulling, 30, "the init container's pull to fail")
    assert status["phase"] == "Pending"
    shown = kubectl("get", "pod", "init-image").stdout
    assert "Init:ErrImagePull" in shown or "Init:ImagePullBackOff" in shown
    core.delete_namespaced_pod("init-image", "default", grace_period_seconds=0)

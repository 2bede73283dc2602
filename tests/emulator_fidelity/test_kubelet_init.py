"""The process kubelet's init containers: run in order before the main container, a failed one fails the pod under
`restartPolicy: Never` (its state and message in initContainerStatuses, the main container never started) or is
restarted under `OnFailure`; sidecars run beside the main container and are stopped when it ends; an init
container's unpullable image holds the pod in `Init:ErrImagePull`; kubectl's STATUS and `logs -c` as on a cluster."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.emulator_fidelity.conftest import KUBECTL
from tests.k8s_emulator.fixtures import RunningCluster
from tests.waiting import eventually as wait_for


@pytest.fixture(scope="module")
def core(shared_cluster: RunningCluster) -> Iterator[client.CoreV1Api]:
    api_client = config.new_client_from_config(config_file=str(shared_cluster.kubeconfig))
    yield client.CoreV1Api(api_client)
    api_client.close()


def sh(name: str, script: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox:1.36", "command": ["sh", "-c", script], **fields}


def pod(name: str, inits: list[dict[str, Any]], main: str, restart: str = "Never") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 5, "initContainers": inits,
                     "containers": [sh("main", main)]}}


def read(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    raw = core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, "default"))
    return raw  # type: ignore[no-any-return]


def phase(core: client.CoreV1Api, name: str, *phases: str) -> Any:
    return lambda: (p := read(core, name))["status"].get("phase") in phases and p


def kubectl(cluster: RunningCluster, *args: str) -> str:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args], capture_output=True,
                          text=True, timeout=60, check=True).stdout


def test_init_containers_run_in_order_before_the_main_one(shared_cluster: RunningCluster, core: client.CoreV1Api,
                                                           tmp_path: Path) -> None:
    trail = tmp_path / "trail"
    inits = [sh("first", f"echo first >> {trail}; echo hello from first"), sh("second", f"echo second >> {trail}")]
    core.create_namespaced_pod("default", pod("init-order", inits, f"echo main >> {trail}"))
    done = wait_for(phase(core, "init-order", "Succeeded", "Failed"), 60, "the pod to end")
    assert done["status"]["phase"] == "Succeeded" and trail.read_text().split() == ["first", "second", "main"]
    statuses = done["status"]["initContainerStatuses"]
    assert [(s["name"], s["state"]["terminated"]["reason"], s["ready"]) for s in statuses] == \
        [("first", "Completed", True), ("second", "Completed", True)]
    initialized = next(c for c in done["status"]["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "True"
    if KUBECTL.exists():
        assert kubectl(shared_cluster, "logs", "init-order", "-c", "first").strip() == "hello from first"


def test_a_failed_init_container_fails_the_pod_under_never(shared_cluster: RunningCluster, core: client.CoreV1Api,
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
    initialized = next(c for c in failed["status"]["conditions"] if c["type"] == "Initialized")
    assert (initialized["status"], initialized["reason"]) == ("False", "ContainersNotInitialized")
    assert "[fetch]" in initialized["message"]
    if KUBECTL.exists():
        assert "Init:Error" in kubectl(shared_cluster, "get", "pod", "init-fails")


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


def test_an_init_containers_unpullable_image_holds_the_pod(shared_cluster: RunningCluster,
                                                           core: client.CoreV1Api) -> None:
    inits = [{"name": "fetch", "image": "registry.invalid/flywheel/no-such-image:1", "command": ["true"]}]
    core.create_namespaced_pod("default", pod("init-image", inits, "true"))

    def pulling() -> dict[str, Any] | None:
        status = read(core, "init-image")["status"]
        waiting = ((status.get("initContainerStatuses") or [{}])[0].get("state") or {}).get("waiting") or {}
        return status if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    status = wait_for(pulling, 30, "the init container's pull to fail")
    assert status["phase"] == "Pending"
    if KUBECTL.exists():
        shown = kubectl(shared_cluster, "get", "pod", "init-image")
        assert "Init:ErrImagePull" in shown or "Init:ImagePullBackOff" in shown
    core.delete_namespaced_pod("init-image", "default", grace_period_seconds=0)

"""The process kubelet enforces the security context on the real control plane, read back with the real kubectl: a
hardened pod runs as its user with only its volumes writable, writing elsewhere fails as on a cluster (and runs
with the override), and runAsNonRoot refuses a root image with the kubelet's CreateContainerConfigError."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import TestCluster
from tests.cluster.fixtures import start_cluster
from tests.k8s.kubelet_pods import KUBECTL, Kubectl, kubectl_of
from tests.waiting import eventually

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not KUBECTL.exists(), reason="run scripts/install-tools.sh for .tools/bin/kubectl")]

# The operator's worker context (flywheel/operator/manifests.py).
HARDENED_POD = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"}}
HARDENED_CONTAINER = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}
ROOT_OVERRIDE = {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0, "readOnlyRootFilesystem": False}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestCluster, Path]]:
    """A cluster whose pods run in a scratch working directory (not the checkout), and that directory's parent."""
    tmp = tmp_path_factory.mktemp("secured")
    workdir = tmp / "work"
    workdir.mkdir()
    running = start_cluster(tmp / "cluster", nodes=1, heartbeat_seconds=0.5, pod_workdir=workdir)
    try:
        yield running, tmp
    finally:
        running.stop()


@pytest.fixture(scope="module")
def kubectl(secured: tuple[TestCluster, Path]) -> Kubectl:
    return kubectl_of(secured[0])


def worker_pod(name: str, code: str, volume_dir: Path, container_context: dict[str, Any] | None = None,
               image: str = "python:3.11", pod_context: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod shaped like the operator's workers: /tmp, /dev/shm and a checkpoint dir, under the hardened context
    unless told otherwise."""
    container = {"name": "worker", "image": image, "command": ["python", "-c", code],
                 "securityContext": HARDENED_CONTAINER if container_context is None else container_context,
                 "terminationMessagePath": "/dev/termination-log",
                 "env": [{"name": "MESSAGE_FILE", "value": "/dev/termination-log"}],
                 "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"},
                                  {"name": "checkpoints", "mountPath": str(volume_dir)}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [container],
                     "securityContext": HARDENED_POD if pod_context is None else pod_context,
                     "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "tmp", "emptyDir": {}},
                                 {"name": "checkpoints", "emptyDir": {}}]}}


def apply(kubectl: Kubectl, manifest: dict[str, Any]) -> None:
    result = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert result.returncode == 0, result.stderr  # the real API server admitted it


def finished(kubectl: Kubectl, name: str, timeout: float = 30.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = json.loads(kubectl("get", "pod", name, "-o", "json").stdout)
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None
    return eventually(done, timeout, f"pod {name} to finish", interval=0.2)


WRITES_VOLUMES = """
import os
open("/tmp/fw-probe-" + os.environ["HOSTNAME"], "w").write("x")
open("/dev/shm/fw-probe-" + os.environ["HOSTNAME"], "w").write("x")
open(os.environ["VOLUME"] + "/step-1", "w").write("x")
open(os.environ["MESSAGE_FILE"], "w").write(f"uid={os.getuid()} gid={os.getgid()} groups={sorted(os.getgroups())}")
"""


def test_the_hardened_pod_runs_as_its_user_and_writes_its_volumes(secured: tuple[TestCluster, Path],
                                                                   kubectl: Kubectl) -> None:
    volume = secured[1] / "ckpt" / "job"
    manifest = worker_pod("writes-volumes", WRITES_VOLUMES, volume)
    manifest["spec"]["containers"][0]["env"].append({"name": "VOLUME", "value": str(volume)})
    apply(kubectl, manifest)
    pod = finished(kubectl, "writes-volumes")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert pod["status"]["phase"] == "Succeeded", kubectl("logs", "writes-volumes").stdout
    assert terminated["message"] == "uid=10001 gid=10001 groups=[10001]"
    assert (volume / "step-1").stat().st_uid == 10001


WRITES_WORKDIR = "open('outside.txt', 'w').write('x')"  # the working directory is on the root filesystem


@pytest.mark.parametrize("context", [HARDENED_CONTAINER, {**HARDENED_CONTAINER, "runAsUser": 0, "runAsNonRoot": False}],
                         ids=["non-root", "root"])
def test_writing_outside_the_volumes_fails_on_the_read_only_root(secured: tuple[TestCluster, Path],
                                                                 kubectl: Kubectl, context: dict[str, Any]) -> None:
    name = f"writes-root-{'root' if context.get('runAsUser') == 0 else 'user'}"
    apply(kubectl, worker_pod(name, WRITES_WORKDIR, secured[1] / "v", context))
    pod = finished(kubectl, name)
    assert pod["status"]["phase"] == "Failed"
    assert "OSError: [Errno 30] Read-only file system: 'outside.txt'" in kubectl("logs", name).stdout
    assert not (secured[1] / "work" / "outside.txt").exists()


def test_the_documented_override_lets_a_root_image_write(secured: tuple[TestCluster, Path],
                                                         kubectl: Kubectl) -> None:
    override = {**HARDENED_CONTAINER, **ROOT_OVERRIDE}
    apply(kubectl, worker_pod("root-override", WRITES_WORKDIR + "; import os; print('uid', os.getuid())",
                              secured[1] / "v", override))
    assert finished(kubectl, "root-override")["status"]["phase"] == "Succeeded", kubectl("logs", "root-override")
    assert "uid 0" in kubectl("logs", "root-override").stdout
    assert (secured[1] / "work" / "outside.txt").exists()
    (secured[1] / "work" / "outside.txt").unlink()


def test_a_read_only_volume_mount_cannot_be_written(secured: tuple[TestCluster, Path], kubectl: Kubectl) -> None:
    manifest = worker_pod("read-only-mount", f"open({str(secured[1] / 'v')!r} + '/x', 'w')", secured[1] / "v")
    manifest["spec"]["containers"][0]["volumeMounts"][2]["readOnly"] = True
    apply(kubectl, manifest)
    assert finished(kubectl, "read-only-mount")["status"]["phase"] == "Failed"
    assert "Read-only file system" in kubectl("logs", "read-only-mount").stdout


def test_run_as_non_root_refuses_a_root_image(secured: tuple[TestCluster, Path], kubectl: Kubectl) -> None:
    apply(kubectl, worker_pod("root-image", "print('never')", secured[1] / "v",
                              pod_context={"runAsNonRoot": True, "fsGroup": 10001}))

    def waiting() -> dict[str, Any] | None:
        statuses = json.loads(kubectl("get", "pod", "root-image", "-o", "json").stdout)["status"].get(
            "containerStatuses") or []
        return statuses[0]["state"].get("waiting") if statuses else None
    state = eventually(waiting, 20, "the container to wait", interval=0.2)
    assert state["reason"] == "CreateContainerConfigError"
    assert state["message"].startswith('container has runAsNonRoot and image will run as root (pod: "root-image_'
                                       'default(')
    assert "CreateContainerConfigError" in kubectl("get", "pod", "root-image").stdout
    events = json.loads(kubectl("get", "events", "--field-selector", "involvedObject.name=root-image",
                                "-o", "json").stdout)["items"]
    assert any(e["reason"] == "Failed" and e["type"] == "Warning" and
               e["message"].startswith("Error: container has runAsNonRoot and image will run as root") for e in events)
    kubectl("delete", "pod", "root-image", "--wait=false")


def test_the_project_image_runs_as_its_own_user_under_run_as_non_root(secured: tuple[TestCluster, Path],
                                                                      kubectl: Kubectl) -> None:
    code = "import getpass, os; print('uid', os.getuid(), getpass.getuser(), 'home', os.environ['HOME'])"
    apply(kubectl, worker_pod("project-image", code, secured[1] / "v", container_context={},
                              image="ghcr.io/acme/flywheel:1.0", pod_context={"runAsNonRoot": True}))
    assert finished(kubectl, "project-image")["status"]["phase"] == "Succeeded"
    assert "uid 10001 flywheel home /home/flywheel" in kubectl("logs", "project-image").stdout


def test_a_user_the_image_does_not_know_has_no_name_and_home_slash(secured: tuple[TestCluster, Path],
                                                                   kubectl: Kubectl) -> None:
    code = "import os, pwd; print('home', os.environ['HOME']); pwd.getpwuid(os.getuid())"
    apply(kubectl, worker_pod("unknown-user", code, secured[1] / "v"))
    assert finished(kubectl, "unknown-user")["status"]["phase"] == "Failed"
    logs = kubectl("logs", "unknown-user").stdout
    assert "home /" in logs and "KeyError: 'getpwuid(): uid not found: 10001'" in logs

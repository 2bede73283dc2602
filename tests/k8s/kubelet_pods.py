"""Helpers for the process kubelet's tests on the real control plane: a client of the cluster, waits on a pod's
phase or removal, its events, and the real kubectl."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.cluster.cluster import TestCluster

REPO = Path(__file__).resolve().parents[2]
KUBECTL = REPO / ".tools" / "bin" / "kubectl"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def core_api(cluster: TestCluster) -> Iterator[client.CoreV1Api]:
    """A CoreV1Api of the cluster's admin (through the fault proxy, as the tests' clients go)."""
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client.CoreV1Api(api_client)
    api_client.close()


def kubectl_of(cluster: TestCluster) -> Kubectl:
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, timeout=60, check=False)
    return run


def read(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    """The pod as the API serves it (camelCase keys), for checks of fields the typed model may not know."""
    raw = core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, "default"))
    return raw  # type: ignore[no-any-return]


def phase_is(core: client.CoreV1Api, name: str, *phases: str) -> Callable[[], client.V1Pod | None]:
    def check() -> client.V1Pod | None:
        current = core.read_namespaced_pod(name, "default")
        return current if current.status.phase in phases else None
    return check


def gone(core: client.CoreV1Api, name: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            core.read_namespaced_pod(name, "default")
        except ApiException as err:
            return err.status == 404
        return False
    return check


def events(core: client.CoreV1Api, name: str, reason: str) -> list[str]:
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return [e.message for e in found if e.reason == reason]

"""Shared pieces for the test cluster's own tests: a small TrainingJob-like CRD and client helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s_emulator.fixtures import RunningCluster, cluster, start_cluster  # noqa: F401  (fixture re-export)

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
GROUP, VERSION, PLURAL, KIND = "test.flywheel.dev", "v1", "minijobs", "MiniJob"

MINIJOB_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "minijob", "kind": KIND, "shortNames": ["mj"]},
        "versions": [{
            "name": VERSION, "served": True, "storage": True,
            "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                     "statusReplicasPath": ".status.ready"}},
            "additionalPrinterColumns": [
                {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            ],
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["maxReplicas"],
                        "x-kubernetes-validations": [
                            {"rule": "self.replicas <= self.maxReplicas",
                             "message": "replicas must not exceed maxReplicas"}],
                        "properties": {
                            "replicas": {"type": "integer", "minimum": 1, "default": 1},
                            "maxReplicas": {"type": "integer", "minimum": 1},
                            "image": {"type": "string", "default": "python:3.11"},
                            "mode": {"type": "string", "enum": ["fast", "exact"]},
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                    },
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            }},
        }],
    },
}


def minijob(name: str, replicas: int = 1, max_replicas: int = 4, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name},
            "spec": {"replicas": replicas, "maxReplicas": max_replicas, **spec}}


def _module_cluster(factory: pytest.TempPathFactory, nodes: int, heartbeat: float) -> Iterator[RunningCluster]:
    running = start_cluster(factory.mktemp("cluster"), nodes=nodes, heartbeat_seconds=heartbeat)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    """One cluster for a module of API-only tests (each test uses its own object names)."""
    yield from _module_cluster(tmp_path_factory, 1, 1.0)


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    """A module's cluster of two nodes, for tests that move pods between nodes (a drain)."""
    yield from _module_cluster(tmp_path_factory, 2, 0.5)

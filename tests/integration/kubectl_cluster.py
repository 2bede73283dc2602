"""A one-node test cluster (the real control plane) driven by the real kubectl, with manifests applied first: the
module fixture of the integration tests that check what the API server accepts (the CRD's schema and CEL, the
schedulers' PodGroups)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.chart.conftest import find_tool
from tests.cluster.fixtures import start_cluster

KUBECTL = find_tool("kubectl")
Run = Callable[..., subprocess.CompletedProcess[str]]


@contextmanager
def kubectl_on_test_cluster(*manifests: Path) -> Iterator[Run]:
    """`run(*kubectl args, stdin=None)` against a fresh test cluster that has `manifests` applied (client-side), its
    CRDs Established (their resources are served a moment after the create)."""
    if KUBECTL is None:
        pytest.skip("kubectl not found (make tools)")
    with start_cluster(nodes=1, heartbeat_seconds=1.0) as cluster:
        def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args], input=stdin,
                                  capture_output=True, text=True, timeout=30)
        for manifest in manifests:
            applied = run("apply", "-f", str(manifest))
            assert applied.returncode == 0, applied.stderr
        for manifest in manifests:
            for doc in yaml.safe_load_all(manifest.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    cluster.wait_established(doc["metadata"]["name"])
        yield run

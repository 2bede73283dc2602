"""Fixtures for the chart tests: the real `helm` binary (PATH, else .tools/bin from scripts/install-tools.sh) and a
cached `helm template` of charts/flywheel."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "flywheel"
KUBE_VERSION = "1.33.0"
RELEASE, NAMESPACE = "fw", "flywheel"


def find_tool(name: str) -> str | None:
    local = ROOT / ".tools" / "bin" / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


HELM = find_tool("helm")


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if HELM is None:
        pytest.skip("helm not found (make tools installs it into .tools/bin)")
    return subprocess.run([HELM, *args], capture_output=True, text=True, check=check, timeout=60,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/flywheel-helm-cache"})


@functools.lru_cache(maxsize=None)
def _render(sets: tuple[str, ...], api_versions: tuple[str, ...], namespace: str) -> tuple[Any, ...]:
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for value in sets:
        args += ["--set", value]
    for api in api_versions:
        args += ["--api-versions", api]
    out = run_helm(*args).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def render(*sets: str, api_versions: tuple[str, ...] = (), namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The chart's objects (not the crds/ directory) for these `--set` values."""
    return list(_render(tuple(sets), tuple(api_versions), namespace))


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]

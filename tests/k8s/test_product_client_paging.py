"""The product's own client (`flywheel.kube.client.Kube`, which the operator's reads and the REST API use) lists in
pages from the real API server, and takes the list again in one piece when a continued page is refused 410 Expired.

kube-apiserver 1.37 serves continued pages from its watch cache's snapshots, so compacting etcd between two pages
no longer expires them (measured here: the third page came); an expired snapshot (one older than the cache keeps)
still gets 410, which the fault proxy stands in for on the continued page."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flywheel.kube import client as kube_client
from flywheel.kube.auth import from_kubeconfig
from tests.cluster.cluster import TestCluster

NAMES = [f"page-{i:02d}" for i in range(7)]
NAMESPACE = "paging"
PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"

pytestmark = pytest.mark.slow


def _fill(cluster: TestCluster) -> None:
    plane = cluster.control_plane
    plane.request("/api/v1/namespaces", "POST", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NAMESPACE}})
    for name in NAMES:
        plane.request(PATH, "POST", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})


def _pages(items: list[dict[str, Any]]) -> list[str]:
    """Ours (the root CA publisher puts kube-root-ca.crt in every namespace)."""
    return [i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith("page-")]


def test_product_client_pages_and_lists_again_after_410(cluster: TestCluster,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _fill(cluster)
    monkeypatch.setattr(kube_client, "LIST_PAGE", 3)
    sent: list[dict[str, str]] = []
    request: Any = None

    async def compacting(method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                         content_type: str = "application/json") -> Any:
        sent.append(dict(params or {}))
        if len(sent) == 2:  # the continued page: its snapshot expired
            cluster.api.fail_next(f"^GET {PATH}$", 410)
        return await request(method, path, body, params, content_type)

    async def run() -> tuple[list[dict[str, Any]], str, list[dict[str, Any]]]:
        nonlocal request
        kube = kube_client.Kube(await from_kubeconfig(cluster.kubeconfig))
        request = kube.request
        try:
            items, version = await kube.list_versioned(PATH)
            kube.request = compacting  # type: ignore[method-assign]
            again = await kube.list(PATH)
            return items, version, again
        finally:
            await kube.close()

    items, version, again = asyncio.run(run())
    assert _pages(items) == NAMES and int(version) > 0
    assert _pages(again) == NAMES
    # First page, the continued page (refused: 410), then the whole list in one piece.
    assert [("limit" in p, "continue" in p) for p in sent] == [(True, False), (True, True), (False, False)], sent

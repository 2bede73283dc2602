"""LIST in pages (`limit`/`continue`) and at a resourceVersion, as kube-apiserver serves them from etcd: one
consistent snapshot across pages, `remainingItemCount`, 410 Expired once the snapshot is compacted (with the
inconsistent token), ListOptions validation; and the clients that page: kubectl's chunks, the official client, and
the product's own (`flywheel.kube.client.Kube`), which takes the list again in one piece after a 410."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from flywheel.kube import client as kube_client
from flywheel.kube.auth import from_kubeconfig
from tests.emulator_fidelity.conftest import KUBECTL
from tests.k8s_emulator.fixtures import RunningCluster

NAMES = [f"page-{i:02d}" for i in range(7)]
PATH = "/api/v1/namespaces/paging/configmaps"


@pytest.fixture(scope="module")
def paged(shared_cluster: RunningCluster) -> Iterator[RunningCluster]:
    """Namespace `paging` with configmaps page-00..06 (page-01, -03, -05 labelled odd=yes)."""
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(shared_cluster.kubeconfig)))
    core.create_namespace({"metadata": {"name": "paging"}})
    for i, name in enumerate(NAMES):
        labels = {"odd": "yes"} if i % 2 else {}
        core.create_namespaced_config_map("paging", {"metadata": {"name": name, "labels": labels}})
    yield shared_cluster
    core.api_client.close()


def get(cluster: RunningCluster, path: str, **params: Any) -> tuple[int, dict[str, Any]]:
    url = f"{cluster.api_url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def names(listed: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in listed["items"]]


def test_pages_are_one_snapshot(paged: RunningCluster) -> None:
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(paged.kubeconfig)))
    status, first = get(paged, PATH, limit=3)
    assert status == 200 and names(first) == NAMES[:3]
    assert first["metadata"]["remainingItemCount"] == 4 and first["metadata"]["continue"]
    # Changes after the first page: the later pages still show the list as it was then.
    core.delete_namespaced_config_map("page-04", "paging")
    core.create_namespaced_config_map("paging", {"metadata": {"name": "page-03a"}})
    core.patch_namespaced_config_map("page-05", "paging", {"data": {"changed": "yes"}})
    status, second = get(paged, PATH, limit=3, **{"continue": first["metadata"]["continue"]})
    assert status == 200 and names(second) == NAMES[3:6]
    assert "data" not in second["items"][2]  # page-05 as it was
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert second["metadata"]["remainingItemCount"] == 1
    status, last = get(paged, PATH, limit=3, **{"continue": second["metadata"]["continue"]})
    assert status == 200 and names(last) == NAMES[6:]
    assert "continue" not in last["metadata"] and "remainingItemCount" not in last["metadata"]
    # A new list sees the changes; a limit above the count gives no token.
    status, now = get(paged, PATH, limit=100)
    assert names(now) == ["page-00", "page-01", "page-02", "page-03", "page-03a", "page-05", "page-06"]
    assert "continue" not in now["metadata"]
    core.create_namespaced_config_map("paging", {"metadata": {"name": "page-04"}})
    core.delete_namespaced_config_map("page-03a", "paging")
    core.api_client.close()


def test_selected_pages_count_matches_only(paged: RunningCluster) -> None:
    status, first = get(paged, PATH, limit=2, labelSelector="odd=yes")
    assert status == 200 and names(first) == ["page-01", "page-03"]
    assert "remainingItemCount" not in first["metadata"]  # unknown under a selector, as on a real server
    status, rest = get(paged, PATH, limit=2, labelSelector="odd=yes", **{"continue": first["metadata"]["continue"]})
    assert names(rest) == ["page-05"] and "continue" not in rest["metadata"]


def test_list_options_are_validated(paged: RunningCluster) -> None:
    _, first = get(paged, PATH, limit=2)
    token = first["metadata"]["continue"]
    status, body = get(paged, PATH, limit=2, resourceVersion=first["metadata"]["resourceVersion"],
                       **{"continue": token})
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"] == "specifying resource version is not allowed when using continue"
    status, body = get(paged, PATH, limit=2, **{"continue": "not-a-token"})
    assert status == 400 and "invalid continue token" in body["message"]
    status, body = get(paged, PATH, resourceVersionMatch="Exact")
    assert (status, body["reason"]) == (422, "Invalid")
    assert "resourceVersionMatch is forbidden unless resourceVersion is provided" in body["message"]
    status, body = get(paged, PATH, resourceVersion="0", resourceVersionMatch="Exact")
    assert status == 422 and 'forbidden for resourceVersion "0"' in body["message"]


def test_exact_resource_version_reads_the_past(paged: RunningCluster) -> None:
    _, before = get(paged, PATH)
    version = before["metadata"]["resourceVersion"]
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(paged.kubeconfig)))
    core.create_namespaced_config_map("paging", {"metadata": {"name": "page-99"}})
    status, exact = get(paged, PATH, resourceVersion=version, resourceVersionMatch="Exact")
    assert status == 200 and names(exact) == names(before) and exact["metadata"]["resourceVersion"] == version
    _, newest = get(paged, PATH, resourceVersion=version, resourceVersionMatch="NotOlderThan")
    assert "page-99" in names(newest)
    _, paged_exact = get(paged, PATH, resourceVersion=version, limit=100)  # a limit makes a version exact
    assert names(paged_exact) == names(before)
    status, body = get(paged, PATH, resourceVersion=str(int(newest["metadata"]["resourceVersion"]) + 100),
                       resourceVersionMatch="Exact")
    assert status == 504 and "Too large resource version" in body["message"]
    core.delete_namespaced_config_map("page-99", "paging")
    core.api_client.close()


def test_compacted_snapshot_expires_with_an_inconsistent_token(paged: RunningCluster) -> None:
    _, first = get(paged, PATH, limit=2)
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(paged.kubeconfig)))
    core.create_namespaced_config_map("paging", {"metadata": {"name": "page-02a"}})
    paged.api.compact()
    status, body = get(paged, PATH, limit=2, **{"continue": first["metadata"]["continue"]})
    assert (status, body["reason"], body["code"]) == (410, "Expired", 410)
    assert body["message"].startswith("The provided continue parameter is too old to display a consistent list")
    status, rest = get(paged, PATH, limit=2, **{"continue": body["metadata"]["continue"]})
    assert status == 200 and names(rest) == ["page-02", "page-02a"]  # from the same key, as the list is now
    assert int(rest["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    status, gone = get(paged, PATH, resourceVersion=first["metadata"]["resourceVersion"],
                       resourceVersionMatch="Exact")
    assert (status, gone["reason"]) == (410, "Expired")
    core.delete_namespaced_config_map("page-02a", "paging")
    core.api_client.close()


def test_clients_follow_the_pages(paged: RunningCluster, tmp_path: Any) -> None:
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(paged.kubeconfig)))
    first = core.list_namespaced_config_map("paging", limit=4)
    rest = core.list_namespaced_config_map("paging", limit=4, _continue=first.metadata._continue)
    assert [c.metadata.name for c in first.items + rest.items] == NAMES
    assert first.metadata.remaining_item_count == 3
    core.api_client.close()
    if KUBECTL.exists():  # kubectl asks for Tables in chunks and prints them as one
        shown = subprocess.run([str(KUBECTL), "--kubeconfig", str(paged.kubeconfig), "--cache-dir", str(tmp_path),
                                "get", "configmaps", "-n", "paging", "--chunk-size=2", "-o", "name"],
                               capture_output=True, text=True, timeout=60, check=True).stdout.split()
        assert shown == [f"configmap/{n}" for n in NAMES]


def test_product_client_pages_and_lists_again_after_410(paged: RunningCluster,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_client, "LIST_PAGE", 3)
    sent: list[dict[str, str]] = []
    request: Any = None
    async def compacting(method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                         content_type: str = "application/json") -> Any:
        sent.append(dict(params or {}))
        if len(sent) == 2:  # between the first and second pages: a write, then etcd compacts
            await request("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "compacted"}})
            paged.api.compact()
        return await request(method, path, body, params, content_type)

    async def run() -> tuple[list[dict[str, Any]], str, list[dict[str, Any]]]:
        nonlocal request
        kube = kube_client.Kube(await from_kubeconfig(paged.kubeconfig))
        request = kube.request
        try:
            items, version = await kube.list_versioned(PATH)
            kube.request = compacting  # type: ignore[method-assign]
            again = await kube.list(PATH)
            return items, version, again
        finally:
            await kube.close()

    items, version, again = asyncio.run(run())
    assert [i["metadata"]["name"] for i in items] == NAMES and int(version) > 0
    assert [i["metadata"]["name"] for i in again] == NAMES
    assert [("limit" in p, "continue" in p) for p in sent] == [(True, False), (True, True), (False, False)]

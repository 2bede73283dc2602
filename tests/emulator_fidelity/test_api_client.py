"""The official python `kubernetes` client against the emulator: conflicts, watches, GC, status isolation."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.emulator_fidelity.conftest import GROUP, MINIJOB_CRD, PLURAL, VERSION, minijob
from tests.k8s_emulator.fixtures import RunningCluster, start_cluster


@pytest.fixture(scope="module")
def api(shared_cluster: RunningCluster) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(shared_cluster.kubeconfig))
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(MINIJOB_CRD)
    yield api_client
    api_client.close()


def _custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def _create_job(api: client.ApiClient, name: str, **spec: Any) -> dict[str, Any]:
    return _custom(api).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, minijob(name, **spec))


def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_create_fills_metadata_and_conflicts(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "cm-meta"}, "data": {"a": "1"}})
    meta = created.metadata
    assert meta.uid and meta.creation_timestamp and meta.namespace == "default" and int(meta.resource_version) > 0
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_config_map("default", {"metadata": {"name": "cm-meta"}})
    assert exists.value.status == 409 and "AlreadyExists" in exists.value.body
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("nope", "default")
    assert missing.value.status == 404
    with pytest.raises(ApiException) as no_namespace:
        core.create_namespaced_config_map("no-such-ns", {"metadata": {"name": "x"}})
    assert no_namespace.value.status == 404


def test_stale_resource_version_is_a_409_conflict(api: client.ApiClient) -> None:
    custom = _custom(api)
    first = _create_job(api, "conflict")
    fresh = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "conflict")
    fresh["spec"]["replicas"] = 2
    updated = custom.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "conflict", fresh)
    assert int(updated["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert updated["metadata"]["generation"] == 2
    first["spec"]["replicas"] = 3  # still carries the old resourceVersion
    with pytest.raises(ApiException) as stale:
        custom.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "conflict", first)
    assert stale.value.status == 409 and "the object has been modified" in stale.value.body


def test_forced_conflict_hook_fails_the_next_write_only(api: client.ApiClient, shared_cluster: RunningCluster) -> None:
    _create_job(api, "forced")
    shared_cluster.api.force_conflict(PLURAL, "default", "forced", group=GROUP)
    patch = {"spec": {"replicas": 2}}
    with pytest.raises(ApiException) as forced:
        _custom(api).patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "forced", patch)
    assert forced.value.status == 409
    assert _custom(api).patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "forced",
                                                       patch)["spec"]["replicas"] == 2


def test_status_subresource_is_isolated(api: client.ApiClient) -> None:
    custom = _custom(api)
    _create_job(api, "status-iso")
    custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "status-iso",
                                          {"spec": {"replicas": 2}, "status": {"phase": "Ignored"}})
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "status-iso")
    assert obj["spec"]["replicas"] == 2 and "status" not in obj
    generation = obj["metadata"]["generation"]
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "status-iso",
                                                 {"spec": {"replicas": 3}, "status": {"phase": "Running"}})
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "status-iso")
    assert obj["status"] == {"phase": "Running"} and obj["spec"]["replicas"] == 2
    assert obj["metadata"]["generation"] == generation  # status writes never bump generation


def test_watch_with_label_selector_sees_added_modified_deleted(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    start_rv = core.list_namespaced_config_map("default").metadata.resource_version
    seen: list[tuple[str, str]] = []

    def collect() -> None:
        for event in watch.Watch().stream(core.list_namespaced_config_map, "default", label_selector="app in (w1)",
                                          resource_version=start_rv, timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                return

    watcher = threading.Thread(target=collect)
    watcher.start()
    core.create_namespaced_config_map("default", {"metadata": {"name": "w-other", "labels": {"app": "w2"}}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "w-mine", "labels": {"app": "w1"}}})
    core.patch_namespaced_config_map("w-mine", "default", {"data": {"k": "v"}})
    core.delete_namespaced_config_map("w-mine", "default")
    watcher.join(10)
    assert seen == [("ADDED", "w-mine"), ("MODIFIED", "w-mine"), ("DELETED", "w-mine")]


def test_field_selectors(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", {"metadata": {"name": "fs-a"}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "fs-b"}})
    names = [c.metadata.name for c in core.list_namespaced_config_map(
        "default", field_selector="metadata.name!=fs-a,metadata.namespace=default").items]
    assert "fs-b" in names and "fs-a" not in names


def test_watch_from_a_compacted_resource_version_is_410_gone(tmp_path: Path) -> None:
    with start_cluster(tmp_path, nodes=1, history_size=5) as small:
        small_api = config.new_client_from_config(config_file=str(small.kubeconfig))
        core = client.CoreV1Api(small_api)
        first_rv = core.create_namespaced_config_map("default", {"metadata": {"name": "gone-0"}}).metadata
        for i in range(1, 8):  # pushes the first write out of the 5-event history
            core.create_namespaced_config_map("default", {"metadata": {"name": f"gone-{i}"}})
        with pytest.raises(ApiException) as gone:
            for _ in watch.Watch().stream(core.list_namespaced_config_map, "default",
                                          resource_version=first_rv.resource_version, timeout_seconds=2):
                pass
        assert gone.value.status == 410
        small_api.close()


def test_dropped_watches_end_streams_and_resume_by_resource_version(api: client.ApiClient,
                                                                    shared_cluster: RunningCluster) -> None:
    core = client.CoreV1Api(api)
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    ended = threading.Event()

    def hold() -> None:
        for _ in watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=rv,
                                      timeout_seconds=30, label_selector="never=matches"):
            pass
        ended.set()

    # The cluster's own loops watch too: wait for one more watcher than before, then drop. A watch counted before
    # may end meanwhile, so the drop can still come before this stream is registered (CI saw it run out its 30 s
    # server timeout): drop again each second until it ends.
    before = shared_cluster.api.watch_count
    threading.Thread(target=hold, daemon=True).start()
    registered = time.monotonic() + 10
    while shared_cluster.api.watch_count <= before and time.monotonic() < registered:
        time.sleep(0.05)
    core.create_namespaced_config_map("default", {"metadata": {"name": "after-drop", "labels": {"x": "1"}}})
    assert shared_cluster.api.drop_watches() >= 1

    def ended_after_a_drop() -> bool:
        if ended.wait(1):
            return True
        shared_cluster.api.drop_watches()
        return False
    _eventually(ended_after_a_drop, 25)  # the stream ends within ms of a drop that finds it
    replay = [e["object"].metadata.name for e in watch.Watch().stream(
        core.list_namespaced_config_map, "default", resource_version=rv, label_selector="x=1", timeout_seconds=1)]
    assert replay == ["after-drop"]


def test_owner_reference_garbage_collection(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    owner = _create_job(api, "owner")
    ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MiniJob", "name": "owner", "uid": owner["metadata"]["uid"],
           "controller": True, "blockOwnerDeletion": True}
    core.create_namespaced_config_map("default", {"metadata": {"name": "dependent", "ownerReferences": [ref]}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "orphan-kept", "ownerReferences": [ref]}})
    core.patch_namespaced_config_map("orphan-kept", "default", {"metadata": {"ownerReferences": None}})
    _custom(api).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "owner")

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_config_map("dependent", "default")
        except ApiException as err:
            return err.status == 404
        return False

    _eventually(dependent_gone)
    assert core.read_namespaced_config_map("orphan-kept", "default").metadata.name == "orphan-kept"


def test_finalizer_keeps_object_until_removed(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", {"metadata": {"name": "fin", "finalizers": ["x.dev/keep"]}})
    core.delete_namespaced_config_map("fin", "default")
    held = core.read_namespaced_config_map("fin", "default")
    assert held.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as adding:
        core.patch_namespaced_config_map("fin", "default", {"metadata": {"finalizers": ["x.dev/keep", "x.dev/new"]}})
    assert adding.value.status == 422
    core.patch_namespaced_config_map("fin", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_config_map("fin", "default")
    assert gone.value.status == 404


def test_namespace_deletion_removes_its_contents(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "doomed"}})
    core.create_namespaced_config_map("doomed", {"metadata": {"name": "inside"}})
    core.delete_namespace("doomed")
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_config_map("doomed", {"metadata": {"name": "late"}})
    assert refused.value.status in (403, 404)

    def namespace_gone() -> bool:
        try:
            core.read_namespace("doomed")
        except ApiException as err:
            return err.status == 404
        return False

    _eventually(namespace_gone)
    assert core.list_namespaced_config_map("doomed").items == []


def test_disconnected_watch_is_released(api: client.ApiClient, shared_cluster: RunningCluster) -> None:
    before = shared_cluster.api.watch_count
    url = f"{shared_cluster.api_url}/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=60"
    response = urllib.request.urlopen(url, timeout=10)
    registered = time.monotonic() + 10
    while shared_cluster.api.watch_count <= before and time.monotonic() < registered:
        time.sleep(0.05)
    response.close()
    _eventually(lambda: shared_cluster.api.watch_count == before)


def test_pause_holds_requests_until_resume(api: client.ApiClient, shared_cluster: RunningCluster) -> None:
    core = client.CoreV1Api(api)
    finished = threading.Event()
    shared_cluster.api.pause()
    try:
        threading.Thread(target=lambda: (core.list_namespace(), finished.set()), daemon=True).start()
        assert not finished.wait(0.5)
    finally:
        shared_cluster.api.resume()
    assert finished.wait(5)

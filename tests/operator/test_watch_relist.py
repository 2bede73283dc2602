"""operator/watch_relist.py: a relist after a watch gap reports what it lacks as DELETED, as client-go's Reflector
does; kopf (1.45) keeps such objects in its indices forever. Fed by fake kopf watch streams; the last tests run
kopf's own watcher and indexer on the wrapped stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import watching
from kopf._cogs.structs import bodies, references
from kopf._core.engines import indexing
from kopf._core.reactor import queueing

from flywheel.operator import watch_relist
from flywheel.operator.watch_relist import reconcile_relists

LISTED = watching.Bookmark.LISTED
PODS = references.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
JOBS = references.Resource(group="flywheel.dev", version="v1", plural="trainingjobs", kind="TrainingJob",
                           namespaced=True)


def pod(name: str, rv: str = "1", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv,
                         "labels": {"flywheel.dev/job": "j"}, "annotations": {"big": "x" * 100},
                         "ownerReferences": [{"kind": "TrainingJob", "name": "j", "uid": "job-uid"}],
                         "creationTimestamp": "2024-01-01T00:00:00Z", **meta},
            "spec": {"nodeName": "node-1", "containers": [{"name": "w", "env": [{"name": "SPEC", "value": "..."}]}]},
            "status": {"phase": "Running"}}


def listed(obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": None, "object": obj}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


async def _fake(events: list[Any]) -> AsyncIterator[Any]:
    for e in events:
        yield e


def run(events: list[Any], resource: references.Resource = PODS, whole: bool = False) -> list[Any]:
    async def collect() -> list[Any]:
        return [e async for e in reconcile_relists(_fake(events), resource, None, whole=whole)]
    return asyncio.run(collect())


def synthetic(out: list[Any]) -> list[dict[str, Any]]:
    return [e for e in out if isinstance(e, dict) and e["type"] == "DELETED"]


def test_the_first_listing_and_its_watch_events_pass_unchanged() -> None:
    a, b = pod("a"), pod("b")
    stream = [listed(a), listed(b), LISTED, event("MODIFIED", pod("a", "2")), event("ADDED", pod("c")),
              event("DELETED", pod("b", "3")), {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}]
    assert run(stream) == stream


def test_an_empty_first_listing_drops_nothing() -> None:
    assert run([LISTED, event("ADDED", pod("a"))]) == [LISTED, event("ADDED", pod("a"))]


def test_a_relist_missing_one_object_yields_one_trimmed_deleted_before_listed() -> None:
    a, b, gone = pod("a"), pod("b"), pod("gone", "7", deletionTimestamp="2024-01-02T00:00:00Z")
    out = run([listed(a), listed(gone), LISTED, event("ADDED", b), event("MODIFIED", gone),
               listed(a), listed(b), LISTED, event("MODIFIED", pod("a", "9"))])
    assert out[:5] == [listed(a), listed(gone), LISTED, event("ADDED", b), event("MODIFIED", gone)]
    assert out[5:7] == [listed(a), listed(b)]
    assert out[7] == {"type": "DELETED", "object": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gone", "namespace": "ns", "uid": "uid-gone", "resourceVersion": "7",
                     "labels": {"flywheel.dev/job": "j"}, "deletionTimestamp": "2024-01-02T00:00:00Z",
                     "ownerReferences": [{"kind": "TrainingJob", "name": "j", "uid": "job-uid"}]}}}
    assert out[8:] == [LISTED, event("MODIFIED", pod("a", "9"))]
    assert len(synthetic(out)) == 1


def test_an_object_added_by_a_watch_event_and_gone_at_the_relist_is_dropped_with_a_deletion_time() -> None:
    out = run([LISTED, event("ADDED", pod("new")), LISTED])
    (gone,) = synthetic(out)
    assert gone["object"]["metadata"]["uid"] == "uid-new"
    assert gone["object"]["metadata"]["deletionTimestamp"].endswith("Z")  # kopf stops daemons on a deletion time
    assert out.index(gone) == len(out) - 2 and out[-1] is LISTED


def test_an_empty_relist_drops_everything_known_once() -> None:
    out = run([listed(pod("a")), listed(pod("b")), LISTED, event("ADDED", pod("c")), LISTED, LISTED])
    assert [e["object"]["metadata"]["name"] for e in synthetic(out)] == ["a", "b", "c"]
    assert out[4:7] == synthetic(out)
    assert out[7:] == [LISTED, LISTED]  # the third listing has nothing left to drop


def test_an_object_deleted_by_a_watch_event_is_not_deleted_again() -> None:
    out = run([listed(pod("a")), listed(pod("b")), LISTED, event("DELETED", pod("b", "5")), listed(pod("a")), LISTED])
    assert synthetic(out) == [event("DELETED", pod("b", "5"))]  # kopf's own, not a second one


def test_the_remembered_parts_are_references_and_the_synthetic_body_is_new() -> None:
    a = pod("a")
    kept = watch_relist.remembered(a, whole=False)
    assert kept["metadata"]["labels"] is a["metadata"]["labels"]  # shared with the index entry (caches.slim_pod)
    assert "annotations" not in kept["metadata"] and "spec" not in kept and "status" not in kept
    out = run([listed(a), LISTED, LISTED])
    (gone,) = synthetic(out)
    assert gone["object"]["metadata"] is not a["metadata"]
    assert "deletionTimestamp" not in a["metadata"]  # the remembered body is not written to


def test_whole_groups_keep_the_whole_body_for_a_daemon_on_its_way_out() -> None:
    job = {"apiVersion": "flywheel.dev/v1", "kind": "TrainingJob", "spec": {"replicas": {"min": 2}},
           "metadata": {"name": "j", "namespace": "ns", "uid": "job-uid", "finalizers": ["f"]}}
    (gone,) = synthetic(run([listed(job), LISTED, LISTED], JOBS, whole=True))
    assert gone["object"]["spec"] is job["spec"]
    assert gone["object"]["metadata"]["name"] == "j" and gone["object"]["metadata"]["deletionTimestamp"]
    assert "deletionTimestamp" not in job["metadata"]


def test_a_listing_retried_without_listed_counts_as_one_so_a_live_object_is_never_dropped() -> None:
    # kopf lists again, with no LISTED between, when a listing breaks off half-way: a0 (created meanwhile) and
    # a are both alive; old was in the broken-off half only, so it goes at the next relist.
    out = run([listed(pod("a")), listed(pod("old")), listed(pod("a0")), listed(pod("a")), LISTED,
               listed(pod("a0")), listed(pod("a")), LISTED])
    assert [e["object"]["metadata"]["name"] for e in synthetic(out)] == ["old"]
    assert out.index(synthetic(out)[0]) == len(out) - 2


def test_the_synthetic_body_drops_the_pod_from_a_kopf_index() -> None:
    a = pod("a")
    (gone,) = synthetic(run([listed(a), LISTED, LISTED]))
    indexers = indexing.OperatorIndexers()
    assert indexers.make_key(bodies.Body(gone["object"])) == indexers.make_key(bodies.Body(a))


@pytest.fixture
def fake_kopf_watch(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """kopf's infinite_watch replaced by one yielding these events (tests fill the list before use)."""
    events: list[Any] = []

    async def infinite_watch(**_: Any) -> AsyncIterator[Any]:
        for e in events:
            yield e

    monkeypatch.setattr(watching, "infinite_watch", infinite_watch)  # restored after the test
    return events


def test_install_wraps_once_the_watch_kopfs_watcher_calls(fake_kopf_watch: list[Any]) -> None:
    fake_kopf_watch += [listed(pod("a")), listed(pod("gone")), LISTED, listed(pod("a")), LISTED]
    watch_relist.install()
    wrapped = watching.infinite_watch
    watch_relist.install()
    assert watching.infinite_watch is wrapped
    assert queueing.watching is watching  # kopf's queueing looks the function up on the module at each watch

    seen: list[tuple[Any, str]] = []

    async def processor(*, raw_event: Any, **_: Any) -> None:
        seen.append((raw_event["type"], raw_event["object"]["metadata"]["name"]))

    settings = kopf.OperatorSettings()
    settings.queueing.idle_timeout = 0.01
    asyncio.run(asyncio.wait_for(queueing.watcher(namespace=None, settings=settings, resource=PODS,
                                                  processor=processor), 10))
    assert ("DELETED", "gone") in seen and ("DELETED", "a") not in seen
    assert [s for s in seen if s[1] == "gone"][-1] == ("DELETED", "gone")


def test_without_the_wrapper_kopfs_watcher_never_hears_of_the_gone_object(fake_kopf_watch: list[Any]) -> None:
    """The defect itself: kopf's relist alone brings no deletion (this would fail if kopf learnt to do it)."""
    fake_kopf_watch += [listed(pod("a")), listed(pod("gone")), LISTED, listed(pod("a")), LISTED]
    seen: list[Any] = []

    async def processor(*, raw_event: Any, **_: Any) -> None:
        seen.append(raw_event["type"])

    settings = kopf.OperatorSettings()
    settings.queueing.idle_timeout = 0.01
    asyncio.run(asyncio.wait_for(queueing.watcher(namespace=None, settings=settings, resource=PODS,
                                                  processor=processor), 10))
    assert "DELETED" not in seen

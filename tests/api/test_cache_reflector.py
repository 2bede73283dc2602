"""The API cache's reflector against a scripted client (no cluster): each watch resumes from the last version seen
(bookmarks included), a 410 Gone relists at once and replaces the store, any other failure relists after a pause,
and the cache's three watches take the paths and label selector the API reads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from flywheel.api.cache import KubeCache, Reflector, apply_event

Obj = dict[str, Any]


def pod(name: str, rv: str, namespace: str = "default") -> Obj:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": rv}}


class ScriptedKube:
    """LISTs answer from `lists` in turn; each WATCH plays the next script from `watches` (a list of events, or an
    exception raised after them). Every call is recorded; when a script runs out, `done` is set and watches hang."""

    def __init__(self, lists: list[tuple[list[Obj], str]], watches: list[list[Any]]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[tuple[str, str, str]] = []
        self.done = asyncio.Event()

    async def list_versioned(self, path: str, label_selector: str = "") -> tuple[list[Obj], str]:
        self.calls.append(("list", path, label_selector))
        return self.lists.pop(0)

    async def watch(self, path: str, resource_version: str, label_selector: str = "",
                    timeout_seconds: int = 60) -> AsyncIterator[Obj]:
        self.calls.append(("watch", path, resource_version))
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()
        for step in self.watches.pop(0):
            if isinstance(step, Exception):
                raise step
            yield step


async def run_until_done(kube: ScriptedKube, store: dict[Any, Obj]) -> Reflector:
    reflector = Reflector("pods", kube, "/api/v1/pods", store, threading.Lock(), retry_seconds=0.01)
    task = asyncio.create_task(reflector.run())
    await asyncio.wait_for(kube.done.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return reflector


def test_each_watch_resumes_from_the_last_version_seen() -> None:
    kube = ScriptedKube([([pod("a", "5")], "10")], [
        [{"type": "ADDED", "object": pod("b", "11")}, {"type": "BOOKMARK", "object": {"metadata": {
            "resourceVersion": "15"}}}],  # the server ends the watch (timeoutSeconds): resume from the bookmark
        [{"type": "MODIFIED", "object": pod("a", "16")}, {"type": "DELETED", "object": pod("b", "17")}]])
    store: dict[Any, Obj] = {}
    reflector = asyncio.run(run_until_done(kube, store))
    assert [c for c in kube.calls if c[0] == "watch"] == [
        ("watch", "/api/v1/pods", "10"), ("watch", "/api/v1/pods", "15"), ("watch", "/api/v1/pods", "17")]
    assert store == {("default", "a"): pod("a", "16")} and reflector.relists == 1 and reflector.synced.is_set()


def test_410_gone_relists_at_once_and_replaces_the_store() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version: 10 (20)"}}
    kube = ScriptedKube([([pod("a", "5"), pod("b", "6")], "10"), ([pod("c", "30")], "31")],
                        [[gone], [{"type": "ADDED", "object": pod("d", "32")}]])
    store: dict[Any, Obj] = {}
    reflector = asyncio.run(run_until_done(kube, store))
    assert [c[0] for c in kube.calls] == ["list", "watch", "list", "watch", "watch"]
    assert kube.calls[3] == ("watch", "/api/v1/pods", "31")  # the new list's version, not the expired one
    assert sorted(store) == [("default", "c"), ("default", "d")] and reflector.relists == 2


def test_a_failed_watch_relists_after_a_pause() -> None:
    kube = ScriptedKube([([pod("a", "5")], "10"), ([], "40")], [[ConnectionResetError("reset by peer")]])
    store: dict[Any, Obj] = {}
    asyncio.run(run_until_done(kube, store))
    assert [c[0] for c in kube.calls] == ["list", "watch", "list", "watch"] and store == {}


def test_apply_event_ignores_bookmarks_and_unknown_types() -> None:
    store: dict[Any, Obj] = {}
    apply_event(store, "ADDED", pod("a", "1"))
    apply_event(store, "BOOKMARK", pod("b", "2"))
    apply_event(store, "MODIFIED", pod("a", "3", "ml"))
    assert store == {("default", "a"): pod("a", "1"), ("ml", "a"): pod("a", "3", "ml")}
    apply_event(store, "DELETED", pod("a", "4"))
    assert list(store) == [("ml", "a")]


def test_the_cache_watches_jobs_labelled_pods_and_events_in_its_namespace() -> None:
    async def paths(namespace: str | None) -> list[tuple[str, str, str]]:
        kube = ScriptedKube([([], "1")] * 3, [])
        cache = KubeCache(kube, namespace).start()
        assert await cache.wait_synced(5) and cache.ready()
        await cache.stop()
        return sorted(c for c in kube.calls if c[0] == "list")

    assert asyncio.run(paths("ml")) == [("list", "/api/v1/namespaces/ml/events", ""),
                                        ("list", "/api/v1/namespaces/ml/pods", "flywheel.dev/job"),
                                        ("list", "/apis/flywheel.dev/v1alpha1/namespaces/ml/trainingjobs", "")]
    assert [c[1] for c in asyncio.run(paths(None))] == ["/api/v1/events", "/api/v1/pods",
                                                        "/apis/flywheel.dev/v1alpha1/trainingjobs"]

"""The operator's shared node list: one LIST serves every job's pass within its max age; concurrent passes share
the request in flight; a failed LIST is retried by the next caller."""

from __future__ import annotations

import asyncio

import pytest

from flywheel.operator.node_cache import LostNodes


def node(name: str, ready: str) -> dict:
    return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": ready}]}}


class FakeKube:
    def __init__(self) -> None:
        self.lists = 0
        self.nodes = [node("a", "True"), node("b", "Unknown")]
        self.fail = False

    async def list(self, path: str) -> list[dict]:
        assert path == "/api/v1/nodes"
        self.lists += 1
        await asyncio.sleep(0.01)
        if self.fail:
            raise RuntimeError("apiserver down")
        return self.nodes


def test_concurrent_passes_share_one_list_and_reuse_it_within_max_age():
    async def go() -> None:
        kube = FakeKube()
        cache = LostNodes(kube, max_age=0.2)  # type: ignore[arg-type]
        results = await asyncio.gather(*(cache.get() for _ in range(50)))
        assert kube.lists == 1 and all(r == {"b"} for r in results)
        assert await cache.get() == {"b"} and kube.lists == 1
        kube.nodes = [node("a", "False"), node("b", "True")]
        await asyncio.sleep(0.25)
        assert await cache.get() == {"a"} and kube.lists == 2

    asyncio.run(go())


def test_a_failed_list_reaches_its_callers_and_the_next_call_lists_again():
    async def go() -> None:
        kube = FakeKube()
        kube.fail = True
        cache = LostNodes(kube, max_age=10)  # type: ignore[arg-type]
        with pytest.raises(RuntimeError):
            await cache.get()
        kube.fail = False
        assert await cache.get() == {"b"} and kube.lists == 2

    asyncio.run(go())

"""The event loop the process kubelet runs on, in a thread of the test process, and the tests' synchronous handle
on the kubelet through it."""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from tests.cluster.kubelet import ClusterKubelet
from tests.kubelet.nodes import NodeSetup

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-cluster-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError as err:  # say what the loop was doing: a CI log is all there is of a rare stall
            what = getattr(coro, "__qualname__", coro)
            raise TimeoutError(f"{what} did not finish in {timeout} s; {self.describe()}") from err

    def describe(self) -> str:
        """The loop thread's own stack (a blocking call holds it) and where each of its tasks waits (a racy read
        from this thread: good enough to say what a stuck call waits on)."""
        frame = sys._current_frames().get(self.thread.ident or 0)
        lines = ["the test cluster's loop thread is at:", *traceback.format_stack(frame)[-6:]] if frame else []
        for task in list(asyncio.all_tasks(self.loop)):
            stack = task.get_stack(limit=3)
            where = "; ".join(f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}"
                              for f in stack)
            lines.append(f"task {task.get_name()} ({getattr(task.get_coro(), '__qualname__', '?')}): {where}")
        return "\n".join(lines)

    def call(self, fn: Any, *args: Any) -> Any:
        async def invoke() -> Any:
            return fn(*args)
        return self.run(invoke())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class KubeletHandle:
    """Thread-safe controls of the process kubelet."""

    def __init__(self, kubelet: ClusterKubelet, loop: LoopThread) -> None:
        self._kubelet, self._loop = kubelet, loop

    @property
    def node_names(self) -> list[str]:
        return list(self._kubelet.node_names)

    def lose_node(self, node: str) -> None:
        self._loop.run(self._kubelet.lose_node(node))

    def restore_node(self, node: str) -> None:
        self._loop.run(self._kubelet.restore_node(node))

    def pid_of(self, namespace: str, name: str) -> int | None:
        return self._loop.call(self._kubelet.pid_of, namespace, name)

    def set_resources(self, node: str, resources: dict[str, str]) -> None:
        """Extended resources of a node, e.g. `{"nvidia.com/gpu": "8"}` (capacity and allocatable)."""
        self._loop.run(self._kubelet.set_resources(node, resources))

    def oom_kill(self, namespace: str, name: str) -> bool:
        return self._loop.run(self._kubelet.oom_kill(namespace, name))

    def add_node(self, node: str, setup: NodeSetup | None = None) -> None:
        """Register one more node (a node pool growing) and run its pods."""
        self._loop.run(self._kubelet.add_node(node, setup))

"""In-process test cluster for pytest: `start_cluster()` runs an `EmulatedCluster` on a background event loop
thread and returns a `RunningCluster` with synchronous handles; `cluster` is a ready-made pytest fixture."""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.k8s_emulator.kubelet import ProcessKubelet
from tests.k8s_emulator.runtime import EmulatedCluster, write_kubeconfig

T = TypeVar("T")


class _LoopThread:
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

    def __init__(self, kubelet: ProcessKubelet, loop: _LoopThread) -> None:
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


class ApiHandle:
    """Thread-safe fault hooks of the API emulator."""

    def __init__(self, cluster: EmulatedCluster, loop: _LoopThread) -> None:
        self._cluster, self._loop = cluster, loop

    def drop_watches(self) -> int:
        return self._loop.call(self._cluster.store.drop_watches)

    def compact(self) -> int:
        """etcd's compaction: continue tokens and watches from before now get 410 Expired."""
        return self._loop.call(self._cluster.store.compact)

    def force_conflict(self, resource: str, namespace: str, name: str, group: str = "", count: int = 1) -> None:
        self._loop.call(self._cluster.store.force_conflict, (group, resource), namespace, name, count)

    def pause(self) -> None:
        self._loop.call(self._cluster.server.pause)

    def pause_disruption_controller(self, paused: bool = True) -> None:
        """Hold (or, with False, release) the PodDisruptionBudget status writes, as a controller manager that is
        down would: a test then sees what an eviction wrote before the controller's next pass."""
        self._loop.call(setattr, self._cluster.disruption_controller, "paused", paused)

    def accept_tokens(self, *tokens: str) -> None:
        """Check bearer tokens from now on: only these (and the cluster's own minted ones) pass, others get 401."""
        self._loop.call(setattr, self._cluster.server, "accepted_tokens", frozenset(tokens))

    def accept_any_token(self) -> None:
        self._loop.call(setattr, self._cluster.server, "accepted_tokens", None)

    def resume(self) -> None:
        self._loop.call(self._cluster.server.resume)

    @property
    def watch_count(self) -> int:
        return len(self._cluster.store.watchers)

    @property
    def resource_version(self) -> int:
        return self._cluster.store.rv


class RunningCluster:
    def __init__(self, cluster: EmulatedCluster, loop: _LoopThread, kubeconfig: Path) -> None:
        self._cluster, self._loop = cluster, loop
        self.kubeconfig = kubeconfig
        self.api_url = cluster.api_url
        self.work_dir = cluster.work_dir
        self.log_dir = cluster.log_dir
        self.etcd_url = cluster.etcd_url
        self.api = ApiHandle(cluster, loop)
        self.kubelet = KubeletHandle(cluster.kubelet, loop) if cluster.kubelet is not None else None
        self._stopped = False

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self._loop.run(self._cluster.stop())
        finally:
            self._loop.close()

    def __enter__(self) -> RunningCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster(work_dir: Path | None = None, nodes: int = 2, etcd: bool = False,
                  node_monitor_grace_seconds: float = 40.0, heartbeat_seconds: float = 2.0,
                  **options: Any) -> RunningCluster:
    """Start a whole test cluster in this process; call `.stop()` (or use it as a context manager)."""
    loop = _LoopThread()
    cluster = EmulatedCluster(work_dir, nodes=nodes, etcd=etcd, node_monitor_grace_seconds=node_monitor_grace_seconds,
                              heartbeat_seconds=heartbeat_seconds, **options)
    try:
        loop.run(cluster.start())
    except BaseException:
        loop.run(cluster.stop())
        loop.close()
        raise
    kubeconfig = cluster.work_dir / "kubeconfig"
    write_kubeconfig(kubeconfig, cluster.api_url)
    return RunningCluster(cluster, loop, kubeconfig)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RunningCluster]:
    running = start_cluster(tmp_path / "cluster", nodes=2, node_monitor_grace_seconds=3.0, heartbeat_seconds=0.5)
    try:
        yield running
    finally:
        running.stop()

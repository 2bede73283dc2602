"""Assembles a test cluster inside one asyncio loop: store + control plane + API server on a loopback port,
the process kubelet, and optionally a real etcd. Also writes the kubeconfig that kubectl and clients use."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.etcd_process import ETCD_BINARY, EtcdServer, free_port
from tests.k8s_emulator.apiserver import ApiServer
from tests.k8s_emulator.controllers import ControlPlane
from tests.k8s_emulator.deployments import DeploymentController
from tests.k8s_emulator.disruption import DisruptionController
from tests.k8s_emulator.kubelet import ProcessKubelet
from tests.k8s_emulator.nodes import NodeSetup
from tests.k8s_emulator.pod_hooks import DEFAULT_POD_HOOKS, PodHook
from tests.k8s_emulator.resources import Registry
from tests.k8s_emulator.store import Store

__all__ = ["ETCD_BINARY", "EmulatedCluster", "free_port", "write_kubeconfig"]

TOKEN = "flywheel-test-token"  # the kubeconfig's; checked only when a test turns on ApiServer.accepted_tokens


def write_kubeconfig(path: Path, api_url: str, namespace: str = "default") -> None:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "flywheel-test",
        "clusters": [{"name": "flywheel-test", "cluster": {"server": api_url}}],
        "users": [{"name": "flywheel-test", "user": {"token": TOKEN}}],
        "contexts": [{"name": "flywheel-test", "context": {"cluster": "flywheel-test", "user": "flywheel-test",
                                                           "namespace": namespace}}],
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


class EmulatedCluster:
    """One cluster on the running loop. `await start()`, then `api_url`; `await stop()` ends everything."""

    def __init__(self, work_dir: Path | None = None, nodes: int = 2, port: int = 0, etcd: bool = False,
                 node_monitor_grace_seconds: float = 40.0, heartbeat_seconds: float = 2.0,
                 history_size: int = 20000, bookmark_interval: float = 30.0, run_kubelet: bool = True,
                 pod_hooks: Sequence[PodHook] = DEFAULT_POD_HOOKS, pod_workdir: Path | None = None,
                 accepted_tokens: Sequence[str] | None = None,
                 node_setup: dict[str, NodeSetup] | None = None) -> None:
        """`pod_hooks` mutate each pod at creation (pod_hooks.py); `pod_workdir` is where the kubelet runs pod
        processes (default: the repository root, so `python -m flywheel...` and relative paths work);
        `accepted_tokens`: check bearer tokens (apiserver.py's `accepted_tokens`; default: no authentication);
        `node_setup` gives nodes (by name: node-1 ...) labels, taints and extended resources."""
        self._owns_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="flywheel-cluster-"))
        self.port = port or free_port()
        self.api_url = f"http://127.0.0.1:{self.port}"
        self.store = Store(Registry(), history_size)
        self.store.pod_hooks.extend(pod_hooks)
        self.control_plane = ControlPlane(self.store, node_monitor_grace_seconds)
        self.deployment_controller = DeploymentController(self.store)
        self.disruption_controller = DisruptionController(self.store)
        self.log_dir = self.work_dir / "pod-logs"
        self.server = ApiServer(self.store, self.control_plane, self.log_dir, bookmark_interval)
        self.server.accepted_tokens = frozenset(accepted_tokens) if accepted_tokens is not None else None
        self.server.admin_handlers["pause-disruption-controller"] = self._pause_disruption_controller
        self.kubelet: ProcessKubelet | None = None
        if run_kubelet:
            self.kubelet = ProcessKubelet(self.api_url, [f"node-{i}" for i in range(1, nodes + 1)], self.log_dir,
                                          heartbeat_seconds, node_status_seconds=max(heartbeat_seconds * 5, 5.0),
                                          workdir=pod_workdir, node_setup=node_setup)
            self._register_kubelet_admin(self.kubelet)
        self.want_etcd = etcd
        self.etcd: EtcdServer | None = None
        self._runner: web.AppRunner | None = None

    async def _pause_disruption_controller(self, parts: list[str], query: dict[str, str]) -> dict[str, Any]:
        self.disruption_controller.paused = query.get("on", "true") == "true"
        return {"paused": self.disruption_controller.paused}

    @property
    def etcd_url(self) -> str | None:
        return self.etcd.client_url if self.etcd else None

    def _register_kubelet_admin(self, kubelet: ProcessKubelet) -> None:
        async def lose(parts: list[str], query: dict[str, str]) -> dict[str, Any]:
            await kubelet.lose_node(query["node"])
            return {"lost": query["node"]}

        async def restore(parts: list[str], query: dict[str, str]) -> dict[str, Any]:
            await kubelet.restore_node(query["node"])
            return {"restored": query["node"]}

        async def pid(parts: list[str], query: dict[str, str]) -> dict[str, Any]:
            return {"pid": kubelet.pid_of(query.get("namespace", "default"), query["name"])}

        async def oom(parts: list[str], query: dict[str, str]) -> dict[str, Any]:
            return {"killed": await kubelet.oom_kill(query.get("namespace", "default"), query["name"])}

        self.server.admin_handlers.update({"lose-node": lose, "restore-node": restore, "pod-pid": pid,
                                           "oom-kill": oom})

    async def start(self) -> None:
        if self.want_etcd:
            loop = asyncio.get_running_loop()
            self.etcd = EtcdServer(self.work_dir / "etcd-data")
            await loop.run_in_executor(None, self.etcd.start)
        self.control_plane.start()
        self.deployment_controller.start()
        self.disruption_controller.start()
        self._runner = web.AppRunner(self.server.app, access_log=None, shutdown_timeout=1.0,
                                     handler_cancellation=True)  # so a disconnected watcher is dropped at once
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        if self.kubelet is not None:
            await self.kubelet.start()

    async def stop(self) -> None:
        await self.deployment_controller.stop()
        await self.disruption_controller.stop()
        if self.kubelet is not None:
            await self.kubelet.stop()
        self.store.drop_watches()
        self.server.resume()
        await self.control_plane.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.etcd is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.etcd.stop)
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

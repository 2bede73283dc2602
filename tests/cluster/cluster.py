"""One test cluster: the control plane's processes (controlplane.py), the process kubelet on a background event
loop (kubelet.py), and optionally a second etcd for the trainers' rendezvous, with synchronous handles for tests."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.controlplane import ControlPlane, ControlPlaneOptions, write_kubeconfig
from tests.cluster.kubelet import ClusterKubelet
from tests.etcd_process import EtcdServer
from tests.k8s_emulator.fixtures import _LoopThread
from tests.k8s_emulator.nodes import NodeSetup


@dataclass
class ClusterOptions:
    nodes: int = 2
    rendezvous_etcd: bool = False  # a second etcd for `--etcd-endpoints` and the workers' rendezvous
    node_monitor_grace_seconds: float = 40.0
    heartbeat_seconds: float = 2.0
    node_setup: dict[str, NodeSetup] = field(default_factory=dict)
    pod_workdir: Path | None = None  # where pod processes run (default: the repository root)


class KubeletHandle:
    """Thread-safe controls of the process kubelet."""

    def __init__(self, kubelet: ClusterKubelet, loop: _LoopThread) -> None:
        self._kubelet, self._loop = kubelet, loop

    @property
    def node_names(self) -> list[str]:
        return list(self._kubelet.node_names)

    def lose_node(self, node: str) -> None:
        """The machine dies: no more Lease renewals or status, its processes frozen."""
        self._loop.run(self._kubelet.lose_node(node))

    def restore_node(self, node: str) -> None:
        self._loop.run(self._kubelet.restore_node(node))

    def add_node(self, node: str, setup: NodeSetup | None = None) -> None:
        self._loop.run(self._kubelet.add_node(node, setup))

    def pid_of(self, namespace: str, name: str) -> int | None:
        return self._loop.call(self._kubelet.pid_of, namespace, name)

    def set_resources(self, node: str, resources: dict[str, str]) -> None:
        self._loop.run(self._kubelet.set_resources(node, resources))

    def oom_kill(self, namespace: str, name: str) -> bool:
        return self._loop.run(self._kubelet.oom_kill(namespace, name))


class TestCluster:
    """`start()` then `kubeconfig`, `api_url`, `kubelet`, `control_plane`; `stop()` ends it all."""

    __test__ = False  # not a pytest class

    def __init__(self, work_dir: Path | None = None, options: ClusterOptions | None = None) -> None:
        self.options = options or ClusterOptions()
        self._owns_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="flywheel-cluster-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.control_plane = ControlPlane(self.work_dir, ControlPlaneOptions(
            node_monitor_grace_seconds=self.options.node_monitor_grace_seconds))
        self.api_url = self.control_plane.api_url
        self.kubeconfig = self.work_dir / "kubeconfig"
        self.log_dir = self.work_dir / "pod-logs"
        self.rendezvous: EtcdServer | None = None
        self._loop: _LoopThread | None = None
        self._kubelet: ClusterKubelet | None = None
        self.kubelet: KubeletHandle | None = None
        self.start_seconds = 0.0

    @property
    def etcd_url(self) -> str | None:
        return self.rendezvous.client_url if self.rendezvous else None

    @property
    def ca_file(self) -> Path:
        return self.control_plane.pki.ca_cert

    @property
    def admin_token(self) -> str:
        return self.control_plane.admin_token

    def start(self) -> None:
        started = time.monotonic()
        try:
            self.control_plane.start()
            write_kubeconfig(self.kubeconfig, self.api_url, self.ca_file, self.admin_token)
            if self.options.rendezvous_etcd:
                self.rendezvous = EtcdServer(self.work_dir / "rendezvous-etcd")
                self.rendezvous.start()
            self._start_kubelet()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def _start_kubelet(self) -> None:
        names = [f"node-{i}" for i in range(1, self.options.nodes + 1)]
        self._loop = _LoopThread()
        self._kubelet = ClusterKubelet(self.api_url, self.control_plane.pki, names, self.log_dir,
                                       self.control_plane.version, self.options.heartbeat_seconds,
                                       workdir=self.options.pod_workdir, node_setup=self.options.node_setup)
        self._loop.run(self._kubelet.start())
        self.kubelet = KubeletHandle(self._kubelet, self._loop)

    def stop(self) -> None:
        if self._loop is not None and self._kubelet is not None:
            try:
                self._loop.run(self._kubelet.stop())
            finally:
                self._loop.close()
                self._loop, self._kubelet, self.kubelet = None, None, None
        if self.rendezvous is not None:
            self.rendezvous.stop()
        self.control_plane.stop()
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> TestCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

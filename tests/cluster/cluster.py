"""One test cluster: the control plane's processes (controlplane.py), the process kubelet on a background event
loop (kubelet.py), optionally real nodes beside it (real_node.py: the kubelet on containerd) and a second etcd for
the trainers' rendezvous, with synchronous handles for tests."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster import images
from tests.cluster.binary import ensure_containerd
from tests.cluster.controlplane import ControlPlane, ControlPlaneOptions, write_kubeconfig
from tests.cluster.fault_proxy import FaultProxy
from tests.cluster.kubelet import ClusterKubelet
from tests.cluster.loop_thread import KubeletHandle, LoopThread
from tests.cluster.real_node import RealNode, RealNodeSettings
from tests.cluster.service_vip import ServiceVip
from tests.etcd_process import EtcdServer
from tests.kubelet.nodes import NodeSetup
from tests.waiting import eventually


@dataclass
class ClusterOptions:
    nodes: int = 2
    rendezvous_etcd: bool = False  # a second etcd for `--etcd-endpoints` and the workers' rendezvous
    node_monitor_grace_seconds: float = 40.0
    heartbeat_seconds: float = 2.0
    node_setup: dict[str, NodeSetup] = field(default_factory=dict)
    pod_workdir: Path | None = None  # where pod processes run (default: the repository root)
    scheduler_names: tuple[str, ...] = ()  # more kube-scheduler profiles, beside default-scheduler
    # Real nodes (real_node.py) beside the process kubelet's: real-1..real-N, holding these podman images.
    real_nodes: int = 0
    real_node_images: tuple[str, ...] = ()


class ApiHandle:
    """Thread-safe faults of the API as the tests' clients see it: the fault proxy's (fault_proxy.py), and real
    ones of the control plane (a component stopped or restarted, etcd compacted)."""

    def __init__(self, cluster: TestCluster, proxy: FaultProxy, loop: LoopThread) -> None:
        self._cluster, self._proxy, self._loop = cluster, proxy, loop

    def drop_watches(self) -> int:
        return self._loop.call(self._proxy.drop_watches)

    def force_conflict(self, resource: str, namespace: str, name: str, group: str = "", count: int = 1) -> None:
        self._loop.call(self._proxy.force_conflict, resource, namespace, name, group, count)

    def fail_next(self, pattern: str, code: int, count: int = 1) -> None:
        self._loop.call(self._proxy.fail_next, pattern, code, count)

    def pause(self) -> None:
        self._loop.call(self._proxy.pause)

    def resume(self) -> None:
        self._loop.call(self._proxy.resume)

    @property
    def watch_count(self) -> int:
        return int(self._loop.call(lambda: self._proxy.watch_count))

    def compact(self) -> int:
        """Compact the API server's etcd to its newest revision (its API, as the API server's own compactor does):
        lists and watches from an older resourceVersion that reach etcd get 410 Expired."""
        return self._cluster.control_plane.compact_etcd()

    def restart(self, component: str, down_seconds: float = 0.0) -> None:
        self._cluster.control_plane.restart(component, down_seconds)


def claim_objects(namespace: str, name: str, path: Path, size: str = "10Gi",
                  access: str = "ReadWriteMany") -> tuple[dict[str, Any], dict[str, Any]]:
    """A PersistentVolume on the hostPath `path` pre-bound (claimRef) to the claim `namespace/name`, and that
    claim naming it: the persistent-volume controller binds the two at once."""
    volume = f"{namespace}-{name}"
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
          "spec": {"capacity": {"storage": size}, "accessModes": [access], "storageClassName": "",
                   "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(path)},
                   "claimRef": {"namespace": namespace, "name": name}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
           "spec": {"accessModes": [access], "resources": {"requests": {"storage": size}}, "storageClassName": "",
                    "volumeName": volume}}
    return pv, pvc


class TestCluster:
    """`start()` then `kubeconfig`, `api_url`, `kubelet`, `control_plane`; `stop()` ends it all."""

    __test__ = False  # not a pytest class

    def __init__(self, work_dir: Path | None = None, options: ClusterOptions | None = None) -> None:
        self.options = options or ClusterOptions()
        self._owns_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="flywheel-cluster-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.control_plane = ControlPlane(self.work_dir, ControlPlaneOptions(
            node_monitor_grace_seconds=self.options.node_monitor_grace_seconds,
            scheduler_names=self.options.scheduler_names))
        self.api_url = self.control_plane.api_url  # the fault proxy's once started
        self.kubeconfig = self.work_dir / "kubeconfig"
        self.log_dir = self.work_dir / "pod-logs"
        self.rendezvous: EtcdServer | None = None
        self._loop: LoopThread | None = None
        self._kubelet: ClusterKubelet | None = None
        self.kubelet: KubeletHandle | None = None
        self.api: ApiHandle | None = None
        self._proxy: FaultProxy | None = None
        self.real_nodes: dict[str, RealNode] = {}
        self._service_vip: ServiceVip | None = None
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
            if self.options.rendezvous_etcd:
                self.rendezvous = EtcdServer(self.work_dir / "rendezvous-etcd")
                self.rendezvous.start()
            self._loop = LoopThread()
            self._proxy = FaultProxy(self.control_plane.api_url, self.control_plane.pki)
            self._loop.run(self._proxy.start())
            self.api_url = self._proxy.url
            self.api = ApiHandle(self, self._proxy, self._loop)
            write_kubeconfig(self.kubeconfig, self.api_url, self.ca_file, self.admin_token)
            self._start_kubelet()
            self._start_real_nodes()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def _start_kubelet(self) -> None:
        names = [f"node-{i}" for i in range(1, self.options.nodes + 1)]
        assert self._loop is not None
        self._kubelet = ClusterKubelet(self.control_plane.api_url, self.control_plane.pki, names, self.log_dir,
                                       self.control_plane.version, self.options.heartbeat_seconds,
                                       workdir=self.options.pod_workdir, node_setup=self.options.node_setup)
        self._loop.run(self._kubelet.start())
        self.kubelet = KubeletHandle(self._kubelet, self._loop)

    def _start_real_nodes(self) -> None:
        if not self.options.real_nodes:
            return
        folder = self.work_dir / "real-nodes"
        root = images.template_root(self.options.real_node_images, folder / "import.log")
        grace = self.options.node_monitor_grace_seconds
        settings = RealNodeSettings(self.control_plane.api_url, self.control_plane.pki, self.control_plane.binary,
                                    ensure_containerd(), images.sandbox_reference(),
                                    lease_seconds=int(min(40, max(2, grace))))
        self._service_vip = ServiceVip(lambda: ("127.0.0.1", self.control_plane.api_port))
        self._service_vip.start()
        for index in range(1, self.options.real_nodes + 1):
            name = f"real-{index}"
            self.real_nodes[name] = RealNode(name, folder / name, settings, root)
            self.real_nodes[name].start()
        for name in self.real_nodes:
            self.wait_node_ready(name)

    def wait_node_ready(self, name: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        conditions: list[dict[str, str]] = []
        while time.monotonic() < deadline:
            node = self.control_plane.request(f"/api/v1/nodes/{name}") or {}
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return
            time.sleep(0.5)
        real = self.real_nodes.get(name)
        raise TimeoutError(f"node {name} not Ready after {timeout:.0f} s; its conditions: "
                           + "; ".join(f"{c['type']}={c['status']} ({c.get('message', '')})" for c in conditions)
                           + (f"\n{real.diagnosis()}" if real is not None else ""))

    def stop(self) -> None:
        for node in self.real_nodes.values():
            node.stop()
        self.real_nodes = {}
        if self._service_vip is not None:
            self._service_vip.stop()
            self._service_vip = None
        if self._loop is not None:
            try:
                if self._kubelet is not None:
                    self._loop.run(self._kubelet.stop())
                if self._proxy is not None:
                    self._loop.run(self._proxy.stop())
            finally:
                self._loop.close()
                self._loop, self._kubelet, self.kubelet, self._proxy = None, None, None, None
        if self.rendezvous is not None:
            self.rendezvous.stop()
        self.control_plane.stop()
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def add_claim(self, name: str, namespace: str = "default", size: str = "10Gi",
                  access: str = "ReadWriteMany") -> None:
        """A PersistentVolumeClaim bound to a hostPath PersistentVolume of its own (pre-bound through claimRef, so
        the persistent-volume controller binds it without a provisioner; returns once it is Bound). The process
        kubelet mounts nothing (pods see the host's paths); a real node mounts the volume's folder, made here
        world-writable as a fresh volume is."""
        plane = self.control_plane
        volume = f"{namespace}-{name}"
        if plane.request(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}") is not None:
            return
        folder = self.work_dir / "volumes" / volume
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)
        pv, pvc = claim_objects(namespace, name, folder, size, access)
        plane.request("/api/v1/persistentvolumes", "POST", pv)
        plane.request(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", "POST", pvc)
        self._wait_bound(namespace, name)

    def _wait_bound(self, namespace: str, name: str, timeout: float = 120.0) -> None:
        """Until the claim is Bound: kube-controller-manager binds it once its controllers run, which on a cluster
        just started on a busy machine can be many seconds; a pod created before then is unschedulable meanwhile
        (`pod has unbound immediate PersistentVolumeClaims`), which a short pendingTimeoutSeconds counts."""
        path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}"
        eventually(lambda: ((self.control_plane.request(path) or {}).get("status") or {}).get("phase") == "Bound",
                   timeout, f"claim {namespace}/{name} to be Bound", interval=0.1)

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """A CRD's resource is served once the CRD is Established, a moment after its create."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.control_plane.request(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            conditions = ((found or {}).get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return
            time.sleep(0.1)
        raise TimeoutError(f"CRD {crd} not Established after {timeout:.0f} s")

    def __enter__(self) -> TestCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and kube-scheduler,
each its own process of the one control-plane binary (binary.py), with credentials made at start (pki.py).

Synchronous and free of pytest, so `python -m tests.cluster up` and the fixtures share it. `stop()`/`start()` of
one component (`restart("kube-apiserver")`, `stop_component("etcd")`) are real faults: the others see the outage
as they would on a cluster. kube-apiserver writes an audit log of every request (audit.py): `audit` reads it."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import pki as pki_module
from tests.cluster.audit import AuditLog
from tests.cluster.audit import apiserver_args as audit_args
from tests.cluster.binary import ensure_binary, kubernetes_version
from tests.etcd_process import EtcdServer, free_port, stop_process

# Admission plugins beyond the API server's defaults (which already include NamespaceLifecycle, LimitRanger,
# ServiceAccount, DefaultTolerationSeconds, PodSecurity, Priority, RuntimeClass, ResourceQuota and the webhooks).
EXTRA_ADMISSION = ("NodeRestriction",)
# Controllers as a cluster runs them; the cloud and bootstrap-token ones have nothing to act on here.
CONTROLLERS = "*"  # the default set: what a cluster runs (bootstrap-token ones are off by default)


@dataclass
class ControlPlaneOptions:
    node_monitor_grace_seconds: float = 40.0  # NotReady after this long without a Lease renewal (Kubernetes: 50)
    api_qps: int = 200  # the controllers' and scheduler's client rate (Kubernetes' defaults: 20 and 50)
    extra_apiserver_args: list[str] = field(default_factory=list)
    # More profiles of the one kube-scheduler, each a schedulerName pods may ask for (the default plugins under
    # another name: a stand-in for a second scheduler such as scheduler-plugins' coscheduling one).
    scheduler_names: tuple[str, ...] = ()


def _wait(what: str, ready: Any, process: subprocess.Popen[bytes] | None, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} while starting:\n{_tail(log)}")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s:\n{_tail(log)}")


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


class ControlPlane:
    """`start()` brings up all four (about 10-20 s on 2 cores), `stop()` ends them; `api_url`, `admin_token`,
    `audit` (who asked the API server for what)."""

    def __init__(self, work_dir: Path, options: ControlPlaneOptions | None = None) -> None:
        self.work_dir = work_dir
        self.options = options or ControlPlaneOptions()
        self.log_dir = work_dir / "logs"
        self.binary = ensure_binary()
        self.version = kubernetes_version()
        self.pki = pki_module.make_pki(work_dir / "pki")
        self.api_port = free_port()
        self.api_url = f"https://127.0.0.1:{self.api_port}"
        self.etcd = EtcdServer(work_dir / "etcd-data", binary=[str(self.binary), "etcd"],
                               extra_args=["--unsafe-no-fsync", "--quota-backend-bytes=4294967296"])
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._ssl = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        self.audit = AuditLog(self.log_dir / "audit.log", self.request)

    @property
    def admin_token(self) -> str:
        return self.pki.tokens["admin"].token

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.etcd.start(timeout=60)
        self._start_apiserver_on_a_free_port()
        for component in ("kube-controller-manager", "kube-scheduler"):
            self.start_component(component)
        _wait("the controllers (the default ServiceAccount and kube-root-ca.crt)", self._controllers_ready,
              self.processes["kube-controller-manager"], self.log_path("kube-controller-manager"), 120)

    def _start_apiserver_on_a_free_port(self, attempts: int = 3) -> None:
        """A port found free can be taken before the API server binds it (two test processes start clusters at
        once): then it starts again on another, as etcd's start does. Later restarts keep the port."""
        for attempt in range(1, attempts + 1):
            try:
                self.start_component("kube-apiserver")
                return
            except RuntimeError:
                if attempt == attempts or "address already in use" not in _tail(self.log_path("kube-apiserver")):
                    raise
                self.api_port = free_port()
                self.api_url = f"https://127.0.0.1:{self.api_port}"

    def stop(self) -> None:
        for component in ("kube-scheduler", "kube-controller-manager", "kube-apiserver"):
            self.stop_component(component)
        self.etcd.stop()

    def start_component(self, component: str) -> None:
        if component == "etcd":
            self.etcd.start(timeout=60)
            return
        argv = [str(self.binary), component, *self._args(component)]
        with open(self.log_path(component), "ab") as log:
            self.processes[component] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                         stdin=subprocess.DEVNULL, start_new_session=True)
        if component == "kube-apiserver":
            _wait("kube-apiserver", self._api_ready, self.processes[component], self.log_path(component), 120)

    def stop_component(self, component: str, kill: bool = False) -> None:
        if component == "etcd":
            self.etcd.stop(kill=kill)
            return
        stop_process(self.processes.pop(component, None), kill, timeout=20)

    def restart(self, component: str, down_seconds: float = 0.0) -> None:
        self.stop_component(component)
        time.sleep(down_seconds)
        self.start_component(component)

    def log_path(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    # ---- arguments -----------------------------------------------------------------------------------------
    def _args(self, component: str) -> list[str]:
        return {"kube-apiserver": self._apiserver_args, "kube-controller-manager": self._controller_manager_args,
                "kube-scheduler": self._scheduler_args}[component]()

    def _apiserver_args(self) -> list[str]:
        p = self.pki
        return [
            f"--etcd-servers={self.etcd.client_url}", "--bind-address=127.0.0.1", f"--secure-port={self.api_port}",
            "--advertise-address=127.0.0.1", f"--tls-cert-file={p.cert('apiserver')}",
            f"--tls-private-key-file={p.key('apiserver')}", f"--client-ca-file={p.ca_cert}",
            f"--token-auth-file={p.token_file}", "--authorization-mode=Node,RBAC",
            f"--enable-admission-plugins={','.join(EXTRA_ADMISSION)}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p.service_account_pub}",
            f"--service-account-signing-key-file={p.service_account_key}",
            f"--service-cluster-ip-range={pki_module.SERVICE_CIDR}", "--allow-privileged=true",
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={p.cert('apiserver-kubelet-client')}",
            f"--kubelet-client-key={p.key('apiserver-kubelet-client')}",
            f"--kubelet-certificate-authority={p.ca_cert}",
            "--profiling=false", "--endpoint-reconciler-type=none", "--v=1",
            *audit_args(self.audit.path, self.work_dir / "audit-policy.json"), *self.options.extra_apiserver_args]

    def _controller_manager_args(self) -> list[str]:
        p, grace = self.pki, self.options.node_monitor_grace_seconds
        return [
            f"--kubeconfig={self._component_kubeconfig('kube-controller-manager')}", "--secure-port=0",
            "--leader-elect=false", "--use-service-account-credentials=true", f"--controllers={CONTROLLERS}",
            f"--root-ca-file={p.ca_cert}", f"--service-account-private-key-file={p.service_account_key}",
            f"--cluster-signing-cert-file={p.ca_cert}", f"--cluster-signing-key-file={p.ca_key}",
            f"--node-monitor-grace-period={grace:g}s", f"--node-monitor-period={min(5.0, grace / 4):g}s",
            "--node-startup-grace-period=60s", "--allocate-node-cidrs=false",
            f"--kube-api-qps={self.options.api_qps}", f"--kube-api-burst={self.options.api_qps * 2}",
            "--concurrent-gc-syncs=5", "--profiling=false", "--v=1"]

    def _scheduler_args(self) -> list[str]:
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                  "clientConnection": {"kubeconfig": str(self._component_kubeconfig("kube-scheduler")),
                                       "qps": self.options.api_qps, "burst": self.options.api_qps * 2},
                  "leaderElection": {"leaderElect": False},
                  "profiles": [{"schedulerName": name}
                               for name in ("default-scheduler", *self.options.scheduler_names)]}
        path = self.work_dir / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return [f"--config={path}", "--secure-port=0", "--profiling=false", "--v=1"]

    def _component_kubeconfig(self, component: str) -> Path:
        path = self.work_dir / f"{component}.kubeconfig"
        write_kubeconfig(path, self.api_url, self.pki.ca_cert, self.pki.tokens[component].token, user=component)
        return path

    def compact_etcd(self) -> int:
        """Compact the store to its newest revision through etcd's gRPC gateway; returns the revision."""
        def call(path: str, body: dict[str, Any]) -> Any:
            request = urllib.request.Request(self.etcd.client_url + path, data=json.dumps(body).encode(),
                                             method="POST")
            with urllib.request.urlopen(request, timeout=10) as reply:
                return json.loads(reply.read())
        revision = int(call("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        call("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    # ---- readiness -----------------------------------------------------------------------------------------
    def request(self, path: str, method: str = "GET", body: Any = None) -> Any:
        """One admin request to the API server (None for 404); for readiness checks and small test set-ups."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.api_url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10, context=self._ssl) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise
        return json.loads(raw) if raw.startswith(b"{") else raw.decode()

    def _api_ready(self) -> bool:
        try:
            return self.request("/readyz") == "ok"
        except (OSError, ValueError):
            return False

    def _controllers_ready(self) -> bool:
        try:
            return (self.request("/api/v1/namespaces/default/serviceaccounts/default") is not None
                    and self.request("/api/v1/namespaces/default/configmaps/kube-root-ca.crt") is not None)
        except (OSError, ValueError):
            return False


def write_kubeconfig(path: Path, api_url: str, ca_file: Path, token: str, user: str = "flywheel-admin",
                     namespace: str = "default") -> None:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "flywheel-test",
        "clusters": [{"name": "flywheel-test", "cluster": {"server": api_url, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "flywheel-test", "context": {"cluster": "flywheel-test", "user": user,
                                                           "namespace": namespace}}],
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.chmod(path, 0o600)

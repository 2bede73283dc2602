"""The API against the test cluster's real API server (kube-apiserver, etcd and the controllers; no kubelet runs a
pod, no operator: the tests write pod and job status themselves, as the kubelet and operator would, so every
response is deterministic).

`api_env` (module scope) starts the cluster, installs the CRD, registers two Ready nodes for the pods to be bound to,
and wraps the app in FastAPI's TestClient, whose start-up starts the watch-backed cache and the actions on the app's
event loop through the product's client (flywheel/kube), as `flywheel api` does; the tests write through the
official sync client. The app's callers authenticate with its token file (ADMIN may do everything, VIEWER, group
flywheel:viewers, may only read); `service_account_token` and `kubectl` give tests the cluster's own callers
(TokenRequest tokens judged by TokenReview and RBAC).
"""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from kubernetes import client, config

from flywheel.api.app import create_app
from flywheel.api.auth import TokenFileAuth
from flywheel.api.cache import KubeCache
from flywheel.api.job_actions import KubeActions
from flywheel.kube.client import Kube, load_credentials
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from tests.cluster.cluster import TestCluster
from tests.cluster.fixtures import start_cluster
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
CRD_NAME = "trainingjobs.flywheel.dev"
ADMIN, VIEWER = "admin-token-0123", "viewer-token-4567"
NODES = ("node-1", "node-2")
# No kubelet heartbeats these nodes: a grace longer than any module keeps the node-lifecycle controller from taking
# them (and their pods) for lost.
NODE_GRACE_S = 3600.0
STRATEGIC = "application/strategic-merge-patch+json"


def kubectl(cluster: TestCluster, *args: str) -> str:
    """The real kubectl (the control plane's binary is kubectl too) as the cluster's admin; fails the test on an
    error."""
    argv = [str(cluster.control_plane.binary), "kubectl", "--kubeconfig", str(cluster.kubeconfig), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def service_account_token(cluster: TestCluster, account: str, namespace: str = "default",
                          bound_secret: str | None = None) -> str:
    """A token of `account` from the TokenRequest API (`kubectl create token`); bound to a Secret, it is revoked
    when that Secret is deleted."""
    bound = ["--bound-object-kind", "Secret", "--bound-object-name", bound_secret] if bound_secret else []
    return kubectl(cluster, "-n", namespace, "create", "token", account, "--duration", "1h", *bound).strip()


def job_doc(name: str, namespace: str = "default", rmin: int = 1, rmax: int = 3, procs: int = 2) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": "flywheel:latest", "replicas": {"min": rmin, "max": rmax}, "procsPerReplica": procs,
                     "trainer": {"model": {"preset": "gpt-tiny"}, "parallelism": {"fsdp": False},
                                 "training": {"steps": 30, "globalBatch": 24, "microBatch": 2}},
                     "checkpoint": {"dir": f"/ckpt/{name}", "everySteps": 5, "claimName": "shared-ckpt"}}}


@dataclass
class ApiEnv:
    cluster: TestCluster
    kube: client.ApiClient
    http: TestClient
    cache: KubeCache
    token_file: Path

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.kube)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.kube)

    def headers(self, token: str = ADMIN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def get(self, path: str, token: str = ADMIN, **kw: Any) -> Any:
        return self.http.get(path, headers=self.headers(token), **kw)

    def create_job(self, name: str, namespace: str = "default", **kw: Any) -> dict[str, Any]:
        obj = self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                          job_doc(name, namespace, **kw))
        eventually(lambda: self.cache.job(namespace, name), what=f"{name} in the cache")
        return obj

    def job(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def set_status(self, name: str, status: dict[str, Any], namespace: str = "default") -> None:
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                          {"status": status},
                                                          _content_type="application/merge-patch+json")
        phase = status.get("phase")
        eventually(lambda: ((self.cache.job(namespace, name) or {}).get("status") or {}).get("phase") == phase,
                   what=f"{name} status in the cache")

    def add_pod(self, job: str, index: int, phase: str, ready: bool, generation: int = 0,
                terminated: dict[str, Any] | None = None, namespace: str = "default") -> None:
        name = f"{job}-worker-{index}"
        self.core.create_namespaced_pod(namespace, {
            "metadata": {"name": name, "labels": {"flywheel.dev/job": job, "flywheel.dev/replica-index": str(index),
                                                  "flywheel.dev/generation": str(generation)}},
            "spec": {"nodeName": f"node-{index + 1}", "restartPolicy": "Never",
                     "containers": [{"name": "worker", "image": "flywheel:latest"}]}})
        state = {"terminated": terminated} if terminated else {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        self.core.patch_namespaced_pod_status(name, namespace, {"status": {
            "phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "worker", "ready": ready, "restartCount": 0, "image": "flywheel:latest",
                                   "imageID": "", "state": state}]}}, _content_type=STRATEGIC)
        eventually(lambda: any(p["metadata"]["name"] == name and (p.get("status") or {}).get("phase") == phase
                               for p in self.cache.pods(namespace, job)), what=f"pod {name} in the cache")

    def add_event(self, job: str, reason: str, message: str, kind: str = "TrainingJob", obj_name: str | None = None,
                  event_type: str = "Normal", ts: str = "2026-01-01T00:00:00Z", namespace: str = "default") -> None:
        target = obj_name or job
        self.core.create_namespaced_event(namespace, {
            "metadata": {"generateName": f"{target}.", "namespace": namespace},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}" if kind == "TrainingJob" else "v1", "kind": kind,
                               "name": target, "namespace": namespace},
            "type": event_type, "reason": reason, "message": message, "firstTimestamp": ts, "lastTimestamp": ts,
            "count": 1, "source": {"component": "flywheel-operator"}})
        eventually(lambda: any(e.get("reason") == reason and e.get("message") == message
                               for e in self.cache.events(namespace, {target})), what=f"event {reason}")


def register_nodes(core: client.CoreV1Api) -> None:
    """Nodes as a kubelet registers them, Ready once: the tests' pods are bound to them (a pod bound to no Node is
    garbage-collected)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
             "lastTransitionTime": now}
    for node in NODES:
        core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
        core.patch_node_status(node, {"status": {"conditions": [ready]}}, _content_type=STRATEGIC)


def prepare(cluster: TestCluster, kube: client.ApiClient) -> None:
    client.ApiextensionsV1Api(kube).create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": "team-b"}})
    register_nodes(core)
    cluster.wait_established(CRD_NAME)
    # A pod is admitted once its namespace's default ServiceAccount exists (the controllers make it).
    eventually(lambda: core.list_namespaced_service_account("team-b").items, timeout=30,
               what="team-b's default ServiceAccount")


@pytest.fixture(scope="module")
def api_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiEnv]:
    tmp = tmp_path_factory.mktemp("api")
    with start_cluster(tmp / "cluster", nodes=0, node_monitor_grace_seconds=NODE_GRACE_S) as cluster:
        kube = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        prepare(cluster, kube)
        token_file = tmp / "tokens.csv"
        token_file.write_text(f"# token,user,uid,groups\n{ADMIN},alice,u1\n{VIEWER},bob,u2,\"flywheel:viewers,dev\"\n")

        async def start(app: Any) -> Callable[[], Awaitable[None]]:
            served = Kube(await load_credentials(str(cluster.kubeconfig)))
            cache = KubeCache(served, watch_seconds=5).start()
            assert await cache.wait_synced(15), "the cache did not sync with the API server"
            app.state.source, app.state.actions = cache, KubeActions(served)

            async def stop() -> None:
                await cache.stop()
                await served.close()
            return stop

        app = create_app(None, TokenFileAuth.from_file(token_file), startup=start)
        with TestClient(app) as http:
            yield ApiEnv(cluster, kube, http, app.state.source, token_file)
        kube.close()

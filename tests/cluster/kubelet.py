"""The process kubelet as a node agent of the real API server: each node it runs is a client of its own
(`system:node:<name>` by client certificate, so the Node authorizer and NodeRestriction judge it as a kubelet),
registers its Node (addresses, capacity, the kubelet endpoint) and a Lease in `kube-node-lease` owned by it,
watches only the pods bound to it (the real kube-scheduler binds them), reports through `pods/status` by
strategic merge, mints each pod's service-account token through the TokenRequest API, and serves
`/containerLogs` and `/exec` over TLS so `kubectl logs` and `kubectl exec` work through the API server.

Which node a request acts for travels in a context variable: each node's watch and heartbeat set it, and the pod
tasks they start inherit it."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster import exec_server
from tests.cluster.logs_server import LogsServer
from tests.cluster.pki import Pki
from tests.kubelet import nodes as node_objects
from tests.kubelet import podenv, sandbox
from tests.kubelet.container import PodProcess
from tests.kubelet.httpclient import ApiStatusError, KubeHttpClient, new_session, resource_path
from tests.kubelet.init_containers import terminated_state
from tests.kubelet.kubelet import ProcessKubelet, _micro_now
from tests.kubelet.nodes import NodeSetup

acting_node: contextvars.ContextVar[str] = contextvars.ContextVar("acting_node")
LEASE_SECONDS = 40
# The API server proxies a node's exec WebSocket as it is (no translation to SPDY) only when the node declares this.
DECLARED_FEATURES = ["ExtendWebSocketsToKubelet"]
GRAPH_LAG_S = 30.0  # how long a node's 403 on its own pod's objects is taken for the authorizer's graph lagging


class NodeClients(KubeHttpClient):
    """One TLS session per node, chosen by `acting_node`."""

    def __init__(self, base_url: str, pki: Pki) -> None:
        super().__init__(base_url)
        self.pki = pki
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        node = acting_node.get(None)
        if node is None:
            raise RuntimeError("a kubelet request made outside any node's context")
        if node not in self._sessions:
            context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
            cert, key = self.pki.node_credentials(node)
            context.load_cert_chain(str(cert), str(key))
            self._sessions[node] = new_session(ssl_context=context)
        return self._sessions[node]

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()


class ClusterKubelet(ProcessKubelet):
    status_patch_type = "application/strategic-merge-patch+json"

    def __init__(self, api_url: str, pki: Pki, node_names: list[str], log_dir: Path, kubelet_version: str,
                 heartbeat_seconds: float = 2.0, workdir: Path | None = None,
                 node_setup: dict[str, NodeSetup] | None = None) -> None:
        super().__init__(api_url, node_names, log_dir, heartbeat_seconds,
                         node_status_seconds=max(heartbeat_seconds * 5, 5.0), workdir=workdir,
                         node_setup=node_setup)
        self.api = NodeClients(api_url, pki)
        self.pki = pki
        self.kubelet_version = f"{kubelet_version}-process"
        self.logs = LogsServer(pki, self.log_dir, self._log_files, self._exec_target)

    async def start(self) -> None:
        await self.logs.start()
        await super().start()
        self._tasks += [asyncio.create_task(self._watch_node(node), name=f"watch {node}")
                        for node in self.node_names]

    async def stop(self) -> None:
        await super().stop()
        await self.logs.stop()

    async def add_node(self, node: str, setup: NodeSetup | None = None) -> None:
        """Register one more node (a node pool growing) and run its pods."""
        self.node_names.append(node)
        self.node_setup[node] = setup or NodeSetup()
        await self._register(node)
        self._tasks.append(asyncio.create_task(self._watch_node(node), name=f"watch {node}"))

    # ---- nodes ---------------------------------------------------------------------------------------------
    async def _register(self, node: str) -> None:
        acting_node.set(node)
        body = node_objects.node_object(node, self.node_setup[node])
        try:
            created = await self.api.request("POST", resource_path("nodes"), body)
        except ApiStatusError as err:
            if err.code != 409:
                raise
            created = await self.api.request("GET", resource_path("nodes", name=node))
        await self._post_node_status(node)
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": node, "namespace": "kube-node-lease", "ownerReferences": [
                     {"apiVersion": "v1", "kind": "Node", "name": node, "uid": created["metadata"]["uid"]}]},
                 "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS,
                          "renewTime": _micro_now()}}
        with contextlib.suppress(ApiStatusError):
            await self.api.request("POST", resource_path("leases", "kube-node-lease",
                                                         group_version="coordination.k8s.io/v1"), lease)

    async def _post_node_status(self, node: str) -> None:
        acting_node.set(node)
        status = node_objects.node_status(node, self.node_setup[node], self.kubelet_version)
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": self.logs.port}}
        status["declaredFeatures"] = DECLARED_FEATURES
        await self.api.request("PATCH", resource_path("nodes", name=node, subresource="status"), {"status": status},
                               content_type="application/strategic-merge-patch+json")

    async def _renew_lease(self, node: str) -> None:
        acting_node.set(node)
        await super()._renew_lease(node)

    # ---- pods ----------------------------------------------------------------------------------------------
    async def _watch_node(self, node: str) -> None:
        acting_node.set(node)
        selector = {"fieldSelector": f"spec.nodeName={node}"}
        resource_version = ""
        while True:
            try:
                if not resource_version:
                    resource_version = await self._resync_node(node)
                async for event in self.api.watch(resource_path("pods"), resource_version, params=selector):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        resource_version = ""  # 410 Gone: list again
                        break
                    resource_version = obj["metadata"].get("resourceVersion", resource_version)
                    if event["type"] == "DELETED":
                        self._pod_gone(obj["metadata"]["uid"])
                    elif event["type"] != "BOOKMARK":
                        await self._reconcile(obj)
            except (TimeoutError, ApiStatusError, OSError, ValueError, aiohttp.ClientError):
                resource_version = ""
                await asyncio.sleep(0.5)
            except Exception:  # noqa: BLE001 - a pod the kubelet cannot handle must not stop it serving the others
                await asyncio.sleep(0.5)

    async def _resync_node(self, node: str) -> str:
        acting_node.set(node)
        listing = await self.api.request("GET", resource_path("pods"),
                                         params={"fieldSelector": f"spec.nodeName={node}"})
        seen = {pod["metadata"]["uid"] for pod in listing["items"]}
        for pod in listing["items"]:
            await self._reconcile(pod)
        for uid, running in list(self.pods.items()):
            if running.node == node and uid not in seen:
                self._pod_gone(uid)
        return str(listing["metadata"]["resourceVersion"])

    async def _resync(self) -> str:
        for node in self.node_names:
            if node not in self.lost:
                with contextlib.suppress(ApiStatusError, OSError, aiohttp.ClientError):
                    await self._resync_node(node)
        return ""

    async def _reconcile(self, pod: dict[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in self.node_names:
            return  # unbound (the scheduler's) or another kubelet's
        acting_node.set(node)
        await super()._reconcile(pod)

    async def _final_delete(self, pod: dict[str, Any]) -> None:
        """A kubelet (since v1.27) reports a deleted pod's terminal phase before its final delete, so a pod that a
        finalizer holds ends Succeeded or Failed, not Running."""
        acting_node.set(pod["spec"]["nodeName"])
        running = self.pods.get(pod["metadata"]["uid"])
        process = running.process if running is not None else None
        if running is not None and process is not None and process.returncode is not None:
            container = pod["spec"]["containers"][0]
            terminated = terminated_state(process.returncode, running.started_at, container,
                                          self.container_files(running, container),
                                          f"process://{running.uid}/{running.restart_count}")
            await self._report(running, "Succeeded" if terminated["exitCode"] == 0 else "Failed",
                               {"terminated": terminated}, False)
        await super()._final_delete(pod)

    async def _report(self, running: PodProcess, *args: Any, **kwargs: Any) -> None:
        acting_node.set(running.node)
        await super()._report(running, *args, **kwargs)

    async def _event(self, pod: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in self.node_names:
            acting_node.set(node)
            await super()._event(pod, *args, **kwargs)

    async def _service_account_env(self, running: PodProcess, pod: dict[str, Any]) -> dict[str, str]:
        """A bound token from the TokenRequest API (the Node authorizer lets a node ask for the accounts of its own
        pods), with the cluster's CA, as the projected `kube-api-access` volume holds them."""
        meta = pod["metadata"]
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"audiences": [], "expirationSeconds": 3607,
                            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                                               "uid": meta["uid"]}}}
        reply = await self._as_node_graph_allows(
            lambda: self.api.request("POST", resource_path("serviceaccounts", meta["namespace"], account, "token"),
                                     request))
        return podenv.write_service_account(self.credentials_dir / running.uid, pod, self.api_url,
                                            token=reply["status"]["token"], ca_pem=self.pki.ca_cert.read_text())

    async def _fetch(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._as_node_graph_allows(lambda: super(ClusterKubelet, self)._fetch(plural, namespace, name))

    @staticmethod
    async def _as_node_graph_allows(call: Callable[[], Awaitable[Any]], within: float = GRAPH_LAG_S) -> Any:
        """The Node authorizer allows a node the objects of its pods once its graph has seen the pod bound, which
        trails the binding the kubelet's watch already shows: a 403 then is retried for a while, as a kubelet's
        sync loop retries, instead of failing the pod's start."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            try:
                return await call()
            except ApiStatusError as err:
                if err.code != 403 or asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(0.25)

    def _log_files(self, namespace: str, name: str, container: str) -> Path | None:
        """The log file of a container of a pod this kubelet runs (None when it runs no such pod)."""
        for running in self.pods.values():
            if (running.namespace, running.name) != (namespace, name):
                continue
            pod = self._latest.get(running.uid) or {}
            spec = pod.get("spec") or {}
            containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
            match = next((c for c in containers if c.get("name") == container), None)
            if match is None and not container and spec.get("containers"):
                match = spec["containers"][0]
            return self.container_files(running, match)[0] if match is not None else None
        return None

    def _exec_target(self, namespace: str, name: str, container: str) -> exec_server.Target:
        """The running process of a container of a pod this kubelet runs (its first container's, or a sidecar's),
        with the sandbox it was started in; NotRunning otherwise."""
        for running in self.pods.values():
            spec = (self._latest.get(running.uid) or {}).get("spec") or {}
            if (running.namespace, running.name) != (namespace, name) or not spec.get("containers"):
                continue
            main = spec["containers"][0]
            container = container or main.get("name", "")
            process = running.process if container == main.get("name") else running.sidecars.get(container)
            if process is None or process.returncode is not None:
                continue  # maybe an older pod of that name still terminating
            declared = next(c for c in [*(spec.get("initContainers") or []), main] if c.get("name") == container)
            return exec_server.Target(pid=process.pid, box=sandbox.plan(self._latest[running.uid], declared),
                                      cwd=self.workdir)
        raise exec_server.NotRunning(f"no running container {container!r} in pod {namespace}/{name}")

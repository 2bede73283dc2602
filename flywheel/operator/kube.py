"""A small asyncio Kubernetes client for what the operator writes (kopf does the watching).

Connection settings come from a kubeconfig path (explicit; the `kubernetes` package would read $KUBECONFIG at import
time) or the in-cluster service account. Only JSON, only the calls the operator makes.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from flywheel.timefmt import rfc3339

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeApiError(Exception):
    """A status >= 400 from the Kubernetes API server: the HTTP status and the decoded body (a Status object)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")


@dataclass(frozen=True)
class Connection:
    server: str
    token: str | None = None
    ca_file: str | None = None
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None


def _data_file(data: str, suffix: str) -> str:
    fd, path = tempfile.mkstemp(prefix="flywheel-op-", suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data))
    return path


def load_connection(kubeconfig: str | None) -> Connection:
    """From a kubeconfig's current context, else from the in-cluster service account."""
    if not kubeconfig:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not (SA_DIR / "token").exists():
            raise RuntimeError("no --kubeconfig given and not running in a cluster")
        return Connection(f"https://{host}:{port}", (SA_DIR / "token").read_text().strip(), str(SA_DIR / "ca.crt"))
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    context = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == context["cluster"])
    user: dict[str, Any] = next((u["user"] for u in cfg.get("users", []) if u["name"] == context.get("user")), {}) or {}
    def path_or_data(node: dict[str, Any], field: str, suffix: str) -> str | None:
        if node.get(field):
            return str(node[field])
        return _data_file(node[f"{field}-data"], suffix) if node.get(f"{field}-data") else None

    ca = path_or_data(cluster, "certificate-authority", ".crt")
    cert = path_or_data(user, "client-certificate", ".crt")
    key = path_or_data(user, "client-key", ".key")
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    return Connection(cluster["server"], user.get("token"), ca, insecure, cert, key)


class Kube:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.conn.server.startswith("https"):
            return False
        ctx = ssl.create_default_context(cafile=self.conn.ca_file)
        if self.conn.insecure:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if self.conn.cert_file:
            ctx.load_cert_chain(self.conn.cert_file, self.conn.key_file)
        return ctx

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self.conn.token:
                headers["Authorization"] = f"Bearer {self.conn.token}"
            self._session = aiohttp.ClientSession(
                self.conn.server, headers=headers, timeout=aiohttp.ClientTimeout(total=30),
                connector=aiohttp.TCPConnector(ssl=self._ssl()))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        """The decoded JSON answer (None for an empty body); KubeApiError for any status >= 400."""
        session = await self.session()
        async with session.request(method, path, json=body, params=params,
                                   headers={"Content-Type": content_type}) as resp:
            data = await resp.json(content_type=None) if resp.content_length != 0 else None
            if resp.status >= 400:
                raise KubeApiError(resp.status, data)
            return data

    # paths
    @staticmethod
    def core(namespace: str, plural: str, name: str = "") -> str:
        return f"/api/v1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")

    @staticmethod
    def custom(group: str, version: str, namespace: str, plural: str, name: str = "") -> str:
        return f"/apis/{group}/{version}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.request("GET", path)
            return found
        except KubeApiError as err:
            if err.status == 404:
                return None
            raise

    async def list(self, path: str, label_selector: str = "") -> list[dict[str, Any]]:
        data = await self.request("GET", path, params={"labelSelector": label_selector} if label_selector else None)
        return list(data.get("items", []))

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create; None when it already exists (the caller's next pass will see it)."""
        try:
            created: dict[str, Any] = await self.request("POST", path, body)
            return created
        except KubeApiError as err:
            if err.status == 409:
                return None
            raise

    async def delete(self, path: str, uid: str | None = None, grace_seconds: int | None = None) -> None:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            await self.request("DELETE", path, body)
        except KubeApiError as err:
            if err.status not in (404, 409):  # gone already, or replaced by a newer object (uid precondition)
                raise

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        patched: dict[str, Any] = await self.request("PATCH", path, patch, content_type="application/merge-patch+json")
        return patched

    async def post_event(self, involved: dict[str, Any], event_type: str, reason: str, message: str,
                         component: str = "flywheel-operator", *, count: int = 1, first_time: float | None = None,
                         last_time: float | None = None) -> None:
        """`count`, `first_time`, `last_time` (unix seconds): an event that stands for `count` occurrences between
        those times (default: one, now)."""
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"  # events about cluster-scoped objects (nodes) live there
        ts = rfc3339()
        first = rfc3339(first_time) if first_time is not None else ts
        last = rfc3339(last_time) if last_time is not None else ts
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
            "involvedObject": {"apiVersion": involved["apiVersion"], "kind": involved["kind"], "name": meta["name"],
                               "namespace": meta.get("namespace", ""), "uid": meta["uid"],
                               "resourceVersion": meta.get("resourceVersion", "")},
            "type": event_type, "reason": reason, "message": message[:1024],
            "firstTimestamp": first, "lastTimestamp": last, "count": max(1, count),
            "source": {"component": component}, "reportingComponent": component,
        }
        await self.request("POST", self.core(namespace, "events"), body)

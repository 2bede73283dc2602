"""The product's Kubernetes client (operator and REST API): a small facade (JSON only) over
kubernetes_asyncio's ApiClient, with LIST pages and WATCH streams (kopf does the operator's own watching).

Connection settings come from auth.py: a kubeconfig path (explicit; the `kubernetes` packages would read
$KUBECONFIG themselves) or the in-cluster service account, kept current (exec tokens, rotated service-account tokens).
A request that gets 401 is sent once more after the credentials are renewed. Why this library: docs/operator.md.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
from kubernetes_asyncio.client import ApiClient, Configuration

from flywheel.contracts.timefmt import rfc3339
from flywheel.kube.auth import Connection, Credentials, CredentialsError, KubeConfigError, load_credentials

__all__ = ["Connection", "Credentials", "CredentialsError", "Kube", "KubeApiError", "KubeConfigError",
           "load_credentials"]

LIST_PAGE = 500  # items per LIST page (limit/continue), as kubectl's default chunk size
REQUEST_TIMEOUT = 30.0
_TIMEOUT = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)


class KubeApiError(Exception):
    """A status >= 400 from the Kubernetes API server: the HTTP status and the decoded body (a Status object)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")


class _Transport:
    """One ApiClient for one set of TLS settings. The library's aiohttp session has trust_env=True, with which
    aiohttp looks up proxies and .netrc on every request (measured: ~3x the client CPU of the request itself); ours
    shares its connector without that (a proxy comes from the kubeconfig's proxy-url).

    A request goes out through the ApiClient's session, headers and auth settings (`send`), but not through its
    call_api: that walks every body to rebuild it before encoding (sanitize_for_serialization, for its generated
    model objects; ours are plain JSON data), ~4% of the operator's CPU in a burst of jobs."""

    def __init__(self, conn: Connection) -> None:
        self.built_for = conn.transport()
        configuration = Configuration(host=conn.server)
        configuration.ssl_ca_cert, configuration.verify_ssl = conn.ca_file, not conn.insecure
        configuration.cert_file, configuration.key_file, configuration.proxy = conn.cert_file, conn.key_file, conn.proxy
        self.configuration = configuration
        self.api = ApiClient(configuration)
        self._library_session = self.api.rest_client.pool_manager
        self.api.rest_client.pool_manager = aiohttp.ClientSession(
            connector=self._library_session.connector, connector_owner=False, read_bufsize=2**21)

    async def send(self, method: str, path: str, body: Any, params: dict[str, str] | None, content_type: str,
                   timeout: aiohttp.ClientTimeout = _TIMEOUT) -> aiohttp.ClientResponse:
        """The response, unread (the caller reads and releases it)."""
        headers = {**self.api.default_headers, "Content-Type": content_type, "Accept": "application/json"}
        await self.api.update_params_for_auth(headers, [], ["BearerToken"])
        rest = self.api.rest_client
        url = f"{self.configuration.host}{path}" + (f"?{urlencode(params)}" if params else "")
        return await rest.pool_manager.request(
            method, url, headers=headers, data=None if body is None else json.dumps(body), timeout=timeout,
            proxy=rest.proxy, proxy_headers=rest.proxy_headers, server_hostname=rest.server_hostname)

    def use_token(self, token: str | None) -> None:
        if token:
            self.configuration.api_key["BearerToken"] = f"Bearer {token}"
        else:
            self.configuration.api_key.pop("BearerToken", None)

    async def close(self) -> None:
        await self.api.close()
        await self._library_session.close()


class Kube:
    def __init__(self, source: Connection | Credentials) -> None:
        self.credentials = source if isinstance(source, Credentials) else Credentials(source)
        self._transport: _Transport | None = None

    @property
    def conn(self) -> Connection:
        return self.credentials.conn

    async def _current(self) -> tuple[_Transport, Connection]:
        """The transport for the current credentials, and those credentials (a 401 renews them since those)."""
        conn = await self.credentials.current()
        if self._transport is not None and self._transport.built_for != conn.transport():
            await self._transport.close()  # new TLS settings (e.g. an exec plugin's new client certificate)
            self._transport = None
        if self._transport is None:
            self._transport = _Transport(conn)
        self._transport.use_token(conn.token)
        return self._transport, conn

    async def close(self) -> None:
        if self._transport is not None:
            await self._transport.close()
            self._transport = None
        self.credentials.close()

    async def _send(self, method: str, path: str, body: Any, params: dict[str, str] | None,
                    content_type: str) -> tuple[int, Any, Connection]:
        transport, conn = await self._current()
        response = await transport.send(method, path, body, params, content_type)
        try:
            raw = await response.read()
        finally:
            response.release()
        return response.status, (json.loads(raw) if raw else None), conn

    async def request(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        """The decoded JSON answer (None for an empty body); KubeApiError for any status >= 400. After a 401 the
        credentials are renewed (token file re-read, exec plugin run again) and, if they changed, the call retried."""
        status, data, used = await self._send(method, path, body, params, content_type)
        # Concurrent 401s with one token share one renewal (auth.Credentials.renew).
        if status == 401 and await self.credentials.renew(used):
            status, data, _ = await self._send(method, path, body, params, content_type)
        if status >= 400:
            raise KubeApiError(status, data)
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

    async def list_versioned(self, path: str, label_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        """Every item, page by page, and the list's resourceVersion (where a watch of the same path resumes). All
        pages are one snapshot; when it is compacted away between pages (410 Expired, after ~5 minutes on a busy
        cluster), the list is taken again in one piece, as client-go's pager does: the rest from the Status's
        inconsistent token would mix two states, and a watch cannot resume from either."""
        selector = {"labelSelector": label_selector} if label_selector else {}
        params = {"limit": str(LIST_PAGE), **selector}
        items: list[dict[str, Any]] = []
        while True:
            try:
                data = await self.request("GET", path, params=params)
            except KubeApiError as err:
                if err.status != 410 or "continue" not in params:
                    raise
                params, items = selector, []
                continue
            items.extend(data.get("items", []))
            meta = data.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion") or "")
            params = {**params, "continue": meta["continue"]}

    async def list(self, path: str, label_selector: str = "") -> list[dict[str, Any]]:
        """Every item, page by page (limit/continue)."""
        items, _ = await self.list_versioned(path, label_selector)
        return items

    async def watch(self, path: str, resource_version: str, label_selector: str = "",
                    timeout_seconds: int = 60) -> AsyncIterator[dict[str, Any]]:
        """The watch events (`{"type": ..., "object": ...}`, bookmarks included) of `path` from `resource_version`,
        until the server ends the watch (after `timeout_seconds`). An ERROR event (410 Gone: the version is too
        old) is yielded like the others; the caller relists. A refused watch raises KubeApiError; 401 renews the
        credentials first, so the caller's next watch uses the fresh ones."""
        params = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_seconds),
                  **({"labelSelector": label_selector} if label_selector else {})}
        transport, used = await self._current()
        response = await transport.send("GET", path, None, params, "application/json", timeout=aiohttp.ClientTimeout(
            connect=REQUEST_TIMEOUT, sock_read=timeout_seconds + REQUEST_TIMEOUT))
        try:
            if response.status >= 400:
                raw = await response.read()
                if response.status == 401:
                    await self.credentials.renew(used)
                raise KubeApiError(response.status, json.loads(raw) if raw else None)
            async for line in response.content:  # one JSON event per line
                if line.strip():
                    yield json.loads(line)
        finally:
            response.release()

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

"""A minimal asyncio client of the Kubernetes REST API, for the process kubelet (it talks HTTP to the API
like a real kubelet, so it also works against any API server URL without auth; it sends KUBELET_TOKEN, which the
emulated API server accepts when it checks tokens)."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

KUBELET_TOKEN = "system:node:process-kubelet"


class ApiStatusError(Exception):
    def __init__(self, code: int, body: Any) -> None:
        super().__init__(f"HTTP {code}: {body}")
        self.code, self.body = code, body


def resource_path(plural: str, namespace: str | None = None, name: str | None = None,
                  subresource: str | None = None, group_version: str = "v1") -> str:
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    path = prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def new_session(token: str | None = None, ssl_context: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(ssl=ssl_context) if ssl_context is not None else None
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), headers=headers,
                                 connector=connector)


class KubeHttpClient:
    """Subclasses may pick the session per request (the real cluster's kubelet: one identity per node)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = new_session(KUBELET_TOKEN)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        data = json.dumps(body) if body is not None else None
        async with self.session.request(method, self.base_url + path, data=data, params=params,
                                        headers={"Content-Type": content_type},
                                        timeout=aiohttp.ClientTimeout(total=30)) as response:
            payload = await response.json(content_type=None)
            if response.status >= 400:
                raise ApiStatusError(response.status, payload)
            return payload

    async def get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path)
        except ApiStatusError as err:
            if err.code == 404:
                return None
            raise

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return await self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    async def watch(self, path: str, resource_version: str, timeout_seconds: int = 300,
                    params: dict[str, str] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events until the server ends the stream."""
        params = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": str(timeout_seconds),
                  "allowWatchBookmarks": "true", **(params or {})}
        async with self.session.get(self.base_url + path, params=params) as response:
            if response.status >= 400:
                raise ApiStatusError(response.status, await response.text())
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)

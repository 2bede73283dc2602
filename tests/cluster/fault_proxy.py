"""A fault proxy in front of kube-apiserver: the tests' clients (kubectl, the operator, kopf) reach the API through it,
so a test can end every watch stream, hold all requests, or answer the next writes to one object with a 409 (or
any status) without touching the server. Everything else passes through as is, watch streams and WebSocket
upgrades (`kubectl exec`: ws_relay.py) included.

It terminates TLS with the API server's own certificate (the same CA and address) and forwards the bearer token,
so authentication and authorization stay the API server's. The process kubelet talks to the API server directly:
its nodes authenticate by client certificate, which a terminating proxy cannot pass on."""

from __future__ import annotations

import asyncio
import re
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from tests.cluster import ws_relay
from tests.cluster.logs_server import serve_tls
from tests.cluster.pki import Pki
from tests.etcd_process import free_port

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}


@dataclass
class Injected:
    """The next `count` requests matching `pattern` (a regex over "METHOD /path") get `code` and `reason`."""
    pattern: re.Pattern[str]
    code: int
    reason: str
    message: str
    count: int


class FaultProxy:
    def __init__(self, upstream_url: str, pki: Pki) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.pki = pki
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.injected: list[Injected] = []
        self.open = asyncio.Event()
        self.open.set()
        self._streams: dict[int, web.Request] = {}  # by id: requests are not hashable
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        upstream_tls = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=upstream_tls, limit=0),
                                              auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(self.pki.cert("apiserver")), str(self.pki.key("apiserver")))
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        self.port = await serve_tls(self._runner, self.port, serving)
        self.url = f"https://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self.open.set()
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # ---- faults (call on the proxy's loop) ------------------------------------------------------------------
    def drop_watches(self) -> int:
        """End every watch stream open now, as an API server restart or a broken connection would."""
        dropped = 0
        for request in list(self._streams.values()):
            if request.transport is not None:
                request.transport.close()
                dropped += 1
        return dropped

    def pause(self) -> None:
        self.open.clear()

    def resume(self) -> None:
        self.open.set()

    def force_conflict(self, resource: str, namespace: str, name: str, group: str = "", count: int = 1) -> None:
        """The next `count` updates of the object (PUT or PATCH, its status included) fail with 409 Conflict."""
        prefix = "/api/v1" if not group else f"/apis/{re.escape(group)}/[^/]+"
        pattern = re.compile(rf"^(PUT|PATCH) {prefix}/namespaces/{re.escape(namespace)}/{re.escape(resource)}/"
                             rf"{re.escape(name)}(/status)?$")
        message = (f'Operation cannot be fulfilled on {resource}{"." + group if group else ""} "{name}": the object '
                   "has been modified; please apply your changes to the latest version and try again")
        self.injected.append(Injected(pattern, 409, "Conflict", message, count))

    def fail_next(self, pattern: str, code: int, count: int = 1, reason: str = "InternalError") -> None:
        """The next `count` requests whose "METHOD /path" matches `pattern` get `code` (429, 500, 503...)."""
        self.injected.append(Injected(re.compile(pattern), code, reason, f"injected by the test cluster: {code}",
                                      count))

    @property
    def watch_count(self) -> int:
        return len(self._streams)

    # ---- forwarding -----------------------------------------------------------------------------------------
    def _injected(self, request: web.Request) -> web.Response | None:
        line = f"{request.method} {request.path}"
        for fault in self.injected:
            if fault.count > 0 and fault.pattern.search(line):
                fault.count -= 1
                body = _status(fault.code, fault.reason, fault.message)
                headers = {"Retry-After": "1"} if fault.code == 429 else {}
                return web.json_response(body, status=fault.code, headers=headers)
        return None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        await self.open.wait()
        injected = self._injected(request)
        if injected is not None:
            return injected
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if ws_relay.is_websocket(request):
            return await ws_relay.relay(request, self._session, self.upstream_url + request.rel_url.raw_path_qs,
                                        headers)
        body = await request.read()
        watching = request.query.get("watch") in ("true", "1")
        try:
            # aiohttp would add a Content-Type of its own (octet-stream) where the caller sent none; the API server
            # takes none for JSON and refuses octet-stream (415).
            upstream = await self._session.request(request.method, self.upstream_url + request.rel_url.raw_path_qs,
                                                   headers=headers, data=body or None, allow_redirects=False,
                                                   skip_auto_headers=("Content-Type",))
        except aiohttp.ClientError as err:
            return web.json_response(_status(503, "ServiceUnavailable", f"the API server is unreachable: {err}"),
                                     status=503)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await response.prepare(request)
            if watching:
                self._streams[id(request)] = request
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, ConnectionResetError):
                if request.transport is not None:  # the API server ended it: so does the client's stream
                    request.transport.close()
            finally:
                self._streams.pop(id(request), None)
        return response


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}

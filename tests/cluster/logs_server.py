"""The kubelet's HTTPS endpoint that the API server proxies `kubectl logs` to: `/containerLogs/<ns>/<pod>/<container>`
with `tailLines`, `limitBytes` and `follow`; and `kubectl exec` to: `/exec/...` (exec_server.py). It serves over the
kubelet's serving certificate (the API server checks it against the cluster CA; it presents its kubelet-client
certificate, which is not checked here: loopback only)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from tests.cluster.exec_server import Resolve, handle_exec
from tests.cluster.pki import Pki
from tests.etcd_process import free_port

LogFile = Callable[[str, str, str], Path | None]
FOLLOW_POLL_S = 0.2


async def serve_tls(runner: web.AppRunner, port: int, context: ssl.SSLContext, attempts: int = 3) -> int:
    """Serve `runner` on loopback `port`, or on another free one when that was taken between choosing it and the bind
    (another test process starting a cluster): the port it serves on."""
    for attempt in range(1, attempts + 1):
        try:
            await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
            return port
        except OSError:
            if attempt == attempts:
                raise
            port = free_port()
    raise AssertionError("unreachable")


def tail(data: bytes, lines: int) -> bytes:
    if lines < 0:
        return data
    if lines == 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


class LogsServer:
    def __init__(self, pki: Pki, log_dir: Path, log_file: LogFile, exec_target: Resolve | None = None) -> None:
        self.pki, self.log_dir, self.log_file, self.exec_target = pki, log_dir, log_file, exec_target
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        app.router.add_get("/healthz", self._healthz)
        if self.exec_target is not None:
            for method in ("GET", "POST"):  # WebSocket upgrades come as GET, SPDY ones as POST
                app.router.add_route(method, "/exec/{namespace}/{pod}/{container}", self._exec)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.pki.cert("kubelet")), str(self.pki.key("kubelet")))
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        self.port = await serve_tls(self._runner, self.port, context)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        assert self.exec_target is not None
        return await handle_exec(request, self.exec_target)

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        ns, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        path = self.log_file(ns, pod, container)
        if path is None:
            return web.Response(status=404, text=f'container "{container}" in pod "{pod}" is not known here')
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        data = tail(data, int(request.query.get("tailLines", "-1")))
        if "limitBytes" in request.query:
            data = data[:int(request.query["limitBytes"])]
        if request.query.get("follow") not in ("true", "1"):
            return web.Response(body=data, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        offset = path.stat().st_size if path.exists() else 0
        while self.log_file(ns, pod, container) is not None:
            await asyncio.sleep(FOLLOW_POLL_S)
            size = path.stat().st_size if path.exists() else 0
            if size > offset:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    await response.write(handle.read(size - offset))
                offset = size
        return response

"""WebSocket requests through the fault proxy (`kubectl exec`, `attach`, `port-forward` of kubectl 1.37): the proxy
opens the same upgrade to the API server with the client's subprotocols and credentials, answers the client with
the subprotocol the API server chose, and relays every message both ways until either side closes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import aiohttp
from aiohttp import web

WEBSOCKET_HEADERS = {"sec-websocket-key", "sec-websocket-version", "sec-websocket-protocol",
                     "sec-websocket-extensions"}


def is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


async def relay(request: web.Request, session: aiohttp.ClientSession, url: str,
                headers: Mapping[str, str]) -> web.StreamResponse:
    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    forwarded = {k: v for k, v in headers.items() if k.lower() not in WEBSOCKET_HEADERS}
    try:
        upstream = await session.ws_connect(url, protocols=protocols, headers=forwarded, autoping=False,
                                            max_msg_size=0)
    except aiohttp.WSServerHandshakeError as err:  # the API server's refusal (401, 403, 404...), as it said it
        return web.Response(status=err.status, text=err.message)
    client = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else (), autoping=False,
                                   max_msg_size=0)
    await client.prepare(request)
    pumps = [asyncio.create_task(_pump(upstream, client)), asyncio.create_task(_pump(client, upstream))]
    await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    for pump in pumps:
        pump.cancel()
    with contextlib.suppress(Exception):
        await upstream.close()
    with contextlib.suppress(Exception):
        await client.close()
    return client


async def _pump(source: aiohttp.ClientWebSocketResponse | web.WebSocketResponse,
                sink: aiohttp.ClientWebSocketResponse | web.WebSocketResponse) -> None:
    code = None
    while True:
        message = await source.receive()
        if message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        elif message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.PING:
            await sink.ping(message.data)
        elif message.type == aiohttp.WSMsgType.PONG:
            await sink.pong(message.data)
        else:
            # The close frame's own code: a server that drops the connection right after its close frame (the API
            # server relaying a real kubelet's exec) leaves `close_code` at 1006, which kubectl takes for a failure.
            code = message.data if message.type == aiohttp.WSMsgType.CLOSE else None
            break
    if not sink.closed:  # pass the close on, with its code
        await sink.close(code=code or source.close_code or aiohttp.WSCloseCode.OK)

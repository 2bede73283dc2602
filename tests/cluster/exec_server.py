"""The kubelet's `/exec/<ns>/<pod>/<container>` for `kubectl exec`, over the WebSocket protocol `v5.channel.k8s.io`
(or v4). The node declares `ExtendWebSocketsToKubelet` in its status, so kube-apiserver proxies kubectl's WebSocket
upgrade to the kubelet as it is instead of translating it to SPDY, which this kubelet does not speak.

Each binary message starts with its channel: 0 stdin, 1 stdout, 2 stderr, 3 the exit status (a metav1.Status),
4 terminal resizes (ignored: no tty); v5's `[255, channel]` closes a channel (stdin's end of file).

The command runs "in the container": in the mount namespace of the container's process (its read-only root, its
/dev/shm, its /etc/passwd), as its user and capabilities (sandbox.py's setpriv), with the environment it was started
with (read back from /proc) and the kubelet's working directory for it. There is no PID namespace: like a probe, the
command sees all of the host's processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from tests.kubelet import sandbox

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 32 * 1024
# The kubelet's names of kubectl's stdin, stdout, stderr and tty options: the API server renames them when it proxies.
STREAM_PARAMS = ("input", "output", "error", "tty")


@dataclass(frozen=True)
class Target:
    """A running container to exec in: its process and the sandbox the kubelet started it in."""
    pid: int
    box: sandbox.Sandbox
    cwd: Path


class NotRunning(Exception):
    """The pod or container is not one this kubelet runs now (the kubelet's 404)."""


Resolve = Callable[[str, str, str], Target]


def status(code: int, command: list[str], message: str = "") -> dict[str, Any]:
    """The metav1.Status of channel 3: what kubectl turns into its own exit code."""
    if message:
        return {"metadata": {}, "status": "Failure", "reason": "InternalError", "code": 500,
                "message": f"Internal error occurred: error executing command in container: {message}"}
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: error executing command {command}, "
                       f"exit code {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def container_env(pid: int) -> dict[str, str]:
    """The environment the container's process was started with (the kubelet's, with the service account's)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(): value.decode(errors="replace") for key, value in pairs}


def missing(command: list[str], env: dict[str, str], cwd: Path) -> str:
    """Why `command` cannot be started (a runtime's message), or "" when its program is there."""
    if not command:
        return "no command given"
    program = command[0]
    if "/" in program:
        found = os.access(cwd / program, os.X_OK) and (cwd / program).is_file()
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
    return "" if found else f'exec: "{program}": executable file not found in $PATH'


def exec_argv(target: Target, command: list[str]) -> list[str]:
    """`command` in the container's mount namespace (its mounts are already there: none is made again), then as
    its user through the same setpriv as its start (sandbox.wrap's own unshare only nests a private copy)."""
    identity = dataclasses.replace(target.box, writable=(), read_only=(), overlays=(), shm="", read_only_root=False)
    return ["nsenter", f"--target={target.pid}", "--mount", f"--wd={target.cwd}", "--",
            *sandbox.wrap(command, identity)]


class ExecSession:
    """One exec: the process and the WebSocket it talks through."""

    def __init__(self, ws: web.WebSocketResponse, process: asyncio.subprocess.Process) -> None:
        self.ws, self.process = ws, process
        self.v5 = ws.ws_protocol == PROTOCOLS[0]

    async def run(self) -> int:
        """Pump the streams until the process has exited and its output is sent; its exit code."""
        pumps = [asyncio.create_task(self._pump(stream, channel)) for stream, channel in
                 ((self.process.stdout, STDOUT), (self.process.stderr, STDERR)) if stream is not None]
        reader = asyncio.create_task(self._read_client())
        done = asyncio.gather(self.process.wait(), *pumps)
        try:
            await asyncio.wait({done, reader}, return_when=asyncio.FIRST_COMPLETED)
            if not done.done():  # the client went away first
                raise ConnectionResetError("the client closed the exec stream")
            code = done.result()[0]
            return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
        finally:
            reader.cancel()
            done.cancel()
            with contextlib.suppress(ProcessLookupError):
                if self.process.returncode is None:
                    os.killpg(self.process.pid, signal.SIGKILL)

    async def _pump(self, stream: asyncio.StreamReader, channel: int) -> None:
        while chunk := await stream.read(CHUNK):
            await self.ws.send_bytes(bytes([channel]) + chunk)

    async def _read_client(self) -> None:
        """Stdin's data and end (v5's close signal); the resize channel is ignored without a tty."""
        stdin = self.process.stdin
        async for message in self.ws:
            if message.type != WSMsgType.BINARY or not message.data:
                continue
            channel, data = message.data[0], message.data[1:]
            if channel == STDIN and stdin is not None and data:
                stdin.write(data)
                with contextlib.suppress(ConnectionError):
                    await stdin.drain()
            elif self.v5 and channel == CLOSE and data[:1] == bytes([STDIN]) and stdin is not None:
                stdin.close()


async def handle_exec(request: web.Request, resolve: Resolve) -> web.StreamResponse:
    ns, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
    command = request.query.getall("command", [])
    ws = web.WebSocketResponse(protocols=PROTOCOLS, autoping=True)
    ready = ws.can_prepare(request)
    if not ready.ok:  # SPDY: the API server sends it only to a node that does not declare WebSockets
        return web.Response(status=400, text="Upgrade request required (this kubelet speaks WebSocket only)")
    if ready.protocol is None:
        return web.Response(status=400, text=f"no supported subprotocol; this kubelet speaks {', '.join(PROTOCOLS)}")
    try:
        target = resolve(ns, pod, container)
        env = container_env(target.pid)
    except (NotRunning, OSError) as err:
        return web.Response(status=404, text=f"container not found ({container!r} in pod {ns}/{pod}): {err}")
    await ws.prepare(request)
    flag = {name: request.query.get(name) in ("1", "true") for name in STREAM_PARAMS}
    why = "a tty is not supported by the process kubelet" if flag["tty"] else missing(command, env, target.cwd)
    if why:
        return await _finish(ws, status(0, command, why))
    pipe = asyncio.subprocess.PIPE
    process = await asyncio.create_subprocess_exec(
        *exec_argv(target, command), env=env, cwd=target.cwd, start_new_session=True,
        stdin=pipe if flag["input"] else asyncio.subprocess.DEVNULL,
        stdout=pipe if flag["output"] else asyncio.subprocess.DEVNULL,
        stderr=pipe if flag["error"] else asyncio.subprocess.DEVNULL)
    try:
        code = await ExecSession(ws, process).run()
    except ConnectionError:
        return ws
    return await _finish(ws, status(code, command))


async def _finish(ws: web.WebSocketResponse, result: dict[str, Any]) -> web.WebSocketResponse:
    """The exit status on channel 3, then a normal close: kubectl's readers see the end of every stream."""
    with contextlib.suppress(ConnectionError):
        await ws.send_bytes(bytes([ERROR]) + json.dumps(result).encode())
    await ws.close()
    return ws

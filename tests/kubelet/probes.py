"""Container probes as the kubelet runs them (core/v1 Probe; the Kubernetes docs' "Configure Liveness, Readiness
and Startup Probes" and "Pod Lifecycle: Container probes"), for the process kubelet's first container.

- startupProbe: the other probes wait until it succeeds; failureThreshold failures in a row kill the container.
- livenessProbe: failureThreshold failures in a row kill the container (preStop, SIGTERM, SIGKILL after the probe's
  terminationGracePeriodSeconds, else the pod's); its restartPolicy then decides, as for any exit.
- readinessProbe: the container starts not ready (the default before the first probe is Failure), turns ready after
  successThreshold successes in a row and not ready after failureThreshold failures in a row. A container without
  one is ready once started (after its startupProbe, if it has one).
- Each probe runs first initialDelaySeconds after the container started, then every periodSeconds; an attempt
  longer than timeoutSeconds fails. Every failed attempt is a Warning `Unhealthy` event ("Liveness probe failed:
  ..."), a kill a `Killing` event ("Container c failed liveness probe, will be restarted").
- Handlers: httpGet (host: the pod's IP unless given; port: a number or a container port's name; success for a
  status >= 200 and < 400), tcpSocket (a connection opens), exec (the command, with the container's environment,
  exits 0). grpc is not run here: such a probe always passes (docs/test-cluster.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

KINDS = (("startupProbe", "Startup"), ("livenessProbe", "Liveness"), ("readinessProbe", "Readiness"))


@dataclass(frozen=True)
class Probe:
    kind: str  # Startup, Liveness or Readiness: the word the kubelet's events use
    spec: Mapping[str, Any]

    def seconds(self, field: str, default: int) -> float:
        return float(self.spec.get(field) or default)

    @property
    def failure_threshold(self) -> int:
        return int(self.spec.get("failureThreshold") or 3)

    @property
    def success_threshold(self) -> int:
        return int(self.spec.get("successThreshold") or 1) if self.kind == "Readiness" else 1


def probes_of(container: Mapping[str, Any]) -> dict[str, Probe]:
    """The container's probes by kind."""
    return {kind: Probe(kind, container[field]) for field, kind in KINDS if container.get(field)}


def ready_at_start(container: Mapping[str, Any]) -> bool:
    """Whether the container is ready as soon as it runs: it has neither a readiness nor a startup probe."""
    return not ({"Readiness", "Startup"} & set(probes_of(container)))


async def attempt(probe: Probe, container: Mapping[str, Any], pod_ip: str, env: Mapping[str, str]) -> str | None:
    """One try of the probe: None when it passed, else why it failed (in the kubelet's words)."""
    timeout = probe.seconds("timeoutSeconds", 1)
    try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that meets its timeout
        async with asyncio.timeout(timeout):
            return await run_handler(probe.spec, container, pod_ip, env)
    except TimeoutError:
        return timed_out(probe.spec, container, pod_ip)


async def run_handler(action: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str,
                      env: Mapping[str, str]) -> str | None:
    """A probe's or a lifecycle hook's handler (httpGet, tcpSocket or exec) run once, without a time limit: None
    when it passed, else why not. No handler (grpc, here): passed."""
    http, tcp, command = action.get("httpGet"), action.get("tcpSocket"), action.get("exec")
    try:
        if http:
            return await _http_get(_url(http, container, pod_ip), http)
        if tcp:
            return await _tcp_socket(*_address(tcp, container, pod_ip))
    except ValueError as err:  # a port name the container does not declare
        return str(err)
    if command:
        return await _exec(list(command.get("command") or []), env)
    return None


def timed_out(action: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str) -> str:
    """Why a handler that ran out of time failed, in the kubelet's words."""
    http, tcp, command = action.get("httpGet"), action.get("tcpSocket"), action.get("exec") or {}
    with contextlib.suppress(ValueError):
        if http:
            return f'Get "{_url(http, container, pod_ip)}": context deadline exceeded (Client.Timeout exceeded ' \
                   'while awaiting headers)'
        if tcp:
            host, port = _address(tcp, container, pod_ip)
            return f"dial tcp {host}:{port}: i/o timeout"
    return f"command {command.get('command')!r} timed out"


def hook_failed(hook: Mapping[str, Any], container: Mapping[str, Any], pod: Mapping[str, Any], why: str) -> str:
    """A failed lifecycle hook, as the kubelet's FailedPreStopHook/FailedPostStartHook events say it."""
    what = f"Exec lifecycle hook ({hook['exec'].get('command')})" if hook.get("exec") else \
        f"HTTP lifecycle hook ({(hook.get('httpGet') or {}).get('path') or '/'})"
    meta = pod["metadata"]
    return (f"{what} for Container \"{container.get('name', '')}\" in Pod \"{meta['name']}_{meta['namespace']}"
            f"({meta['uid']})\" failed - error: {why}")


def _port(port: Any, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    named = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
    if named.get(port) is None:
        raise ValueError(f"port {port!r} is not a named port of the container")
    return int(named[port])


def _url(action: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str) -> str:
    scheme = str(action.get("scheme") or "HTTP").lower()
    port = _port(action.get("port"), container)
    return f"{scheme}://{action.get('host') or pod_ip}:{port}{action.get('path') or '/'}"


def _address(action: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str) -> tuple[str, int]:
    return str(action.get("host") or pod_ip), _port(action.get("port"), container)


async def _http_get(url: str, action: Mapping[str, Any]) -> str | None:
    headers = {h["name"]: h.get("value", "") for h in action.get("httpHeaders") or []}
    headers.setdefault("User-Agent", "kube-probe/1.37")
    try:
        async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=False) as response:
            if 200 <= response.status < 400:
                return None
            return f"HTTP probe failed with statuscode: {response.status}"
    except aiohttp.ClientConnectorError as err:
        return f'Get "{url}": dial tcp {err.host}:{err.port}: connect: {_said(err.os_error)}'
    except (aiohttp.ClientError, OSError) as err:
        return f'Get "{url}": {err}'


def _said(err: OSError) -> str:
    """An OS error as Go's net package words it ("connection refused")."""
    return os.strerror(err.errno).lower() if err.errno else str(err)


async def _tcp_socket(host: str, port: int) -> str | None:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError as err:
        return f"dial tcp {host}:{port}: connect: {_said(err)}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def _exec(command: list[str], env: Mapping[str, str]) -> str | None:
    try:
        proc = await asyncio.create_subprocess_exec(*command, env=dict(env), stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT,
                                                    stdin=asyncio.subprocess.DEVNULL)
    except OSError as err:
        return f"exec {command!r}: {err}"
    try:
        out, _ = await proc.communicate()
    except asyncio.CancelledError:  # the probe's timeout, or the runner stopped: the command goes too
        proc.kill()
        await asyncio.shield(proc.wait())
        raise
    if proc.returncode == 0:
        return None
    return out.decode(errors="replace").strip() or f"command {command!r} exited with {proc.returncode}"


Event = Callable[[str, str, str], Awaitable[None]]  # (type, reason, message)


class ProbeRunner:
    """Runs a started container's probes until it is killed for one or `stop`ped (the container ended)."""

    def __init__(self, container: Mapping[str, Any], pod_ip: str, env: Mapping[str, str], *,
                 set_ready: Callable[[bool, bool], Awaitable[None]], kill: Callable[[Probe], Awaitable[None]],
                 event: Event) -> None:
        """set_ready(started, ready) reports the container's state; kill(probe) kills it for that probe."""
        self.container, self.pod_ip, self.env = container, pod_ip, env
        self.probes = probes_of(container)
        self.set_ready, self.kill, self.event = set_ready, kill, event
        self.ready = ready_at_start(container)
        self.started = "Startup" not in self.probes
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> None:
        if self.probes:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """The container ended: no probe runs or reports after this returns."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5)  # a probe that ignores its cancellation reports nothing

    async def _run(self) -> None:
        if "Startup" in self.probes and not await self._loop(self.probes["Startup"], self._on_startup):
            return
        loops = [self._loop(self.probes[kind], handle) for kind, handle in
                 (("Liveness", self._on_liveness), ("Readiness", self._on_readiness)) if kind in self.probes]
        await asyncio.gather(*loops)

    async def _loop(self, probe: Probe, handle: Callable[[Probe, int, int], Awaitable[bool]]) -> bool:
        """Probe until `handle` (given the successes and failures in a row) says stop; whether it ended well."""
        await asyncio.sleep(probe.seconds("initialDelaySeconds", 0))
        successes = failures = 0
        while True:
            why = await attempt(probe, self.container, self.pod_ip, self.env)
            if self._stopped:
                return False
            if why is None:
                successes, failures = successes + 1, 0
            else:
                successes, failures = 0, failures + 1
                await self.event("Warning", "Unhealthy", f"{probe.kind} probe failed: {why}")
            done = await handle(probe, successes, failures)
            if done:
                return failures == 0
            await asyncio.sleep(probe.seconds("periodSeconds", 10))

    async def _on_startup(self, probe: Probe, successes: int, failures: int) -> bool:
        if successes:
            self.started = True
            self.ready = "Readiness" not in self.probes
            await self.set_ready(True, self.ready)
            return True
        return await self._on_liveness(probe, successes, failures)

    async def _on_liveness(self, probe: Probe, successes: int, failures: int) -> bool:
        if failures < probe.failure_threshold:
            return False
        name = self.container.get("name", "")
        await self.event("Normal", "Killing",
                         f"Container {name} failed {probe.kind.lower()} probe, will be restarted")
        await self.kill(probe)
        return True

    async def _on_readiness(self, probe: Probe, successes: int, failures: int) -> bool:
        ready = True if successes >= probe.success_threshold else False if failures >= probe.failure_threshold \
            else self.ready
        if ready != self.ready:
            self.ready = ready
            await self.set_ready(self.started, ready)
        return False

"""A pod's first container as the process kubelet runs it (kubelet.py): the process record, and the lifecycle around
the process -- the postStart hook before it is Running, its probes while it runs (probes.py), the preStop hook and
the kill when a probe or hook fails or the pod is deleted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from flywheel.local import procs
from tests.kubelet import podenv, probes

PRE_STOP_EXTENSION_S = 2.0  # what the kubelet grants SIGTERM after a preStop hook that used the whole grace period


def crash_backoff(restarts: int) -> float:
    """Seconds before a failed container's restart number `restarts` (CrashLoopBackOff): the kubelet's doubling, from
    0.5 s and capped at 5 s here (10 s to 300 s on a cluster)."""
    return min(0.5 * 2 ** (restarts - 1), 5.0)

@dataclass
class PodProcess:
    uid: str
    namespace: str
    name: str
    node: str
    process: asyncio.subprocess.Process | None = None
    restart_count: int = 0
    started_at: str = ""
    terminating: bool = False
    oom_killed: bool = False
    last_terminated: dict[str, Any] | None = None
    config_error: str = ""  # the last CreateContainerConfigError, so its event is posted once
    env: dict[str, str] = field(default_factory=dict)  # the container's, for its exec probes
    task: asyncio.Task[None] | None = None
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    # Init containers (init_containers.py): their statuses by name, the running sidecars, whether all are done.
    initialized: bool = True
    init_statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    sidecars: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    sidecar_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    finishing: bool = False  # the main container has ended for good: sidecars are stopped, not restarted
    last_report: tuple[Any, ...] = ()  # the arguments of the last status report (a sidecar's change repeats it)

    def signal(self, sig: int) -> None:
        """SIGTERM goes to the container's process group, as the runtime sends it to PID 1 (torch's agent passes
        it on to the ranks). SIGKILL and the freeze of a lost node (SIGSTOP/SIGCONT) reach every process below it,
        as a cgroup kill or a dead machine does: torch's agent starts each rank in a session of its own, which
        the process group alone would miss."""
        signal_process(self.process, sig)

    def signal_pod(self, sig: int) -> None:
        """`signal` to every container of the pod: the one running and its sidecars (a lost node, a gone pod)."""
        for process in (self.process, *self.sidecars.values()):
            signal_process(process, sig)


def signal_process(process: asyncio.subprocess.Process | None, sig: int) -> None:
    """PodProcess.signal for one container's process."""
    if process is None or process.returncode is not None:
        return
    below = procs.descendants(process.pid) if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT) else []
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


class KubeletPart:
    """What the kubelet's parts (mixed into ProcessKubelet) use of it: the pods it last saw, its status report and
    its events."""

    _latest: dict[str, dict[str, Any]]

    async def _report(self, running: PodProcess, phase: str, state: dict[str, Any], ready: bool,
                      reason: str = "", started: bool | None = None) -> None:
        raise NotImplementedError

    async def _event(self, pod: dict[str, Any], reason: str, message: str, component: str = "kubelet",
                     kind: str = "Normal") -> None:
        raise NotImplementedError


class ContainerLifecycle(KubeletPart):
    """The container's hooks and probes, mixed into ProcessKubelet."""

    async def _running(self, running: PodProcess, pod: dict[str, Any], started: str) -> int:
        """A started container until it exits: its postStart hook, then Running with its probes; its exit code."""
        assert running.process is not None
        if not await self._post_start(running, pod):
            return await running.process.wait()  # killed for its failed hook: never Running
        prober = self._prober(running, pod, {"running": {"startedAt": started}})
        await self._report(running, "Running", {"running": {"startedAt": started}}, prober.ready,
                           started=prober.started)
        await self._event(pod, "Started", f"Started container {pod['spec']['containers'][0]['name']} "
                          f"(pid {running.process.pid})")
        prober.start()
        code = await running.process.wait()
        await prober.stop()
        return code

    async def _post_start(self, running: PodProcess, pod: dict[str, Any]) -> bool:
        """The container's `lifecycle.postStart` hook, right after its start; the container is Running only once
        the hook is done. A failed hook is a `FailedPostStartHook` Warning and kills the container (preStop,
        SIGTERM, SIGKILL after the pod's grace period); the restart policy then applies. Whether it passed."""
        container = pod["spec"]["containers"][0]
        hook = (container.get("lifecycle") or {}).get("postStart") or {}
        if not hook or running.process is None:
            return True
        if hook.get("sleep"):
            await asyncio.sleep(float(hook["sleep"].get("seconds") or 0))
            return True
        why = await probes.run_handler(hook, container, podenv.POD_IP, running.env)
        if not why:
            return True
        await self._event(pod, "FailedPostStartHook", probes.hook_failed(hook, container, pod, why), kind="Warning")
        await self._kill_container(running, int(pod["spec"].get("terminationGracePeriodSeconds", 30)))
        return False

    async def _kill_container(self, running: PodProcess, grace: int) -> None:
        """Kill the container (a deletion, a failed probe or hook): its preStop hook first, then SIGTERM, then
        SIGKILL, both within the grace period; a hook that took all of it leaves the signal a one-off 2 s (the
        kubelet's). Returns once the process has exited."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(grace, 0)
        await self._pre_stop(running, deadline)
        running.signal(signal.SIGTERM)
        if running.process is not None and running.process.returncode is None:
            try:
                await asyncio.wait_for(running.process.wait(), max(deadline - loop.time(), 0)
                                       or (PRE_STOP_EXTENSION_S if grace > 0 else 0))
            except TimeoutError:
                running.signal(signal.SIGKILL)
                await running.process.wait()

    async def _pre_stop(self, running: PodProcess, deadline: float) -> None:
        """The container's `lifecycle.preStop` hook, within the grace period: `sleep` (cut short by the container's
        exit), or an `exec`/`httpGet` handler (probes.py), whose failure is a `FailedPreStopHook` Warning. Not run
        for a container that has exited."""
        pod = self._latest.get(running.uid) or {}
        container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
        hook = (container.get("lifecycle") or {}).get("preStop") or {}
        if not hook or not running.initialized or running.process is None or running.process.returncode is not None:
            return
        budget = max(deadline - asyncio.get_running_loop().time(), 0.0)
        if hook.get("sleep"):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(running.process.wait(), min(float(hook["sleep"].get("seconds") or 0), budget))
            return
        try:
            async with asyncio.timeout(budget):
                why = await probes.run_handler(hook, container, podenv.POD_IP, running.env)
        except TimeoutError:
            why = probes.timed_out(hook, container, podenv.POD_IP)
        if why:
            await self._event(pod, "FailedPreStopHook", probes.hook_failed(hook, container, pod, why), kind="Warning")

    def _prober(self, running: PodProcess, pod: dict[str, Any], state: dict[str, Any]) -> probes.ProbeRunner:
        """The container's probes (probes.py), reporting its readiness and killing it on a failed one."""
        async def set_ready(started: bool, ready: bool) -> None:
            if not running.terminating:
                await self._report(running, "Running", state, ready, started=started)

        async def kill(probe: probes.Probe) -> None:
            grace = probe.spec.get("terminationGracePeriodSeconds")
            await self._kill_container(running, int(pod["spec"].get("terminationGracePeriodSeconds", 30)
                                                    if grace is None else grace))

        async def event(kind: str, reason: str, message: str) -> None:
            await self._event(pod, reason, message, kind=kind)

        return probes.ProbeRunner(pod["spec"]["containers"][0], podenv.POD_IP, running.env, set_ready=set_ready,
                                  kill=kill, event=event)

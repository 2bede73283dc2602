"""A pod's init containers as the process kubelet runs them (kubelet.py), before its first container: the regular
ones in order, each to completion before the next; the sidecars (`restartPolicy: Always`) started in their turn and
kept running (restarted when they exit) beside the main container, then stopped once it has ended for good.

As a kubelet: each init container's image is pulled in its turn (Init:ErrImagePull and its back-off), a missing
ConfigMap or Secret is CreateContainerConfigError on that init container; while they run the pod is Pending with
`Initialized=False` (ContainersNotInitialized), the main container waiting in `PodInitializing`; a regular init
container that fails is restarted with a back-off under the pod's `OnFailure`/`Always` policy, and under `Never`
fails the pod (phase Failed, its terminated state and message in `initContainerStatuses`, the main container never
started). Each container has its own log (`kubectl logs POD -c NAME`) and termination message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from pathlib import Path
from typing import Any

from tests.kubelet import images, podenv, termination
from tests.kubelet.clock import now_rfc3339
from tests.kubelet.container import PodProcess, crash_backoff, signal_process
from tests.kubelet.container_start import ContainerStart

MAIN_WAITING = {"waiting": {"reason": "PodInitializing"}}


def is_sidecar(container: dict[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def terminated_state(code: int, started: str, container: dict[str, Any], files: tuple[Path, Path],
                     container_id: str, *, early: bool = False, oom: bool = False) -> dict[str, Any]:
    """`state.terminated` of a container that ended with process status `code` (negative: killed by a signal,
    reported as 128 + N as container runtimes do), with its termination message."""
    exit_code = 128 - code if code < 0 else code
    reason = "OOMKilled" if oom else "Completed" if exit_code == 0 else "StartError" if early else "Error"
    state = {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": now_rfc3339(),
             "containerID": container_id}
    said = termination.message(container, files[1], files[0], exit_code)
    if said:
        state["message"] = said
    return state


class PodInitialization(ContainerStart):
    """Mixed into ProcessKubelet."""

    async def _initialize(self, running: PodProcess, pod: dict[str, Any]) -> bool:
        """Run the pod's init containers; whether its main container may start (False: the pod failed, reported,
        or is being deleted)."""
        containers = pod["spec"].get("initContainers") or []
        if not containers:
            return True
        running.initialized = False
        for container in containers:
            running.init_statuses[container["name"]] = self._init_status(container, MAIN_WAITING, 0)
        await self._report(running, "Pending", MAIN_WAITING, False)
        for container in containers:
            waiting = functools.partial(self._init_waiting, running, pod, container, 0)
            if running.terminating or not await images.pull_image(str(container.get("image", "")), waiting,
                                                                  lambda: running.terminating):
                return False
            ok = await (self._start_sidecar(running, pod, container) if is_sidecar(container)
                        else self._run_to_completion(running, pod, container))
            if not ok:
                return False
        running.initialized = True
        return True

    @staticmethod
    def _init_status(container: dict[str, Any], state: dict[str, Any], restarts: int, *, ready: bool = False,
                     last: dict[str, Any] | None = None) -> dict[str, Any]:
        status = {"name": container["name"], "image": container.get("image", ""), "imageID": "",
                  "ready": ready, "started": "running" in state, "restartCount": restarts, "state": state}
        if last:
            status["lastState"] = {"terminated": last}
        return status

    async def _init_waiting(self, running: PodProcess, pod: dict[str, Any], container: dict[str, Any],
                            restarts: int, reason: str, message: str) -> None:
        """An init container that cannot start: waiting with `reason`, and the kubelet's Warning event (once per
        distinct message)."""
        before = running.init_statuses.get(container["name"], {}).get("state", {}).get("waiting") or {}
        state = {"waiting": {"reason": reason, "message": message}}
        running.init_statuses[container["name"]] = self._init_status(container, state, restarts)
        await self._report(running, "Pending", MAIN_WAITING, False)
        if before.get("message") != message:
            await self._event(pod, "Failed", f"Error: {reason}: {message}", kind="Warning")

    async def _start_once(self, running: PodProcess, pod: dict[str, Any], container: dict[str, Any],
                          restarts: int) -> tuple[asyncio.subprocess.Process | int | None, str]:
        """One start of an init container: its process (an int: it could not start), or None after a config
        error (reported; the caller retries); and when it started."""
        started = now_rfc3339()
        try:
            argv, env = await self._container_command(running, pod, container)
        except podenv.ConfigError as err:
            await self._init_waiting(running, pod, container, restarts, "CreateContainerConfigError", str(err))
            return None, started
        process = await self._exec(argv, env, self.container_files(running, container)[0])
        if not isinstance(process, int):
            await self._event(pod, "Started", f"Started container {container['name']} (pid {process.pid})")
        return process, started

    async def _run_to_completion(self, running: PodProcess, pod: dict[str, Any], container: dict[str, Any]) -> bool:
        """A regular init container, restarted on failure as the pod's policy says; whether it completed."""
        name, restarts, last = container["name"], 0, None
        while not running.terminating:
            process, started = await self._start_once(running, pod, container, restarts)
            if process is None:
                await asyncio.sleep(1.0)  # config error: retried by the kubelet's sync loop
                continue
            if isinstance(process, int):
                code = process
            else:
                running.process = process
                running.init_statuses[name] = self._init_status(container, {"running": {"startedAt": started}},
                                                                restarts, last=last)
                await self._report(running, "Pending", MAIN_WAITING, False)
                code = await process.wait()
                running.process = None
            if running.terminating:
                return False
            ended = terminated_state(code, started, container, self.container_files(running, container),
                                     f"process://{running.uid}/{name}/{restarts}", early=isinstance(process, int))
            if ended["exitCode"] == 0:
                running.init_statuses[name] = self._init_status(container, {"terminated": ended}, restarts,
                                                                ready=True, last=last)
                return True
            if pod["spec"].get("restartPolicy", "Always") == "Never":
                running.init_statuses[name] = self._init_status(container, {"terminated": ended}, restarts, last=last)
                await self._stop_sidecars(running, pod)
                await self._report(running, "Failed", MAIN_WAITING, False)
                return False
            restarts, last = restarts + 1, ended
            backoff = crash_backoff(restarts)
            running.init_statuses[name] = self._init_status(
                container, {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off {backoff}s restarting "
                                        f"failed container={name} pod={running.name}"}}, restarts, last=last)
            await self._report(running, "Pending", MAIN_WAITING, False)
            await asyncio.sleep(backoff)
        return False

    async def _start_sidecar(self, running: PodProcess, pod: dict[str, Any], container: dict[str, Any]) -> bool:
        """Start a sidecar and keep it running (`_keep_sidecar`); the next init container waits until it has
        started. Whether it did (False: the pod is being deleted)."""
        started = asyncio.Event()
        running.sidecar_tasks.append(asyncio.create_task(self._keep_sidecar(running, pod, container, started)))
        while not started.is_set() and not running.terminating:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):  # not wait_for, which can lose a cancellation (deployments.py)
                    await started.wait()
        return started.is_set() and not running.terminating

    async def _keep_sidecar(self, running: PodProcess, pod: dict[str, Any], container: dict[str, Any],
                            started_once: asyncio.Event) -> None:
        name, restarts, last = container["name"], 0, None
        while not (running.terminating or running.finishing):
            process, started = await self._start_once(running, pod, container, restarts)
            if process is None:
                await asyncio.sleep(1.0)
                continue
            if isinstance(process, int):
                code = process
            else:
                running.sidecars[name] = process
                running.init_statuses[name] = self._init_status(container, {"running": {"startedAt": started}},
                                                                restarts, ready=True, last=last)
                started_once.set()
                await self._report_again(running)
                code = await process.wait()
                running.sidecars.pop(name, None)
            ended = terminated_state(code, started, container, self.container_files(running, container),
                                     f"process://{running.uid}/{name}/{restarts}", early=isinstance(process, int))
            if running.terminating or running.finishing:
                running.init_statuses[name] = self._init_status(container, {"terminated": ended}, restarts, last=last)
                return
            restarts, last = restarts + 1, ended
            running.init_statuses[name] = self._init_status(container, {"waiting": {"reason": "CrashLoopBackOff"}},
                                                            restarts, last=last)
            await self._report_again(running)
            await asyncio.sleep(crash_backoff(restarts))

    async def _report_again(self, running: PodProcess) -> None:
        """The pod's last status report again, with the init containers' statuses as they are now."""
        if running.last_report and not running.terminating:
            await self._report(running, *running.last_report)

    async def _stop_sidecars(self, running: PodProcess, pod: dict[str, Any]) -> None:
        """The main container has ended for good (or the pod is deleted): SIGTERM to the sidecars, the last started
        first, SIGKILL to any left after the pod's grace period; their final states recorded."""
        running.finishing = True
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        for process in reversed(list(running.sidecars.values())):
            signal_process(process, signal.SIGTERM)
        waits = [p.wait() for p in running.sidecars.values()]
        if waits:
            _, left = await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=grace)
            if left:
                for process in running.sidecars.values():
                    signal_process(process, signal.SIGKILL)
        await asyncio.gather(*running.sidecar_tasks, return_exceptions=True)

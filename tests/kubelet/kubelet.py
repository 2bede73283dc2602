"""The process kubelet: registers N nodes (Node + Lease heartbeats), runs the first container of each pod bound to
them as a local process group, reports pod status, and kills on deletion (SIGTERM, grace, SIGKILL). `lose_node`
freezes a node like a dead machine; `restore_node` brings it back. How it watches its pods and whom it acts as
is the API server's client's business (tests/cluster/kubelet.py)."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import datetime
import functools
import os
import shutil
import signal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests.kubelet import images, nodes, podenv
from tests.kubelet.clock import now_rfc3339
from tests.kubelet.container import ContainerLifecycle, PodProcess, crash_backoff
from tests.kubelet.httpclient import ApiStatusError, KubeHttpClient, resource_path
from tests.kubelet.init_containers import PodInitialization, terminated_state
from tests.kubelet.nodes import NodeSetup

REPO_ROOT = Path(__file__).resolve().parents[2]
SHM_BASE = Path("/dev/shm")  # the machine's: each node's host memory is a folder of it
KUBELET_VERSION = "v1.37.2-flywheel"  # the control plane's release (tests/k8s/controlplane): within the version skew


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ProcessKubelet(ContainerLifecycle, PodInitialization, abc.ABC):
    # A strategic merge keeps the pod conditions others own (DisruptionTarget...), as a kubelet's status patch does.
    status_patch_type = "application/merge-patch+json"

    def __init__(self, api_url: str, node_names: list[str], log_dir: Path, heartbeat_seconds: float = 2.0,
                 node_status_seconds: float = 10.0, workdir: Path | None = None,
                 node_setup: dict[str, NodeSetup] | None = None) -> None:
        self.api = KubeHttpClient(api_url)
        self.node_setup = {name: (node_setup or {}).get(name) or NodeSetup() for name in node_names}
        parsed = urlparse(api_url)
        self.api_host, self.api_port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.node_names = list(node_names)
        self.log_dir = log_dir
        self.workdir = workdir or REPO_ROOT  # every pod's process runs here
        self.api_url = api_url
        self.credentials_dir = log_dir.parent / "serviceaccounts"  # <pod uid>/{token,namespace,kubeconfig}
        self.heartbeat_seconds, self.node_status_seconds = heartbeat_seconds, node_status_seconds
        self.lost: set[str] = set()
        self.pods: dict[str, PodProcess] = {}  # by pod uid
        self._latest: dict[str, dict[str, Any]] = {}  # last seen pod object by uid
        self.shm_root = SHM_BASE / f"flywheel-test-cluster-{os.getpid()}-{id(self):x}"  # <node>/: a node's /dev/shm
        self._tasks: list[asyncio.Task[None]] = []

    # ---- lifecycle -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for node in self.node_names:
            await self._register(node)
        self._tasks = [asyncio.create_task(self._heartbeats())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for pod in list(self.pods.values()):
            pod.terminating = True
            pod.signal_pod(signal.SIGKILL)  # also ends SIGSTOPped processes
            for child in (pod.task, *pod.sidecar_tasks):
                if child is not None:
                    child.cancel()
        for pod in list(self.pods.values()):
            if pod.process is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pod.process.wait(), 5)
        await asyncio.gather(*self._tasks, *(p.task for p in self.pods.values() if p.task),
                             *(t for p in self.pods.values() for t in p.sidecar_tasks), return_exceptions=True)
        shutil.rmtree(self.shm_root, ignore_errors=True)
        await self.api.close()

    # ---- nodes ---------------------------------------------------------------------------------------------
    async def _register(self, node: str) -> None:
        body = nodes.node_object(node, self.node_setup[node])
        with contextlib.suppress(ApiStatusError):
            await self.api.request("POST", resource_path("nodes"), body)
        await self._post_node_status(node)
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": node, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": _micro_now()}}
        with contextlib.suppress(ApiStatusError):
            await self.api.request("POST", resource_path("leases", "kube-node-lease",
                                                         group_version="coordination.k8s.io/v1"), lease)

    async def _post_node_status(self, node: str) -> None:
        await self.api.merge_patch(resource_path("nodes", name=node, subresource="status"),
                                   {"status": nodes.node_status(node, self.node_setup[node], KUBELET_VERSION)})

    async def _renew_lease(self, node: str) -> None:
        await self.api.merge_patch(resource_path("leases", "kube-node-lease", node,
                                                 group_version="coordination.k8s.io/v1"),
                                   {"spec": {"renewTime": _micro_now()}})

    async def _heartbeats(self) -> None:
        loop = asyncio.get_running_loop()
        last_status = loop.time()
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            post_status = loop.time() - last_status >= self.node_status_seconds
            for node in self.node_names:
                if node in self.lost:
                    continue
                with contextlib.suppress(ApiStatusError, OSError, asyncio.TimeoutError):
                    await self._renew_lease(node)
                    if post_status:
                        await self._post_node_status(node)
            if post_status:
                last_status = loop.time()

    async def set_resources(self, node: str, resources: dict[str, str]) -> None:
        """Change the node's extended resources (e.g. a device plugin coming up with 8 GPUs) and report them."""
        self.node_setup[node].resources.update(resources)
        await self._post_node_status(node)
        await self._resync()  # pods waiting for the resource get another chance

    async def lose_node(self, node: str) -> None:
        """The node dies: no more heartbeats or status, its processes freeze, its pods stay Terminating."""
        self.lost.add(node)
        for pod in self.pods.values():
            if pod.node == node:
                pod.signal_pod(signal.SIGSTOP)

    async def restore_node(self, node: str) -> None:
        """The node comes back: its heartbeats start again, its processes run on, and the resync stops those of pods
        deleted meanwhile. The first lease and status go at once; one refused or timed out on a busy API server is
        not the restore's failure (a kubelet retries at its next heartbeat, as `_heartbeats` does here)."""
        self.lost.discard(node)
        with contextlib.suppress(ApiStatusError, OSError, asyncio.TimeoutError):
            await self._renew_lease(node)
            await self._post_node_status(node)
        for pod in list(self.pods.values()):
            if pod.node == node:
                pod.signal_pod(signal.SIGCONT)
        await self._resync()

    # ---- pods ----------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def _resync(self) -> str:
        """List this kubelet's pods again and reconcile each (after a node comes back or changes)."""

    async def _reconcile(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid, node = meta["uid"], spec.get("nodeName")
        if node not in self.node_names:  # unbound (the scheduler's) or another kubelet's
            return
        self._latest[uid] = pod
        if node in self.lost:
            return
        running = self.pods.get(uid)
        if meta.get("deletionTimestamp"):
            if running is None:
                await self._final_delete(pod)
            elif not running.terminating:
                running.terminating = True
                await self._event(pod, "Killing", f"Stopping container {pod['spec']['containers'][0]['name']}")
                asyncio.create_task(self._terminate(running, int(meta.get("deletionGracePeriodSeconds") or 0)))
            return
        phase = (pod.get("status") or {}).get("phase")
        if running is None and phase not in ("Succeeded", "Failed"):
            runtime = PodProcess(uid=uid, namespace=meta["namespace"], name=meta["name"], node=node)
            self.pods[uid] = runtime
            runtime.task = asyncio.create_task(self._run(runtime))

    def _pod_gone(self, uid: str) -> None:
        """The pod object is gone (force-deleted or finished): its processes must not outlive it."""
        self._latest.pop(uid, None)
        running = self.pods.get(uid)
        if running is None or running.node in self.lost:
            return  # a dead node cannot act; restore_node() cleans up
        running.terminating = True
        running.signal_pod(signal.SIGCONT)
        running.signal_pod(signal.SIGKILL)
        running.gone.set()

    async def _terminate(self, running: PodProcess, grace: int) -> None:
        """The deleted pod's container killed within its grace period (container.py), then the final delete once
        its node can act."""
        await self._kill_container(running, grace)
        pod = self._latest.get(running.uid)
        if pod is not None:
            await self._stop_sidecars(running, pod)
        while running.node in self.lost:
            await asyncio.sleep(0.2)
        pod = self._latest.get(running.uid)
        if pod is not None:
            await self._final_delete(pod)

    async def _final_delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiStatusError):
            await self.api.request("DELETE", resource_path("pods", meta["namespace"], meta["name"]),
                                   {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        self.pods.pop(meta["uid"], None)

    async def oom_kill(self, namespace: str, name: str) -> bool:
        """Memory hook: SIGKILL the pod's processes and report the container OOMKilled (exit code 137)."""
        for pod in self.pods.values():
            if (pod.namespace, pod.name) == (namespace, name) and pod.process is not None:
                pod.oom_killed = True
                pod.signal(signal.SIGKILL)
                return True
        return False

    def pid_of(self, namespace: str, name: str) -> int | None:
        for pod in self.pods.values():
            if (pod.namespace, pod.name) == (namespace, name) and pod.process is not None \
                    and pod.process.returncode is None:
                return pod.process.pid
        return None

    async def _event(self, pod: dict[str, Any], reason: str, message: str, component: str = "kubelet",
                     kind: str = "Normal") -> None:
        """A core/v1 Event about the pod, as the scheduler and kubelet post them (`kubectl describe pod`)."""
        meta, now = pod["metadata"], now_rfc3339()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta["uid"]},
                "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": now,
                "lastTimestamp": now, "source": {"component": component, "host": pod["spec"].get("nodeName", "")}}
        with contextlib.suppress(ApiStatusError, OSError, asyncio.TimeoutError):
            await self.api.request("POST", resource_path("events", meta["namespace"]), body)

    # ---- running one pod -----------------------------------------------------------------------------------
    async def _fetch(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.api.get_or_none(resource_path(plural, namespace, name))

    async def _report(self, running: PodProcess, phase: str, state: dict[str, Any], ready: bool,
                      reason: str = "", started: bool | None = None) -> None:
        running.last_report = (phase, state, ready, reason, started)
        if running.node in self.lost:
            return
        pod = self._latest.get(running.uid)
        if pod is None:
            return
        container = (pod["spec"]["containers"] or [{}])[0]
        now = now_rfc3339()
        status_word = "True" if ready else "False"
        container_status = {"name": container.get("name", ""), "image": container.get("image", ""),
                            "imageID": "", "containerID": f"process://{running.uid}/{running.restart_count}",
                            "ready": ready, "started": "running" in state if started is None else started,
                            "restartCount": running.restart_count,
                            "state": state}
        if running.last_terminated:
            container_status["lastState"] = {"terminated": running.last_terminated}
        status: dict[str, Any] = {
            "phase": phase, "hostIP": podenv.POD_IP, "podIP": podenv.POD_IP, "podIPs": [{"ip": podenv.POD_IP}],
            "startTime": running.started_at or now, "containerStatuses": [container_status],
            "conditions": [{"type": t, "status": s, "lastTransitionTime": now} for t, s in (
                ("PodScheduled", "True"), ("Initialized", "True" if running.initialized else "False"),
                ("ContainersReady", status_word), ("Ready", status_word))]}
        if running.init_statuses:
            status["initContainerStatuses"] = list(running.init_statuses.values())
        if not running.initialized:
            waiting = [name for name, s in running.init_statuses.items() if not s["ready"]]  # done, or a sidecar up
            status["conditions"][1].update(reason="ContainersNotInitialized",
                                           message=f"containers with incomplete status: [{' '.join(waiting)}]")
        if reason:
            status["reason"] = reason
        with contextlib.suppress(ApiStatusError, OSError, asyncio.TimeoutError):
            await self.api.request("PATCH", resource_path("pods", running.namespace, running.name, "status"),
                                   {"status": status}, content_type=self.status_patch_type)

    async def _waiting(self, running: PodProcess, pod: dict[str, Any], reason: str, message: str) -> None:
        """The container cannot start yet: Pending, waiting with `reason`, and the kubelet's Warning event."""
        await self._report(running, "Pending", {"waiting": {"reason": reason, "message": message}}, False)
        await self._event(pod, "Failed", f"Error: {reason}: {message}", kind="Warning")

    async def _start_process(self, running: PodProcess, pod: dict[str, Any]) -> int | None:
        """Start the first container; return an exit code at once if it cannot start."""
        try:
            argv, env = await self._container_command(running, pod, pod["spec"]["containers"][0])
        except podenv.ConfigError as err:
            said, running.config_error = running.config_error, str(err)
            await self._report(running, "Pending", {"waiting": {"reason": "CreateContainerConfigError",
                                                                "message": str(err)}}, False)
            if said != str(err):  # the kubelet's Warning, once per distinct error
                await self._event(pod, "Failed", f"Error: {err}", kind="Warning")
            return None
        process = await self._exec(argv, env, self.container_files(running, pod["spec"]["containers"][0])[0])
        if isinstance(process, int):
            return process
        running.process = process
        return None

    async def _run(self, running: PodProcess) -> None:
        running.started_at = running.started_at or now_rfc3339()  # the kubelet took the pod (status.startTime)
        pod = self._latest.get(running.uid)
        if pod is None or not await self._initialize(running, pod):
            return
        image = (pod or {}).get("spec", {}).get("containers", [{}])[0].get("image", "")
        if pod is None or not await images.pull_image(image, functools.partial(self._waiting, running, pod),
                                                      lambda: running.terminating):
            return
        while not running.terminating:
            pod = self._latest.get(running.uid)
            if pod is None:
                return
            started = now_rfc3339()
            early_exit = await self._start_process(running, pod)
            if running.terminating and running.process is not None:  # deleted while it was being started
                running.signal(signal.SIGKILL)
                await running.process.wait()
                return
            if running.process is None and early_exit is None:
                await asyncio.sleep(1.0)  # config error: retry, like the kubelet's sync loop
                continue
            if early_exit is None:
                code = await self._running(running, pod, started)
            else:
                code = early_exit
            if running.terminating:
                return
            container = pod["spec"]["containers"][0]
            terminated = terminated_state(code, started, container, self.container_files(running, container),
                                          f"process://{running.uid}/{running.restart_count}",
                                          early=early_exit is not None, oom=running.oom_killed)
            exit_code = terminated["exitCode"]
            running.oom_killed = False
            policy = pod["spec"].get("restartPolicy", "Always")
            if policy == "Always" or (policy == "OnFailure" and exit_code != 0):
                running.last_terminated = terminated
                running.restart_count += 1
                running.process = None
                backoff = crash_backoff(running.restart_count)
                await self._report(running, "Running", {"waiting": {"reason": "CrashLoopBackOff",
                                                                    "message": f"back-off {backoff}s"}}, False)
                await asyncio.sleep(backoff)
                continue
            phase = "Succeeded" if exit_code == 0 else "Failed"
            await self._stop_sidecars(running, pod)
            await self._report(running, phase, {"terminated": terminated}, False)
            return

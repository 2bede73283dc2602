"""How the process kubelet makes a container's process (kubelet.py, init_containers.py): its command line and
environment (podenv.py), sandboxed as its security context says (sandbox.py), its log and termination message files
on the host, and the node's /dev/shm."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

from tests.kubelet import host_ports, images, podenv, sandbox, termination
from tests.kubelet.container import KubeletPart, PodProcess


class ContainerStart(KubeletPart):
    """Mixed into ProcessKubelet, which sets these."""

    log_dir: Path
    credentials_dir: Path
    workdir: Path
    shm_root: Path
    api_url: str
    api_host: str
    api_port: int

    async def _fetch(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        raise NotImplementedError

    async def _service_account_env(self, running: PodProcess, pod: dict[str, Any]) -> dict[str, str]:
        """The pod's service-account credentials written for its processes, and the env that points at them."""
        return podenv.write_service_account(self.credentials_dir / running.uid, pod, self.api_url)

    def container_files(self, running: PodProcess, container: dict[str, Any]) -> tuple[Path, Path]:
        """The container's log and termination message file on the host: the pod's own for its first container,
        one per name for an init container (`kubectl logs -c NAME`)."""
        base = f"{running.namespace}_{running.name}_{running.uid}"
        pod = self._latest.get(running.uid) or {}
        if container.get("name") != ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name"):
            base += f".{container.get('name', '')}"
        return self.log_dir / f"{base}.log", self.log_dir / f"{base}.termination-log"

    async def _container_command(self, running: PodProcess, pod: dict[str, Any],
                                 container: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of one of the pod's containers (sandboxed as its security context says, with
        its termination message file); podenv.ConfigError when they cannot be made (a missing ConfigMap...)."""
        box = sandbox.plan(pod, container)
        mounted = {}
        if await podenv.automounts_token(pod, self._fetch):
            mounted = await self._service_account_env(running, pod)
        env = host_ports.spread(pod, await podenv.container_env(pod, container, self.api_host, self.api_port,
                                                                self._fetch, mounted))
        running.env = env
        argv = podenv.container_argv(container, env)
        message_file = self.container_files(running, container)[1]
        termination.mount(container, env, message_file)
        box = dataclasses.replace(box, shm=str(self._node_shm(running.node)))
        if box.needed:
            argv = self._sandboxed(running, pod, container, box, argv, env, message_file)
        elif box.namespaced:
            argv = sandbox.wrap(argv, box)  # only the node's /dev/shm
        return argv, env

    async def _exec(self, argv: list[str], env: dict[str, str], log_path: Path) -> asyncio.subprocess.Process | int:
        """The container's process, its output appended to `log_path`; 128 when it cannot be started."""
        with open(log_path, "ab") as log:
            try:
                return await asyncio.create_subprocess_exec(
                    *argv, cwd=self.workdir, env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
            except OSError as err:
                log.write(f"process kubelet: cannot start {argv!r}: {err}\n".encode())
                return 128

    def _node_shm(self, node: str) -> Path:
        """The node's host memory: a folder under the machine's /dev/shm, the node's /dev/shm in its containers
        (it outlives the pods, as a host's memory does, and goes with the kubelet)."""
        folder = self.shm_root / node
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o1777)
        return folder

    def _sandboxed(self, running: PodProcess, pod: dict[str, Any], container: dict[str, Any], box: sandbox.Sandbox,
                   argv: list[str], env: dict[str, str], message_file: Path) -> list[str]:
        """Run `argv` as the security context says (sandbox.py): the termination message file stays writable,
        the image's accounts and HOME apply, and a non-root user the image does not know gets HOME=/ (as from
        a runtime) instead of the kubelet's."""
        declared = {item["name"] for item in container.get("env") or []}
        box = dataclasses.replace(box, writable=(*box.writable, str(message_file)))
        try:
            os.chmod(message_file, 0o666)
            sandbox.prepare_host(pod, container)
            accounts = self.credentials_dir.parent / "accounts" / running.uid
            accounts.mkdir(parents=True, exist_ok=True)
            box = sandbox.image_accounts(box, str(container.get("image", "")), accounts)
        except OSError as err:
            raise podenv.ConfigError(f"cannot prepare the container's volumes: {err}") from err
        image_env = images.image_env(str(container.get("image", "")))
        if "HOME" not in declared:
            env["HOME"] = image_env.get("HOME") or ("/" if box.uid != 0 else env.get("HOME", "/root"))
        return sandbox.wrap(argv, box)

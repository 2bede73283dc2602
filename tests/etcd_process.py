"""A real etcd (the Debian `etcd` 3.4 binary) on free loopback ports with its own data dir: the one launcher the
tests, the test cluster (`python -m tests.cluster up`) and their fixtures share. No pytest here, so the test
cluster runs outside pytest; the pytest fixture is tests/rendezvous/etcd_server.py's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ETCD_BINARY = os.environ.get("FLYWHEEL_ETCD_BINARY") or shutil.which("etcd") or "/usr/bin/etcd"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes] | None, kill: bool = False, timeout: float = 10.0) -> None:
    """SIGTERM (or SIGKILL) a server process and wait for it; SIGKILL if it outlasts `timeout`."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class EtcdExited(RuntimeError):
    """etcd exited while starting (e.g. a port taken between choosing it and binding it)."""


class EtcdServer:
    """One single-member etcd. `stop()`/`start()` keep the data dir and ports, so a restart is a real restart.
    Its log is `<data dir>.log` beside the data dir."""

    def __init__(self, data_dir: Path, binary: list[str] | None = None, extra_args: list[str] | None = None) -> None:
        """`binary`: the command that runs etcd (default the Debian binary; the test cluster's control plane runs
        the etcd Kubernetes pins, `[controlplane, "etcd"]`)."""
        self.data_dir = data_dir
        self.binary = binary or [ETCD_BINARY]
        self.extra_args = extra_args or []
        self.client_port = free_port()
        self.peer_port = free_port()
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._served = False  # once it served, a restart keeps its ports (a real restart)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 20.0, attempts: int = 3) -> None:
        """Start it; on its first start, an etcd that exits at once (a port found free and taken before etcd binds
        it, with many tests and clusters starting etcd at once under pytest-xdist) is started again on new ports."""
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(timeout)
                self._served = True
                return
            except EtcdExited:
                if self._served or attempt == attempts:
                    raise
                self.client_port, self.peer_port = free_port(), free_port()

    def _start_once(self, timeout: float) -> None:
        client_url, peer_url = self.client_url, f"http://127.0.0.1:{self.peer_port}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            *self.binary,
            "--name=flywheel-test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=flywheel-test={peer_url}",
            "--heartbeat-interval=50",
            "--election-timeout=250",
            "--logger=zap",
            "--log-level=warn",
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                             env={**os.environ, "ETCD_UNSUPPORTED_ARCH": ""})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EtcdExited(f"etcd exited with {self._process.returncode}: {self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd not healthy after {timeout} s: {self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def stop(self, kill: bool = False) -> None:
        process, self._process = self._process, None
        stop_process(process, kill)

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

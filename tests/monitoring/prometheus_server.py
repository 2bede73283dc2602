"""A real Prometheus (Debian's /usr/bin/prometheus) on a free loopback port with a temp config and data dir."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

PROMETHEUS_BINARY = os.environ.get("FLYWHEEL_PROMETHEUS_BINARY") or shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL_BINARY = os.environ.get("FLYWHEEL_PROMTOOL_BINARY") or shutil.which("promtool") or "/usr/bin/promtool"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: list[str]
    labels: dict[str, str] | None = None  # target labels, e.g. the exporter pod's namespace/pod on Kubernetes
    honor_labels: bool = False


class PrometheusServer:
    def __init__(self, workdir: Path, jobs: list[ScrapeJob], scrape_interval: str = "1s"):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
                  "scrape_configs": [
                      {"job_name": j.name, "honor_labels": j.honor_labels,
                       "static_configs": [{"targets": j.targets, **({"labels": j.labels} if j.labels else {})}]}
                      for j in jobs]}
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS_BINARY, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready after {timeout}s: {self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class ChildProcess:
    """A helper process (`python -m module args`) that prints `listening on <port>` when it serves."""

    def __init__(self, module: str, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                                     cwd=Path(__file__).resolve().parents[2], text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"{module} did not start: {line!r}")
        self.port = int(line.split()[-1])
        self.address = f"127.0.0.1:{self.port}"

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL also ends a stopped process
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()

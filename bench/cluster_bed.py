"""The operator benchmarks' test bed: the test cluster (the real control plane, the process kubelet, an etcd for
rendezvous), the real `flywheel operator` process and the real kubectl, with jobs made from
examples/operator-tiny.yaml (its checkpoint claim and the events' bound to volumes of their own, as the operator tests
have them)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
KUBECTL = REPO / ".tools" / "bin" / "kubectl"
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
EXAMPLE = REPO / "examples" / "operator-tiny.yaml"


class Bed:
    def __init__(self, workdir: Path, node_grace: float, nodes: int = 2) -> None:
        from tests.cluster.fixtures import start_cluster
        from tests.operator.conftest import OperatorProcess

        self.workdir = workdir
        self._api: Any = None
        self.cluster = start_cluster(workdir / "cluster", nodes=nodes, etcd=True,
                                     node_monitor_grace_seconds=node_grace)
        for claim in ("flywheel-ckpt", "flywheel-events"):  # kube-scheduler places no pod whose claim is unbound
            self.cluster.add_claim(claim)
        self.events = workdir / "events"
        self.events.mkdir()
        self.kubectl("apply", "-f", str(CRD))
        self.cluster.wait_established("trainingjobs.flywheel.dev")
        self.operator = OperatorProcess(self.cluster, self.events, workdir / "operator.log")
        self.operator.start()

    def kubectl(self, *args: str) -> str:
        return subprocess.run([str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig), *args], check=True,
                              capture_output=True, text=True, timeout=60).stdout

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def job(self, name: str) -> dict[str, Any]:
        """The TrainingJob as the API serves it. The polls read through one in-process client: a kubectl process per
        poll (~50 ms of CPU each, several a second) would take CPU from the training the benchmark measures."""
        from kubernetes import client

        response = client.CustomObjectsApi(self._client()).get_namespaced_custom_object(
            "flywheel.dev", "v1alpha1", "default", "trainingjobs", name, _preload_content=False, _request_timeout=30)
        return dict(json.loads(response.data))

    def pods(self, job: str) -> list[dict[str, Any]]:
        from kubernetes import client

        response = client.CoreV1Api(self._client()).list_namespaced_pod(
            "default", label_selector=f"flywheel.dev/job={job}", _preload_content=False, _request_timeout=30)
        return list(json.loads(response.data)["items"])

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import config

            self._api = config.new_client_from_config(str(self.cluster.kubeconfig))
        return self._api

    def apply_job(self, name: str, *, steps: int, checkpoint_every: int, node_failure_grace_s: float,
                  replicas: int = 2, procs_per_replica: int = 1, max_restarts: int = 10, spares: int = 0,
                  memory_every_steps: int = 0) -> None:
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"]["name"] = name
        spec = doc["spec"]
        spec["replicas"] = {"min": replicas, "max": replicas, **({"spares": spares} if spares else {})}
        spec["procsPerReplica"] = procs_per_replica
        spec["checkpoint"].update(dir=str(self.workdir / "ckpt" / name), everySteps=checkpoint_every)
        if memory_every_steps:
            spec["checkpoint"]["memoryEverySteps"] = memory_every_steps
        spec["trainer"]["training"]["steps"] = steps
        spec["faultTolerance"].update(nodeFailureGraceSeconds=node_failure_grace_s, maxRestarts=max_restarts)
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        self.kubectl("apply", "-f", str(path))

    def events_file(self, name: str) -> Path | None:
        return next(iter(self.events.glob(f"default_{name}_*.jsonl")), None)

    def steps(self, name: str) -> list[tuple[float, int]]:
        """(wall time, step) of every step event of the job so far."""
        out = []
        for path in self.events.glob(f"default_{name}_*.jsonl"):
            for line in path.read_text().splitlines():
                if '"event":"step"' in line.replace(" ", ""):
                    record = json.loads(line)
                    out.append((record["time"], record["step"]))
        return out

    def close(self) -> None:
        self.operator.stop()
        self.cluster.stop()


def wait(what: str, probe: Any, timeout: float, interval: float = 0.1) -> Any:
    """Polls `probe` until it returns something true, and returns that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

"""The operator against the test cluster (the real control plane + the process kubelet + an etcd for rendezvous) with
the real kubectl.

`op_env` (module scope) starts the cluster, applies the CRD with kubectl and runs `flywheel operator` as a
subprocess (`OperatorProcess` can kill and restart it). Jobs are examples/operator-tiny.yaml with a fresh name and
checkpoint dir per test, applied with `kubectl apply -f`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.contracts.faults import STEP_DELAY_ENV
from tests.cluster.cluster import TestCluster as RunningCluster
from tests.cluster.fixtures import start_cluster
from tests.waiting import eventually as _eventually

REPO = Path(__file__).resolve().parents[2]
KUBECTL = REPO / ".tools" / "bin" / "kubectl"
EXAMPLE = REPO / "examples" / "operator-tiny.yaml"
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"


eventually = partial(_eventually, interval=0.2)  # the operator acts on 0.2 s-scale loops
# The step delay of a job that only has to keep running while a test acts (deleted or suspended by it): a gpt-tiny
# step computes in ~0.02-0.05 s, so its ranks leave most of the 2 cores to the other test process.
IDLE_STEP_S = 0.1
# A job long enough to be hit mid-run (a worker killed, a node lost, the operator killed) and then to train on: its
# ranks idle LONG_STEP_S before each step, which keeps it running ~13 s on half the steps (and their CPU) that 400
# full-speed ones took. `OpEnv.long_job_yaml` applies both.
LONG_STEPS = 200
LONG = {"trainer.training.steps": LONG_STEPS, "checkpoint.everySteps": 20}
LONG_STEP_S = 0.04
HOLD_TAINT = "example.com/hold"  # keeps new pods off a node; not one of the operator's drain taint keys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The operator as the image runs it: the tests' sync `kubernetes` client (pyproject's dev extra, not in the image)
# hidden, since kopf imports it whenever it is installed (~14 MB more of the operator's memory).
AS_IN_IMAGE = ["-c", "import runpy, sys; sys.modules['kubernetes'] = None; sys.argv[0] = 'flywheel'; "
                     "runpy.run_module('flywheel.cli', run_name='__main__')"]


class OperatorProcess:
    def __init__(self, cluster: RunningCluster, events_dir: Path | None, log_path: Path) -> None:
        """`events_dir` None: no --events-dir (the chart's default; progress then comes from etcd alone)."""
        self.cluster, self.events_dir, self.log_path = cluster, events_dir, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.extra_args: list[str] = []
        self.monitor_args: list[str] = ["--no-health-monitor"]  # test_health_operator.py turns it on
        self.metrics_port = _free_port()
        self.as_in_image = False  # bench/operator_scale: without the test-only packages the image lacks

    def start(self) -> None:
        entry = AS_IN_IMAGE if self.as_in_image else ["-m", "flywheel.cli"]
        argv = [sys.executable, *entry, "operator", "--kubeconfig", str(self.cluster.kubeconfig),
                "--etcd-endpoints", str(self.cluster.etcd_url),
                # The workers write the event log on the claim mounted there, as the chart sets it up (the test
                # kubelet enforces the read-only root: an undeclared path is not writable).
                *(["--events-dir", str(self.events_dir), "--events-claim", "flywheel-events"]
                  if self.events_dir is not None else []),
                "--metrics-port-base", "0", "--worker-env", "OMP_NUM_THREADS=1",
                "--operator-metrics-port", str(self.metrics_port), *self.monitor_args, *self.extra_args]
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
        self.starts += 1

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def restart(self, *extra_args: str) -> None:
        self.stop()
        self.extra_args = list(extra_args)
        self.start()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def operator_running(cluster: RunningCluster, operator: OperatorProcess) -> Iterator[None]:
    """The TrainingJob CRD applied with kubectl and established, then `operator` started, for the block; the
    operator and the cluster stopped after it, whatever happens."""
    try:
        subprocess.run([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", str(CRD)], check=True,
                       capture_output=True, timeout=60)
        cluster.wait_established("trainingjobs.flywheel.dev")
        operator.start()
        yield
    finally:
        operator.stop()
        cluster.stop()


def with_step_delay(doc: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Makes the job `doc`'s ranks idle `seconds` before each step: returns a ConfigMap setting
    FLYWHEEL_STEP_DELAY_SECONDS (flywheel/contracts/faults.py) and points the worker container of the job's
    pod template at it with envFrom (a template's `env` may not name FLYWHEEL_ variables; envFrom passes through, and
    the operator's own env wins over it, as in Kubernetes)."""
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{doc['metadata']['name']}-step-delay"},
                  "data": {STEP_DELAY_ENV: str(seconds)}}
    containers = doc["spec"].setdefault("template", {}).setdefault("spec", {}).setdefault("containers", [])
    worker = next((c for c in containers if c.get("name") == "worker"), None)
    if worker is None:
        containers.append(worker := {"name": "worker"})
    worker.setdefault("envFrom", []).append({"configMapRef": {"name": config_map["metadata"]["name"]}})
    return config_map


@contextlib.contextmanager
def node_tainted(kubectl: Callable[..., Any], node: str, taint: str) -> Iterator[None]:
    """`kubectl taint nodes NODE TAINT` (key=value:Effect) for the block, removed after it whatever happens (the test
    cluster's and a real cluster's kubectl alike)."""
    kubectl("taint", "nodes", node, taint)
    try:
        yield
    finally:
        kubectl("taint", "nodes", node, taint.split("=", 1)[0].split(":", 1)[0] + "-", check=False)


def worker_node(pods: list[dict[str, Any]], name: str) -> str:
    """The node of pod `name` among `pods`."""
    return next(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"] == name)


@dataclass
class OpEnv:
    cluster: RunningCluster
    operator: OperatorProcess
    events_dir: Path
    tmp: Path

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig), *args], input=stdin,
                                capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def job_yaml(self, name: str, *, step_delay_s: float = 0.0, **spec_changes: Any) -> Path:
        """examples/operator-tiny.yaml with a new name, its own checkpoint dir and `spec_changes` merged in;
        `step_delay_s`: its ranks idle that long before each step (a job that must stay running for a while
        without taking the CPU the other test process needs)."""
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"]["name"] = name
        doc["spec"]["checkpoint"]["dir"] = str(self.tmp / "ckpt" / name)
        for dotted, value in spec_changes.items():
            node = doc["spec"]
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
        before = [with_step_delay(doc, step_delay_s)] if step_delay_s else []
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all([*before, doc]))
        return path

    def long_job_yaml(self, name: str, **spec_changes: Any) -> Path:
        """`job_yaml` of a LONG job (paced by LONG_STEP_S), with `spec_changes` over LONG."""
        return self.job_yaml(name, step_delay_s=LONG_STEP_S, **{**LONG, **spec_changes})

    def job(self, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "tj", name, "-o", "json").stdout)

    def status(self, name: str) -> dict[str, Any]:
        return self.job(name).get("status") or {}

    def pods(self, name: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-l", f"flywheel.dev/job={name}", "-o", "json").stdout
        return json.loads(out)["items"]

    def jobs_with_pods(self, *names: str) -> set[str]:
        """Which of these jobs have pods, from one LIST: one snapshot (a call per job would race a pod's end)."""
        out = self.kubectl("get", "pods", "-l", f"flywheel.dev/job in ({','.join(names)})", "-o", "json").stdout
        return {p["metadata"]["labels"]["flywheel.dev/job"] for p in json.loads(out)["items"]}

    def events_of(self, name: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
        return json.loads(out)["items"]

    def events_file(self, name: str) -> Path:
        uid = self.job(name)["metadata"]["uid"]
        return self.events_dir / f"default_{name}_{uid}.jsonl"

    def records(self, name: str) -> list[dict[str, Any]]:
        path = self.events_file(name)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def last_step(self, name: str) -> int:
        return max((r["step"] for r in self.records(name) if r["event"] == "step"), default=0)

    def done_hash(self, name: str) -> str:
        done = [r for r in self.records(name) if r["event"] == "done"]
        assert done, f"{name}: no done event"
        return str(done[-1]["params_sha256"])

    def wait_phase(self, name: str, phase: str, timeout: float) -> dict[str, Any]:
        return eventually(lambda: (s := self.status(name)).get("phase") == phase and s, timeout,
                          lambda: f"{name} to reach {phase}; now {self._state(name)}", interval=0.5)

    def _state(self, name: str) -> str:
        """The job's phase, reason, message and true conditions, and its pods' phases: what a timed-out wait says."""
        status = self.status(name)
        conditions = [f"{c['type']}: {c.get('message', '')}" for c in status.get("conditions", [])
                      if c.get("status") == "True"]
        pods = [_pod_state(p) for p in self.pods(name)]
        log = self.operator.log_path.read_text(errors="replace").splitlines() if self.operator.log_path.exists() else []
        said = [line for line in log if name in line][-12:]
        nodes = json.loads(self.kubectl("get", "nodes", "-o", "json", check=False).stdout or '{"items": []}')["items"]
        ready = {n["metadata"]["name"]: next((c["status"] for c in n["status"].get("conditions", [])
                                              if c["type"] == "Ready"), "?") for n in nodes}
        return (f"{status.get('phase')} ({status.get('reason')}: {status.get('message')}); conditions {conditions}; "
                f"pods {pods}; nodes Ready {ready}; last step {self.last_step(name)}; "
                "the operator's last lines on it:\n" + "\n".join(said))

    def delete(self, name: str) -> None:
        self.kubectl("delete", "tj", name, "--wait=false", check=False)


def _start_cluster(tmp: Path) -> RunningCluster:
    # The gang scheduler's name is served by a profile of the one kube-scheduler (test_gang_jobs_get_a_podgroup).
    cluster = start_cluster(tmp / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=3.0,
                            heartbeat_seconds=0.5, scheduler_names=("scheduler-plugins-scheduler",))
    for claim in ("flywheel-ckpt", "flywheel-events"):  # the example's and the events' (bound at once)
        cluster.add_claim(claim)
    return cluster


@pytest.fixture(scope="module")
def op_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpEnv]:
    """On the test cluster (the real control plane and the process kubelet), one per module."""
    if not KUBECTL.exists():
        pytest.skip("real kubectl missing: run scripts/install-tools.sh")
    tmp = tmp_path_factory.mktemp("operator")
    cluster = _start_cluster(tmp)
    events_dir = tmp / "events"
    events_dir.mkdir()
    operator = OperatorProcess(cluster, events_dir, tmp / "operator.log")
    with operator_running(cluster, operator):
        yield OpEnv(cluster, operator, events_dir, tmp)


def _pod_state(pod: dict[str, Any]) -> str:
    """A pod's phase, and for one not running yet its node and why not (a condition's reason and message)."""
    status = pod.get("status") or {}
    said = f"{pod['metadata']['name']}={status.get('phase')}"
    if status.get("phase") == "Pending":
        why = [f"{c['type']} {c.get('reason', '')}: {c.get('message', '')}" for c in status.get("conditions", [])
               if c.get("status") != "True"]
        said += f" (node {pod['spec'].get('nodeName')}; {'; '.join(why) or 'no condition false'})"
    return said

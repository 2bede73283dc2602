"""The test bed of bench/operator_scale: the test cluster (the real control plane) without nodes, kube-scheduler or
its fault proxy (every client here talks to kube-apiserver directly), a stand-in kubelet that moves pods to Running
or Succeeded by their status alone (no process, no CPU: 200 running jobs fit on 2 cores), a clock of when each job's
pods were first seen, and a count of each caller's API requests from kube-apiserver's audit log
(tests/cluster/audit.py).

The bench's own requests (job creates, the stand-in kubelet's status writes, its watch) go as a ServiceAccount of
their own, so the count of the operator's requests (the kubeconfig's admin user) leaves them out.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from flywheel.contracts.labels import JOB_LABEL
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from tests.cluster.audit import Attributes, Recorded, service_account
from tests.cluster.pki import ADMIN_USER

REPO = Path(__file__).resolve().parents[1]
KUBECTL = REPO / ".tools" / "bin" / "kubectl"
CRD = REPO / "crds" / "trainingjobs.flywheel.dev.yaml"
BENCH_ACCOUNT = "operator-scale-bench"  # the bench's identity in the request count (a ServiceAccount in default)
OPERATOR_USER = ADMIN_USER  # the operator's: the cluster kubeconfig's
NAMESPACES = ("default", "peer", "bare")
JSON = {"Content-Type": "application/json"}  # ours, the kopf peer's, the bare client's


def job_doc(name: str, replicas: int, namespace: str = "default") -> dict[str, Any]:
    """A small TrainingJob; hang detection off (its stand-in pods never step)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": {"min": replicas, "max": replicas}, "procsPerReplica": 1,
                     "trainer": {"model": {"preset": "gpt-tiny"},
                                 "training": {"steps": 10, "globalBatch": replicas, "microBatch": 1}},
                     "checkpoint": {"dir": f"/ckpt/{name}", "ephemeral": True},  # no claim on the bed
                     "faultTolerance": {"progressTimeoutSeconds": 0}}}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024


def split_counts(counts: Counter[tuple[str, Attributes]], identity: str) -> tuple[int, int, dict[str, int]]:
    """(requests but watches, watches, requests by "verb resource") of one caller, from the audit log's count of each
    kind of request per user (`Recorded.counts`)."""
    mine: Counter[str] = Counter()
    for (who, (verb, _, resource, _)), n in counts.items():
        if who == identity:
            mine[f"{verb} {resource}"] += n
    watches = sum(n for key, n in mine.items() if key.startswith("watch "))
    return sum(mine.values()) - watches, watches, dict(sorted(mine.items(), key=lambda kv: -kv[1]))


def pod_status(phase: str) -> dict[str, Any]:
    """What a kubelet writes for a worker that runs (ready) or exited 0."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    running = phase == "Running"
    state = {"running": {"startedAt": now}} if running else {
        "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
    return {"status": {"phase": phase, "startTime": now,
                       "conditions": [{"type": "Ready", "status": "True" if running else "False",
                                       "lastTransitionTime": now}],
                       "containerStatuses": [{"name": "worker", "ready": running, "restartCount": 0,
                                              "image": "flywheel:latest", "imageID": "", "state": state}]}}


class StandInKubelet:
    """Watches every pod with a job label: records when each was first seen, and, while `mode` is "Running" or
    "Succeeded", writes that status to each new pod (and to the pods it is told to)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.seen: dict[tuple[str, str], dict[str, float]] = {}  # (namespace, job) -> {pod: first seen}
        self.mode: str | None = None
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.writer = ThreadPoolExecutor(8)
        listed: Any = core.list_pod_for_all_namespaces()
        version = listed.metadata.resource_version
        self.thread = threading.Thread(target=self._run, args=(version,), daemon=True)
        self.thread.start()

    def _run(self, version: str) -> None:
        while not self.stop.is_set():
            try:
                # The events as JSON, not the client's model objects: building a V1Pod per event took as much CPU as
                # the operator spent creating the pods, on the 2 cores the operator and the API server share.
                stream = self.core.list_pod_for_all_namespaces(watch=True, resource_version=version, timeout_seconds=5,
                                                               label_selector=JOB_LABEL, _preload_content=False)
                try:
                    for line in watch.watch.iter_resp_lines(stream):
                        version = self._take(json.loads(line))
                finally:
                    stream.close()
                    stream.release_conn()
            except Exception:  # noqa: BLE001 -- any dropped or broken stream: resume from the last version
                time.sleep(0.1)

    def _take(self, event: dict[str, Any]) -> str:
        """One watch event: a new pod's first sight (and its status, in a mode); its resourceVersion."""
        if event["type"] == "ERROR":
            raise RuntimeError(event["object"].get("message"))
        meta = event["object"]["metadata"]
        if event["type"] == "ADDED":
            job = meta["labels"][JOB_LABEL]
            with self.lock:
                self.seen.setdefault((meta["namespace"], job), {}).setdefault(meta["name"], time.time())
            if self.mode and (event["object"].get("status") or {}).get("phase", "Pending") == "Pending":
                self.set_phase(meta["namespace"], meta["name"], self.mode)
        return str(meta["resourceVersion"])

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        self.writer.submit(self._write, namespace, name, phase)

    def _write(self, namespace: str, name: str, phase: str) -> None:
        try:
            self.core.patch_namespaced_pod_status(name, namespace, pod_status(phase))
        except client.ApiException as err:
            if err.status != 404:  # deleted meanwhile
                raise

    def pods_of(self, namespace: str, job: str) -> list[str]:
        with self.lock:
            return list(self.seen.get((namespace, job), {}))

    def all_seen(self, namespace: str, job: str, count: int) -> float | None:
        """When the last of the job's first `count` pods was seen, or None before."""
        with self.lock:
            pods = self.seen.get((namespace, job), {})
            return max(pods.values()) if len(pods) >= count else None

    def close(self) -> None:
        self.stop.set()
        self.writer.shutdown(wait=True)


class Cluster:
    """The test cluster with the CRD, the three namespaces and the bench's clients; `mark()` and `requests(mark)`
    count the API requests in between. Nobody schedules or runs the pods: no nodes, and kube-scheduler stopped (it
    would mark each pod Unschedulable, a status the operator acts on); the stand-in kubelet writes their status."""

    def __init__(self, workdir: Path) -> None:
        from tests.cluster.controlplane import write_kubeconfig
        from tests.cluster.fixtures import start_cluster

        self.workdir = workdir
        self.cluster = start_cluster(workdir / "cluster", nodes=0, etcd=True)
        plane = self.cluster.control_plane
        # Every client here (the operator, the peers, the bench's own) talks to kube-apiserver directly: the test
        # cluster's fault proxy (tests/cluster/fault_proxy.py) forwards each request and watch from this process's
        # Python event loop, on the same 2 cores, which no real cluster has (no fault is injected here).
        self.cluster.kubeconfig = workdir / "kubeconfig-direct"
        write_kubeconfig(self.cluster.kubeconfig, plane.api_url, self.cluster.ca_file, self.cluster.admin_token)
        plane.stop_component("kube-scheduler")
        self.kubectl("apply", "-f", str(CRD))
        self.cluster.wait_established(f"{PLURAL}.{GROUP}")
        for namespace in NAMESPACES[1:]:
            self.kubectl("create", "namespace", namespace)
        self._wait_default_accounts()
        bench = service_account(plane.request, "default", BENCH_ACCOUNT, cluster_role="cluster-admin")
        api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        api.configuration.api_key = {"authorization": f"Bearer {bench.token}"}
        api.rest_client.pool_manager.connection_pool_kw["maxsize"] = 32  # bursts run 16 threads
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.kubelet = StandInKubelet(self.core)

    def _wait_default_accounts(self, timeout: float = 60.0) -> None:
        """Each namespace's default ServiceAccount, which kube-controller-manager makes a moment after the namespace
        (pods are refused until it exists)."""
        deadline = time.monotonic() + timeout
        for namespace in NAMESPACES:
            while self.cluster.control_plane.request(f"/api/v1/namespaces/{namespace}/serviceaccounts/default") is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no default ServiceAccount in {namespace}")
                time.sleep(0.1)

    def mark(self) -> int:
        """A position in the API server's audit log: `requests(mark)` counts what came after."""
        return self.cluster.control_plane.audit.mark()

    def requests(self, mark: int) -> Recorded:
        return self.cluster.control_plane.audit.since(mark)

    def kubectl(self, *args: str) -> str:
        return subprocess.run([str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig), *args], check=True,
                              capture_output=True, text=True, timeout=60).stdout

    def create_jobs(self, names: list[str], replicas: int, namespace: str = "default") -> dict[str, float]:
        """Create the jobs from 16 threads; name -> when its create returned."""
        def create(name: str) -> float:
            # This client sends a create's body without a Content-Type (and ignores `_content_type`); kube-apiserver
            # answers 415 to that.
            self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                        job_doc(name, replicas, namespace), _headers=JSON)
            return time.time()

        with ThreadPoolExecutor(16) as pool:
            return dict(zip(names, pool.map(create, names)))

    def phases(self, namespace: str) -> Counter[str]:
        listed: Any = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        jobs = listed["items"]
        return Counter((job.get("status") or {}).get("phase", "") for job in jobs)

    def wait_phase(self, namespace: str, phase: str, count: int, timeout: float) -> float:
        """Seconds until `count` jobs of the namespace are in `phase` (polled each 0.5 s); TimeoutError after."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            if self.phases(namespace)[phase] >= count:
                return time.monotonic() - began
            time.sleep(0.5)
        raise TimeoutError(f"{namespace}: {count} jobs not {phase} within {timeout:.0f} s: {self.phases(namespace)}")

    def wait_pods(self, namespace: str, names: list[str], replicas: int, timeout: float) -> dict[str, float | None]:
        """Wall time each job's pods were all first seen (None: not within `timeout`)."""
        deadline = time.monotonic() + timeout
        out: dict[str, float | None] = {}
        while time.monotonic() < deadline and len(out) < len(names):
            for name in names:
                if name not in out and (seen := self.kubelet.all_seen(namespace, name, replicas)) is not None:
                    out[name] = seen
            time.sleep(0.05)
        return {name: out.get(name) for name in names}

    def succeed_pods(self, namespace: str, names: list[str]) -> None:
        for name in names:
            for pod in self.kubelet.pods_of(namespace, name):
                self.kubelet.set_phase(namespace, pod, "Succeeded")

    def wait_gone(self, namespace: str, names: list[str], timeout: float) -> None:
        """Until none of these jobs is left in the API (the operator removed its finalizer from each)."""
        wanted, deadline = set(names), time.monotonic() + timeout
        while time.monotonic() < deadline:
            items = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
            if not wanted & {item["metadata"]["name"] for item in items}:
                return
            time.sleep(0.2)
        raise TimeoutError(f"jobs still there after {timeout:g} s: {sorted(wanted)[:5]}...")

    def delete_jobs(self, namespace: str, names: list[str]) -> None:
        """Delete the jobs, then their pods at once (without a kubelet, a graceful delete never ends)."""
        def delete(name: str) -> None:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            for pod in self.kubelet.pods_of(namespace, name):
                try:
                    self.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
                except client.ApiException as err:
                    if err.status != 404:
                        raise

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(delete, names))

    def close(self) -> None:
        self.kubelet.close()
        self.cluster.stop()


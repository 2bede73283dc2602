"""The peers of bench/operator_scale, each run as its own process on the same test cluster:

- `kopf`: a minimal kopf operator. On a TrainingJob's create it creates the job's headless Service, its
  PodDisruptionBudget and its worker pods (what Flywheel's operator creates) and writes one status (Running); when
  all its pods have Succeeded (seen from kopf's pod watch, no LIST) it writes Succeeded. Nothing else: no etcd, no
  event log, no policy, no restarts. Its CPU per job is the floor a kopf-based operator pays for the same objects.
- `bare`: a bare client (aiohttp, 16 jobs in flight) creating the same Service, budget and pods for N job names
  directly,
  no operator: the throughput the test cluster allows for these objects.

    python -m bench.operator_scale_peer kopf --kubeconfig K --namespace peer
    python -m bench.operator_scale_peer bare --kubeconfig K --namespace bare --jobs 500 --replicas 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from flywheel.contracts.labels import INDEX_LABEL, JOB_LABEL
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION

RDZV_PORT = 29400


def service(job: str, namespace: str) -> dict[str, Any]:
    labels = {JOB_LABEL: job}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": job, "namespace": namespace, "labels": labels},
            "spec": {"clusterIP": "None", "selector": labels, "publishNotReadyAddresses": True,
                     "ports": [{"name": "rdzv", "port": RDZV_PORT}]}}


def budget(job: str, namespace: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": job, "namespace": namespace, "labels": {JOB_LABEL: job}},
            "spec": {"minAvailable": replicas, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                     "selector": {"matchLabels": {JOB_LABEL: job}}}}


def pod(job: str, namespace: str, index: int, replicas: int) -> dict[str, Any]:
    """A worker pod of the same shape as the operator's (labels, one container, env, volumes)."""
    env = {"FLYWHEEL_JOB": job, "FLYWHEEL_REPLICA_INDEX": str(index), "FLYWHEEL_NNODES": str(replicas),
           "OMP_NUM_THREADS": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-worker-{index}", "namespace": namespace,
                         "labels": {JOB_LABEL: job, INDEX_LABEL: str(index)}},
            "spec": {"restartPolicy": "Never", "hostname": f"{job}-worker-{index}", "subdomain": job,
                     "containers": [{"name": "worker", "image": "flywheel:latest",
                                     "command": ["flywheel", "worker", "--job", job],
                                     "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
                                     "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}],
                     "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}


class Api:
    """POST and merge-PATCH against the kubeconfig's server with its bearer token."""

    def __init__(self, kubeconfig: Path) -> None:
        doc = yaml.safe_load(kubeconfig.read_text())
        self.server = doc["clusters"][0]["cluster"]["server"].rstrip("/")
        token = doc["users"][0]["user"].get("token")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(headers=self.headers, connector=aiohttp.TCPConnector(limit=32))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def create(self, path: str, body: dict[str, Any]) -> None:
        assert self.session is not None
        async with self.session.post(self.server + path, json=body) as resp:
            if resp.status not in (200, 201, 409):  # 409: already there (a retried create)
                raise RuntimeError(f"POST {path}: {resp.status} {await resp.text()}")

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        assert self.session is not None
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        async with self.session.patch(self.server + path, json={"status": status},
                                      headers={"Content-Type": "application/merge-patch+json"}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"PATCH {path}: {resp.status} {await resp.text()}")

    async def create_job_objects(self, job: str, namespace: str, replicas: int) -> None:
        await self.create(f"/api/v1/namespaces/{namespace}/services", service(job, namespace))
        await self.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
                          budget(job, namespace, replicas))
        await asyncio.gather(*(self.create(f"/api/v1/namespaces/{namespace}/pods", pod(job, namespace, i, replicas))
                               for i in range(replicas)))


def run_kopf_peer(kubeconfig: Path, namespace: str) -> None:
    import kopf

    api = Api(kubeconfig)
    succeeded: dict[str, set[str]] = {}  # job -> its pods seen Succeeded
    replicas_of: dict[str, int] = {}
    done: set[str] = set()

    @kopf.on.login()
    def login(**kwargs: Any) -> Any:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup()
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # the peer posts no events (ours posts a few per job)
        await api.open()

    @kopf.on.cleanup()
    async def cleanup(**_: Any) -> None:
        await api.close()

    @kopf.on.create(GROUP, VERSION, PLURAL)
    async def created(name: str, namespace: str | None, spec: kopf.Spec, **_: Any) -> None:
        assert namespace is not None  # the peer watches one namespace
        replicas = int(spec["replicas"]["max"])
        replicas_of[name] = replicas
        await api.create_job_objects(name, namespace, replicas)
        await api.patch_status(namespace, name, {"phase": "Running"})

    @kopf.on.event("pods", labels={JOB_LABEL: kopf.PRESENT})
    async def pod_event(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        assert namespace is not None
        job = body["metadata"]["labels"][JOB_LABEL]
        if (body.get("status") or {}).get("phase") != "Succeeded" or job in done:
            return
        pods = succeeded.setdefault(job, set())
        pods.add(body["metadata"]["name"])
        if len(pods) >= replicas_of.get(job, 2):
            done.add(job)
            await api.patch_status(namespace, job, {"phase": "Succeeded"})

    kopf.run(standalone=True, namespaces=[namespace], clusterwide=False)


async def bare_burst(kubeconfig: Path, namespace: str, jobs: int, replicas: int, in_flight: int = 16) -> float:
    """Create every job's Service, budget and pods, `in_flight` jobs at a time; the seconds it took."""
    api = Api(kubeconfig)
    await api.open()
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with gate:
            await api.create_job_objects(f"bare-{i}", namespace, replicas)

    print(json.dumps({"began": time.time()}), flush=True)  # the bench measures from here to its pods seen
    began = time.monotonic()
    try:
        await asyncio.gather(*(one(i) for i in range(jobs)))
    finally:
        await api.close()
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=("kopf", "bare"))
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    os.environ["KUBECONFIG"] = str(args.kubeconfig)  # kopf.login_with_kubeconfig reads it
    if args.which == "kopf":
        run_kopf_peer(args.kubeconfig, args.namespace)
    else:
        seconds = asyncio.run(bare_burst(args.kubeconfig, args.namespace, args.jobs, args.replicas))
        print(json.dumps({"created_s": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

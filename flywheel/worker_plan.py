"""Pure planning: a TrainingJob plus the facts of where it runs -> the workers to start, with their env.

Used by the local executor (`flywheel run`) and by the operator (one Pod per WorkerPlan). No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from flywheel.contracts.replica import REPLICA_INDEX_ENV
from flywheel.planner import DEVICES
from flywheel.spec import TrainingJob
from flywheel.spec.auto import resolve_auto
from flywheel.spec.object_names import worker_name as worker_name  # re-exported: the worker pods' names
from flywheel.spec.parse import spec_to_env_json
from flywheel.spec.pod import planner_device


@dataclass(frozen=True)
class Placement:
    """What the executor decided about where and how the job runs."""

    replicas: int  # workers to run now, within [min, max]
    rdzv_backend: str  # "c10d" locally (the supervisor hosts the store), "etcd-v3" on a cluster
    rdzv_endpoint: str
    master_addr: str
    master_port: int
    checkpoint_dir: str
    launcher: tuple[str, ...]  # argv that runs `flywheel launch`
    metrics_port_base: int = 0  # 0 = no metrics endpoint
    per_worker_metrics_port: bool = True  # locally all workers share one host, so each gets base + index
    events_file: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    hostname_suffix: str = ""  # on a cluster: ".<job>-workers.<namespace>.svc" so peers resolve through the Service


@dataclass(frozen=True)
class WorkerPlan:
    index: int
    name: str
    hostname: str
    first_rank: int  # expected global rank range; the rendezvous has the final say when the world changes
    last_rank: int
    env: dict[str, str]
    argv: tuple[str, ...]


def rdzv_run_id(job: TrainingJob) -> str:
    return f"{job.metadata.namespace}-{job.metadata.name}"


def run_id(job: TrainingJob, uid: str) -> str:
    """The operator's run id: unique per TrainingJob incarnation (torch closes a finished rendezvous for good); the
    etcd keys of its rendezvous, liveness and progress are under it (the REST API reads the progress too)."""
    return f"{rdzv_run_id(job)}-{uid[:8]}"


def plan_workers(job: TrainingJob, placement: Placement) -> list[WorkerPlan]:
    """One WorkerPlan per replica, with the worker contract env (docs/contracts.md)."""
    spec = job.spec
    if not spec.replicas.min <= placement.replicas <= spec.replicas.max:
        raise ValueError(f"placement.replicas={placement.replicas} is outside spec.replicas "
                         f"[{spec.replicas.min}, {spec.replicas.max}]")
    procs = spec.procs_per_replica
    world = placement.replicas * procs
    # Workers get a concrete layout: `parallelism.auto` is resolved here, once for all of them, on the device
    # profile the job was validated with (so this pick exists: the schema ran the same search).
    spec_json = spec_to_env_json(resolve_auto(spec, DEVICES[planner_device(spec.pod_view())]))
    argv = tuple(placement.launcher) + (("--", *spec.command) if spec.command else ())
    plans = []
    for index in range(placement.replicas):
        metrics_port = 0
        if placement.metrics_port_base:
            metrics_port = placement.metrics_port_base + (index if placement.per_worker_metrics_port else 0)
        env = {
            "MASTER_ADDR": placement.master_addr,
            "MASTER_PORT": str(placement.master_port),
            "WORLD_SIZE": str(world),
            "PET_NNODES": f"{spec.replicas.min}:{spec.replicas.max}",
            "PET_NPROC_PER_NODE": str(procs),
            "PET_RDZV_BACKEND": placement.rdzv_backend,
            "PET_RDZV_ENDPOINT": placement.rdzv_endpoint,
            "PET_RDZV_ID": rdzv_run_id(job),
            "PET_MAX_RESTARTS": str(spec.fault_tolerance.max_restarts),
            "FLYWHEEL_WARM_START": "1" if spec.fault_tolerance.warm_start else "0",
            "FLYWHEEL_JOB": f"{job.metadata.namespace}/{job.metadata.name}",
            REPLICA_INDEX_ENV: str(index),
            "FLYWHEEL_SPEC": spec_json,
            "FLYWHEEL_CHECKPOINT_DIR": placement.checkpoint_dir,
            "FLYWHEEL_METRICS_PORT": str(metrics_port),
        }
        if placement.events_file:
            env["FLYWHEEL_EVENTS_FILE"] = placement.events_file
        env.update(placement.extra_env)
        name = worker_name(job.metadata.name, index)
        plans.append(WorkerPlan(index=index, name=name, hostname=name + placement.hostname_suffix,
                                first_rank=index * procs, last_rank=(index + 1) * procs - 1, env=env, argv=argv))
    return plans


def describe_plan(plans: list[WorkerPlan]) -> list[dict[str, object]]:
    """A JSON-friendly view of the plan (for `flywheel plan -o json`); the spec blob is summarised."""
    out = []
    for p in plans:
        env = dict(p.env)
        env["FLYWHEEL_SPEC"] = f"<{len(env['FLYWHEEL_SPEC'])} bytes of JSON>"
        out.append({"index": p.index, "name": p.name, "hostname": p.hostname,
                    "ranks": [p.first_rank, p.last_rank], "argv": list(p.argv), "env": env})
    return out


def faults_env(faults: list[dict[str, object]], fault_dir: str) -> dict[str, str]:
    """Env that asks the trainer to inject rank-level faults (tests and demos only)."""
    rank_faults = [f for f in faults if f.get("kind") in ("kill", "hang")]
    if not rank_faults:
        return {}
    return {"FLYWHEEL_FAULTS": json.dumps(rank_faults, sort_keys=True), "FLYWHEEL_FAULT_DIR": fault_dir}

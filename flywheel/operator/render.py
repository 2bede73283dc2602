"""`flywheel render JOB.yaml [-o yaml|json]`: the Service, the PodGroup (gang jobs with --gang-scheduler), every
worker Pod and every warm spare Pod (spec.replicas.spares) exactly as the operator would create them (the same
builders, operator/manifests.py and spare_pods.py), for review before `kubectl apply`, like `helm template`. The
operator's settings that shape a pod are options here, with the operator's defaults; the job's uid (in the
rendezvous id and the event-log path) is --uid, a placeholder by default. Only the owner reference the operator
adds on creation is left out."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flywheel.operator.manifests import OperatorSettings
    from flywheel.spec import TrainingJob

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
DEFAULT_ETCD = "flywheel-etcd-0.flywheel-etcd.flywheel.svc:2379"  # the chart's etcd, released as `flywheel`


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="TrainingJob YAML")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument("--uid", default=PLACEHOLDER_UID, help="the TrainingJob's uid (default: a placeholder)")
    p.add_argument("--replicas", type=int, help="workers to render (default: spec.replicas target or max)")
    p.add_argument("--generation", type=int, default=0, help="the restart generation label (default 0)")
    p.add_argument("--etcd-endpoints", default=os.environ.get("FLYWHEEL_ETCD_ENDPOINTS", DEFAULT_ETCD))
    p.add_argument("--events-dir", default="", help="the operator's --events-dir")
    p.add_argument("--events-claim", default="", help="the operator's --events-claim")
    p.add_argument("--metrics-port-base", type=int, default=9400, help="the operator's (default 9400; 0 = none)")
    p.add_argument("--worker-env", action="append", default=[], metavar="K=V", help="the operator's --worker-env")
    p.add_argument("--gang-scheduler", choices=("none", "scheduler-plugins", "volcano"), default="none")
    p.add_argument("--security-profile", choices=("hardened", "image"), default="hardened")
    p.add_argument("--rdma-resource", default="rdma/rdma_shared_device_a")
    p.add_argument("--no-disruption-budgets", dest="disruption_budgets", action="store_false",
                   help="the operator's: no PodDisruptionBudget")


def settings_from_args(args: argparse.Namespace) -> OperatorSettings:
    from flywheel.operator.manifests import OperatorSettings

    env = tuple((key, value) for key, _, value in (item.partition("=") for item in args.worker_env if "=" in item))
    return OperatorSettings(etcd_endpoints=args.etcd_endpoints, events_dir=args.events_dir,
                            events_claim=args.events_claim, metrics_port_base=args.metrics_port_base,
                            worker_env=env, gang_scheduler=args.gang_scheduler,
                            security_profile=args.security_profile, rdma_resource=args.rdma_resource,
                            disruption_budgets=args.disruption_budgets)


def render_objects(job: TrainingJob, settings: OperatorSettings, uid: str = PLACEHOLDER_UID,
                   generation: int = 0, replicas: int | None = None) -> list[dict[str, Any]]:
    """The objects the operator creates for `job` (Service, PodGroup, PodDisruptionBudget, one Pod per worker, one
    per spare), in that order."""
    from flywheel.operator import manifests as m
    from flywheel.operator.event_log import events_file
    from flywheel.operator.spare_pods import spare_pod

    if replicas is not None:
        job = job.model_copy(update={"spec": job.spec.model_copy(
            update={"replicas": job.spec.replicas.model_copy(update={"target": replicas})})})
    events = str(events_file(settings.events_dir, job.metadata.namespace, job.name, uid)) \
        if settings.events_dir else None
    objects = [m.service(job)]
    group = m.pod_group(job, settings)
    if group is not None:
        objects.append(group)
    if settings.disruption_budgets:
        objects.append(m.disruption_budget(job))
    workers = m.plan(job, uid, settings, events)
    objects += [m.pod(job, worker, generation, settings) for worker in workers]
    objects += [spare_pod(job, workers[0], n, generation, settings) for n in range(job.spec.replicas.spares)]
    return objects


def run(args: argparse.Namespace) -> int:
    import yaml

    from flywheel.spec import SpecError, load_job

    try:
        job = load_job(args.job)
        objects = render_objects(job, settings_from_args(args), args.uid, args.generation, args.replicas)
    except (SpecError, ValueError) as err:
        print(f"{args.job}: {err}")
        return 2
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
    else:
        print(yaml.safe_dump_all(objects, sort_keys=False), end="")
    return 0

"""Warm spare pods (spec.replicas.spares, policy/spares.py): the pod a CreateSpare creates, the labels and env a
PromoteSpare gives it, and the etcd side the operator uses (the spare agent's keys, flywheel/etcd/spares.py).

A spare pod is a worker pod (same image, command, env, volumes, template) except: named `<job>-spare-<n>`, labelled
role=spare without a replica index, env FLYWHEEL_SPARE=1 and FLYWHEEL_SPARE_ID=<pod name> instead of
FLYWHEEL_REPLICA_INDEX, and a preferred anti-affinity away from the job's workers, so that the node a worker is
lost with is seldom the spare's too.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from flywheel.contracts import replica
from flywheel.contracts.labels import GENERATION_LABEL, INDEX_LABEL, JOB_LABEL, ROLE_LABEL, ROLE_SPARE, ROLE_WORKER
from flywheel.operator import manifests as m
from flywheel.spec import TrainingJob
from flywheel.spec.object_names import spare_name as spare_name  # re-exported: the spare pods' names
from flywheel.worker_plan import WorkerPlan

# The spare contract's env names (flywheel/contracts/replica.py, shared with the spare agent).
SPARE_ENV, SPARE_ID_ENV = replica.SPARE_ENV, replica.SPARE_ID_ENV
ANTI_AFFINITY_WEIGHT = 50  # below a topologyKey's pod affinity (100): staying in the domain matters more


def spare_plan(worker: WorkerPlan, name: str) -> WorkerPlan:
    """A worker's plan turned into a spare's: its own name, no replica index, the spare env."""
    env = {k: v for k, v in worker.env.items() if k != replica.REPLICA_INDEX_ENV}
    env.update({SPARE_ENV: "1", SPARE_ID_ENV: name})
    return replace(worker, index=-1, name=name, hostname=name + worker.hostname[len(worker.name):], env=env)


def spare_pod(job: TrainingJob, worker: WorkerPlan, number: int, generation: int,
              settings: m.OperatorSettings, nodes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The spare pod `<job>-spare-<number>`, built from any worker's plan (they differ only in the index); `nodes`:
    only on one of them (a spare moved off a worker's node)."""
    plan = spare_plan(worker, spare_name(job.name, number))
    body = copy.deepcopy(m.pod(job, plan, generation, settings))
    labels = body["metadata"]["labels"]
    labels.pop(INDEX_LABEL, None)
    labels[ROLE_LABEL] = ROLE_SPARE
    term = {"weight": ANTI_AFFINITY_WEIGHT, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {JOB_LABEL: job.name, ROLE_LABEL: ROLE_WORKER}},
        "topologyKey": "kubernetes.io/hostname"}}
    anti = body["spec"].setdefault("affinity", {}).setdefault("podAntiAffinity", {})
    anti.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(term)
    if nodes:
        only_on(body["spec"]["affinity"], nodes)
    return body


def only_on(affinity: dict[str, Any], nodes: tuple[str, ...]) -> None:
    """Require one of `nodes` on top of the template's required node affinity: nodeSelectorTerms are ORed, so the
    name requirement joins each term (a term's requirements are ANDed), or is the one term when there is none."""
    names = {"key": "metadata.name", "operator": "In", "values": list(nodes)}
    required = affinity.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    for term in terms:
        term.setdefault("matchFields", []).append(dict(names))
    if not terms:
        terms.append({"matchFields": [names]})


def promoted_labels(index: int, generation: int) -> dict[str, str]:
    """A promoted spare's labels: a worker of that replica index and generation."""
    return {ROLE_LABEL: ROLE_WORKER, INDEX_LABEL: str(index), GENERATION_LABEL: str(generation)}


def promotion_env(worker: WorkerPlan) -> dict[str, str]:
    """What the promotion tells the spare's agent: the env of replica `worker.index` that a spare's lacks (the
    replica index; the rest of a worker's env is the same for every index)."""
    spare = spare_plan(worker, "").env
    return {k: v for k, v in worker.env.items() if spare.get(k) != v}


"""The builders the tests share: a TrainingJob (document or parsed), a spec, the policy's pods and job view, a
reconcile pass, the health monitor's view of a job, and an example of examples/ changed and written out. Defaults
are the smallest job the policy tests need (2 workers, 2 restarts, 5 s node grace); a test changes what it is about
with dotted paths, e.g. `spec(**{"replicas.spares": 1, "faultTolerance.maxRestarts": 10})`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from flywheel.policy.decisions import Pass
from flywheel.policy.health_checks import WatchedJob
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import HealthFindings, Observed, ObservedProgress, PodView
from flywheel.policy.reconcile import reconcile as reconcile_pass
from flywheel.policy.xid import WatchedPod
from flywheel.spec import API_VERSION, TrainingJob, TrainingJobSpec, parse_job, parse_spec
from flywheel.spec.status import Phase, TrainingJobStatus

NOW = 1_800_000_000.0
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# The policy tests' job: 2 workers of one rank each, 2 restarts allowed, a lost node given up on after 5 s.
POLICY_SPEC: dict[str, Any] = {"replicas": {"min": 2, "max": 2},
                               "trainer": {"training": {"globalBatch": 8, "microBatch": 2}},
                               "faultTolerance": {"maxRestarts": 2, "nodeFailureGraceSeconds": 5}}


def with_paths(doc: dict[str, Any], **dotted: Any) -> dict[str, Any]:
    """A deep copy of `doc` with each dotted path ("trainer.training.steps") set, its missing parents created."""
    out = copy.deepcopy(doc)
    for path, value in dotted.items():
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def example(name: str = "tiny", **dotted: Any) -> dict[str, Any]:
    """examples/NAME.yaml as a document, each dotted path ("spec.checkpoint.dir") set."""
    return with_paths(yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()), **dotted)


def job_file(directory: Path, doc: dict[str, Any], name: str = "job.yaml") -> Path:
    """`doc` written as YAML to directory/name, for `flywheel plan/run` and load_job."""
    path = directory / name
    path.write_text(yaml.safe_dump(doc))
    return path


def spec(**dotted: Any) -> TrainingJobSpec:
    """The policy tests' spec (POLICY_SPEC) with each dotted path changed."""
    return parse_spec(with_paths(POLICY_SPEC, **dotted))


def job_doc(spec: dict[str, Any] | None = None, *, name: str = "j", namespace: str | None = None,
            labels: dict[str, str] | None = None, **dotted: Any) -> dict[str, Any]:
    """A TrainingJob object around a spec document (none: every default), then each dotted path set from the top
    ("spec.replicas.min", "metadata.uid")."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": meta}
    if spec is not None:
        doc["spec"] = copy.deepcopy(spec)
    return with_paths(doc, **dotted)


def job(spec: dict[str, Any] | None = None, *, name: str = "j", namespace: str | None = None,
        labels: dict[str, str] | None = None, **dotted: Any) -> TrainingJob:
    """job_doc(...) parsed and validated, as the operator and `flywheel run` read it."""
    return parse_job(job_doc(spec, name=name, namespace=namespace, labels=labels, **dotted))


def pod(index: int, phase: str = "Running", generation: int = 0, **kw: Any) -> PodView:
    """Worker `index` of generation `generation` as the policy sees it (j-worker-INDEX), ready while Running;
    `uid` and PodView's other fields by keyword."""
    kw.setdefault("uid", f"u{index}-{generation}")
    return PodView(name=f"j-worker-{index}", index=index, generation=generation, phase=phase,
                   ready=phase == "Running", **kw)


def spare(number: int, ready: bool = True, generation: int = 0, node: str | None = None, **kw: Any) -> PodView:
    """Warm spare `number` (j-spare-NUMBER, no replica index), Running; `ready`: warm and waiting."""
    return PodView(name=f"j-spare-{number}", uid=f"s{number}", index=-1, generation=generation,
                   phase=kw.pop("phase", "Running"), ready=ready, role="spare", spare_ready=ready, node=node, **kw)


def view(s: TrainingJobSpec, pods: list[PodView], generation: int = 0, now: float = NOW,
         progress: ObservedProgress | None = None, findings: HealthFindings | None = None,
         restart_requested_at: str | None = None) -> JobView:
    """The policy's view of a job: its spec, its worker pods and what was observed, at `now`."""
    return JobView(s, pods, progress or ObservedProgress(), now, generation, restart_requested_at,
                   findings or HealthFindings())


def fresh(phase: Phase = Phase.RUNNING, **fields: Any) -> Pass:
    """A pass that starts from a status in `phase` with the given fields."""
    return Pass(TrainingJobStatus(phase=phase, **fields))


def reconcile(s: TrainingJobSpec | None, invalid: str | None, status: TrainingJobStatus, pods: list[PodView],
              progress: ObservedProgress, now: float, **observed: Any) -> Pass:
    """One pass, its observations given as the pods, the progress and `Observed`'s other fields by keyword."""
    return reconcile_pass(s, invalid, status, Observed(pods, progress, **observed), now)


def watched_job(n: int = 2, *, name: str = "train", namespace: str = "ml", phase: str = "Running",
                pod_phase: str = "Running", started: float = 0.0, timeout: float = 10, first: float = 100,
                **pod_fields: Any) -> WatchedJob:
    """The health monitor's view of a job: `n` workers NAME-worker-I on node-I, Running since `started`, with
    progressTimeoutSeconds `timeout` and firstStepTimeoutSeconds `first`."""
    pods = tuple(WatchedPod(f"{name}-worker-{i}", namespace, name, str(i), f"node-{i}", pod_phase, started,
                            **pod_fields) for i in range(n))
    return WatchedJob(namespace, name, phase, timeout, first, pods)

"""Builders for the policy tests: a spec, pods, a typed status and a JobView."""

from __future__ import annotations

from typing import Any

from flywheel.policy.decisions import Pass
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import HealthFindings, Observed, ObservedProgress, PodView
from flywheel.policy.reconcile import reconcile as reconcile_pass
from flywheel.spec import TrainingJobSpec, parse_spec
from flywheel.spec.status import Phase, TrainingJobStatus

NOW = 1_800_000_000.0


def spec(**changes: Any) -> TrainingJobSpec:
    doc: dict[str, Any] = {"replicas": {"min": 2, "max": 2},
                           "trainer": {"training": {"globalBatch": 8, "microBatch": 2}},
                           "faultTolerance": {"maxRestarts": 2, "nodeFailureGraceSeconds": 5}}
    for dotted, value in changes.items():
        node = doc
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return parse_spec(doc)


def pod(index: int, phase: str = "Running", generation: int = 0, **kw: Any) -> PodView:
    return PodView(name=f"j-worker-{index}", uid=f"u{index}-{generation}", index=index, generation=generation,
                   phase=phase, ready=phase == "Running", **kw)


def view(s: TrainingJobSpec, pods: list[PodView], generation: int = 0, now: float = NOW,
         progress: ObservedProgress | None = None, findings: HealthFindings | None = None,
         restart_requested_at: str | None = None) -> JobView:
    return JobView(s, pods, progress or ObservedProgress(), now, generation, restart_requested_at,
                   findings or HealthFindings())


def fresh(phase: Phase = Phase.RUNNING, **fields: Any) -> Pass:
    return Pass(TrainingJobStatus(phase=phase, **fields))


def reconcile(s: TrainingJobSpec | None, invalid: str | None, status: TrainingJobStatus, pods: list[PodView],
              progress: ObservedProgress, now: float, **observed: Any) -> Pass:
    """One pass, its observations given as the pods, the progress and `Observed`'s other fields by keyword."""
    return reconcile_pass(s, invalid, status, Observed(pods, progress, **observed), now)
